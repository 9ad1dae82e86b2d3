"""A pool's scheduler at farm scale, simulated: N boards whose jobs take a fixed time.

harness/execution/pool.py runs here as it runs a real farm (its queue, its member threads, the
fingerprint judge, every result written to a real store as it ends); only the board is a
stand-in: reaching one costs nothing, and its job sleeps JOB_S and returns a valid result. So
the controller's CPU per job and the wall time over the ideal (jobs x JOB_S / N), per job, are
the scheduler's own cost, which this prints for each farm size, and for a run where a quarter of the members die mid-job (each
dies in its first job, then cannot be reached): no job may be lost, and none may finish twice.

    python benchmarks/pool_scale.py [--boards 1,4,16,64,256] [--jobs-per-board 4] [--job-s 0.2]
    python benchmarks/pool_scale.py --real [--epochs 2] [--train-samples 30000]
    python benchmarks/pool_scale.py ... --json docs/targets/pool_scale.json   # the docs' record
    python benchmarks/pool_scale.py --doc docs/targets/pool_scale.json        # its tables

--real measures the real thing instead: two sshd boards on loopback, each pinned to one core of
this machine, as one pool against one such board alone: every Table 1 cell of paper-fmnist on the
C++ binary for a few epochs, and a grid tune of 8 trials (also as two tune processes, one a board,
sharing one study in a real PostgreSQL); each side's wall time, and whether the two sides trained
the same (the cells' weights, INT8 bit for bit and FP32 too, on one thread a job; the trials'
validation accuracies).

Prints a table; asserts nothing but the faults' bookkeeping (every job once).
"""
from __future__ import annotations

import argparse
import contextlib
import io
import json
import platform
import statistics
import sys
import tempfile
import time
from collections import Counter
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

from rich.console import Console  # noqa: E402

from harness.boards import lease  # noqa: E402
from harness.boards.transport import Stop, TransportError  # noqa: E402
from harness.execution import pool  # noqa: E402
from harness.execution.progress import ProgressView  # noqa: E402
from harness.planning.inventory import Target  # noqa: E402
from harness.planning.runs import Job  # noqa: E402
from harness.stores.store import Store  # noqa: E402
from workloads.envinfo import probe  # noqa: E402
from workloads.result import skeleton  # noqa: E402
from workloads.spec import JobSpec  # noqa: E402


class SleepingBoard:
    """A board whose every job sleeps job_s and ends ok; a dying one loses its first job halfway."""

    def __init__(self, target: Target, facts: dict, job_s: float, dies: bool):
        self.target, self.facts, self.job_s, self.dies = target, facts, job_s, dies

    def run(self, job: Job, store, run_id, on_event, terms) -> dict:
        if self.dies:
            time.sleep(self.job_s / 2)
            self.dies = False
            return skeleton(job.spec, {}, "lost", f"{self.target.name}: the connection went away mid-job")
        time.sleep(self.job_s)
        r = skeleton(job.spec, {}, "ok", None)
        return {**r, "steps": 10, "train_seconds": self.job_s, "wall_seconds": self.job_s, "model": {}}


def simulate(boards: int, jobs_per_board: int, job_s: float, dying: float = 0.0) -> dict:
    """One pool run of boards x jobs_per_board jobs; its wall time, the ideal, and the bookkeeping."""
    facts = probe(".")
    dead: set[str] = set()
    members = [Target(name=f"b{i}", host="sim") for i in range(boards)]
    doomed = {m.name for m in members[:int(boards * dying)]}

    @contextlib.contextmanager
    def connected(name, target, prep, store, run_id, view, stop, judge=None):
        if target.name in dead:
            raise TransportError(f"{target.name}: cannot connect: connection refused")
        judge(target, facts)
        yield target, SleepingBoard(target, facts, job_s, target.name in doomed)
        if target.name in doomed:
            dead.add(target.name)

    jobs = [Job(f"sim.{i}", "farm", 3600, JobSpec(job_id=f"sim.{i}", method="full-zo", target="farm").to_dict())
            for i in range(boards * jobs_per_board)]
    finished: Counter = Counter()
    with tempfile.TemporaryDirectory() as tmp:
        store = Store(Path(tmp))
        run_id = store.new_run({"jobs": [j.to_dict() for j in jobs]})
        view = ProgressView({"farm": len(jobs)}, Console(file=io.StringIO()))

        def finish(name: str, result: dict) -> None:
            store.add_result(run_id, result)
            finished[result["job"]["job_id"]] += 1

        farm = Target(name="farm", host="", members=members, attempts=3, drop_after=2)
        before, pool.connected = pool.connected, connected
        try:
            t0, cpu0 = time.perf_counter(), time.process_time()
            pool.run(farm, jobs, None, store, run_id, view, Stop(), finish, lease.Terms(run_id))
            wall, cpu = time.perf_counter() - t0, time.process_time() - cpu0
        finally:
            pool.connected = before
        results = store.results(run_id)
        ok = sum(r["status"] == "ok" for r in results)
        lost = sum(len(r["pool"]["attempts"]) for r in results)
        dropped = view.console.file.getvalue().count("dropped for the rest of this run")
    # every job on the members that live (the dying ones' lost halves overlap the others' work)
    ideal = len(jobs) * job_s / (boards - len(doomed))
    return {"boards": boards, "jobs": len(jobs), "wall": wall, "cpu": cpu, "ideal": ideal, "ok": ok,
            "lost_attempts": lost, "dropped": dropped, "twice": sum(n > 1 for n in finished.values()), "missing": len(jobs) - len(finished)}


