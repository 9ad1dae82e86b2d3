"""`zobench compare BASELINE CURRENT`: a regression gate that ignores noise.

The gate works per job key (measurements.py), on the per-step time, the peak memory (the GPU's
peak allocation for a cuda job, the process's peak RSS otherwise) and, where a power meter
measured it on both sides, the energy per step. A change counts only when it passes both tests:
- it is significant by a two-sided Mann-Whitney U test over the repeats (alpha 0.05), and
- it is larger than a relative threshold (default 5%) between the two sides' estimates, by
  each estimate the estimator takes, the same way.

The default estimator takes two: the fastest repeat and the median. On a shared machine most
noise is one-sided: a neighbour, a migration or a cold cache only ever add time, so the median
of a side moves with how busy the machine was while it ran, while the fastest repeat stays on
the code's own cost (Chen & Revels, "Robust benchmarking in noisy environments", 2016). But
each repeat is a process of its own, and a process can be lucky (a memory layout that runs a
key 10% faster): one such repeat moves the minimum of five alone. Code that got slower moves
them all, the fastest and the typical repeat alike, so a change counts only where both moved
(docs/compare.md has the measurements). `--estimator min` or `median` judges on one alone.

The statistical test alone flags tiny but consistent shifts. A bare percentage alone raises
false alarms on noisy runners. And when other work kept the machine busy through every
repeat of a side, even its fastest repeat is slow: each job records the machine's load
(machine_load.py), and a key whose step time change (or lack of one) the load could explain on
its own is "noisy" rather than regressed, improved or unchanged; load excuses no more than that (its energy too: a step that takes longer draws
the device's idle power longer). Each key ends up in one of these states
(docs/compare.md):
- improved, regressed or unchanged;
- not judged: the test could not tell, so the key is neither passed nor failed, with why:
  - noisy: a side ran under load it did not cause, enough to make or hide the change measured;
  - too few repeats: so few samples a side that no order of them is significant (the smallest
    p the test can give is not below alpha), so "no counted change" would say nothing;
- not comparable: the target's fingerprint changed between the two sides (CPU, cores,
  governor, kernel, runtime versions, the CPU the C++ binary was built for and its kernel
  paths, or the binary's hash while the harness commit stayed the same, i.e. the build changed
  and the code did not), or the repeats of one side (runs
  pooled, or a run resumed after an upgrade) disagree on it. Numbers from different
  machines are not compared. Under --judge-by instructions (by_instructions), also a key
  without a count of one build on each side;
- missing: the key is on one side only.
The gate passes (exit 0) only when it judged every key on both sides and none regressed: a key
it could not judge (not judged, or not comparable) is exit 3 with how many and why, never a
silent "unchanged" (--allow-unjudged lets a noisy runner pass on the keys it did judge). A gate
that judged no key at all fails even then: a kernel upgrade on a CI image, or a suite whose
keys all changed, must not turn it green.
"""
from __future__ import annotations

import math
import statistics
from dataclasses import asdict, dataclass, field

from workloads import jsonfile

from harness.stores import validity
from harness.stores.machine_load import LOADED, contention, starved, wanted
from harness.stores.metrics import LOADED_METRICS, METRICS, Metric
from harness.stores.measurements import FINGERPRINT, Measurement, differs

