"""The ElasticZO paper's Fig. 7 beside zobench's: each ZO configuration's training step, phase
by phase, as shares of its time, and INT8's speed-up over FP32.

Fig. 7 is the paper's C++ code on a Raspberry Pi Zero 2 (LeNet-5, MNIST, 100 epochs); its text
gives ranges over the configurations: the forward passes 84.3-84.8% of an FP32 step and
94.8-97.1% of an INT8 one, the backward 0.76% and 2.5%, ZO perturb + update 11.8-13.1% and
1.0-1.2%, INT8 1.38-1.42x faster. zobench's are measured here: the native C++ build, one
thread, LeNet-5 at batch 32 on Fashion-MNIST (MNIST's shapes), the configurations taking turns
--repeats times after a round that warms up, medians. The phases are grouped as Alg. 1's lines:
forward = forward + loss (lines 6, 8), backward = backward + bp_update (line 12), ZO = zo_perturb
+ zo_update (lines 5, 7, 10-11), other = data. With --a53, the Cortex-A53 estimate
(benchmarks/a53_estimate.py, minutes a configuration) adds its ZO loops' share of the modelled
cycles and INT8's speed-up: the model times functions, not phases, so it gives no other share.

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
    from benchmarks.runtimes import bench_spec, ms_per_step
    from harness.preparation.artifacts import raw_idx
    from testkit.binaries import aarch64_binary, native_binary
    from testkit.runners import run_runner
    binary, data = native_binary(), str(raw_idx("fashion-mnist", "").dir)
    runs: dict[str, dict[str, list[dict]]] = {}
    with tempfile.TemporaryDirectory() as d:
        for r in range(repeats + 1):
            for method, k in CONFIGS:
                for precision in PRECISIONS:
                    spec = bench_spec(method, k, 32, steps, data, threads=1, precision=precision)
                    res = run_runner(spec, Path(d), [binary], check=True)
                    if r:
                        runs.setdefault(config_name(method, k), {}).setdefault(precision, []).append(
                            {"shares": shares(res), "ms_step": ms_per_step(res)})
        here = {c: {p: {"shares": {g: statistics.median(x["shares"][g] for x in xs) for g in GROUPS},
                        "ms_step": statistics.median(x["ms_step"] for x in xs)} for p, xs in by.items()}
                for c, by in runs.items()}
        model = None
        if a53:
            arm, cache, model = aarch64_binary("cortex-a53"), {}, {}
            for method, k in CONFIGS:
                for precision in PRECISIONS:
                    e = estimate_config(arm, method, k, precision, 32, 2, data, Path(d), cache)
                    model.setdefault(config_name(method, k), {})[precision] = {
                        "zo_share": 100 * e["zo_cycles"] / e["cycles"], "mcycles_step": e["cycles"] / 1e6}
    return {"version": 1, "commit": records.commit(), "date": date.today().isoformat(), "machine": envinfo.cpu_model(Path("/proc/cpuinfo").read_text()),
            "repeats": repeats, "steps": steps, "here": here, "a53": model}


def span(lo: float, hi: float) -> str:
    return f"{lo:g}" if lo == hi else f"{lo:g}-{hi:g}"


def table(record: dict) -> str:
    """Fig. 7's ranges beside the record's shares, per precision, one row per source and configuration."""
    groups = list(GROUPS)
    rows = ["| precision | where | configuration | " + " | ".join(f"{g}, %" for g in groups) + " | INT8 × |",
            "|---" * (len(groups) + 4) + "|"]
    for p in PRECISIONS:
        rows.append(f"| {p} | Fig. 7, Pi Zero 2 | ElasticZO | " +
                    " | ".join(span(*FIG7[p][g]) if g in FIG7[p] else "" for g in groups) +
                    f" | {span(*FIG7_SPEEDUP) if p == 'int8' else ''} |")
        for c, by in record["here"].items():
            speedup = by["fp32"]["ms_step"] / by["int8"]["ms_step"]
            rows.append(f"| {p} | here | {c} | " + " | ".join(f"{by[p]['shares'][g]:.1f}" for g in groups) +
                        f" | {f'{speedup:.2f}' if p == 'int8' else ''} |")
        for c, by in (record["a53"] or {}).items():
            speedup = by["fp32"]["mcycles_step"] / by["int8"]["mcycles_step"]
            rows.append(f"| {p} | A53 model | {c} | " +
                        " | ".join(f"{by[p]['zo_share']:.1f}" if g == "ZO perturb + update" else "" for g in groups) +
                        f" | {f'{speedup:.2f}' if p == 'int8' else ''} |")
    return "\n".join(rows)


def read(path: Path) -> dict:
    """The record at path, checked by showing it (benchmarks/record.py)."""
    return records.read(path, table, "fig7.py")


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--repeats", type=int, default=5)
    ap.add_argument("--steps", type=int, default=200)
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
