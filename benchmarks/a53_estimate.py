"""The Cortex-A53's step time, estimated without the board: instructions counted under QEMU,
cycles from the core's pipeline model.

A Raspberry Pi Zero 2's numbers cannot be measured here, and QEMU's speed says nothing about
the A53's. What QEMU does say exactly is which instructions the aarch64 binary executes: run
under `qemu-aarch64 -cpu cortex-a53 -d in_asm,exec,nochain`, it logs every translated block's
instructions and every execution of a block. The run is made twice, with S and 2S training
steps, and the difference is S steps' work, without start-up, data loading and evaluation.
Each block's cycles come from llvm-mca's Cortex-A53 model (LLVM's AArch64SchedA53: dual
issue, in order, the latencies Arm publishes), as the steady-state cycles of the block run
back to back: an estimate that ignores cache misses and branch mispredictions, the same for
every configuration, so its ratios (INT8 over FP32, the ZO loops' share) are what it is for.

The ZO perturbation and update are the blocks of zrng::add_normal's, each_bits32's,
fill_bits32's and each_half16's loops (every ZO pass runs there); their instructions per
parameter are divided by the passes (three a step).
Prints a table; asserts nothing. --json FILE writes the record; --show FILE prints the table from
a record, running nothing: docs/cpus.md's table is the record docs/a53.json shown
(tests/test_fig7.py checks that), with the working.
"""
from __future__ import annotations

import argparse
import collections
import json
import re
import subprocess
import sys
import tempfile
from datetime import date
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))

from benchmarks import record as records  # noqa: E402
from benchmarks.runtimes import bench_spec, paper_batches  # noqa: E402
from harness.preparation.artifacts import raw_idx  # noqa: E402
from harness.planning.suites import MethodChoice  # noqa: E402
from testkit.binaries import aarch64_binary  # noqa: E402
from testkit.runners import QEMU_A53, run_runner  # noqa: E402
from workloads.vocab import PAPER_CONFIGS  # noqa: E402

# the symbols every ZO pass's loops are compiled into: FP32's perturbation (Irwin-Hall, unmasked),
# the hash's (and every other FP32 pass), INT8's chunk of hashes and its pass over their halves
ZO_LOOPS = ("add_normal", "each_bits32", "fill_bits32", "each_half16")
BLOCK = re.compile(r"^IN: ?(.*)$")
INSN = re.compile(r"^0x([0-9a-f]+):\s+[0-9a-f]{8}\s+(.*)$")
TRACE = re.compile(r"^Trace \d+: 0x[0-9a-f]+ \[[0-9a-f]+/([0-9a-f]+)/")
BRANCH = re.compile(r"^(b|bl|b\.\w+|cbz|cbnz|tbz|tbnz)\s")


def trace(binary: str, spec: dict, tmp: Path) -> tuple[dict, dict, dict, dict]:
    """Run the job under QEMU's logging: block pc -> executions, instructions, function; and
    the job's result."""
    log = tmp / "qemu.log"
    result = run_runner(spec, tmp, [*QEMU_A53, "-d", "in_asm,exec,nochain", "-D", str(log), binary], check=True)
    return (*read_log(log), result)


def read_log(log: Path) -> tuple[dict, dict, dict]:
    """QEMU's in_asm,exec log: block pc -> executions, its instructions, its function. The
    log is removed once read (a step's is hundreds of MB)."""
    counts, blocks, where = collections.Counter(), {}, {}
    current, body, name = None, [], ""
    with open(log, errors="replace") as f:
        for line in f:
            if line.startswith("Trace"):
                m = TRACE.match(line)
                if m:
                    counts[int(m.group(1), 16)] += 1
                continue
            m = BLOCK.match(line)
            if m:
                current, body, name = None, [], m.group(1).strip()
                continue
            m = INSN.match(line)
            if m:
                if not body:
                    current = int(m.group(1), 16)
                body.append(m.group(2).strip())
                continue
            if current is not None and body:      # the block's listing ended
                blocks[current], where[current] = body, name
                current, body = None, []
    log.unlink()
    return counts, blocks, where


def mca_cycles(body: list[str], cache: dict) -> float:
    """Steady-state cycles of one execution of a block on the A53 (llvm-mca); a block it cannot
    read (a system instruction) counts one cycle per instruction."""
    key = tuple(body)
    if key not in cache:
        # a branch's target is a number in QEMU's listing: point it at the block itself
        text = "\n".join(ins.rsplit("#0x", 1)[0] + "." if BRANCH.match(ins) else ins for ins in body)
        p = subprocess.run(["llvm-mca", "-mtriple=aarch64", "-mcpu=cortex-a53", "-iterations=200"],
                           input=text + "\n", capture_output=True, text=True)
        m = re.search(r"Total Cycles:\s+(\d+)", p.stdout)
        cache[key] = int(m.group(1)) / 200 if p.returncode == 0 and m else float(len(body))
    return cache[key]


def estimate(binary: str, spec: dict, steps: int, tmp: Path, cache: dict) -> dict:
    """Per training step: instructions and A53 cycles, all and in the ZO loops; and the
    parameters the ZO passes perturb."""
    runs = []
    for s in (steps, 2 * steps):
        spec = {**spec, "hyper": {**spec["hyper"], "train_samples": spec["hyper"]["batch_size"] * s}}
        runs.append(trace(binary, spec, tmp))
    (c1, b1, w1, _), (c2, b2, w2, result) = runs
    blocks, where = {**b1, **b2}, {**w1, **w2}
    out = {"insns": 0.0, "cycles": 0.0, "zo_insns": 0.0, "zo_cycles": 0.0, "params_zo": result["model"]["params_zo"]}
    for pc in set(c1) | set(c2):
        n = (c2[pc] - c1[pc]) / steps           # executions per step
        if not n or pc not in blocks:
            continue
        insns, cycles = n * len(blocks[pc]), n * mca_cycles(blocks[pc], cache)
        out["insns"] += insns
        out["cycles"] += cycles
        if any(name in where[pc] for name in ZO_LOOPS):
            out["zo_insns"] += insns
            out["zo_cycles"] += cycles
    return out