ALPHA = 0.05
THRESHOLD = 0.05     # the smallest relative change that counts, by default (--threshold 5)
# instructions per step are deterministic (harness/execution/instructions.py): any change past this
# counts, on one repeat a side, with no test (--instructions-threshold 1)
INSTRUCTION_THRESHOLD = 0.01
# A side's estimates by name, and the ones each --estimator judges on (the module docstring says why both)
ESTIMATES = {"min": min, "median": statistics.median}
ESTIMATORS = {"both": ("min", "median"), "min": ("min",), "median": ("median",)}
ESTIMATOR = "both"    # the default (--estimator): compare, history and the benchmark read it here
# what decides a key (--judge-by): its time (with memory, energy and instructions where counted), or,
# on a shared CI runner, only what load cannot move: its instructions per step and peak memory
JUDGED_BY = ("time", "instructions")
STATUSES = ("regressed", "improved", "noisy", "too few repeats", "unchanged", "not comparable", "missing")
COMPARED = ("regressed", "improved", "unchanged")
UNJUDGED = ("noisy", "too few repeats")     # the test could not tell: shown as "not judged (...)"
OUT_OF_SCOPE = ("missing",)                  # a key on one side only: added or dropped, nothing to judge
# Load excuses only what it can explain (docs/compare.md): a counted change is judged unless the
# slower side's load could have made it on its own, and "unchanged" stands unless the busier
# side's could have hidden a change of the threshold. Where one side's load is unknown (an export
# from an older zobench), the other side's is judged alone: more than LOADED of the CPU its jobs
# wanted, and no repeat of it measured the code.
# LOADED (machine_load.py, which the results table's load flag reads too)
EXIT_REGRESSED, EXIT_NOT_JUDGED = 1, 3
EXIT_CODES = ("exit codes: 0 every key on both sides judged and none regressed; 1 a key regressed "
              "(--fail-on-change: or improved); 2 bad input; 3 a key could not be judged (noisy, too few "
              "repeats or not comparable; --allow-unjudged: only when no key was judged at all)")




@dataclass
class MetricChange:
    baseline: float            # the estimate (`estimate`), in the metric's unit
    current: float
    change: float              # relative: current / baseline - 1
    p_value: float
    significant: bool          # p < alpha and every estimate moved past the threshold, the same way
    measures: str = ""         # which source both sides had, where a metric has several
    estimate: str = "min"      # the estimate shown: of the estimator's, the one that moved least


def point_estimate(estimator: str) -> tuple[str, object]:
    """(name, function) of the one estimate a series' point shows under the estimator: the
    median where it judges on both (a point's range is shown beside it)."""
    name = ESTIMATORS[estimator][-1]
    return name, ESTIMATES[name]


def shift(before: list[float], after: list[float], estimator: str, threshold: float) -> tuple[float, float, float, str, bool]:
    """(before, after, change, estimate, beyond) by the estimator's estimates: the one that moved
    least, and whether every one of them moved past the threshold in the same direction."""
    moves = []
    for name in ESTIMATORS[estimator]:
        b, a = ESTIMATES[name](before), ESTIMATES[name](after)
        moves.append((b, a, a / b - 1 if b else 0.0, name))
    b, a, change, name = min(moves, key=lambda m: abs(m[2]))
    beyond = all(abs(m[2]) > threshold and (m[2] > 0) == (change > 0) for m in moves)
    return b, a, change, name, beyond


@dataclass
class Instructions:
    """A key's instructions per step, judged on their own: deterministic, so no test and no load."""
    status: str                # regressed, improved, unchanged, or "not judged" (why: in reason)
    baseline: float | None = None   # the median of each side's counts (they agree; median in case)
    current: float | None = None
    change: float | None = None
    build: str | None = None   # the build both counted
    reason: str = ""


@dataclass
class Verdict:
    key: str
    status: str                # one of STATUSES
    reason: str = ""
    metrics: dict = field(default_factory=dict)
    instructions: Instructions | None = None    # None: neither side counted


