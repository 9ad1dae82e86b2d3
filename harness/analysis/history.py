"""`zobench history`: per job key and target fingerprint, step time, peak memory, energy,
instructions per step and final accuracy against commit order, from the shared store, with the commits where a change is
detected (docs/store.md).

Change points use the rule the regression gate already applies (harness/analysis/compare.py), along the
series: at each commit boundary, the samples of up to WINDOW commits before it against those of
up to WINDOW commits from it on; a boundary is a change when the two-sided Mann-Whitney U test
is significant and the estimates (the minimum and the median by default, as the gate) both
differ by more than the threshold, the same way. Significant at the gate's alpha (0.05)
divided by the number of boundaries tested (Bonferroni): a series of n commits asks n - 1 questions where compare asks one (at 0.05 each,
same-code series showed false changes: docs/store.md). A step shows at its own boundary and,
weaker, at its neighbours (their windows
straddle it, and a min estimate does not see that, since one side keeps a sample of the old
level): of adjacent flagged boundaries the most significant (smallest p) is kept, the first on a tie. Why not a library's
detector (ruptures' PELT, say): they assume a noise model (Gaussian, a penalty to tune) that a
shared machine's one-sided noise breaks, and a lab already trusts the gate's verdicts; here the
history finds exactly what compare would have flagged between those commits.

Instructions per step, where jobs counted them, are a count, the same for the same code: their
changes are found as the gate judges them (counted_changes), at each commit whose count moved
past the gate's instructions threshold from the last counted one, with no test.

A result that ran beside other work is left out of the change points' time and energy: when
other processes or steal took more than compare.LOADED of the CPU its job wanted
(results.starved, from its load record), none of its repeats measured the code alone; the point
counts it as loaded. Its memory and accuracy, which load does not move, stay. A result that ran
throttled (its validity flags, harness/stores/validity.py) is left out the same way, counted as flagged.

A series is one job key on one fingerprint: a fingerprint change (CPU, governor, kernel, runtime
versions, GPU and driver) starts a new series, listed with what changed, never joined.
"""
from __future__ import annotations

import statistics
from dataclasses import dataclass, field

from harness.analysis.compare import (ALPHA, ESTIMATOR, INSTRUCTION_THRESHOLD, LOADED, counted_change,
                                      mann_whitney_p, point_estimate, shift)
from harness.stores import machine_load
from harness.stores.metrics import BY_NAME, LOADED_METRICS, METRICS

WINDOW = 3


@dataclass
class Point:
    commit: str
    first_run: str                                 # its first run (when the commit entered the series)
    samples: dict = field(default_factory=dict)    # metric -> values, one per result
    accuracy: list = field(default_factory=list)   # final test accuracy per result
    results: int = 0
    loaded: int = 0        # of them, those whose time and energy other work moved: left out of both
    flagged: int = 0       # and those that ran throttled (validity flags): left out of both too
    shares: list = field(default_factory=list)     # each result's lost share where known (machine_load.flag)
    left_out: dict = field(default_factory=dict)   # metric -> the values of the loaded or throttled results


@dataclass
class Change:
    metric: str
    commit: str            # the first commit of the new level
    at: int                # its point's index in the series
    before: float          # estimates, in the metric's unit
    after: float
    change: float          # after / before - 1
    p_value: float | None  # None: a count's change (instructions), judged by its threshold, no test


@dataclass
class Series:
    key: str
    target: str
    fingerprint: str
    facts: dict
    points: list = field(default_factory=list)
    changes: list = field(default_factory=list)
    split_from: str = ""   # what differs from the previous series of the key (a fingerprint change)


def build(rows: list[tuple], facts: dict[str, dict]) -> list[Series]:
    """Series from the store's rows (job_key, target, fingerprint, git_commit, run_id, each of
    metrics.METRICS' columns, test_accuracy, starved, flags), in run order."""
    series: dict[tuple, Series] = {}
    for key, target, fp, commit, run_id, *values, acc, share, flags in rows:
        s = series.setdefault((key, fp), Series(key, target, fp, facts.get(fp, {})))
        commit = commit or run_id        # a run pushed without its commit stands for one
        if not s.points or s.points[-1].commit != commit:
            s.points.append(Point(commit, run_id))
        p = s.points[-1]
        loaded = share is not None and share > LOADED
        p.results += 1
        p.loaded += loaded
        p.flagged += bool(flags) and not loaded
        if share is not None:
            p.shares.append(share)
        for m, v in zip(METRICS, values):
            if v is not None:
                out = (loaded or flags) and m.name in LOADED_METRICS
                (p.left_out if out else p.samples).setdefault(m.name, []).append(v)
        if acc is not None:
            p.accuracy.append(acc)
    out = list(series.values())
    last: dict[str, Series] = {}
    for s in out:      # in order of first appearance: what changed from the key's previous machine
        prev = last.get(s.key)
        if prev is not None:
            s.split_from = ", ".join(f"{k} {prev.facts.get(k)!r} -> {s.facts.get(k)!r}"
                                     for k in sorted(set(prev.facts) | set(s.facts))
                                     if prev.facts.get(k) != s.facts.get(k)) or "fingerprint"
        last[s.key] = s
    return out


