"""The shared store at lab scale (docs/store.md): a throwaway PostgreSQL filled with generated
results, then the queries `zobench history` and `zobench compare --baseline-from` make, timed.

The store holds --results results (default 1,000,000): runs of --keys job keys each on --boards
boards (a fingerprint per board), --runs-per-commit runs per commit, a fifth of them on
pull-request branches, the rest on main. Every result is a copy of a real one (a short ci run's
result JSON, made first) with its ids and numbers changed, so rows are the size real ones are.
It prints the tables' sizes, each query's median time over --repeats runs, and the plans'
index use; with --publish, the time `zobench publish` takes to write the store's site (no run
reports: the generated runs have no plans to report) and what the overview page weighs. Asserts
nothing.
"""
from __future__ import annotations

import argparse
import json
import statistics
import sys
import tempfile
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

from harness.stores import measurements  # noqa: E402
from harness.stores import pgstore
from harness.stores.store import Store  # noqa: E402
from testkit.compare_runs import run  # noqa: E402
from testkit.postgres import Postgres  # noqa: E402

TEMPLATE_RUN = ["--suite", "ci", "--runtime", "cpp", "--precision", "fp32", "--method", "full-zo",
                "--set", "train_samples=320"]


def template() -> dict:
    """A real result of a short ci run: what every generated row copies."""
    with tempfile.TemporaryDirectory() as d:
        store = Store(Path(d))
        run_id = run(store, TEMPLATE_RUN)
        return store.results(run_id)[0]


def fill(conn, result: dict, boards: int, keys: int, runs: int, per_commit: int) -> None:
    """runs runs of keys results each, generated inside the server (generate_series): a run's
    board is its number modulo boards, its commit its number over per_commit times boards."""
    from psycopg.types.json import Jsonb

    # the fingerprint's id as pgstore.fingerprint_id makes it: sha256 of the facts' sorted JSON
    conn.execute("INSERT INTO fingerprints SELECT encode(sha256(convert_to('{\"cpu_model\": \"board ' || b || '\"}', "
                 "'UTF8')), 'hex'), jsonb_build_object('cpu_model', 'board ' || b) FROM generate_series(0, %s - 1) b",
                 (boards,))
    conn.execute("CREATE TEMP TABLE board AS SELECT b, fingerprint FROM generate_series(0, %s - 1) b "
                 "JOIN fingerprints ON facts->>'cpu_model' = 'board ' || b", (boards,))
    conn.execute(
        "INSERT INTO runs SELECT 'run-' || g, timestamptz '2024-01-01' + g * interval '1 minute', 'ci', "
        "md5('commit-' || (g / (%s * %s))), CASE WHEN g %% 5 = 4 THEN 'pr-' || (g / 5) ELSE 'main' END, "
        "'{\"jobs\": []}'::jsonb FROM generate_series(0, %s - 1) g", (per_commit, boards, runs))
    conn.execute(
        "INSERT INTO results SELECT 'run-' || g, 'job-' || k, "
        "'lenet5/fashion-mnist key-' || k || ' fp32 cpp board-' || (g %% %s) || ' threads=1', "
        "'board-' || (g %% %s), board.fingerprint, 'ok', 0.0015 * (1 + 0.05 * random()), "
        "20000000 + (random() * 1000)::int, NULL, 0.7 + 0.01 * random(), 0.0, "
        "timestamptz '2024-01-01' + g * interval '1 minute', "
        "%s || jsonb_build_object('started_at', g::text) "
        "FROM generate_series(0, %s - 1) g JOIN board ON board.b = g %% %s, generate_series(0, %s - 1) k",
        (boards, boards, Jsonb(result), runs, boards, keys))
    conn.execute("INSERT INTO series SELECT DISTINCT job_key, fingerprint, target FROM results")
    conn.execute("ANALYZE")


def timed(fn, repeats: int) -> float:
    times = []
    for _ in range(repeats):
        t0 = time.perf_counter()
        fn()
        times.append(time.perf_counter() - t0)
    return statistics.median(times)