def judge_instructions(b: Measurement, c: Measurement, threshold: float) -> Instructions | None:
    """Instructions per step between two sides: a change past the threshold is a regression or an
    improvement on one repeat a side, anything within is unchanged. Counts of two builds are
    two programs' (docs/compare.md): not judged."""
    if not b.instructions and not c.instructions:
        why = [f"{side}: {m.uncounted}" for side, m in (("baseline", b), ("current", c)) if m.uncounted]
        return Instructions("not judged", reason="instructions not counted: " + "; ".join(why)) if why else None
    if not (b.instructions and c.instructions):
        side, other = ("baseline", c) if b.instructions else ("current", b)
        why = f" ({other.uncounted})" if other.uncounted else ""
        return Instructions("not judged", reason=f"instructions counted in {side} only{why}: not judged")
    builds = sorted({*b.instruction_builds, *c.instruction_builds}, key=str)
    if len(builds) > 1:
        return Instructions("not judged", reason=f"instructions counted on builds {', '.join(map(str, builds))}: not judged")
    mb, mc = statistics.median(b.instructions), statistics.median(c.instructions)
    status, change = counted_change(mb, mc, threshold)
    return Instructions(status, mb, mc, change, builds[0])


def counted_change(before: float, after: float, threshold: float) -> tuple[str, float]:
    """(status, change) of a count, which is deterministic: past the threshold a regression or an
    improvement, no test; within it unchanged (the gate, and history along a series)."""
    change = after / before - 1
    return ("unchanged" if abs(change) <= threshold else "regressed" if change > 0 else "improved"), change


def with_instructions(v: Verdict, ins: Instructions | None, loaded: bool = False) -> Verdict:
    """A key's verdict with its instructions': a regression in them fails the key whatever its time
    says (load moves no instruction count); an improvement makes an unchanged key improved; a
    time the test could not judge stays not judged for time, the note saying the instructions'.
    A time that changed while the instructions did not, on a side that ran beside other work
    (loaded: more than LOADED of its CPU lost), is not judged: the load rule's model of a
    machine that busy is all that would call it code (docs/compare.md)."""
    v.instructions = ins
    if ins is None:
        return v
    said = ins.reason or f"instructions {ins.status} ({100 * ins.change:+.2f}%, counted on {ins.build})"
    if ins.status == "regressed" and v.status != "regressed":
        v.status = "regressed"
        said += ": judged on them, whatever the time's verdict"
    elif ins.status == "unchanged" and loaded and v.status in ("regressed", "improved") and all(
            name in LOADED_METRICS for name, m in v.metrics.items() if m.significant):
        v.status = "noisy"
        moved = ", ".join(f"{name} {m.change * 100:+.0f}%" for name, m in v.metrics.items() if m.significant)
        said += f"; {moved} beside other work: not judged"
    elif ins.status == "improved" and v.status == "unchanged":
        v.status = "improved"
    v.reason = "; ".join(x for x in (v.reason, said) if x)
    return v


def mann_whitney_p(a: list[float], b: list[float]) -> float:
    from scipy.stats import mannwhitneyu

    if len(a) < 2 or len(b) < 2 or len(set(a) | set(b)) == 1:
        return 1.0
    return float(mannwhitneyu(a, b, alternative="two-sided").pvalue)


def fingerprint_changes(b: Measurement, c: Measurement) -> list[str]:
    changed = [k for k in FINGERPRINT if differs(k, b.fingerprint.get(k), c.fingerprint.get(k))]
    if b.binary_sha256 != c.binary_sha256 and b.harness_commit == c.harness_commit:
        changed.append("binary_sha256")
    return changed


def side_load(m: Measurement, estimate) -> float | None:
    """A side's starved() share by the estimator its times are judged by: with the minimum,
    that of its quietest repeat, so one busy repeat among quiet ones never excuses a slowdown
    its fastest (quiet) repeats show as well."""
    threads = m.facts.get("threads") or 0
    known = [x for x in (starved(load, threads) for load in m.load) if x is not None]
    return estimate(known) if known else None


def team(m: Measurement) -> int:
    """How many threads of a side's jobs must all run for it to move (threads 0: every core): the
    threads it ran on the CPUs of their machine, or one where every repeat's team worked on the
    cores the load left it (measurements.adaptive_team), whose slowdown follows its lost share
    as one thread's does (docs/compare.md)."""
    if m.adaptive and all(m.adaptive) and len(m.adaptive) == len(m.load):
        return 1
    threads = m.facts.get("threads") or 0
    return max((wanted(load, threads) for load in m.load if contention(load) is not None), default=1)


