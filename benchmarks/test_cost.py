"""Where `make test`'s time goes, in CPU seconds per test file and per test, measured so that
other work on the machine does not move it.

make test is CPU-bound on a 2-core machine: its wall time is about its CPU seconds over the
cores, so a file's cost is its CPU seconds, not its wall seconds (which a busy machine
stretches). A test's CPU is more than its worker's: the runners, sshd boards, PostgreSQL
servers and warm servers it starts are other processes, some never waited for by pytest. So
each xdist worker moves itself into a cgroup of its own (cgroup v1's cpuacct, or v2 where
this user may make one) at start, which every process it starts inherits, and the cgroup's
CPU counter is read around each test (setup, call and teardown: a module's fixtures are
charged to the test that set them up or tore them down). What a worker spends outside tests
(collection, session fixtures' teardown) is its "outside tests" line.

`python benchmarks/test_cost.py [--top N] [--json F] [PYTEST ARGS...]` runs the suite as
make test does (a worker per core and one more, --dist loadfile) with this module as a plugin
and prints per file CPU and wall seconds, the largest tests, and the totals. Asserts nothing.
"""
from __future__ import annotations

import argparse
import json
import os
import subprocess
import sys
import tempfile
import time
from collections import defaultdict
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parent.parent
OUT_ENV = "ZOBENCH_TEST_COST_DIR"
CGROUPS = (("/sys/fs/cgroup/cpuacct", "cpuacct.usage", "tasks", 1e-9),       # v1: nanoseconds
           ("/sys/fs/cgroup/unified", "cpu.stat", "cgroup.procs", 1e-6),     # v2 beside v1: usage_usec
           ("/sys/fs/cgroup", "cpu.stat", "cgroup.procs", 1e-6))             # v2 alone


class Counter:
    """The CPU seconds of this process and everything it starts from now on."""

    def __init__(self, name: str):
        for root, counter, procs, unit in CGROUPS:
            folder = Path(root) / name
            try:
                folder.mkdir(exist_ok=True)
                (folder / procs).write_text(str(os.getpid()))
            except OSError:
                continue
            self.file, self.unit = folder / counter, unit
            return
        raise SystemExit("test_cost: no cgroup this user may make (cpuacct v1 or v2's cpu.stat): "
                         "the CPU of the processes a test starts cannot be counted")

    def seconds(self) -> float:
        text = self.file.read_text()
        if self.file.name == "cpu.stat":
            text = next(line.split()[1] for line in text.splitlines() if line.startswith("usage_usec"))
        return int(text) * self.unit


_counter: Counter | None = None
_rows: list[dict] = []
_start: tuple[float, float] = (0.0, 0.0)


def pytest_configure(config):
    global _counter, _start
    if os.environ.get(OUT_ENV):     # xdist's controller too: the workers' start-up is charged to it
        _counter = Counter(f"zobench-test-cost-{os.getpid()}")
        _start = (_counter.seconds(), time.perf_counter())


@pytest.hookimpl(hookwrapper=True)
def pytest_runtest_protocol(item, nextitem):
    if _counter is None:
        yield
        return
    cpu, wall = _counter.seconds(), time.perf_counter()
    yield
    _rows.append({"test": item.nodeid, "file": item.nodeid.split("::")[0],
                  "cpu": _counter.seconds() - cpu, "wall": time.perf_counter() - wall})


def pytest_unconfigure(config):
    if _counter is None:
        return
    total = _counter.seconds() - _start[0]
    worker = os.environ.get("PYTEST_XDIST_WORKER", "controller")
    Path(os.environ[OUT_ENV], f"{worker}.json").write_text(json.dumps(
        {"worker": worker, "cpu": total, "wall": time.perf_counter() - _start[1], "tests": _rows}))


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--top", type=int, default=25, help="the largest tests to list")
    ap.add_argument("--json", type=Path, help="write every test's CPU and wall seconds here")
    args, pytest_args = ap.parse_known_args()
    with tempfile.TemporaryDirectory() as d:
        env = {**os.environ, OUT_ENV: d, "PYTHONPATH": str(ROOT)}
        t0 = time.perf_counter()
        workers = (os.cpu_count() or 1) + 1
        rc = subprocess.call([sys.executable, "-m", "pytest", "-p", "benchmarks.test_cost", "-n", str(workers),
                              "--dist", "loadfile", "--no-loadscope-reorder", "-q", *pytest_args], cwd=ROOT, env=env)
        wall = time.perf_counter() - t0
        workers = [json.loads(p.read_text()) for p in sorted(Path(d).glob("*.json"))]
    tests = [t for w in workers for t in w["tests"]]
    if not tests:
        print("test_cost: no test was counted", file=sys.stderr)
        return rc or 1
    files = defaultdict(lambda: [0.0, 0.0, 0])
    for t in tests:
        f = files[t["file"]]
        f[0] += t["cpu"]
        f[1] += t["wall"]
        f[2] += 1
    in_tests = sum(t["cpu"] for t in tests)
    cpu = sum(w["cpu"] for w in workers)
    print(f"\n{'file':44} {'tests':>5} {'CPU s':>8} {'wall s':>8} {'CPU %':>6}")
    for name, (c, w, n) in sorted(files.items(), key=lambda kv: -kv[1][0]):
        print(f"{name:44} {n:5d} {c:8.1f} {w:8.1f} {100 * c / cpu:6.1f}")
    print(f"{'outside tests (start-up, collection, teardown)':44} {'':5} {cpu - in_tests:8.1f} {'':8} "
          f"{100 * (cpu - in_tests) / cpu:6.1f}")
    print(f"{'all':44} {len(tests):5d} {cpu:8.1f} {wall:8.1f}   on {len(workers)} workers, "
          f"{os.cpu_count()} cores: CPU / cores = {cpu / (os.cpu_count() or 1):.0f} s")
    print(f"\nthe {args.top} largest tests by CPU")
    for t in sorted(tests, key=lambda t: -t["cpu"])[:args.top]:
        print(f"{t['cpu']:7.1f} {t['wall']:7.1f}  {t['test']}")
    if args.json:
        args.json.write_text(json.dumps({"wall": wall, "workers": workers}, indent=1))
    return rc


if __name__ == "__main__":
    sys.exit(main())
