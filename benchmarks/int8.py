"""The C++ binary's INT8 vs FP32 per-step time and peak RSS, side by side in one run.

For each method both precisions train the same steps from the same seed, alternating,
--repeats times; the table gives medians, the INT8 speed-up, and each run's peak RSS
(the binary's whole process, so a few MiB of it are the C++ runtime and the dataset) and
its training buffers (memory.buffers_bytes, the exact allocation the analytic model counts).
Prints; asserts nothing.
"""
from __future__ import annotations

import argparse
import statistics
import sys
import tempfile
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))

from benchmarks.runtimes import WORKLOADS, ZO_PHASES, bench_spec, ms_per_step, share  # noqa: E402
from harness.preparation.artifacts import raw_idx  # noqa: E402
from testkit.binaries import native_binary  # noqa: E402
from testkit.runners import policy_env, run_runner  # noqa: E402
from harness.planning.suites import MethodChoice  # noqa: E402
from workloads.vocab import PAPER_CONFIGS  # noqa: E402


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__)
    ap.add_argument("--repeats", type=int, default=5)
    ap.add_argument("--steps", type=int, default=60)
    ap.add_argument("--batch", type=int, default=32)
    ap.add_argument("--binary", help="the cpp binary to time (default: build it for this machine)")
    ap.add_argument("--model", choices=tuple(WORKLOADS), default="lenet5")
    args = ap.parse_args()
    binary, data_dir = args.binary or native_binary(), str(raw_idx(WORKLOADS[args.model][0], "").dir)
    print(f"{args.model}, batch {args.batch}, {args.steps} steps, {args.repeats} repeats (medians)")
    print(f"{'method':14} {'fp32 ms':>8} {'int8 ms':>8} {'int8 x':>7} {'fp32 MiB':>9} {'int8 MiB':>9} "
          f"{'fp32 buf KiB':>12} {'int8 buf KiB':>12} {'int8 zo%':>9}")
    with tempfile.TemporaryDirectory() as d:
        tmp = Path(d)
        for method, k in PAPER_CONFIGS:
            ms, rss, zo = {"fp32": [], "int8": []}, {"fp32": [], "int8": []}, []
            buf = {}
            for r in range(args.repeats + 1):            # the first round warms up and is dropped
                for precision in ("fp32", "int8"):
                    spec = bench_spec(method, k, args.batch, args.steps, data_dir, precision=precision,
                                      model=args.model)
                    res = run_runner(spec, tmp, binary, check=True, env=policy_env(binary))
                    if r == 0:
                        continue
                    ms[precision].append(ms_per_step(res))
                    rss[precision].append(res["memory"]["peak_rss_bytes"] / 2 ** 20)
                    buf[precision] = res["memory"]["buffers_bytes"] / 2 ** 10
                    if precision == "int8":
                        zo.append(100 * share(res, *ZO_PHASES))
            f, i = statistics.median(ms["fp32"]), statistics.median(ms["int8"])
            print(f"{MethodChoice(method, k)!s:14} {f:8.3f} {i:8.3f} {f / i:7.2f} "
                  f"{statistics.median(rss['fp32']):9.1f} {statistics.median(rss['int8']):9.1f} "
                  f"{buf['fp32']:12.1f} {buf['int8']:12.1f} {statistics.median(zo):9.1f}", flush=True)


if __name__ == "__main__":
    main()