def explained(busy: float, quiet: float, threads: int = 1) -> float:
    """The slowdown a job of `threads` threads gets from losing a share `busy` of the CPU it wants
    to other work instead of `quiet`. One thread does the same work on (1 - share) of the CPU. A
    team of threads that meets at a barrier every step moves only while all of them run, and the
    kernel runs each beside other work on its own: the chance that all run at once is the
    share's power (docs/compare.md has the measurements)."""
    return ((1 - quiet) / max(1 - busy, 0.01)) ** threads - 1


def unexplained(change: float, gap: float) -> float:
    """What is left of a change between two sides (current / baseline - 1) once the slower side
    is granted the slowdown `gap` its extra load can cause: the slower / faster ratio divided by
    1 + gap, less 1."""
    ratio = 1 + change if change > 0 else 1 / (1 + change)
    return ratio / (1 + max(gap, 0.0)) - 1


def side_heat(m: Measurement, estimate) -> tuple[float, str]:
    """(the slowdown a side's validity flags can explain, by the estimator its times are judged
    by: with the minimum, none while one repeat ran unflagged; what happened, "" for nothing)."""
    happened = [(i, v["flags"]) for i, v in enumerate(m.validity) if isinstance(v, dict) and v.get("flags")]
    if not happened:
        return 0.0, ""
    gap = estimate([validity.slowdown_explained(v) for v in m.validity])
    repeats: dict[str, list[str]] = {}
    for i, flags in happened:
        repeats.setdefault(validity.shown(flags), []).append(f"r{i}")
    return gap, "; ".join(f"{what} during {', '.join(rs)}" for what, rs in repeats.items()) + \
        f" on {m.facts.get('target', '?')}"


def noise(b: Measurement, c: Measurement, step: MetricChange, threshold: float) -> tuple[str, str]:
    """(why the key's step time is not judged, or ""; a note on load it was judged beside, or "").
    A counted change can only have come from the slower side's load or throttling (both add time,
    never take it away): it is judged when more of it is left than the threshold once that side
    is granted all the slowdown its extra load and its clock's measured reduction can cause (a
    flag without a measured clock can cause any). An "unchanged" can hide a change under either
    side's, so the one that could hide more matters: it stands unless that could be more than the
    threshold."""
    estimate = ESTIMATES[step.estimate]     # the load and clocks by the estimate the time is judged on
    shares = {"baseline": side_load(b, estimate), "current": side_load(c, estimate)}
    heat = {"baseline": side_heat(b, estimate), "current": side_heat(c, estimate)}

    def gap_of(side: str) -> tuple[float, str]:
        other = "baseline" if side == "current" else "current"
        mine, theirs = shares[side], shares[other]
        gap, words = 0.0, []
        if mine is not None:
            said = f"{side} ran beside other work: other processes or steal took {100 * mine:.0f}% of the CPU its jobs wanted"
            if theirs is None and mine > LOADED:
                gap = math.inf
                words.append(f"{said} (unknown in {other})")
            elif theirs is not None:
                threads = team(b if side == "baseline" else c)
                gap = explained(mine, theirs, threads)
                it = "it" if threads == 1 else f"its {threads} threads"
                words.append(f"{said} ({100 * theirs:.0f}% in {other}: enough to slow {it} by {100 * gap:.0f}%)")
        hot, what = heat[side]
        if not what:
            return gap, "; ".join(words)
        clock = f"its clock {100 * hot:.0f}% slower" if math.isfinite(hot) else "its clock unknown"
        # load that explains nothing is no part of the story
        return (1 + max(gap, 0.0)) * (1 + hot) - 1, "; ".join([*words[:gap > 0], f"{side} ran throttled: {what} ({clock})"])

    if step.significant:
        gap, said = gap_of("current" if step.change > 0 else "baseline")
        if not said:
            return "", ""
        if unexplained(step.change, gap) > threshold:
            return "", f"{said}, not by the {100 * abs(step.change):.0f}% measured: judged" if gap > 0 else ""
        return said, ""
    gap, said = max(gap_of("baseline"), gap_of("current"), key=lambda g: g[0])
    return (said, "") if said and gap > threshold else ("", "")


