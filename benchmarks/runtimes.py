"""Per-step training time of the cpp binary and the ONNX Runtime runner vs the torch
runner, side by side in one run.

For each method and batch size the runtimes train the same steps from the same seed,
alternating, --repeats times; the table gives medians, each runtime's speed-up over
torch, and the binary's ZO perturb+update and forward shares of training time.
ort trains no full-bp (forward-only by design). Prints; asserts nothing.
"""
from __future__ import annotations

import argparse
import statistics
import sys
import tempfile
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))

from testkit.runners import ORT_RUNNER, TORCH_RUNNER, idx_data_dir, job_spec, native_binary, run_runner  # noqa: E402

from harness.artifacts import onnx_graph  # noqa: E402
from harness.suites import MethodChoice  # noqa: E402
from workloads.vocab import PAPER_CONFIGS  # noqa: E402

ZO_PHASES = ("zo_perturb", "zo_update")


def bench_spec(method: str, k: int, batch: int, steps: int, data_dir: str, threads: int = 0, **fields) -> dict:
    """One untraced epoch of `steps` batches of Fashion-MNIST from seed 0, and a short test pass."""
    return job_spec(method, k, seed=0, steps=steps, batch=batch, test_samples=32, threads=threads,
                    data_dir=data_dir, hyper={"trace_steps": 0}, **fields)


def ms_per_step(r: dict) -> float:
    return 1000 * r["train_seconds"] / r["steps"]


def share(r: dict, *phases: str) -> float:
    """The fraction of training time the phases took."""
    return sum(r["phases"][p]["seconds"] for p in phases) / r["train_seconds"]


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__)
    ap.add_argument("--repeats", type=int, default=3)
    ap.add_argument("--steps", type=int, default=40)
    ap.add_argument("--threads", type=int, default=0, help="0 = each runtime's default")
    args = ap.parse_args()
    binary, data_dir = native_binary(), idx_data_dir()
    commands = {"torch": TORCH_RUNNER, "cpp": binary, "ort": ORT_RUNNER}
    print(f"{'method':16} {'batch':>5} {'torch ms':>9} {'cpp ms':>8} {'ort ms':>8} {'cpp x':>6} {'ort x':>6} "
          f"{'cpp zo%':>8} {'cpp fwd%':>8}")
    with tempfile.TemporaryDirectory() as d:
        tmp = Path(d)
        for batch in (32, 256):
            for method, k in PAPER_CONFIGS:
                spec = bench_spec(method, k, batch, args.steps, data_dir, threads=args.threads)
                runtimes = {rt: cmd for rt, cmd in commands.items() if rt != "ort" or method != "full-bp"}
                if "ort" in runtimes:
                    spec["onnx_model"] = str(onnx_graph("lenet5", method, k))
                ms = {rt: [] for rt in runtimes}
                shares = []
                run_runner(spec, tmp, runtimes["cpp"], check=True)     # warm-up: page cache, CPU clocks
                for _ in range(args.repeats):
                    for rt, cmd in runtimes.items():
                        r = run_runner(spec, tmp, cmd, check=True)
                        ms[rt].append(ms_per_step(r))
                        if rt == "cpp":
                            shares.append((share(r, *ZO_PHASES), share(r, "forward")))
                med = {rt: statistics.median(v) for rt, v in ms.items()}
                t, c, o = med["torch"], med["cpp"], med.get("ort")
                zo, fwd = (100 * statistics.median(s[i] for s in shares) for i in (0, 1))
                ort_ms, ort_x = (f"{o:8.2f}", f"{t / o:6.2f}") if o else (f"{'-':>8}", f"{'-':>6}")
                print(f"{MethodChoice(method, k)!s:16} {batch:5d} {t:9.2f} {c:8.2f} {ort_ms} {t / c:6.2f} {ort_x} "
                      f"{zo:8.1f} {fwd:8.1f}", flush=True)


if __name__ == "__main__":
    main()
