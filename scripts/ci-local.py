#!/usr/bin/env python3
"""The bench workflow (.github/workflows/bench.yml) end to end on this machine, against a
throwaway PostgreSQL (Debian's `postgresql`, started in a temporary folder and stopped at the
end: testkit/postgres.py): a few pushes to main, then a pull request of the same code (the gate
passes, exit 0, or judges nothing beside other work that could hide a change, exit 3) and one
with a 20% slowdown injected (the gate fails, exit 1).

    .venv/bin/python scripts/ci-local.py [--mains 3] [--full | --instructions]

Without --full the ci suite is narrowed to its single-threaded C++ Full ZO key (seconds a run);
with it, the whole suite runs each time (minutes). Judged by time, the same code can still come
out regressed on a machine busy enough (no load rule is a model of every neighbour); with
--instructions the workflow runs as a shared runner's should (docs/compare.md, "Instructions
per step"): every run counts the key's instructions per step, the gate judges by them
(`--judge-by instructions`) and the slower pull request's slowdown is real work
(`inject_work`), so the same code exits 0 and the slower 1 however busy the machine. Exits 0
when each step ended as it should.
"""
from __future__ import annotations

import argparse
import os
import shutil
import subprocess
import sys
import tempfile
from pathlib import Path

REPO = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(REPO))

from testkit.postgres import Postgres  # noqa: E402

# the ci suite's single-threaded C++ Full ZO key (testkit/compare_runs.py's SOLO: one thread, so
# that other work on the other core moves it less)
NARROW = "--runtime cpp --precision fp32 --method full-zo --set train_samples=3200 --target solo --inventory {inv}"


# where the job summary says the dashboard is served (nowhere: ci-local only checks the link)
DASHBOARD = "http://dashboard.invalid/zobench"


def commit(i: int) -> str:
    return f"{i + 10:x}" * 20


def step(name: str, mode: str, env: dict, want: tuple[int, ...]) -> bool:
    """One run of the workflow's script; `want`: the exit codes it may end with."""
    print(f"== {name}: scripts/bench-ci.sh {mode}", flush=True)
    rc = subprocess.run([str(REPO / "scripts/bench-ci.sh"), mode], cwd=REPO, env=env).returncode
    ok = rc in want
    print(f"== {name}: exit {rc} ({'as expected' if ok else 'expected ' + ' or '.join(map(str, want))})", flush=True)
    return ok


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--mains", type=int, default=3, help="runs pushed to main before the pull requests")
    ap.add_argument("--full", action="store_true", help="the whole ci suite each run")
    ap.add_argument("--slowdown", type=float, default=0.2, help="what the slower pull request injects (0.2 = 20%%)")
    ap.add_argument("--threshold", type=float, default=5.0, help="the gate's threshold in percent (compare's default 5)")
    ap.add_argument("--instructions", action="store_true",
                    help="count instructions per step and judge by them (a shared runner's recipe; not with --full)")
    ap.add_argument("--keep-site", type=Path, help="copy the published dashboard here at the end")
    args = ap.parse_args()
    if args.full and args.instructions:
        ap.error("--instructions counts the narrow C++ key's instructions; the full suite's other runtimes have none")
    counted = " --instructions" if args.instructions else ""
    judge = " --judge-by instructions" if args.instructions else ""
    pg = Postgres()
    try:
        with tempfile.TemporaryDirectory(prefix="zobench-ci-") as results:
            inv = Path(results) / "inventory.toml"
            inv.write_text('[targets.solo]\nprofile = "local"\nthreads = 1\n')
            env = {**os.environ, "ZOBENCH_STORE": pg.new_database(), "RESULTS": str(Path(results) / "results"),
                   "ZOBENCH": str(REPO / ".venv/bin/zobench"),
                   "ZOBENCH_CI_ARGS": "" if args.full else NARROW.format(inv=inv) + counted,
                   "ZOBENCH_COMPARE_ARGS": f"--threshold {args.threshold}{judge}",
                   # the job summary links to the dashboard, published by the last step (it reads the whole store)
                   "ZOBENCH_DASHBOARD_URL": DASHBOARD, "ZOBENCH_PUBLISH_ARGS": f"--reports 0 --threshold {args.threshold}"}
            env.pop("GITHUB_STEP_SUMMARY", None)
            # each run its own commit (a checkout's own would be every run's here): the dashboard's points
            ok = all(step(f"push to main {i + 1}/{args.mains}", "main", {**env, "ZOBENCH_COMMIT": commit(i)}, (0,))
                     for i in range(args.mains))
            pr = {**env, "ZOBENCH_BRANCH": "same-code", "ZOBENCH_COMMIT": commit(args.mains)}
            # the same code passes; beside other work that could hide a change of the threshold
            # the gate judges nothing and says so (exit 3, docs/compare.md), never "regressed"
            # (judged by instructions, nothing but the code moves them: exit 0 alone)
            ok = step("pull request, same code", "pr", pr, (0,) if args.instructions else (0, 3)) and ok
            site = Path(results) / "site"
            slower = "inject_work" if args.instructions else "inject_slowdown"     # the count sees no busy-wait
            slow = {**env, "ZOBENCH_BRANCH": "slower", "ZOBENCH_COMMIT": commit(args.mains + 1), "ZOBENCH_SITE": str(site),
                    "ZOBENCH_CI_ARGS": f"{env['ZOBENCH_CI_ARGS']} --set {slower}={args.slowdown}"}
            ok = step(f"pull request, {args.slowdown:.0%} slower", "pr", slow, (1,)) and ok
            if args.keep_site:
                shutil.copytree(site, args.keep_site, dirs_exist_ok=True)
    finally:
        pg.stop()
    print("ci-local: " + ("every step ended as the workflow should" if ok else "a step did not end as it should"))
    return 0 if ok else 1


if __name__ == "__main__":
    sys.exit(main())
