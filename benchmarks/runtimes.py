"""Per-step training time of the cpp binary and the ONNX Runtime runner vs the torch
runner, side by side in one run, for LeNet-5 or PointNet (--model).

For each method and batch size the runtimes train the same steps from the same seed,
alternating, --repeats times; the table gives medians, each runtime's speed-up over
torch, the binary's ZO perturb+update and forward shares of training time, and each
runtime's forward pass in GFLOP/s (models.Model.forward_flops) against the cores' FP32
peak, measured by benchmarks/peak_flops.cpp. ort trains no full-bp (forward-only by
design). Prints; asserts nothing.
"""
from __future__ import annotations

import argparse
import os
import statistics
import subprocess
import sys
import tempfile
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))

from testkit.binaries import native_binary  # noqa: E402
from testkit.runners import ORT_RUNNER, TORCH_RUNNER, job_spec, policy_env, run_runner  # noqa: E402

from harness.preparation.artifacts import onnx_graph, raw_idx  # noqa: E402
from harness.planning import suites  # noqa: E402
from harness.planning.suites import MethodChoice  # noqa: E402
from workloads.models import MODELS  # noqa: E402
from workloads.vocab import PAPER_CONFIGS  # noqa: E402

ZO_PHASES = ("zo_perturb", "zo_update")
# per model: its data set and the batch sizes timed (PointNet: the paper's 32, 1,024 points)
WORKLOADS = {"lenet5": ("fashion-mnist", (32, 256)), "pointnet": ("modelnet40-synthetic", (32,))}


def bench_spec(method: str, k: int, batch: int, steps: int, data_dir: str, threads: int = 0,
               model: str = "lenet5", **fields) -> dict:
    """One untraced epoch of `steps` batches from seed 0, and a short test pass."""
    return job_spec(method, k, seed=0, steps=steps, batch=batch, test_samples=32, threads=threads,
                    data_dir=data_dir, hyper={"trace_steps": 0}, model=MODELS[model],
                    dataset=WORKLOADS[model][0], **fields)


def paper_batches() -> dict[str, list[int]]:
    """Per precision, the batches a step is timed at beside Fig. 7: the batch paper-mnist trains
    it at (Fig. 7 times the paper's MNIST training), and FP32's too, so that INT8's per-z cost is
    seen at one batch with FP32's. The ZO loops cost the same per step at any batch, so their
    share of a step falls as its batch grows: INT8 trains at 128 (docs/reproduction.md)."""
    suite = suites.load("paper-mnist")
    batch = {p: suite.hyper_for(MethodChoice("elastic-zo", 1), p)["batch_size"] for p in suite.precisions}
    return {p: sorted({batch["fp32"], b}) for p, b in batch.items()}


def peak_gflops(threads: int) -> float:
    """The cores' FP32 multiply-add peak with this many threads (0 = all), measured."""
    with tempfile.TemporaryDirectory() as d:
        exe = Path(d) / "peak"
        subprocess.run(["g++", "-O3", "-march=native", "-ffp-contract=fast", "-fopenmp",
                        str(ROOT / "benchmarks" / "peak_flops.cpp"), "-o", str(exe)], check=True)
        env = {**os.environ, **({"OMP_NUM_THREADS": str(threads)} if threads else {})}
        return float(subprocess.run([exe], env=env, capture_output=True, text=True, check=True).stdout)


def forward_gflops(r: dict, flops_per_sample: int, batch: int) -> float:
    """GFLOP/s of the runner's forward passes (the forward phase's mean call)."""
    f = r["phases"]["forward"]
    return flops_per_sample * batch * f["calls"] / f["seconds"] / 1e9


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
    ap.add_argument("--runtimes", default="torch,cpp,ort", help="which to time (cpp always runs)")
    ap.add_argument("--binary", help="the cpp binary to time (default: build it for this machine), "
                                     "e.g. an older build to compare with")
    ap.add_argument("--model", choices=tuple(WORKLOADS), default="lenet5")
    args = ap.parse_args()
    model = MODELS[args.model]
    binary, data_dir = args.binary or native_binary(), str(raw_idx(WORKLOADS[args.model][0], "").dir)
    wanted = {*args.runtimes.split(","), "cpp"}
    commands = {rt: cmd for rt, cmd in {"torch": TORCH_RUNNER, "cpp": binary, "ort": ORT_RUNNER}.items()
                if rt in wanted}
    peak = peak_gflops(args.threads)
    print(f"{model.name}: {model.forward_flops() / 1e6:.1f} MFLOP per sample's forward; the cores' FP32 peak "
          f"(benchmarks/peak_flops.cpp, threads={args.threads or 'all'}): {peak:.0f} GFLOP/s")
    print(f"{'method':16} {'batch':>5} {'torch ms':>9} {'cpp ms':>8} {'ort ms':>8} {'cpp x':>6} {'ort x':>6} "
          f"{'cpp zo%':>8} {'cpp fwd%':>8}  forward GFLOP/s torch / cpp (% of peak) / ort")
    with tempfile.TemporaryDirectory() as d:
        tmp = Path(d)
        for batch in WORKLOADS[args.model][1]:
            for method, k in PAPER_CONFIGS:
                spec = bench_spec(method, k, batch, args.steps, data_dir, threads=args.threads, model=args.model)
                runtimes = {rt: cmd for rt, cmd in commands.items() if rt != "ort" or method != "full-bp"}
                if "ort" in runtimes:
                    spec["onnx_model"] = str(onnx_graph(model, method, k))
                ms, gflops = {rt: [] for rt in runtimes}, {rt: [] for rt in runtimes}
                shares = []
                run_runner(spec, tmp, runtimes["cpp"], check=True, env=policy_env(runtimes["cpp"]))  # warm-up
                for _ in range(args.repeats):
                    for rt, cmd in runtimes.items():
                        r = run_runner(spec, tmp, cmd, check=True, env=policy_env(cmd))
                        ms[rt].append(ms_per_step(r))
                        gflops[rt].append(forward_gflops(r, model.forward_flops(), batch))
                        if rt == "cpp":
                            shares.append((share(r, *ZO_PHASES), share(r, "forward")))
                med = {rt: statistics.median(v) for rt, v in ms.items()}
                gf = {rt: statistics.median(v) for rt, v in gflops.items()}
                t, c, o = med.get("torch"), med["cpp"], med.get("ort")
                zo, fwd = (100 * statistics.median(s[i] for s in shares) for i in (0, 1))
                torch_ms, cpp_x = (f"{t:9.2f}", f"{t / c:6.2f}") if t else (f"{'-':>9}", f"{'-':>6}")
                ort_ms, ort_x = (f"{o:8.2f}", f"{t / o:6.2f}" if t else f"{'-':>6}") if o else (f"{'-':>8}", f"{'-':>6}")
                rate = lambda rt: f"{gf[rt]:.1f}" if rt in gf else "-"  # noqa: E731
                print(f"{MethodChoice(method, k)!s:16} {batch:5d} {torch_ms} {c:8.2f} {ort_ms} {cpp_x} {ort_x} "
                      f"{zo:8.1f} {fwd:8.1f}  {rate('torch')} / {rate('cpp')} ({100 * gf['cpp'] / peak:.0f}%) / "
                      f"{rate('ort')}", flush=True)


if __name__ == "__main__":
    main()