def judged(b: Measurement, c: Measurement, estimator: str, threshold: float) -> tuple[dict, list[str]]:
    """Each metric's change where both sides measured it, and a note for each that one side
    measured alone (a power meter added since the baseline): not judged, and not a failure."""
    metrics, notes = {}, []
    for metric in METRICS:
        if metric.counted:      # judge_instructions' rule, not the test
            continue
        change = judge(metric, b, c, estimator, threshold)
        if change is not None:
            metrics[metric.name] = change
        elif lone := [side for side, m in (("baseline", b), ("current", c))
                      if any(getattr(m, s.attr) for s in metric.sources)]:
            notes.append(f"{metric.title} measured in {lone[0]} only: not judged")
    return metrics, notes


def judge(metric: Metric, b: Measurement, c: Measurement, estimator: str, threshold: float) -> MetricChange | None:
    """The change of a metric between the two sides' estimates; None where they share no source."""
    for source in metric.sources:
        xb, xc = getattr(b, source.attr), getattr(c, source.attr)
        if xb and xc:
            mb, mc, change, by, beyond = shift(xb, xc, estimator, threshold)
            p = mann_whitney_p(xb, xc)
            return MetricChange(mb * metric.scale, mc * metric.scale, change, p, p < ALPHA and beyond, source.what, by)
    return None


def compare(base: dict[str, Measurement], cur: dict[str, Measurement], threshold: float,
            estimator: str, instruction_threshold: float = INSTRUCTION_THRESHOLD, by: str = "time") -> list[Verdict]:
    out = []
    for key in list(base) + [k for k in cur if k not in base]:
        b, c = base.get(key), cur.get(key)
        if b is None or c is None:
            out.append(Verdict(key, "missing", "only in " + ("current" if b is None else "baseline")))
            continue
        mixed = [f"{side}'s repeats disagree: {m.disagreement}" for side, m in (("baseline", b), ("current", c))
                 if m.disagreement]
        if mixed:
            out.append(Verdict(key, "not comparable", "; ".join(mixed)))
            continue
        changed = fingerprint_changes(b, c)
        if changed:
            was, now = ({**m.fingerprint, "binary_sha256": str(m.binary_sha256)[:12],
                         "lock": m.fingerprint.get("lock") and m.fingerprint["lock"][:12]} for m in (b, c))
            out.append(Verdict(key, "not comparable", "fingerprint changed: " + ", ".join(
                f"{k} {was.get(k)!r} -> {now.get(k)!r}" for k in changed)))
            continue
        v, notes = Verdict(key, "unchanged"), []
        v.metrics, unjudged = judged(b, c, estimator, threshold)
        noisy, beside = noise(b, c, v.metrics["step_time"], threshold)
        # peak memory does not grow with a neighbour's CPU load: its verdict stands either way
        decisive = [m for name, m in v.metrics.items() if m.significant and not (noisy and name in LOADED_METRICS)]
        if any(m.change > 0 for m in decisive):
            v.status = "regressed"
        elif decisive:
            v.status = "improved"
        elif noisy:
            v.status = "noisy"
        if noisy or beside:
            notes.append(noisy or beside)
        if b.per_epoch or c.per_epoch:
            notes.append("one repeat: epochs used as samples (correlated)")
        if not testable(b, c):
            notes.append(f"{len(b.step_s)} and {len(c.step_s)} samples: too few for the test to find a change "
                         f"(its smallest p is {2 / math.comb(len(b.step_s) + len(c.step_s), len(b.step_s)):.3f})")
            v.status = "too few repeats"     # ties can push the test's approximate p below alpha even so
        v.reason = "; ".join(notes + unjudged)
        loaded = any((side_load(m, min) or 0.0) > LOADED for m in (b, c))
        ins = judge_instructions(b, c, instruction_threshold)
        out.append(by_instructions(v, ins, testable(b, c)) if by == "instructions" else with_instructions(v, ins, loaded))
    return out


