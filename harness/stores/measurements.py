"""Results grouped into measurements: one per job key, with its samples and fingerprint.

`compare` and `export` both read runs through this module, and `compare` reads an exported
file back through it as well. A key is everything that sets the work a job does: workload,
method, precision, runtime, target, thread count and the hyperparameters that differ from
their defaults (so a batch-size change is a new key, never a "regression"); only the
test-only knobs that make a job slower or fail on purpose stay out of it. Its samples are, per
repeat, the per-step time, the peak RSS, the GPU's peak allocation (a cuda job) and the energy
per step (where a meter measured it), with the machine's load during each repeat. A single
repeat falls back to its per-epoch step times (and per-epoch energy): they are correlated, so a
comparison says when it used them.
"""
from __future__ import annotations

import dataclasses
import json
import math
from dataclasses import dataclass, field
from pathlib import Path

from workloads import datasets, gpuinfo, vocab
from workloads.spec import Hyper

from harness.errors import UserError
from harness.stores import machine_load
from harness.stores.schema import full_job, joules_per_step, step_seconds
from harness.stores.store import Store

FINGERPRINT = ("cpu_model", "cores", "governor", "kernel", "versions", "gpu", "build_cpu", "kernels",
               "omp_wait_policy", "lock")
# Facts a result has only since zobench recorded them (the CPU the C++ binary was built for, the
# kernel path each layer kind ran, OpenMP's wait policy, the lock its Python's packages came from):
# a side without one does not know it, which is no change.
RECORDED_LATER = ("build_cpu", "kernels", "omp_wait_policy", "lock")
# Facts added after the shared store's fingerprint ids were first hashed (pgstore.fingerprint_id):
# left out where a result lacks them, so an older result keeps the id it was pushed under.
ONLY_WHEN_KNOWN = ("omp_wait_policy", "lock")


def differs(fact: str, a, b) -> bool:
    """Whether two results' values of a fact differ; one that older results lack
    (RECORDED_LATER) missing on either side does not."""
    return a != b and not (fact in RECORDED_LATER and None in (a, b))
# What pooled repeats must share besides the fingerprint: the same build of the same code.
BUILD = ("binary_sha256", "harness_commit")
# inject_slowdown, inject_work and fault exist so that a test can run the same job slower or
# failing; a key that split on them could never show the regression they inject. trace_steps
# stays in: the trace is work inside the timed steps.
KEY_IGNORES = ("inject_slowdown", "inject_work", "fault")
HYPER_DEFAULTS = dataclasses.asdict(Hyper())


def test_only(hyper: dict) -> list[str]:
    """The test-only settings (KEY_IGNORES) a job's hyperparameters set away from their defaults:
    such a run fakes its numbers (a slowdown, a fault), so the store marks it and never pools it
    into a baseline or a history series, though its key is the real job's (issue 60)."""
    return [k for k in KEY_IGNORES if hyper.get(k, HYPER_DEFAULTS[k]) not in (HYPER_DEFAULTS[k], None)]


@dataclass
class Measurement:
    key: str
    facts: dict                                   # workload, method, precision, runtime, target, threads, hyper
    step_s: list = field(default_factory=list)    # seconds per step, one per repeat (or per epoch)
    peak_rss: list = field(default_factory=list)  # bytes, one per repeat
    per_epoch: bool = False                       # step_s holds one repeat's epochs
    fingerprint: dict = field(default_factory=dict)
    binary_sha256: str | None = None
    harness_commit: str = ""
    load: list = field(default_factory=list)      # each repeat's machine_load.of_steps (None where unknown)
    disagreement: str = ""                        # how its repeats' fingerprints differ ("" = they agree)
    device_peak: list = field(default_factory=list)      # bytes torch allocated at most, per cuda repeat
    joules_per_step: list = field(default_factory=list)  # J, per repeat (or epoch) a meter measured
    validity: list = field(default_factory=list)  # each repeat's result["validity"] (None where not judged)
    adaptive: list = field(default_factory=list)  # per repeat: its threads worked as the load left cores (adaptive_team)
    wall_s: list = field(default_factory=list)    # per repeat: its job's seconds in all (compare --rerun's estimate)
    instructions: list = field(default_factory=list)  # per repeat counted: instructions per step (instructions.py)
    instruction_builds: list = field(default_factory=list)  # the build each of those counted
    uncounted: str = ""                           # why a repeat asked for a count got none (its `why`)

    @property
    def repeats(self) -> int:
        return len(self.peak_rss) or len(self.step_s)