def real(epochs: int, train_samples: int) -> dict:
    """The shortened reproduction on a pool of one pinned board and of two, side by side."""
    import os
    import subprocess

    from testkit.sshd import board_toml, client_home, make_farm

    with tempfile.TemporaryDirectory() as tmp:
        root = Path(tmp)
        boards, key = make_farm(root / "sshd", ["p1", "p2"])
        env = {**os.environ, "HOME": str(client_home(root / "home", boards))}
        for core, b in enumerate(boards):       # the board's sessions are sshd's children: they keep its core
            os.sched_setaffinity(b.proc.pid, {core % os.cpu_count()})
        inv = root / "inventory.toml"
        inv.write_text("".join(board_toml(b.name, b, key, root / b.name, runtimes=["cpp", "torch"],
                                                arch=os.uname().machine) for b in boards)
                       + '[targets.one]\nmembers = ["p1"]\n[targets.two]\nmembers = ["p1", "p2"]\n')
        cmd = [sys.executable, "-m", "zobench", "run", "--suite", "paper-fmnist", "--runtime", "cpp", "--no-report",
               "--inventory", str(inv), "--set", f"epochs={epochs}", "--set", f"train_samples={train_samples}",
               "--set", "test_samples=1000"]
        tune = [sys.executable, "-m", "zobench", "tune", "--no-report", "--suite", "paper-fmnist", "--method", "full-zo",
                "--precision", "fp32", "--runtime", "cpp", "--sampler", "grid", "--grid-points", "8", "--trials", "8",
                "--pruner", "none", "--epochs", str(epochs), "--set", f"train_samples={train_samples}",
                "--inventory", str(inv)]
        walls, outcome = {}, {}

        def timed(what: str, name: str, argv: list[str]) -> None:
            results = root / f"r-{what}-{name}"
            t0 = time.perf_counter()
            p = subprocess.run([*argv, "--target", name, "--results", str(results)], env=env, capture_output=True,
                               text=True)
            if p.returncode != 0:
                raise SystemExit(p.stderr[-2000:])
            walls[what, name] = time.perf_counter() - t0
            store = Store(results)
            run_id = store.latest()
            got = store.results(run_id)
            members = Counter(r["pool"]["member"] for r in got)
            if what == "tune":      # each trial's values and validation accuracies
                same = {tuple(t["values"].items()): t["validation_accuracy"] for t in store.run_plan(run_id)["tune"]["trials"]}
            else:                   # each cell's final weights
                same = {r["job"]["job_id"].split(".", 1)[1]: (r["model"] or {}).get("weights_sha256") for r in got}
            outcome[what, name] = (same, members)

        try:
            timed("run", "two", cmd)        # deploys and builds once: not timed
            for what, argv in (("run", cmd), ("tune", tune)):
                for name in ("one", "two"):
                    timed(what, name, argv)
            shared = shared_study(tune, env, root)
        finally:
            for b in boards:
                b.stop()
    out = {"epochs": epochs, "train_samples": train_samples, "cores": os.cpu_count(), "shared": shared}
    for what in ("run", "tune"):
        (a, _), (b, members) = outcome[what, "one"], outcome[what, "two"]
        out[what] = {"one_s": walls[what, "one"], "two_s": walls[what, "two"], "members": dict(sorted(members.items())),
                     "identical": sum(a[k] == b.get(k) for k in a), "of": len(a)}
    return out


def shared_study(tune: list[str], env: dict, root: Path) -> dict:
    """The same grid tune as two `zobench tune` processes at once, one on each board, sharing one
    study in a real PostgreSQL (testkit/postgres.py; Optuna's RDB storage): their wall time, and
    whether each point ran once and both processes took trials."""
    import subprocess

    from testkit.postgres import Postgres

    pg = Postgres()
    try:
        url = pg.new_database()
        t0 = time.perf_counter()
        procs = [subprocess.Popen([*tune, "--storage", url, "--study", "bench", "--target", board, "--results",
                                   str(root / f"r-shared-{board}")], env=env, stdout=subprocess.DEVNULL,
                                  stderr=subprocess.PIPE, text=True) for board in ("p1", "p2")]
        errs = [p.communicate()[1] for p in procs]
        wall = time.perf_counter() - t0
        if any(p.returncode for p in procs):
            raise SystemExit("\n".join(e[-2000:] for e in errs))
    finally:
        pg.stop()
    stores = {board: Store(root / f"r-shared-{board}") for board in ("p1", "p2")}
    trials = {board: s.run_plan(s.latest())["tune"]["trials"] for board, s in stores.items()}
    values = [tuple(t["values"].items()) for ts in trials.values() for t in ts]
    return {"wall_s": wall, "trials": {b: len(ts) for b, ts in trials.items()},
            "each_point_once": len(values) == len(set(values))}


