"""The ElasticZO paper's Fig. 7 beside zobench's: each ZO configuration's training step, phase
by phase, as shares of its time, and INT8's speed-up over FP32.

Fig. 7 is the paper's C++ code on a Raspberry Pi Zero 2 (LeNet-5, MNIST, 100 epochs); its text
gives ranges over the configurations: the forward passes 84.3-84.8% of an FP32 step and
94.8-97.1% of an INT8 one, the backward 0.76% and 2.5%, ZO perturb + update 11.8-13.1% and
1.0-1.2%, INT8 1.38-1.42x faster (a time per epoch). zobench's are measured here: the native C++
build, one thread, LeNet-5 on Fashion-MNIST (MNIST's shapes) at each precision's batch as
paper-mnist trains it, and INT8 at FP32's batch too (runtimes.paper_batches), the runs taking
turns --repeats times after a round that warms up, medians. The phases are grouped as Alg. 1's
lines: forward = forward + loss (lines 6, 8), backward = backward + bp_update (line 12), ZO =
zo_perturb + zo_update (lines 5, 7, 10-11), other = data. INT8's speed-up is per sample, so per
epoch, as Fig. 7's. With --a53, the Cortex-A53 estimate (benchmarks/a53_estimate.py, minutes a
run) adds its ZO loops' share of the modelled cycles and INT8's speed-up: the model times
functions, not phases, so it gives no other share.

--json FILE writes the record; --show FILE prints the table from a record, running nothing:
docs/cpus.md's table is the record docs/fig7.json shown (tests/test_fig7.py checks that).
"""
from __future__ import annotations

import argparse
import json
import statistics
import sys
import tempfile
from datetime import date
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))

from benchmarks import record as records  # noqa: E402
from workloads import envinfo  # noqa: E402
from workloads.vocab import PAPER_CONFIGS, PAPER_NAMES, TRAIN_PHASES  # noqa: E402

# Alg. 1's lines, the groups Fig. 7 draws: every training phase in one of them
GROUPS = {"forward": ("forward", "loss"), "backward": ("backward", "bp_update"),
          "ZO perturb + update": ("zo_perturb", "zo_update"), "other": ("data",)}
# the paper's text on Fig. 7: (low, high) % of a step per precision, and INT8's speed-up
FIG7 = {"fp32": {"forward": (84.3, 84.8), "backward": (0.76, 0.76), "ZO perturb + update": (11.8, 13.1)},
        "int8": {"forward": (94.8, 97.1), "backward": (2.5, 2.5), "ZO perturb + update": (1.0, 1.2)}}
FIG7_SPEEDUP = (1.38, 1.42)
CONFIGS = tuple((m, k) for m, k in PAPER_CONFIGS if m != "full-bp")    # Fig. 7's: the ZO methods
PRECISIONS = ("fp32", "int8")


def config_name(method: str, k: int) -> str:
    return f"ElasticZO {PAPER_NAMES[k]}" if method == "elastic-zo" else "Full ZO"


def shares(result: dict) -> dict[str, float]:
    """A result's training time by group, as % of the step's training time."""
    total = sum(result["phases"][p]["seconds"] for p in TRAIN_PHASES)
    return {g: 100 * sum(result["phases"][p]["seconds"] for p in phases) / total for g, phases in GROUPS.items()}