def changed_hyper(hyper: dict, device: str = "cpu") -> list[tuple[str, object]]:
    """The hyperparameters that differ from their defaults, in workloads.spec.Hyper's field
    order. The spec resolves the warm-up to its device's default, which is a default still: a
    result from before there was a warm-up (none in its hyper) keeps the key it had."""
    defaults = {**HYPER_DEFAULTS, "warmup_steps": vocab.WARMUP_STEPS[device]}
    order = {k: i for i, k in enumerate(HYPER_DEFAULTS)}
    return [(k, v) for k, v in sorted(hyper.items(), key=lambda kv: (order.get(kv[0], len(order)), kv[0]))
            if k not in KEY_IGNORES and (k not in defaults or v != defaults[k])]


def hyper_key(hyper: dict, device: str = "cpu") -> str:
    return " ".join(f"{k}={v}" for k, v in changed_hyper(hyper, device))


def shown_value(v) -> str:
    """A hyperparameter as people read it (and TOML reads back): a rate to 3 significant digits;
    a key keeps every digit (hyper_key)."""
    return f"{v:.3g}" if isinstance(v, float) else str(v)


def shown_hyper(items) -> str:
    """(name, value) pairs as people read them: "lr_zo=0.000316 zo_scale=8"."""
    return " ".join(f"{k}={shown_value(v)}" for k, v in items)


def job_key(job: dict) -> tuple[str, dict]:
    """The key a job's results are pooled and compared under, and its facts; a spec that lacks
    fields (one written before they existed) has their defaults (schema.full_job)."""
    job = full_job(job)
    w = job["workload"]
    precision = vocab.precision_key(job["precision"], job["zo_loss"], job["method"])
    # the data set as the job read it: a rotated copy, a subset or a validation split is other data
    data = datasets.data_name(w["dataset"], w["rotate"], w["validation"], w["subset"])
    facts = {"workload": f"{w['model']}/{data}", "method": vocab.method_key(job["method"], job["bp_layers"]),
             "precision": precision, "runtime": job["runtime"], "target": job["target"], "threads": job["threads"],
             "hyper": hyper_key(job["hyper"], job["device"])}
    words = [*list(facts.values())[:5], f"threads={facts['threads'] or 'auto'}", facts["hyper"]]
    return " ".join(w for w in words if w), facts


def adaptive_team(env: dict) -> bool:
    """Whether a result's threads worked on as many cores as the load left it (the C++ binary's
    team under auto: env.threads.working), so that beside other work it slows as one thread
    does, not as a team that waits for its descheduled members (docs/threads.md, docs/compare.md)."""
    threads = env.get("threads")
    return isinstance(threads, dict) and threads.get("wait") == "auto" and "working" in threads


def fingerprint(env: dict) -> dict:
    """What must be the same for two results to be compared: the machine, its GPU's identity
    for a GPU job (not its clocks of the moment), and for the C++ binary the CPU it was built
    for and the kernels it ran."""
    facts = {k: env.get(k) for k in FINGERPRINT if k not in ONLY_WHEN_KNOWN or env.get(k) is not None}
    return {**facts, "gpu": gpuinfo.fingerprint(env.get("gpu"))}