def farm(sizes: list[int], jobs_per_board: int, job_s: float, repeats: int) -> list[dict]:
    """simulate() at each farm size, whole and with a quarter of the members dying: medians."""
    rows = []
    for n in sizes:
        for dying in (0.0, 0.25) if n >= 4 else (0.0,):
            runs = [simulate(n, jobs_per_board, job_s, dying) for _ in range(repeats)]
            r = runs[0]
            rows.append({"boards": n, "dying": dying, "jobs": r["jobs"], "job_s": job_s, "ideal_s": r["ideal"],
                         "wall_s": statistics.median(x["wall"] for x in runs),
                         "cpu_s": statistics.median(x["cpu"] for x in runs),
                         "every_job_once": all(x["ok"] == x["jobs"] and not x["twice"] and not x["missing"]
                                               for x in runs)})
    return rows


def markdown(record: dict) -> str:
    """The tables docs/targets.md shows, from a record this script wrote (--json)."""
    lines = []
    if record.get("farm"):
        lines += ["| boards | jobs | wall s | ideal s | speed-up | controller CPU ms/job | over ideal ms/job | "
                  "a quarter die mid-job |", "|---|---|---|---|---|---|---|---|"]
        for r in record["farm"]:
            serial = r["jobs"] * r["job_s"]
            lines.append(f"| {r['boards']} | {r['jobs']} | {r['wall_s']:.3f} | {r['ideal_s']:.3f} | "
                         f"{serial / r['wall_s']:.1f}x | {1000 * r['cpu_s'] / r['jobs']:.2f} | "
                         f"{1000 * (r['wall_s'] - r['ideal_s']) / r['jobs']:.2f} | "
                         + ("-" if not r["dying"] else "every job once, ok" if r["every_job_once"] else "LOST OR DOUBLED")
                         + " |")
    if record.get("real"):
        r = record["real"]
        if lines:
            lines.append("")
        lines += [f"| two boards, a core each, against one ({r['epochs']} epochs of {r['train_samples']} samples a "
                  "job) | 1 board s | 2 boards s | ratio | jobs per member | identical on both sides |",
                  "|---|---|---|---|---|---|"]
        for what, title in (("run", "paper-fmnist's Table 1 cells on cpp"), ("tune", "a grid tune of 8 trials")):
            x = r[what]
            lines.append(f"| {title} | {x['one_s']:.1f} | {x['two_s']:.1f} | {x['two_s'] / x['one_s']:.2f}x | "
                         f"{', '.join(f'{m} {n}' for m, n in x['members'].items())} | {x['identical']} of {x['of']} |")
        if r.get("shared"):
            x, one = r["shared"], r["tune"]["one_s"]
            lines.append(f"| the same tune as two `zobench tune` processes, one a board, on one PostgreSQL study | "
                         f"{one:.1f} | {x['wall_s']:.1f} | {x['wall_s'] / one:.2f}x | "
                         f"{', '.join(f'{m} {n}' for m, n in x['trials'].items())} | "
                         f"{'each grid point once' if x['each_point_once'] else 'A POINT RAN TWICE'} |")
    return "\n".join(lines) + "\n"


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--boards", default="1,4,16,64,256")
    ap.add_argument("--jobs-per-board", type=int, default=4)
    ap.add_argument("--job-s", type=float, default=0.2)
    ap.add_argument("--repeats", type=int, default=3)
    ap.add_argument("--real", action="store_true", help="two pinned loopback boards against one (minutes)")
    ap.add_argument("--epochs", type=int, default=2)
    ap.add_argument("--train-samples", type=int, default=30000)
    ap.add_argument("--json", type=Path, help="add this run's figures to a record (docs/targets/pool_scale.json)")
    ap.add_argument("--doc", type=Path, help="print the tables of a record, as docs/targets.md shows them")
    args = ap.parse_args()
    if args.doc:
        return print(markdown(json.loads(args.doc.read_text())), end="")
    record = {"real": real(args.epochs, args.train_samples)} if args.real else \
        {"farm": farm([int(x) for x in args.boards.split(",")], args.jobs_per_board, args.job_s, args.repeats)}
    print(markdown(record), end="")
    if args.json:           # kept beside the docs: their tables are this record's (tests/test_pool.py)
        kept = json.loads(args.json.read_text()) if args.json.is_file() else {}
        args.json.write_text(json.dumps({**kept, **record, "machine": platform.processor() or platform.machine(),
                                         "cpu_model": probe(".").get("cpu_model")}, indent=1) + "\n")


if __name__ == "__main__":
    main()
