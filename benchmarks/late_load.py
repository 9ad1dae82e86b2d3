"""torch's thread pool when other work arrives after it started: the launcher's pick for a
Python runner (workloads/wait_policy.py) is made once, at the start, so load that comes later
meets the spin it picked on a quiet machine. Beside 0, 1 and 2 busy loops started before each
runner (as load that came in the meantime would be): auto's quiet pick (GOMP_SPINCOUNT=SPIN),
passive (auto's pick beside load) and libgomp's own default (a spin 30 times longer), taken in
turn, medians; libgomp's default runs once beside load (it can take minutes). Asserts nothing.

    python benchmarks/late_load.py [--steps 100] [--repeats 3]
"""
from __future__ import annotations

import argparse
import statistics
import sys
import tempfile
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

from benchmarks.runtimes import WORKLOADS, bench_spec, ms_per_step  # noqa: E402
from harness.preparation.artifacts import raw_idx  # noqa: E402
from testkit.runners import TORCH_RUNNER, WAIT_VARIABLES, busy_loops, run_runner  # noqa: E402
from workloads import wait_policy  # noqa: E402

POOLS = {f"spin {wait_policy.SPIN}": wait_policy.environment("spin"), "passive": wait_policy.environment("passive"),
         "libgomp default": {}}


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--steps", type=int, default=100)
    ap.add_argument("--repeats", type=int, default=3)
    args = ap.parse_args()
    data = str(raw_idx(WORKLOADS["lenet5"][0], "").dir)
    print(f"torch, LeNet-5, batch 32, {args.steps} steps, medians of {args.repeats}; ms/step")
    print(f"{'method':8} {'busy':>4} " + " ".join(f"{p:>16}" for p in POOLS))
    for method in ("full-zo", "full-bp"):
        spec = bench_spec(method, 0, 32, args.steps, data)
        with tempfile.TemporaryDirectory() as d:
            for busy in (0, 1, 2):
                ms = {p: [] for p in POOLS}
                with busy_loops(busy):
                    for r in range(args.repeats):
                        for pool, env in POOLS.items():
                            if busy and not env and r:
                                continue
                            res = run_runner(spec, Path(d), TORCH_RUNNER, check=True, env={**WAIT_VARIABLES, **env})
                            ms[pool].append(ms_per_step(res))
                print(f"{method:8} {busy:4d} " + " ".join(f"{statistics.median(v):16.2f}" for v in ms.values()),
                      flush=True)


if __name__ == "__main__":
    main()