def publish(shared, compare_last: int) -> None:
    """zobench publish of the whole store, once (it reads every result's row), timed."""
    from harness.analysis import site
    from harness.analysis.compare import ESTIMATOR, THRESHOLD

    with tempfile.TemporaryDirectory() as d:
        t0 = time.perf_counter()
        wrote = site.publish(site.SharedSource(shared), Path(d), THRESHOLD, ESTIMATOR, 0, compare_last)
        seconds = time.perf_counter() - t0
        keys = [f.stat().st_size for f in (Path(d) / "data" / "keys").iterdir()]
        plotly = (Path(d) / "plotly.min.js").stat().st_size
    print(f"  publish: {seconds:.0f} s; {wrote['series']:,} series, {wrote['compares']} compare views; the overview "
          f"loads {wrote['overview_bytes'] / 2 ** 20:.2f} MiB, a key's page {statistics.median(keys) / 1024:.0f} KiB "
          f"(median) of data and {plotly / 2 ** 20:.1f} MiB of Plotly once")


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--results", type=int, default=1_000_000)
    ap.add_argument("--boards", type=int, default=200)
    ap.add_argument("--keys", type=int, default=25)
    ap.add_argument("--runs-per-commit", type=int, default=2)
    ap.add_argument("--repeats", type=int, default=5)
    ap.add_argument("--publish", action="store_true", help="also time zobench publish of the whole store")
    ap.add_argument("--compare-last", type=int, default=20, help="--publish's compare views a branch (default 20)")
    args = ap.parse_args()
    runs = args.results // args.keys
    print(f"template: a real ci result; generating {runs * args.keys:,} results ({runs:,} runs of {args.keys} keys "
          f"on {args.boards} boards)", flush=True)
    result = template()
    pg = Postgres()
    try:
        url = pg.new_database()
        with pgstore.SharedStore(url) as shared:
            t0 = time.perf_counter()
            with shared.conn.transaction():
                fill(shared.conn, result, args.boards, args.keys, runs, args.runs_per_commit)
            print(f"filled in {time.perf_counter() - t0:.0f} s; result JSON {len(json.dumps(result)):,} bytes as text")
            for table in ("runs", "results", "fingerprints"):
                size, rows = shared.conn.execute(
                    f"SELECT pg_total_relation_size('{table}'), (SELECT count(*) FROM {table})").fetchone()
                print(f"  {table:13} {rows:>10,} rows  {size / 2 ** 20:>9,.0f} MiB with indexes and TOAST")
            key = "key-7 fp32 cpp board-13 "
            since = shared.conn.execute("SELECT git_commit FROM runs WHERE run_id = %s",
                                        (f"run-{runs * 3 // 4}",)).fetchone()[0]
            # the current side of a CI compare: one board's 25 keys, as measurements
            cur = {}
            for k in range(args.keys):
                r = {**result, "job": {**result["job"], "target": "board-13", "job_id": f"job-{k}"}}
                m = measurements.from_results([("now", r)])
                (only,) = m.values()
                only.key = f"lenet5/fashion-mnist key-{k} fp32 cpp board-13 threads=1"
                only.fingerprint = {"cpu_model": "board 13"}
                cur[only.key] = only
            cases = {
                "history KEY --target T (whole series)": lambda: shared.history([key], "board-13", None, None),
                "history KEY --since REF": lambda: shared.history([key], None, since[:8], None),
                "history --target T (25 keys)": lambda: shared.history([], "board-13", None, None),
                "compare --baseline-from (25 keys, last 5 of main)": lambda: shared.baseline(cur, "main", 5, []),
            }
            for name, fn in cases.items():
                fn()    # warm: the first read loads pages from disk
                print(f"  {name:52} {1e3 * timed(fn, args.repeats):9.1f} ms (median of {args.repeats})")
            sql, params = shared.history_query([key], "board-13", None, None)
            plan = shared.conn.execute("EXPLAIN " + sql, params).fetchall()
            print("  history KEY --target T, its plan:\n" + "\n".join(f"    {line[0]}" for line in plan))
            if args.publish:
                publish(shared, args.compare_last)
    finally:
        pg.stop()
    return 0


if __name__ == "__main__":
    sys.exit(main())