def from_results(results: list[tuple[str, dict]], across_builds: bool = False) -> dict[str, Measurement]:
    """The ok results, each with the run id it came from, grouped by job key. Repeats of one key
    must share a fingerprint and, unless across_builds (a baseline pooled from a branch's last
    runs, one commit each: harness/stores/pgstore.py), a build."""
    out: dict[str, Measurement] = {}
    epochs: dict[str, list] = {}
    first: dict[str, tuple[str, dict]] = {}       # key -> (run id/job id, identity) of its first repeat
    for run_id, r in results:
        if r.get("status") != "ok" or step_seconds(r) is None:
            continue
        key, facts = job_key(r["job"])
        env = r.get("env") or {}
        fp = fingerprint(env)
        identity = {**fp, **({} if across_builds else {k: env.get(k) for k in BUILD})}
        m = out.setdefault(key, Measurement(key, facts, fingerprint=fp,
                                            binary_sha256=env.get("binary_sha256"),
                                            harness_commit=env.get("harness_commit", "")))
        where = f"{run_id}/{r['job'].get('job_id')}"
        where0, id0 = first.setdefault(key, (where, identity))
        if not m.disagreement:      # pooled runs, or a run resumed after an upgrade
            m.disagreement = "; ".join(f"{k} {id0.get(k)!r} ({where0}) vs {identity.get(k)!r} ({where})"
                                       for k in {**id0, **identity} if differs(k, id0.get(k), identity.get(k)))
        memory = r.get("memory") or {}
        m.step_s.append(step_seconds(r))
        m.peak_rss.append(memory.get("peak_rss_bytes") or 0)
        for samples, x in ((m.device_peak, memory.get("device_peak_bytes")), (m.joules_per_step, joules_per_step(r))):
            if x is not None:       # no GPU, no meter, or a result from before either was measured
                samples.append(x)
        m.load.append(machine_load.of_steps(r))
        m.validity.append(r.get("validity") if isinstance(r.get("validity"), dict) else None)
        m.adaptive.append(adaptive_team(env))
        m.wall_s.append(r.get("wall_seconds") or 0.0)
        counted = r.get("instructions")
        if isinstance(counted, dict) and counted.get("per_step"):
            m.instructions.append(counted["per_step"])
            m.instruction_builds.append(counted.get("build"))
        elif isinstance(counted, dict) and counted.get("why"):
            m.uncounted = m.uncounted or counted["why"]
        epochs[key] = [(e["seconds"], e.get("joules"), r["steps"] / len(r["epochs"])) for e in r.get("epochs") or []]
    for key, m in out.items():
        if len(m.step_s) == 1 and len(epochs[key]) > 1:
            m.step_s = [seconds / steps for seconds, _, steps in epochs[key]]
            m.per_epoch = True
            if m.joules_per_step and all(joules is not None for _, joules, _ in epochs[key]):
                m.joules_per_step = [joules / steps for _, joules, steps in epochs[key]]
    return out


def load(source: str, results_dir: Path) -> tuple[str, dict[str, Measurement]]:
    """A run id of the store, several joined by commas (their repeats pooled: runs taken
    in turn with the other side's cancel a slow drift of the machine), or a file written by
    `zobench export --format pytest-benchmark`."""
    path = Path(source)
    if path.suffix == ".json" and path.is_file():
        return str(path), read_export(path)
    store, results = Store(results_dir), []
    for run_id in source.split(","):
        try:
            results += [(run_id, r) for r in store.results(run_id)]
        except UserError as e:      # the store's unknown-run error, which lists the runs there
            raise UserError(f"{run_id!r} is neither a run id nor an exported .json file: {e}") from None
    return source, from_results(results)


class BadSamples(ValueError):
    """An exported benchmark's samples are not numbers compare can use; the message says which."""


def number(x, where: str, *, positive: bool) -> float:
    """x as a finite number >= 0 (> 0 where positive)."""
    if isinstance(x, bool) or not isinstance(x, (int, float)):
        raise BadSamples(f"{where}: {json.dumps(x)[:60]} is not a number")
    if not math.isfinite(x):
        raise BadSamples(f"{where}: {x} is not finite")
    if x < 0 or (positive and x == 0):
        raise BadSamples(f"{where}: {x} is not {'> 0' if positive else '>= 0'}")
    return float(x)