def by_instructions(v: Verdict, ins: Instructions | None, fair: bool) -> Verdict:
    """A key under --judge-by instructions, for a CI runner shared with work the gate cannot see:
    judged by what that work cannot move, its instructions per step (one count a side) and its
    peak memory (where the test could tell), so the same code passes and more work fails however
    busy the runner was. Its time and energy are shown, and a change of them named, never judged.
    A key without counts of one build a side cannot be judged so: not comparable (exit 3)."""
    v.instructions = ins
    if ins is None or ins.change is None:
        v.status = "not comparable"
        v.reason = ((ins.reason if ins else "instructions not counted on either side")
                    + " (--judge-by instructions judges a key by its count: `zobench run --instructions`)")
        return v
    memory = [m for name, m in v.metrics.items() if name not in LOADED_METRICS and m.significant and fair]
    v.status = ("regressed" if ins.status == "regressed" or any(m.change > 0 for m in memory) else
                "improved" if ins.status == "improved" or memory else "unchanged")
    moved = [f"{name} {100 * m.change:+.0f}% (p={m.p_value:.3f})" for name, m in v.metrics.items()
             if name in LOADED_METRICS and m.significant]
    notes = [f"judged by instructions: {ins.status} ({100 * ins.change:+.2f}%, counted on {ins.build})"]
    if moved:
        notes.append(f"{', '.join(moved)}: shown, not judged (--judge-by instructions)")
    v.reason = "; ".join(notes + [v.reason] * bool(v.reason))
    return v


def repeats_to_judge(baseline: int) -> int:
    """How many repeats a current side needs beside a baseline's for the test to be able to find a
    change at all (testable), and at least the baseline's own: compare --rerun's first target."""
    n = 1
    while 2 / math.comb(baseline + n, baseline) >= ALPHA:
        n += 1
    return max(n, baseline)


def testable(b: Measurement, c: Measurement) -> bool:
    """Whether the test could find a change at all between the two sides' step-time samples: the
    smallest two-sided p of the Mann-Whitney U test, every sample of one side below every one of
    the other, is 2 / C(nb + nc, nb); at or above alpha no change can count (1 and 5 repeats,
    2 and 2, 3 and 3), and "unchanged" would pass a doubling (issue 60)."""
    nb, nc = len(b.step_s), len(c.step_s)
    return nb > 0 and nc > 0 and 2 / math.comb(nb + nc, nb) < ALPHA


def counts(verdicts: list[Verdict]) -> dict[str, int]:
    return {s: sum(v.status == s for v in verdicts) for s in STATUSES}


def summary(verdicts: list[Verdict]) -> str:
    return ", ".join(f"{n} {label(s)}" for s, n in counts(verdicts).items() if n)


def label(status: str) -> str:
    """A status as every format shows it: a key the test could not tell says so first."""
    return f"not judged ({status})" if status in UNJUDGED else status