def estimate_config(binary: str, method: str, k: int, precision: str, batch: int, steps: int, data_dir: str,
                    tmp: Path, cache: dict) -> dict:
    """estimate() of a paper configuration's LeNet-5 job: one thread, no warm-up."""
    spec = bench_spec(method, k, batch, steps, data_dir, threads=1, precision=precision)
    spec["hyper"]["warmup_steps"] = 0
    return estimate(binary, spec, steps, tmp, cache)


def measure(configs: list[tuple[str, int]], batches: dict[str, list[int]], cpu: str, steps: int,
            ghz: float) -> dict:
    """The record: estimate() of each configuration, precision and batch, printed as it comes."""
    binary, data_dir = aarch64_binary(cpu), str(raw_idx("fashion-mnist", "").dir)
    record = {"version": 2, "commit": records.commit(), "date": date.today().isoformat(), "cpu": cpu,
              "steps": steps, "ghz": ghz, "rows": []}
    cache: dict = {}
    with tempfile.TemporaryDirectory() as d:
        for method, k in configs:
            for precision, bs in batches.items():
                for batch in bs:
                    e = estimate_config(binary, method, k, precision, batch, steps, data_dir, Path(d), cache)
                    record["rows"].append({"method": str(MethodChoice(method, k)), "precision": precision,
                                           "batch": batch, **e})
                    print(table(record).splitlines()[-1], flush=True)
    return record


def upgrade(record: dict) -> dict:
    """A version-1 record (one batch for every row, the record's) as version 2's, a batch a row."""
    if record.get("version") != 1:
        return record
    return {**record, "version": 2, "rows": [{**r, "batch": record["batch"]} for r in record["rows"]]}


def table(record: dict) -> str:
    """The record as docs/cpus.md shows it: per step, instructions, cycles and ms at the clock;
    the ZO loops' share of the cycles and their instructions per ZO parameter and pass (three
    passes a step); INT8's speed-up per sample (so per epoch) over the same method's FP32 row."""
    record = upgrade(record)
    rows = ["| method | precision | batch | M instructions / step | M cycles / step | ms / step | ZO loops, % of cycles "
            "| instructions / parameter / pass | INT8 speed-up per epoch |", "|---|---|---|---|---|---|---|---|---|"]
    for r in record["rows"]:
        speedup = records.speedup(r, record["rows"], "cycles", "method")
        zo = r["zo_cycles"] > 0
        share = f"{100 * r['zo_cycles'] / r['cycles']:.1f}" if zo else "–"
        per_param = f"{r['zo_insns'] / (3 * r['params_zo']):.2f}" if zo else "–"
        rows.append(f"| {r['method']} | {r['precision']} | {r['batch']} | {r['insns'] / 1e6:.2f} | "
                    f"{r['cycles'] / 1e6:.2f} | {r['cycles'] / record['ghz'] / 1e6:.1f} | {share} | {per_param} | "
                    f"{speedup} |")
    return "\n".join(rows)


def read(path: Path) -> dict:
    """The record at path, checked by showing it (benchmarks/record.py), as version 2."""
    return upgrade(records.read(path, table, "a53_estimate.py"))


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--steps", type=int, default=2, help="S: the runs train S and 2S steps")
    ap.add_argument("--batch", type=int, help="every precision at this batch (default: each as paper-mnist trains "
                    "it, and INT8 at FP32's batch too: benchmarks/runtimes.py, paper_batches)")
    ap.add_argument("--cpu", default="cortex-a53", help="the aarch64 build (harness/planning/cpu.py name)")
    ap.add_argument("--ghz", type=float, default=1.0, help="the clock the ms are given at (Pi Zero 2: 1 GHz)")
    ap.add_argument("--methods", nargs="+", default=[str(MethodChoice(m, k)) for m, k in PAPER_CONFIGS],
                    help="of the paper's configurations (each precision's run takes minutes)")
    ap.add_argument("--precisions", nargs="+", choices=("fp32", "int8"), default=["fp32", "int8"])
    ap.add_argument("--json", type=Path, help="write the record here too")
    ap.add_argument("--show", type=Path, help="print the table of this record, running nothing")
    args = ap.parse_args()
    if args.show:
        return records.show(args.show, table, "a53_estimate.py")
    configs = [(m, k) for m, k in PAPER_CONFIGS if str(MethodChoice(m, k)) in args.methods]
    if len(configs) != len(args.methods):
        ap.error(f"--methods: each of {', '.join(str(MethodChoice(m, k)) for m, k in PAPER_CONFIGS)}")
    if args.steps < 1 or (args.batch is not None and args.batch < 1) or args.ghz <= 0:
        ap.error("--steps and --batch: at least 1; --ghz: above 0")
    batches = {p: [args.batch] if args.batch else bs for p, bs in paper_batches().items() if p in args.precisions}
    print(f"LeNet-5, one thread, {args.cpu} build; cycles: llvm-mca's Cortex-A53 model at {args.ghz:g} GHz")
    print(table({"ghz": args.ghz, "rows": []}), flush=True)
    record = measure(configs, batches, args.cpu, args.steps, args.ghz)
    if args.json:
        args.json.write_text(json.dumps(record, indent=1) + "\n")
    return 0


if __name__ == "__main__":
    sys.exit(main())