def measure(repeats: int, steps: int, a53: bool) -> dict:
    from benchmarks.a53_estimate import estimate_config
    from benchmarks.runtimes import bench_spec, ms_per_step, paper_batches
    from harness.preparation.artifacts import raw_idx
    from testkit.binaries import aarch64_binary, native_binary
    from testkit.runners import run_runner
    binary, data = native_binary(), str(raw_idx("fashion-mnist", "").dir)
    batches = paper_batches()
    runs = [(method, k, p, b) for method, k in CONFIGS for p in PRECISIONS for b in batches[p]]
    least, samples = min(b for *_, b in runs), {}
    with tempfile.TemporaryDirectory() as d:
        for r in range(repeats + 1):
            for method, k, p, b in runs:
                # as many samples at every batch
                spec = bench_spec(method, k, b, max(1, steps * least // b), data, threads=1, precision=p)
                res = run_runner(spec, Path(d), [binary], check=True)
                if r:
                    samples.setdefault((method, k, p, b), []).append({"shares": shares(res), "ms_step": ms_per_step(res)})
        here = [{"config": config_name(method, k), "precision": p, "batch": b,
                 "shares": {g: statistics.median(x["shares"][g] for x in xs) for g in GROUPS},
                 "ms_step": statistics.median(x["ms_step"] for x in xs)}
                for (method, k, p, b), xs in samples.items()]
        model = None
        if a53:
            arm, cache, model = aarch64_binary("cortex-a53"), {}, []
            for method, k, p, b in runs:
                e = estimate_config(arm, method, k, p, b, 2, data, Path(d), cache)
                model.append({"config": config_name(method, k), "precision": p, "batch": b,
                              "zo_share": 100 * e["zo_cycles"] / e["cycles"], "mcycles_step": e["cycles"] / 1e6})
    return {"version": 2, "commit": records.commit(), "date": date.today().isoformat(),
            "machine": envinfo.cpu_model(Path("/proc/cpuinfo").read_text()),
            "repeats": repeats, "steps": steps, "here": here, "a53": model}


def upgrade(record: dict) -> dict:
    """A version-1 record (every run at batch 32, keyed by configuration and precision) as version 2's
    rows, so the records made before INT8 was timed at its own batch still show."""
    if record.get("version") != 1:
        return record
    def rows(by: dict) -> list[dict]:
        return [{"config": c, "precision": p, "batch": 32, **v} for c, ps in by.items() for p, v in ps.items()]
    return {**record, "version": 2, "here": rows(record["here"]), "a53": record["a53"] and rows(record["a53"])}


def span(lo: float, hi: float) -> str:
    return f"{lo:g}" if lo == hi else f"{lo:g}-{hi:g}"


def table(record: dict) -> str:
    """Fig. 7's ranges beside the record's shares, per precision, one row per source, batch and
    configuration."""
    record, groups = upgrade(record), list(GROUPS)
    rows = ["| precision | where | batch | configuration | " + " | ".join(f"{g}, %" for g in groups) +
            " | INT8 × per epoch |", "|---" * (len(groups) + 5) + "|"]
    here, model = record["here"], record["a53"] or []
    for p in PRECISIONS:
        rows.append(f"| {p} | Fig. 7, Pi Zero 2 | not given | ElasticZO | " +
                    " | ".join(span(*FIG7[p][g]) if g in FIG7[p] else "" for g in groups) +
                    f" | {span(*FIG7_SPEEDUP) if p == 'int8' else ''} |")
        for r in (r for r in here if r["precision"] == p):
            rows.append(f"| {p} | here | {r['batch']} | {r['config']} | " +
                        " | ".join(f"{r['shares'][g]:.1f}" for g in groups) + f" | {records.speedup(r, here, 'ms_step', 'config')} |")
        for r in (r for r in model if r["precision"] == p):
            rows.append(f"| {p} | A53 model | {r['batch']} | {r['config']} | " +
                        " | ".join(f"{r['zo_share']:.1f}" if g == "ZO perturb + update" else "" for g in groups) +
                        f" | {records.speedup(r, model, 'mcycles_step', 'config')} |")
    return "\n".join(rows)


def read(path: Path) -> dict:
    """The record at path, checked by showing it (benchmarks/record.py), as version 2."""
    return upgrade(records.read(path, table, "fig7.py"))


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--repeats", type=int, default=5)
    ap.add_argument("--steps", type=int, default=200, help="steps at the smallest batch (a larger one: as many samples)")
    ap.add_argument("--a53", action="store_true", help="add the Cortex-A53 estimate's (minutes a configuration)")
    ap.add_argument("--json", type=Path, help="write the record here too")
    ap.add_argument("--show", type=Path, help="print the table of this record, running nothing")
    a = ap.parse_args()
    if a.show:
        return records.show(a.show, table, "fig7.py")
    if a.repeats < 1 or a.steps < 1:
        ap.error("--repeats and --steps: at least 1")
    record = measure(a.repeats, a.steps, a.a53)
    print(table(record))
    if a.json:
        a.json.write_text(json.dumps(record, indent=1) + "\n")
    return 0


if __name__ == "__main__":
    sys.exit(main())