def why_unjudged(verdicts: list[Verdict]) -> str:
    """How many keys were not judged and why, by reason: "2 noisy: other work kept the machine
    busy while they ran; 1 too few repeats; 1 not comparable"."""
    n = counts(verdicts)
    parts = []
    for status in (*UNJUDGED, "not comparable"):
        if not n[status]:
            continue
        reasons = [v.reason for v in verdicts if v.status == status]
        why = ""
        if status == "noisy":
            why = " or ".join(w for w, seen in (("other work kept the machine busy", "beside other work"),
                                                ("the board throttled", "ran throttled"))
                              if any(seen in r for r in reasons))
            why = f": {why} while they ran" if why else ""
        elif status == "too few repeats":
            why = (" (the test cannot find a change in so few: more repeats (a suite's `repeats`) "
                   "or more runs joined by commas)")
        elif status == "not comparable":
            why = " or ".join(w for w, seen in (("the machine or build changed", ("fingerprint", "disagree")),
                                                ("no instructions counted to judge by", ("--judge-by",)))
                              if any(s in r for r in reasons for s in seen))
            why = f" ({why})" if why else ""
        parts.append(f"{n[status]} {status}{why}")
    counted = [v.instructions.status for v in verdicts if v.status in UNJUDGED and v.instructions
               and v.instructions.change is not None]
    if counted:     # their time is not judged; their instructions were, and did not regress
        parts.append(f"instructions per step judged on {len(counted)} of them: "
                     + ", ".join(f"{counted.count(s)} {s}" for s in ("unchanged", "improved") if s in counted))
    return "; ".join(parts)


def gate(verdicts: list[Verdict], fail_on_change: bool = False, allow_unjudged: bool = False) -> tuple[int, str]:
    """The gate's exit code and its one-line verdict (the markdown summary's first line, stderr's
    line): 0 only when every key on both sides was judged and none regressed."""
    n = counts(verdicts)
    scope = len(verdicts) - sum(n[s] for s in OUT_OF_SCOPE)
    unjudged = sum(n[s] for s in (*UNJUDGED, "not comparable"))
    judged_n = sum(n[s] for s in COMPARED)
    if n["regressed"]:
        line = f"compare: fail: {n['regressed']} of {scope} job keys regressed"
        return EXIT_REGRESSED, line + (f" ({unjudged} not judged: {why_unjudged(verdicts)})" if unjudged else "")
    if fail_on_change and n["improved"]:
        return EXIT_REGRESSED, (f"compare: fail: {n['improved']} of {scope} job keys improved "
                                "(--fail-on-change): time to update the baseline")
    if not judged_n:
        why = [w for w in (why_unjudged(verdicts), n["missing"] and f"{n['missing']} missing") if w]
        return EXIT_NOT_JUDGED, f"compare: not judged: no job key was judged ({'; '.join(why)}); a gate that judged nothing does not pass"
    if unjudged and not (allow_unjudged and not n["not comparable"]):
        return EXIT_NOT_JUDGED, (f"compare: not judged: {unjudged} of {scope} job keys could not be judged "
                                 f"({why_unjudged(verdicts)}); none of the {judged_n} judged regressed")
    if unjudged:
        return 0, (f"compare: pass (--allow-unjudged): none of the {judged_n} judged job keys regressed; "
                   f"{unjudged} of {scope} not judged ({why_unjudged(verdicts)})")
    return 0, f"compare: pass: all {judged_n} job keys judged, none regressed"


def exit_code(verdicts: list[Verdict], fail_on_change: bool, allow_unjudged: bool = False) -> tuple[int, str]:
    """The gate's exit code, and the one line that says why when it is not a plain pass (stderr)."""
    code, line = gate(verdicts, fail_on_change, allow_unjudged)
    return code, (line if code or "not judged" in line else "")


def cells(v: Verdict, shown: list[Metric]) -> list[str]:
    """A verdict's cell per shown metric: both estimates, the change and p (the table and the
    dashboard's compare view)."""
    cells = []
    for metric in shown:
        m = v.metrics.get(metric.name)
        unit = f"{metric.unit} {m.measures}".rstrip() if m else ""
        cells.append(f"{m.baseline:.3f} -> {m.current:.3f} {unit} ({100 * m.change:+.1f}%, p={m.p_value:.3f})"
                     if m else "")
    return cells


