"""The C++ binary's FP32 vs INT8 per-step time on each x86 kernel path this machine runs.

Each x86 CPU name the CPU can run (harness/planning/cpu.py: x86-64, -v2, -v3 (AVX2), -v4 (AVX-512
without VNNI), -v4-vnni) is built, and for each method both precisions train the same steps
from the same seed, alternating, --repeats times. Per path a table of medians: FP32 and INT8
ms/step, the INT8 speed-up, each one's ZO share (zo_perturb + zo_update over training time), and
INT8 without those phases against FP32 without them: the kernels' own speed-up, apart from the
perturbation noise. Then, once, the torch runner's FP32 full-zo step beside this machine's own
(-march=native) cpp build's. Prints; asserts nothing.
"""
from __future__ import annotations

import argparse
import platform
import statistics
import sys
import tempfile
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))

from benchmarks.runtimes import ZO_PHASES, bench_spec, ms_per_step, share  # noqa: E402
from harness.preparation.artifacts import raw_idx  # noqa: E402
from harness.planning.suites import MethodChoice  # noqa: E402
from testkit.binaries import native_binary, x86_names_here  # noqa: E402
from testkit.runners import TORCH_RUNNER, policy_env, run_runner  # noqa: E402
from workloads import vocab  # noqa: E402
from workloads.vocab import PAPER_CONFIGS  # noqa: E402


def alternating(runs: dict, tmp: Path, repeats: int, policy: str = vocab.OMP_WAIT_POLICY) -> dict[str, list[dict]]:
    """Each run's results ({name: (spec, command)}), the runs taking turns `repeats` times after
    a first round that warms up (page cache, CPU clocks) and is dropped; each runner waits as a
    target's `policy` makes it (the harness's default unless told)."""
    out = {name: [] for name in runs}
    for r in range(repeats + 1):
        for name, (spec, command) in runs.items():
            res = run_runner(spec, tmp, command, check=True, env=policy_env(command, policy))
            if r:
                out[name].append(res)
    return out


def medians(runs: list[dict]) -> tuple[float, float, float]:
    """Medians of ms/step, of the ZO phases' share and of ms/step without them."""
    ms = [ms_per_step(r) for r in runs]
    zo = [share(r, *ZO_PHASES) for r in runs]
    return statistics.median(ms), statistics.median(zo), statistics.median(m * (1 - z) for m, z in zip(ms, zo))


def alternating_options(doc: str) -> argparse.ArgumentParser:
    """The options of a benchmark whose runs take turns (alternating): repeats, steps, batch and
    threads, LeNet-5's defaults."""
    ap = argparse.ArgumentParser(description=doc)
    ap.add_argument("--repeats", type=int, default=5)
    ap.add_argument("--steps", type=int, default=200)
    ap.add_argument("--batch", type=int, default=32)
    ap.add_argument("--threads", type=int, default=0, help="0 = all cores")
    return ap


def main() -> None:
    ap = alternating_options(__doc__)
    ap.add_argument("--cpus", help="comma-separated x86 CPU names (default: every one this machine runs)")
    args = ap.parse_args()
    if platform.machine() != "x86_64":
        sys.exit("kernel_paths.py times the x86 paths: run it on an x86 machine")
    names = args.cpus.split(",") if args.cpus else x86_names_here()
    data_dir = str(raw_idx("fashion-mnist", "").dir)

    def spec(method: str, k: int, precision: str) -> dict:
        return bench_spec(method, k, args.batch, args.steps, data_dir, threads=args.threads, precision=precision)

    print(f"lenet5, batch {args.batch}, {args.steps} steps, {args.repeats} repeats (medians); "
          f"threads {args.threads or 'all'}")
    with tempfile.TemporaryDirectory() as d:
        tmp = Path(d)
        for name in names:
            binary = native_binary(name)
            print(f"\n{name}")
            print(f"{'method':14} {'fp32 ms':>8} {'int8 ms':>8} {'int8 x':>7} {'fp32 zo%':>9} {'int8 zo%':>9} "
                  f"{'fp32-zo ms':>10} {'int8-zo ms':>10} {'kernels x':>9}")
            for method, k in PAPER_CONFIGS:
                res = alternating({p: (spec(method, k, p), binary) for p in ("fp32", "int8")}, tmp, args.repeats)
                kernels = res["int8"][0]["env"]["kernels"]
                (f, zf, rest_f), (i, zi, rest_i) = medians(res["fp32"]), medians(res["int8"])
                print(f"{MethodChoice(method, k)!s:14} {f:8.3f} {i:8.3f} {f / i:7.2f} {100 * zf:9.1f} {100 * zi:9.1f} "
                      f"{rest_f:10.3f} {rest_i:10.3f} {rest_f / rest_i:9.2f}", flush=True)
            print("kernels: " + ", ".join(f"{kind} {path}" for kind, path in kernels.items()))
        res = alternating({rt: (spec("full-zo", 0, "fp32"), command)
                           for rt, command in (("torch", TORCH_RUNNER), ("cpp", native_binary()))}, tmp, args.repeats)
        torch_ms, cpp_ms = (statistics.median(map(ms_per_step, runs)) for runs in res.values())
        print(f"\nfp32 full-zo: torch {torch_ms:.3f} ms/step, cpp (native) {cpp_ms:.3f} ms/step: "
              f"cpp {torch_ms / cpp_ms:.2f}x faster")


if __name__ == "__main__":
    main()