def series(rows: list[tuple], facts: dict[str, dict], threshold: float, estimator: str = ESTIMATOR,
           track=lambda items: items) -> list[Series]:
    """build()'s series, each with its change points (detect()); track(series) may show the
    progress of a long search (zobench publish)."""
    found = build(rows, facts)
    for s in track(found):
        s.changes = detect(s, threshold, estimator)
    return found


def detect(s: Series, threshold: float, estimator: str = ESTIMATOR, window: int = WINDOW) -> list[Change]:
    """The series' change points, per metric, by the rule of the module docstring."""
    found = []
    alpha = ALPHA / max(1, len(s.points) - 1)
    for name, metric in BY_NAME.items():
        if metric.counted:
            found += counted_changes(s, name)
            continue
        flagged = []
        for i in range(1, len(s.points)):
            before = [v for p in s.points[max(0, i - window):i] for v in p.samples.get(name, [])]
            after = [v for p in s.points[i:i + window] for v in p.samples.get(name, [])]
            if not before or not after:
                continue
            b, a, change, _, beyond = shift(before, after, estimator, threshold)
            p = mann_whitney_p(before, after)
            if p < alpha and beyond:
                flagged.append((i, Change(name, s.points[i].commit, i, b, a, change, p)))
        run: list = []
        for i, c in flagged + [(None, None)]:      # of each run of adjacent boundaries, the most significant
            if run and (i is None or i != run[-1][0] + 1):
                found.append(min(run, key=lambda x: x[1].p_value)[1])
                run = []
            if i is not None:
                run.append((i, c))
    return found


def counted_changes(s: Series, name: str, threshold: float = INSTRUCTION_THRESHOLD) -> list[Change]:
    """A count's changes (instructions per step): deterministic, so a change is at each commit
    whose count differs from the last counted one's by more than the gate's instructions
    threshold, as compare judges them, with no test and no window."""
    found, last = [], None
    for i, p in enumerate(s.points):
        v = p.samples.get(name)
        if not v:
            continue
        now = statistics.median(v)
        if last is not None and (moved := counted_change(last, now, threshold))[0] != "unchanged":
            found.append(Change(name, p.commit, i, last, now, moved[1], None))
        last = now
    return found


def cell(p: Point, m, estimate) -> str:
    """A point's value of a metric with its range and, for one that load moves, the load flag of
    the busiest result it holds; where every result's was left out (loaded or throttled), their
    value marked so, never a blank: the reader sees what was measured and why it is not judged."""
    v, lost, scale = p.samples.get(m.name), p.left_out.get(m.name), m.scale
    if v:
        flag = machine_load.flag(max(p.shares)) if p.shares and m.name in LOADED_METRICS else ""
        return f"{estimate(v) * scale:.4g} ({min(v) * scale:.4g}-{max(v) * scale:.4g})" + (f" [{flag}]" if flag else "")
    if lost:
        why = machine_load.flag(max(p.shares)) if p.loaded and p.shares else "⚠ throttled"
        return f"{estimate(lost) * scale:.4g} [{why}: left out]"
    return "-"


def render(all_series: list[Series], fmt: str, estimator: str = ESTIMATOR) -> str:
    """Per series its points (commit, results, each metric's estimate and spread, accuracy) and
    its change points; Markdown for a CI job summary."""
    (shown_as, estimate), lines = point_estimate(estimator), []
    md = fmt == "markdown"
    for s in all_series:
        head = f"{s.key} on {s.target} (fingerprint {s.fingerprint[:12]})"
        lines += [f"### {head}" if md else head]
        if s.split_from:
            lines.append(f"new series: the fingerprint changed ({s.split_from})")
        shown = [m for m in METRICS if any(p.samples.get(m.name) or p.left_out.get(m.name) for p in s.points)]
        cols = ["commit", "n", *(f"{m.title} {m.unit} ({shown_as}, range)" for m in shown), "accuracy %"]
        rows = []
        for p in s.points:
            left_out = ", ".join(f"{n} {what}" for n, what in ((p.loaded, "loaded"), (p.flagged, "throttled")) if n)
            cells = [p.commit[:12], f"{p.results}" + (f" ({left_out})" if left_out else "")]
            for m in shown:
                cells.append(cell(p, m, estimate))
            cells.append(f"{100 * sum(p.accuracy) / len(p.accuracy):.1f}" if p.accuracy else "-")
            rows.append(cells)
        if md:
            lines += ["", "| " + " | ".join(cols) + " |", "|" + "---|" * len(cols),
                      *("| " + " | ".join(r) + " |" for r in rows), ""]
        else:
            widths = [max(len(x) for x in col) for col in zip(cols, *rows)]
            lines += ["  " + "  ".join(c.ljust(w) for c, w in zip(r, widths)) for r in [cols, *rows]]
        for c in s.changes:
            m = BY_NAME[c.metric]
            lines.append(f"{'- ' if md else '  '}change at {c.commit[:12]}: {m.title} {c.before * m.scale:.4g} -> "
                         f"{c.after * m.scale:.4g} {m.unit} ({c.change:+.1%}, "
                         + ("counted)" if c.p_value is None else f"p = {c.p_value:.3g})"))
        if not s.changes:
            lines.append(f"{'- ' if md else '  '}no change detected")
        lines.append("")
    return "\n".join(lines).rstrip() + "\n"