def instruction_cell(ins: Instructions | None) -> str:
    """A key's instructions per step as the tables show them: both counts, the change and the
    build counted; "not judged" where they could not be."""
    if ins is None:
        return ""
    if ins.change is None:
        return "not judged"
    return f"{ins.baseline / 1e6:.3f}M -> {ins.current / 1e6:.3f}M /step ({100 * ins.change:+.2f}%, {ins.build})"


def title_of(verdicts: list[Verdict], base_name: str, cur_name: str, threshold: float, estimator: str,
             instruction_threshold: float = INSTRUCTION_THRESHOLD, by: str = "time") -> str:
    counted = any(v.instructions for v in verdicts)
    if by == "instructions":
        return (f"zobench compare {base_name} -> {cur_name}: {summary(verdicts)} (judged by instructions per "
                f"step, {100 * instruction_threshold:g}%, one count a side, and peak memory, Mann-Whitney U, "
                f"alpha {ALPHA}, threshold {100 * threshold:g}%; time shown, not judged)")
    return (f"zobench compare {base_name} -> {cur_name}: {summary(verdicts)} "
            f"(Mann-Whitney U, alpha {ALPHA}, threshold {100 * threshold:g}% between the "
            f"{' and the '.join(f'{e}s' for e in ESTIMATORS[estimator])}"
            + (f"; instructions per step: {100 * instruction_threshold:g}%, one count a side" if counted else "") + ")")


def render(verdicts: list[Verdict], fmt: str, base_name: str, cur_name: str, threshold: float,
           estimator: str, fail_on_change: bool = False, allow_unjudged: bool = False,
           instruction_threshold: float = INSTRUCTION_THRESHOLD, by: str = "time") -> str:
    code, line = gate(verdicts, fail_on_change, allow_unjudged)
    if fmt == "json":
        return jsonfile.dumps({"baseline": base_name, "current": cur_name, "threshold": threshold, "alpha": ALPHA,
                               "instruction_threshold": instruction_threshold, "judged_by": by,
                               "estimator": estimator, "exit_code": code, "gate": line,
                               "summary": counts(verdicts),
                               "verdicts": [{**asdict(v), "judged": v.status in COMPARED} for v in verdicts]})
    shown = [m for m in METRICS if any(m.name in v.metrics for v in verdicts)]     # energy: where a meter was
    counted = any(v.instructions for v in verdicts)
    head = ["job key", "status", *(m.title for m in shown), *["instructions"] * counted, "note"]
    rows = [[v.key, label(v.status), *cells(v, shown), *[instruction_cell(v.instructions)] * counted, v.reason]
            for v in verdicts]
    title = title_of(verdicts, base_name, cur_name, threshold, estimator, instruction_threshold, by)
    if fmt == "markdown":
        icon = {"regressed": "🔴", "improved": "🟢", "noisy": "🟡", "too few repeats": "🟡",
                "not comparable": "⚪", "missing": "⚪"}
        mark = {0: "✅", EXIT_REGRESSED: "❌", EXIT_NOT_JUDGED: "⚠️"}[code]
        lines = [f"**{mark} {line.removeprefix('compare: ')} (exit {code})**", "", f"### {title}", "",
                 "| " + " | ".join(head) + " |", "|" + "---|" * len(head)]
        lines += ["| " + " | ".join([f"`{r[0]}`", f"{icon.get(v.status, '')} {r[1]}".lstrip(), *r[2:]]) + " |"
                  for r, v in zip(rows, verdicts)]
        return "\n".join(lines)
    widths = [max(len(str(x)) for x in col) for col in zip(head, *rows)]
    fmt_row = lambda r: "  ".join(str(x).ljust(w) for x, w in zip(r, widths)).rstrip()  # noqa: E731
    return "\n".join([title, fmt_row(head), *map(fmt_row, rows)])
