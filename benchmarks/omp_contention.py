"""How much a C++ job slows beside other work, against how much the CPU share it lost explains,
for each thread count and OpenMP wait policy (issue: load must cost time in proportion to the
CPU it takes, or the gate's rule in docs/compare.md cannot excuse it).

For each wait policy (a target's omp_wait_policy: auto, the default, then passive / active / the
runtime's own) and each thread count (1, every core, twice the cores: a 4-core board's team on
this 2-core machine), one quiet job (the C++ binary's Full ZO, or --runtime, --method,
--precision), then the same job beside N busy-loop processes (N = 1 .. cores). Each loaded job's
slowdown over the quiet one is printed beside what its lost share s explains, 1 / (1 - s) - 1
(compare.explained), and their ratio: close to 1 means the load record can account for the
slowdown; far above 1 means spinning threads waited for descheduled ones. "vs auto" is the
loaded job's time over auto's quiet one at the same thread count, the price of the policy
against the default. Medians of --repeats jobs; the jobs run through `zobench run` as a user's
do, so auto's pick for a Python runner is the launcher's. Asserts nothing.

    python benchmarks/omp_contention.py [--samples 3200] [--repeats 3] [--method full-bp] [--policy passive]
        [--runtime torch] [--precision int8] [--threads 2]
"""
from __future__ import annotations

import argparse
import os
import statistics
import subprocess
import sys
import tempfile
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

from harness.analysis import compare  # noqa: E402
from harness.stores import machine_load  # noqa: E402
from harness.stores.schema import step_seconds  # noqa: E402
from harness.stores.store import Store  # noqa: E402
from testkit.runners import REPO, busy_loops  # noqa: E402

POLICIES = ("auto", "passive", "active", "default")


def job(root: Path, threads: int, policy: str, samples: int, method: str, runtime: str,
        precision: str) -> tuple[float, float]:
    """(ms/step, the share of the CPU it wanted that other work took) of one job."""
    inv = root / "targets.toml"
    inv.write_text(f'[targets.here]\ntransport = "local"\nruntimes = ["{runtime}"]\nthreads = {threads}\n'
                   f'lease = "{root / "lease"}"\nomp_wait_policy = "{policy}"\n')
    env = {k: v for k, v in os.environ.items() if k not in ("OMP_WAIT_POLICY", "OMP_NUM_THREADS", "GOMP_SPINCOUNT")}
    p = subprocess.run([sys.executable, "-m", "zobench", "run", "--results", str(root / "res"), "--no-report",
                        "--inventory", str(inv), "--target", "here", "--runtime", runtime, "--precision", precision,
                        "--zo-loss", "float", "--method", method, "--set", "epochs=1", "--set", f"train_samples={samples}",
                        "--set", "test_samples=32"], cwd=REPO, env=env, capture_output=True, text=True)
    store = Store(root / "res")
    (r,) = store.results(store.latest())
    if p.returncode != 0 or r["status"] != "ok":
        raise SystemExit(f"job failed: {r.get('error') or p.stderr[-500:]}")
    return 1e3 * step_seconds(r), compare.starved(machine_load.of_steps(r), threads) or 0.0


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--samples", type=int, default=3200, help="training samples of each job (batch 32)")
    ap.add_argument("--repeats", type=int, default=3)
    ap.add_argument("--method", default="full-zo", help="the job's method (full-zo, full-bp, elastic-zo:1)")
    ap.add_argument("--policy", action="append", choices=POLICIES, help="only these policies (default: all)")
    ap.add_argument("--threads", type=int, action="append", help="only these thread counts (default: 1, cores, 2 x cores)")
    ap.add_argument("--runtime", choices=("cpp", "torch", "ort"), default="cpp")
    ap.add_argument("--precision", default="fp32")
    args = ap.parse_args()
    cores = os.cpu_count() or 1
    print(f"{args.runtime} {args.method} {args.precision}, {args.samples // 32} steps of batch 32, medians of {args.repeats}")
    print(f"{'policy':8} {'threads':>7} {'busy':>4} {'ms/step':>8} {'lost':>5} {'slowdown':>9} {'explained':>9} {'ratio':>6} "
          f"{'vs auto':>7}")
    auto_quiet: dict[int, float] = {}
    with tempfile.TemporaryDirectory() as tmp:
        for policy in args.policy or POLICIES:
            for threads in args.threads or sorted({1, cores, 2 * cores}):
                quiet = None
                for n in range(cores + 1):
                    with busy_loops(n):
                        got = [job(Path(tmp), threads, policy, args.samples, args.method, args.runtime, args.precision)
                               for _ in range(args.repeats)]
                    ms, lost = statistics.median(g[0] for g in got), statistics.median(g[1] for g in got)
                    quiet = quiet or ms
                    if policy == "auto" and not n:
                        auto_quiet[threads] = ms
                    slow, expl = ms / quiet - 1, compare.explained(lost, 0.0)
                    ratio = f"{(1 + slow) / (1 + expl):6.2f}" if n else "     -"
                    versus = f"{ms / auto_quiet[threads]:7.2f}" if threads in auto_quiet else "      -"
                    print(f"{policy:8} {threads:7d} {n:4d} {ms:8.2f} {100 * lost:4.0f}% {100 * slow:8.0f}% "
                          f"{100 * expl:8.0f}% {ratio} {versus}", flush=True)
    return 0


if __name__ == "__main__":
    sys.exit(main())