def numbers(value, where: str, *, positive: bool) -> list[float]:
    """value as a non-empty list of number()s."""
    if not isinstance(value, list) or not value:
        raise BadSamples(f"{where}: expected a non-empty list of numbers, got {json.dumps(value)[:60]}")
    return [number(x, f"{where}[{i}]", positive=positive) for i, x in enumerate(value)]


def read_export(path: Path) -> dict[str, Measurement]:
    """The measurements of a `zobench export --format pytest-benchmark` file; a file that is
    not one, or whose samples compare cannot use, is a one-line UserError naming what is wrong."""
    try:
        text = path.read_bytes().decode("utf-8")
    except UnicodeDecodeError as e:
        raise UserError(f"{path}: not UTF-8 text (byte {e.object[e.start]:#04x} at offset {e.start}); "
                        "expected the JSON of `zobench export --format pytest-benchmark`") from None
    out: dict[str, Measurement] = {}
    try:
        for i, b in enumerate(json.loads(text)["benchmarks"]):
            m = from_benchmark(b)
            if m.key in out:
                raise BadSamples(f"key {m.key!r} appears twice")
            out[m.key] = m
    except BadSamples as e:
        raise UserError(f"{path}: benchmarks[{i}]: {e}") from None
    except RecursionError:      # nested deeper than the JSON decoder goes: no export is
        raise UserError(f"{path}: not a zobench pytest-benchmark export (nested too deeply to read)") from None
    except (json.JSONDecodeError, KeyError, TypeError, AttributeError) as e:
        raise UserError(f"{path}: not a zobench pytest-benchmark export ({type(e).__name__}: {e})") from None
    return out


def from_benchmark(b: dict) -> Measurement:
    z = b["extra_info"]["zobench"]
    where = f"({z['key']}) "
    load = z.get("load") or []
    if not isinstance(load, list) or not all(x is None or isinstance(x, dict) for x in load):
        raise BadSamples(f"{where}extra_info.zobench.load: expected a list of load records or nulls")
    for j, rec in enumerate(load):
        for k, v in (rec or {}).items():
            if v is not None:
                number(v, f"{where}extra_info.zobench.load[{j}].{k}", positive=False)
    checked = z.get("validity") or []
    if not isinstance(checked, list) or not all(x is None or (isinstance(x, dict) and isinstance(x.get("flags", []), list))
                                                for x in checked):
        raise BadSamples(f"{where}extra_info.zobench.validity: expected a list of validity records or nulls")
    for name in ("facts", "fingerprint"):      # tables compare reads by key: another type is no export
        if not isinstance(z[name], dict):
            raise BadSamples(f"{where}extra_info.zobench.{name}: expected a table, got {json.dumps(z[name])[:60]}")
    # an export from before zobench measured a GPU's memory or energy has neither: unknown
    optional = {attr: numbers(z[name], f"{where}extra_info.zobench.{name}", positive=attr == "instructions")
                if z.get(name) not in (None, []) else []
                for attr, name in (("device_peak", "device_peak_bytes"), ("joules_per_step", "joules_per_step"),
                                   ("instructions", "instructions"))}
    builds = z.get("instruction_builds") or []
    if not isinstance(builds, list) or not all(isinstance(x, str) for x in builds) or \
            len(builds) != len(optional["instructions"]):
        raise BadSamples(f"{where}extra_info.zobench.instruction_builds: expected a build name per instruction count")
    optional["instruction_builds"] = builds
    return Measurement(z["key"], z["facts"], numbers(b["stats"]["data"], f"{where}stats.data", positive=True),
                       numbers(z["peak_rss_bytes"], f"{where}extra_info.zobench.peak_rss_bytes", positive=False),
                       z["per_epoch"], z["fingerprint"], z["binary_sha256"], z["harness_commit"], load, **optional,
                       validity=checked, adaptive=[x is True for x in z.get("adaptive") or []])
