"""The shared results store on a real PostgreSQL server (testkit/postgres.py): runs written to
it read back equal to the local ones, push is idempotent, concurrent runs keep every result, an
unreachable store is one clear error and loses nothing, and compare takes its baseline from the
main branch's runs in the store."""
import json
import re
import subprocess
import sys

import pytest
from hypothesis import HealthCheck, assume, given, settings, strategies as st

from harness.stores import pgstore
from harness.stores import validity
from harness.stores.store import Store
from testkit import compare_runs
from testkit.runners import REPO, TINY_CPP, cli, script, start, zobench
from testkit.sshd import free_port
from testkit.tools import require

# scripts/ci-local.py, whose commits and dashboard address a test checks
ci_local = script("ci-local.py")

ONE = [*TINY_CPP, "--method", "full-zo"]     # one job of a second


@pytest.fixture
def url(server):
    return server.new_database()


def rows(url: str, sql: str, *args):
    import psycopg
    with psycopg.connect(url) as c:
        return c.execute(sql, args).fetchall()


def test_a_run_with_a_store_reads_back_equal_and_pulls_into_a_fresh_folder(capsys, tmp_path, url):
    r = cli(capsys, "run", "--results", tmp_path / "a", "--no-report", "--store", url, *TINY_CPP)
    assert r.returncode == 0, r.stderr
    local = Store(tmp_path / "a")
    run_id = local.latest()
    assert f"run {run_id} -> store" in r.stderr and "4 results added, 0 updated, 0 unchanged" in r.stderr
    with pgstore.SharedStore(url) as shared:
        assert shared.run_ids() == [run_id]
        assert shared.run_plan(run_id) == local.run_plan(run_id)
        assert shared.results(run_id) == local.results(run_id)
    # the indexed columns are the result's own numbers
    for job_id, step_s, peak, status in rows(url, "SELECT job_id, step_seconds, peak_rss_bytes, status FROM results"):
        (mine,) = [x for x in local.results(run_id) if x["job"]["job_id"] == job_id]
        assert (status, peak) == (mine["status"], mine["memory"]["peak_rss_bytes"])
        assert step_s == pytest.approx(mine["train_seconds"] / mine["steps"], rel=1e-12)
    (branch,) = rows(url, "SELECT branch, git_commit FROM runs")
    assert branch == (local.run_plan(run_id)["git"]["branch"], local.run_plan(run_id)["git"]["commit"])

    r = cli(capsys, "pull", run_id, "--store", url, "--results", tmp_path / "b")
    assert r.returncode == 0 and "4 results written" in r.stderr
    fresh = Store(tmp_path / "b")
    assert fresh.run_plan(run_id) == local.run_plan(run_id) and fresh.results(run_id) == local.results(run_id)
    r = cli(capsys, "pull", run_id, "--store", url, "--results", tmp_path / "b")
    assert "0 results written" in r.stderr
    # a reading command given the store reads the run from it
    r = cli(capsys, "results", "--store", url, "--results", tmp_path / "c", "--format", "json")
    assert r.returncode == 0 and {x["job_id"] for x in json.loads(r.stdout)} == \
        {x["job"]["job_id"] for x in local.results(run_id)}
    r = cli(capsys, "export", "--store", url, "--run", run_id, "--results", tmp_path / "d", "--format", "csv")
    assert r.returncode == 0 and len(r.stdout.strip().splitlines()) == 1 + 4       # a header, a row per key
    assert Store(tmp_path / "d").results(run_id) == local.results(run_id)


def test_pull_never_overwrites_a_newer_local_result_and_refuses_a_damaged_run(capsys, tmp_path, url):
    """A run pushed with one job interrupted, then resumed here (ok): pulling it back keeps the
    local ok result and says so; a result run again elsewhere and pushed (started later) is
    pulled over the older local one; a run whose plan is damaged in the store is one line, exit
    2, and writes nothing."""
    store = Store(tmp_path / "a")
    first = compare_runs.made_up_result(10.0, repeat=0)
    broken = {**compare_runs.made_up_result(10.0, repeat=1), "status": "interrupted", "error": "interrupted by SIGINT"}
    run_id = compare_runs.made_up_run(store, [first, broken])
    assert cli(capsys, "push", run_id, "--store", url, "--results", tmp_path / "a").returncode == 0
    resumed = {**compare_runs.made_up_result(10.5, repeat=1), "started_at": "2026-01-01T01:00:00+00:00"}
    store.add_result(run_id, resumed)
    r = cli(capsys, "pull", run_id, "--store", url, "--results", tmp_path / "a")
    assert r.returncode == 0 and r.stderr.strip() == (
        f"run {run_id} -> {store.runs / run_id}: 0 results written; kept 1 local results newer than the store's "
        f"({resumed['job']['job_id']}): push them with zobench push {run_id}")
    assert {x["job"]["job_id"]: x for x in store.results(run_id)}[resumed["job"]["job_id"]] == resumed
    # elsewhere, the first job was run again later and pushed: that one is newer than the local copy
    again = {**compare_runs.made_up_result(9.5, repeat=0), "started_at": "2026-01-02T00:00:00+00:00"}
    other = Store(tmp_path / "b")
    assert cli(capsys, "pull", run_id, "--store", url, "--results", tmp_path / "b").returncode == 0
    other.add_result(run_id, again)
    assert cli(capsys, "push", run_id, "--store", url, "--results", tmp_path / "b").returncode == 0
    r = cli(capsys, "pull", run_id, "--store", url, "--results", tmp_path / "a")
    assert "1 results written; kept 1 local" in r.stderr
    assert {x["job"]["job_id"]: x for x in store.results(run_id)}[again["job"]["job_id"]] == again
    # a damaged row, the plan whole (issue 47): the whole results are pulled, the row is named, exit 2;
    # history names it too rather than chart its columns
    import psycopg
    with psycopg.connect(url) as c:
        c.execute("UPDATE results SET result = '{\"junk\": 1}'::jsonb WHERE job_id = %s", (first["job"]["job_id"],))
    r = cli(capsys, "pull", run_id, "--store", url, "--results", tmp_path / "d")
    assert r.returncode == 2 and "Traceback" not in r.stderr
    assert f"the row of run {run_id} job {first['job']['job_id']} is damaged" in r.stderr
    assert r.stderr.strip().splitlines()[-1].startswith(f"zobench: error: pull: 1 damaged row in the store left out (run {run_id}")
    assert [x["job"]["job_id"] for x in Store(tmp_path / "d").results(run_id)] == [resumed["job"]["job_id"]]
    r = cli(capsys, "history", "--store", url)
    assert r.returncode == 2 and f"history: 1 row of the store is damaged, their results no results (run {run_id} job " in r.stderr
    # a damaged plan (a hand edit, a bad migration): nothing is written
    with psycopg.connect(url) as c:
        c.execute("UPDATE runs SET plan = '[]'::jsonb")
        c.execute("UPDATE results SET result = '{\"job\": 3}'::jsonb WHERE job_id = %s", (first["job"]["job_id"],))
    r = cli(capsys, "pull", run_id, "--store", url, "--results", tmp_path / "c")
    assert r.returncode == 2 and r.stderr.strip().endswith(
        f"run {run_id} in store {pgstore.shown(url)} is damaged: its plan: not a JSON object with a list of jobs; "
        "nothing pulled")
    assert not (tmp_path / "c" / "runs" / run_id).exists() and "Traceback" not in r.stderr


def test_a_fit_run_is_pushed_with_its_probes(capsys, tmp_path, url):
    r = cli(capsys, "fit", "--results", tmp_path, "--budget", "64M", "--store", url)
    if "nothing is concluded" in r.stderr:
        pytest.skip("no memory cgroup here: under RLIMIT_AS the probe fails rather than ending oom")
    assert r.returncode == 1 and "too small" in r.stderr      # nothing fits 64 MiB; the run is kept all the same
    run_id = Store(tmp_path).latest()
    with pgstore.SharedStore(url) as shared:
        assert shared.run_ids() == [run_id] and shared.run_plan(run_id)["fit"]["budget_bytes"] == 64 << 20
        assert [x["status"] for x in shared.results(run_id)] == [x["status"] for x in Store(tmp_path).results(run_id)]


def test_push_twice_changes_nothing_and_a_resumed_result_updates_its_row(capsys, tmp_path, url):
    store = Store(tmp_path)
    run_id = compare_runs.made_up_run(store, [compare_runs.made_up_result(10.0, repeat=i) for i in range(3)])
    r = cli(capsys, "push", run_id, "--store", url, "--results", tmp_path, "--branch", "main")
    assert r.returncode == 0 and "3 results added, 0 updated, 0 unchanged" in r.stderr
    before = rows(url, "SELECT run_id, job_id, result, pushed_at FROM results JOIN runs USING (run_id) ORDER BY job_id")
    r = cli(capsys, "push", run_id, "--store", url, "--results", tmp_path, "--branch", "main")
    assert "0 results added, 0 updated, 3 unchanged" in r.stderr
    assert rows(url, "SELECT run_id, job_id, result, pushed_at FROM results JOIN runs USING (run_id) "
                     "ORDER BY job_id") == before
    # the run resumed since: one job's result is new
    changed = compare_runs.made_up_result(12.0, repeat=1)
    store.add_result(run_id, changed)
    r = cli(capsys, "push", run_id, "--store", url, "--results", tmp_path, "--branch", "main")
    assert "0 results added, 1 updated, 2 unchanged" in r.stderr
    assert rows(url, "SELECT count(*) FROM results") == [(3,)]
    assert rows(url, "SELECT result FROM results WHERE job_id = %s", changed["job"]["job_id"]) == [(changed,)]
    # --branch moves a pushed run, and says so; without it the run keeps the branch it has
    r = cli(capsys, "push", run_id, "--store", url, "--results", tmp_path, "--branch", "pr-7")
    assert r.returncode == 0 and "3 unchanged; moved from branch 'main' to 'pr-7'" in r.stderr
    r = cli(capsys, "push", run_id, "--store", url, "--results", tmp_path)
    assert "moved" not in r.stderr and rows(url, "SELECT branch FROM runs") == [("pr-7",)]
    cli(capsys, "push", run_id, "--store", url, "--results", tmp_path, "--branch", "main")
    assert rows(url, "SELECT branch FROM runs") == [("main",)]


def test_two_runs_at_once_keep_every_result(tmp_path, url):
    procs = [start("run", "--results", tmp_path / side, "--no-report", "--store", url, *ONE) for side in "ab"]
    for p in procs:
        out, err = p.communicate(timeout=600)
        assert p.returncode == 0, err
    local = {side: Store(tmp_path / side) for side in "ab"}
    want = {(s.latest(), r["job"]["job_id"]) for s in local.values() for r in s.results(s.latest())}
    got = set(rows(url, "SELECT run_id, job_id FROM results"))
    assert got == want and len(want) == 2 * len(local["a"].results(local["a"].latest()))


def test_an_unreachable_store_is_one_error_and_the_run_keeps_its_results(capsys, tmp_path):
    nowhere = f"postgresql://zobench@127.0.0.1:{free_port()}/db"
    store = Store(tmp_path)
    run_id = compare_runs.made_up_run(store, [compare_runs.made_up_result(10.0)])
    r = cli(capsys, "push", run_id, "--store", nowhere, "--results", tmp_path)
    assert r.returncode == 2 and "cannot connect" in r.stderr and "Traceback" not in r.stderr
    assert len(r.stderr.strip().splitlines()) == 1

    before = set(store.run_ids())
    r = cli(capsys, "run", "--results", tmp_path, "--no-report", "--store", nowhere, *ONE)
    (run_id,) = set(store.run_ids()) - before
    assert r.returncode == 2 and "Traceback" not in r.stderr
    assert [x["status"] for x in store.results(run_id)] == ["ok"]        # kept, all of it
    assert "the run goes on" in r.stderr.splitlines()[0]                  # said before the run
    assert f"push them later with zobench push {run_id} --store {nowhere} --results {tmp_path}" in r.stderr
    r = cli(capsys, "results", "--store", "mysql://x", "--results", tmp_path)
    assert r.returncode == 2 and "expected a PostgreSQL URL" in r.stderr


@pytest.mark.parametrize("form", ["url", "query", "keyword", "store=", "PGPASSWORD", "pgpass"])
def test_a_password_is_never_printed_written_nor_pushed_in_any_form_libpq_takes(capsys, tmp_path, url, monkeypatch, form):
    """A real run pushed to a real store (trust auth: the password is taken and not needed), and
    an unreachable one, with the password in each form libpq takes: it is in no output, no file
    the run wrote and no row of the store."""
    secret = "hunter2-" + form.lower().strip("=")
    base = url.rpartition("/")
    db = base[2]
    host_port = url.split("@")[1].split("/")[0]
    host, port = host_port.split(":")
    given = {"url": f"postgresql://zobench:{secret}@{host_port}/{db}",
             "query": f"postgresql://zobench@{host_port}/{db}?password={secret}&sslmode=disable",
             "keyword": f"host={host} port={port} user=zobench dbname={db} password={secret}",
             "store=": f"postgresql://zobench:{secret}@{host_port}/{db}"}.get(form, url)
    if form == "PGPASSWORD":
        monkeypatch.setenv("PGPASSWORD", secret)
    if form == "pgpass":
        (tmp_path / "pgpass").write_text(f"{host}:{port}:{db}:zobench:{secret}\n")
        (tmp_path / "pgpass").chmod(0o600)
        monkeypatch.setenv("PGPASSFILE", str(tmp_path / "pgpass"))
    store_args = [f"--store={given}"] if form == "store=" else ["--store", given]
    monkeypatch.setattr(sys, "argv", ["zobench", "run", "--results", str(tmp_path / "res"), "--no-report",
                                      *store_args, *ONE])      # what run.json keeps
    r = cli(capsys, *sys.argv[1:])
    assert r.returncode == 0, r.stderr
    said = r.stdout + r.stderr
    unreachable = given.replace(port, str(free_port())) if given != url else url.replace(port, str(free_port()))
    r = cli(capsys, "push", Store(tmp_path / "res").latest(), "--results", tmp_path / "res", "--store", unreachable)
    assert r.returncode == 2 and "cannot connect" in r.stderr
    said += r.stdout + r.stderr
    written = [f for f in (tmp_path / "res").rglob("*") if f.is_file() and secret.encode() in f.read_bytes()]
    stored = rows(url, "SELECT plan::text FROM runs") + rows(url, "SELECT result::text FROM results")
    assert secret not in said and written == [] and not any(secret in text for (text,) in stored)
    assert rows(url, "SELECT count(*) FROM results") == [(1,)]      # it was pushed
    argv = " ".join(Store(tmp_path / "res").run_plan(Store(tmp_path / "res").latest())["argv"])
    assert {"url": f"postgresql://zobench@{host_port}/{db}", "store=": f"--store=postgresql://zobench@{host_port}/{db}",
            "keyword": f"host={host} port={port} user=zobench dbname={db}"}.get(form, "--store") in argv


@pytest.mark.parametrize("char", ["?", "#", "/", "@"])
def test_a_password_holding_a_url_delimiter_is_in_no_line_file_nor_row(tmp_path, url, char):
    """A password holding '?' or '#' (libpq reads the user info to the last '@' and connects),
    '/' (it cannot connect) or an unescaped '@' (the part after it is read as the host): a real
    run to a real store, as a separate process, and a push to a port nobody listens on. No part
    of the password is printed, written to the results folder or to the store's rows, and
    run.json's command line names the store without it."""
    host_port, db = url.split("@")[1].split("/")
    secret = f"p{char}TailSecret9"
    given = f"postgresql://zobench:{secret}@{host_port}/{db}"
    run = zobench("run", "--results", tmp_path / "res", "--no-report", "--store", given, *ONE)
    assert run.returncode == (0 if char in "?#" else 2), run.stderr
    store = Store(tmp_path / "res")
    unreachable = given.replace(host_port.split(":")[1], str(free_port()))
    push = zobench("push", store.latest(), "--results", tmp_path / "res", "--store", unreachable)
    assert push.returncode == 2 and "cannot connect" in push.stderr, push.stderr
    said = run.stdout + run.stderr + push.stdout + push.stderr
    written = [f for f in (tmp_path / "res").rglob("*") if f.is_file() and b"TailSecret" in f.read_bytes()]
    pushed = char in "?#"       # where libpq connects (elsewhere the store's tables were never made)
    stored = rows(url, "SELECT plan::text FROM runs") + rows(url, "SELECT result::text FROM results") if pushed else []
    assert "TailSecret" not in said and written == [] and not any("TailSecret" in t for (t,) in stored), said
    assert len(stored) == (2 if pushed else 0)
    assert f"postgresql://zobench@{host_port}/{db}" in store.run_plan(store.latest())["argv"]


def test_the_schema_is_migrated_once_and_a_newer_one_is_refused(url):
    with pgstore.SharedStore(url):
        pass
    with pgstore.SharedStore(url) as s:
        assert s.migrate() == len(pgstore.MIGRATIONS)
    assert rows(url, "SELECT version FROM zobench_schema") == [(v,) for v in range(1, len(pgstore.MIGRATIONS) + 1)]
    import psycopg
    with psycopg.connect(url) as c:
        c.execute("INSERT INTO zobench_schema VALUES (99)")
    with pytest.raises(Exception, match="its schema is version 99, newer than this zobench's"):
        pgstore.SharedStore(url)


def test_compare_takes_its_baseline_from_the_main_branchs_runs(capsys, tmp_path, url):
    """Made-up runs of known samples: three main-branch runs at 10 ms a step pooled as the
    baseline (and a feature-branch run at 30 ms that must not be), against a current run at
    12 ms (a 20% slowdown: exit 1) and one at 10 ms (exit 0)."""
    store = Store(tmp_path)

    def made(ms: float, branch: str | None) -> str:
        made.n += 1
        run_id = compare_runs.made_up_run(store, [compare_runs.made_up_result(ms * (1 + 0.002 * i), repeat=i)
                                                  for i in range(5)], f"2026-01-01T00:00:{made.n:02d}+00:00")
        if branch:
            assert cli(capsys, "push", run_id, "--store", url, "--results", tmp_path, "--branch", branch).returncode == 0
        return run_id

    made.n = 0
    mains = [made(10.0, "main") for _ in range(3)]
    made(30.0, "feature")
    slow, same = made(12.0, None), made(10.0, None)
    r = cli(capsys, "compare", "--baseline-from", url, "--branch", "main", slow, "--results", tmp_path,
            "--format", "markdown")
    assert r.returncode == 1, r.stdout + r.stderr
    assert "regressed" in r.stdout and all(m in r.stdout for m in mains)
    r = cli(capsys, "compare", "--baseline-from", url, "--branch", "main", same, "--results", tmp_path)
    assert r.returncode == 0, r.stdout + r.stderr
    r = cli(capsys, "compare", "--baseline-from", url, "--branch", "main", "--last", "1", same, "--results", tmp_path)
    assert r.returncode == 0 and mains[-1] in r.stdout and mains[0] not in r.stdout
    r = cli(capsys, "compare", "--baseline-from", url, "--branch", "nowhere", same, "--results", tmp_path)
    assert r.returncode == 2 and "no ok result" in r.stderr
    # two runs of the store compared from a folder that has neither: pulled first
    r = cli(capsys, "compare", "--store", url, f"{mains[0]},{mains[1]}", mains[2], "--results", tmp_path / "elsewhere")
    assert r.returncode == 0 and "unchanged" in r.stdout
    assert sorted(Store(tmp_path / "elsewhere").run_ids()) == sorted(mains)


def test_a_run_with_a_test_only_setting_is_marked_and_never_pooled_into_a_baseline_or_history(capsys, tmp_path, url):
    """Issue 60: a run made with --set inject_slowdown (the docs' way to fake a slowdown) keeps the
    real job's key. Pushed to main as its newest run, it is marked in the store, compare
    --baseline-from pools main's real runs only (the newest of them under --last 1), and history
    leaves it out of the series and names it apart; a store from before the mark gets it by
    migration."""
    store = Store(tmp_path)
    commits = [f"{i:x}" * 40 for i in range(1, 5)]

    def made(ms: float, n: int, **hyper) -> str:
        run_id = compare_runs.made_up_run(store, [compare_runs.made_up_result(ms * (1 + 0.002 * i), repeat=i,
                                                                              hyper=hyper) for i in range(5)],
                                          f"2026-01-01T00:00:{n:02d}+00:00",
                                          {"commit": commits[n], "branch": "main", "dirty": False})
        assert cli(capsys, "push", run_id, "--store", url, "--results", tmp_path, "--branch", "main").returncode == 0
        return run_id

    mains = [made(10.0, n) for n in range(2)]
    faked = made(20.0, 2, inject_slowdown=1.0)
    crashed = made(10.0, 3, fault="crash@full-bp")     # a fault aimed at another method: its numbers look real
    assert sorted(set(rows(url, "SELECT DISTINCT run_id, array_to_string(test_only, ',') FROM results"))) == sorted(
        [(m, "") for m in mains] + [(faked, "inject_slowdown"), (crashed, "fault")])
    same = compare_runs.made_up_run(store, [compare_runs.made_up_result(10.0 * (1 + 0.002 * i), repeat=i)
                                            for i in range(5)], "2026-01-01T00:00:30+00:00")
    r = cli(capsys, "compare", "--baseline-from", url, "--branch", "main", "--last", "1", same, "--results", tmp_path)
    assert r.returncode == 0 and mains[-1] in r.stdout and faked not in r.stdout and crashed not in r.stdout, r.stdout
    r = cli(capsys, "history", "--store", url, "--format", "json")
    assert r.returncode == 0, r.stderr
    (s,) = json.loads(r.stdout)
    assert [p["first_run"] for p in s["points"]] == mains
    assert r.stderr == ("zobench: history: note: left out 2 runs with a test-only setting, never a point of a "
                        "series: " + ", ".join(sorted([f"{faked} (inject_slowdown)", f"{crashed} (fault)"])) + "\n")
    import psycopg
    with psycopg.connect(url) as c:          # the store as the version before the mark left it
        c.execute("ALTER TABLE results DROP COLUMN test_only, DROP COLUMN instructions_per_step")
        c.execute("DELETE FROM zobench_schema WHERE version >= 4")
    with pgstore.SharedStore(url):
        pass
    assert sorted(rows(url, "SELECT DISTINCT run_id, array_to_string(test_only, ',') FROM results "
                            "WHERE test_only <> '{}'")) == sorted([(faked, "inject_slowdown"), (crashed, "fault")])


def test_history_finds_a_slowdown_at_its_commit_and_nothing_in_the_same_code(capsys, tmp_path, server):
    """Made-up results over six commits of main, five repeats each spread as a quiet machine's
    are: in one series 50% slower from the fourth commit on, in the other the same throughout.
    History finds the fourth commit and nothing in the same code; compare --baseline-from takes
    the same code's last main runs as its baseline, and a current run of the same code passes
    (exit 0) where a slower one fails (exit 1). Statistics on samples of known properties: real
    timings move with whatever else the machine runs (make bench measures the gate on them,
    benchmarks/compare_noise.py); the next test runs the same commands on real runs."""
    slow_url, same_url = server.new_database(), server.new_database()
    store = Store(tmp_path / "results")
    commits = [f"{i:x}" * 40 for i in range(1, 7)]

    def made_up(ms: float, n: int, branch: str, commit: str) -> str:
        return compare_runs.made_up_run(store, [compare_runs.made_up_result(ms * (1 + 0.004 * i), repeat=i)
                                                for i in (3, 0, 4, 1, 2)], f"2026-01-01T00:00:{n:02d}+00:00",
                                        {"commit": commit, "branch": branch, "dirty": False})

    for i, commit in enumerate(commits):
        for n, (url, ms) in enumerate(((slow_url, 15.0 if i >= 3 else 10.0), (same_url, 10.0))):
            run_id = made_up(ms, 2 * i + n, "main", commit)
            assert cli(capsys, "push", run_id, "--store", url, "--results", store.root).returncode == 0
    r = cli(capsys, "history", "--store", slow_url, "--format", "json", "--out", tmp_path / "chart", "--threshold", "25")
    assert r.returncode == 0, r.stderr
    (s,) = json.loads(r.stdout)
    assert [p["commit"] for p in s["points"]] == commits and all(p["results"] == 5 for p in s["points"])
    assert [(c["metric"], c["commit"]) for c in s["changes"]] == [("step_time", commits[3])]
    assert s["changes"][0]["change"] == pytest.approx(0.5)
    assert (tmp_path / "chart" / "history.png").is_file()
    r = cli(capsys, "history", "--store", same_url, "--format", "json", "--threshold", "25")
    (s,) = json.loads(r.stdout)
    assert len(s["points"]) == 6 and s["changes"] == []
    r = cli(capsys, "history", "--store", same_url, "--since", commits[4][:8], "--threshold", "25")
    assert r.returncode == 0 and commits[3][:12] not in r.stdout and commits[4][:12] in r.stdout
    assert "no change detected" in r.stdout
    for ms, want in ((10.0, 0), (15.0, 1)):
        current = made_up(ms, 20 + want, "pull-request", "f" * 40)
        r = cli(capsys, "compare", "--baseline-from", same_url, "--branch", "main", current,
                "--results", store.root, "--threshold", "25")
        assert r.returncode == want, r.stdout + r.stderr


def test_real_runs_pushed_by_commit_make_the_history_the_report_and_the_baseline(capsys, tmp_path, server,
                                                                                  monkeypatch):
    """Real short runs of three commits pushed as main: each commit a point of the key's series
    holding its five results (those that ran beside other work counted as loaded, their times
    left out), the history chart written, the report of a run charting its key's history, and
    compare --baseline-from reading the main runs back as the baseline of a current run, whose
    key it compares or calls noisy (which of them is the machine's load: the previous test
    judges made-up samples of known properties)."""
    url = server.new_database()
    inv = compare_runs.solo_inventory(tmp_path)
    commits = [f"{i:x}" * 40 for i in range(1, 4)]
    monkeypatch.setenv("ZOBENCH_BRANCH", "main")

    def run(push: bool) -> str:
        # 20 steps a job rather than the gate's 100: what is checked is where the results go, not their spread
        r = cli(capsys, "run", "--results", tmp_path / "results", "--no-report", "--inventory", inv,
                *(["--store", url] if push else []), *compare_runs.SOLO, "--set", "train_samples=640")
        assert r.returncode == 0, r.stderr
        return Store(tmp_path / "results").latest()

    for commit in commits:
        monkeypatch.setenv("ZOBENCH_COMMIT", commit)
        last = run(True)
    r = cli(capsys, "history", "--store", url, "--format", "json", "--out", tmp_path / "chart")
    assert r.returncode == 0, r.stderr
    (s,) = json.loads(r.stdout)
    # five results a commit; those that ran beside other work are counted, not sampled
    assert [p["commit"] for p in s["points"]] == commits and all(
        p["results"] == 5 == len(p["samples"].get("step_time", [])) + p["loaded"]
        and len(p["samples"]["peak_memory"]) == 5 for p in s["points"])
    assert (tmp_path / "chart" / "history.png").is_file()
    r = cli(capsys, "report", "--results", tmp_path / "results", "--run", last, "--store", url)
    assert r.returncode == 0, r.stderr
    report = Store(tmp_path / "results").runs / last / "report"
    assert (report / "history.png").is_file() and "history.png" in (report / "report.md").read_text()
    monkeypatch.delenv("ZOBENCH_BRANCH")
    monkeypatch.setenv("ZOBENCH_COMMIT", "f" * 40)
    current = run(False)
    r = cli(capsys, "compare", "--baseline-from", url, "--branch", "main", current, "--results", tmp_path / "results",
            "--format", "json")
    (v,) = json.loads(r.stdout)["verdicts"]
    assert v["status"] in ("unchanged", "improved", "regressed", "noisy"), v
    assert r.returncode == {"unchanged": 0, "improved": 0, "regressed": 1, "noisy": 3}[v["status"]], r.stderr


def test_a_fingerprint_change_starts_a_new_series_said_so(capsys, tmp_path, url):
    store = Store(tmp_path)
    for n, kernel in enumerate(("6.1.0", "6.1.0", "6.12.0")):
        run_id = compare_runs.made_up_run(store, [compare_runs.made_up_result(10.0, repeat=i, kernel=kernel)
                                                  for i in range(3)], f"2026-01-01T00:00:{n:02d}+00:00")
        assert cli(capsys, "push", run_id, "--store", url, "--results", tmp_path).returncode == 0
    r = cli(capsys, "history", "--store", url, "--format", "json")
    old, new = json.loads(r.stdout)
    assert old["key"] == new["key"] and old["fingerprint"] != new["fingerprint"]
    assert len(old["points"]) == 2 and len(new["points"]) == 1       # never joined
    assert old["split_from"] == "" and new["split_from"] == "kernel '6.1.0' -> '6.12.0'"
    r = cli(capsys, "history", "--store", url)
    assert "new series: the fingerprint changed (kernel '6.1.0' -> '6.12.0')" in r.stdout
    r = cli(capsys, "history", "--store", url, "nothing-like-this")
    assert r.returncode == 2 and "no ok result" in r.stderr
    (tmp_path / "a-file").write_text("kept")      # --out names a file: one line, the file untouched
    r = cli(capsys, "history", "--store", url, "--out", tmp_path / "a-file")
    assert r.returncode == 2 and r.stderr.strip().splitlines()[-1] == \
        f"zobench: error: history --out: {tmp_path / 'a-file'} is a file, not a folder"
    assert (tmp_path / "a-file").read_text() == "kept"
    r = cli(capsys, "history", "--store", url, "--out", "/proc/self")     # a system folder: no traceback
    (line,) = r.stderr.strip().splitlines()[-1:]
    assert r.returncode == 2 and "Traceback" not in r.stderr and line.startswith("zobench: error: history --out: /proc/")
    assert "is a system folder" in line


def test_the_store_comes_from_the_environment_or_the_users_config(capsys, tmp_path, url, monkeypatch):
    home = tmp_path / "home"
    (home / ".config/zobench").mkdir(parents=True)
    monkeypatch.setenv("HOME", str(home))
    monkeypatch.delenv("ZOBENCH_STORE", raising=False)
    store = Store(tmp_path / "results")
    run_id = compare_runs.made_up_run(store, [compare_runs.made_up_result(10.0)])
    r = cli(capsys, "push", run_id, "--results", store.root)
    assert r.returncode == 2 and "no store" in r.stderr
    config = home / ".config/zobench/config.toml"
    config.write_text("[store]\nuri = 'x'\n")
    r = cli(capsys, "push", run_id, "--results", store.root)
    assert r.returncode == 2 and f"{config}: store.uri: unknown key" in r.stderr
    config.write_text(f"[store]\nurl = '{url}'\n")
    r = cli(capsys, "push", run_id, "--results", store.root)
    assert r.returncode == 0 and "1 results added" in r.stderr
    monkeypatch.setenv("ZOBENCH_STORE", "mysql://elsewhere")     # the environment comes before the config
    r = cli(capsys, "push", run_id, "--results", store.root)
    assert r.returncode == 2 and "$ZOBENCH_STORE: expected a PostgreSQL URL" in r.stderr


def test_the_ci_workflow_runs_end_to_end_against_a_local_postgresql(tmp_path):
    """scripts/ci-local.py: main's runs pushed, a pull request of the same code passes the gate
    and a slower one fails it, each step's exit code checked by the script itself. The workflow's
    steps are what is tested here, not the gate's power (tests/test_compare.py), and as a shared
    runner's recipe (--instructions): counted instructions per step judge, so the same code is
    exit 0 and 20% more work exit 1 however busy this machine is (judged by time, a runner that
    busy once failed the same code at +36%)."""
    require("initdb")
    r = subprocess.run([sys.executable, "scripts/ci-local.py", "--mains", "1", "--instructions",
                        "--keep-site", tmp_path / "site"], cwd=REPO, capture_output=True, text=True, timeout=900)
    assert r.returncode == 0, r.stdout[-3000:] + r.stderr[-3000:]
    ends = [line for line in r.stdout.splitlines() if line.startswith("== ") and ": exit " in line]
    codes = [line.split(": exit ")[1].split()[0] for line in ends]
    assert codes == ["0", "0", "1"], r.stdout
    # the verdicts and the job rows they judge, whole: pytest's own message cuts a long stdout in the middle
    said = "\n".join(line for line in r.stdout.splitlines() if line.startswith(("| `", "**", "==", "zobench")))
    assert "**✅ pass: all 1 job keys judged, none regressed (exit 0)**" in r.stdout, said
    # the same code's counts: equal, or (seen twice in make test, cause not found; docs/compare.md)
    # a few instructions a step apart, under 0.005%, which the 1% threshold calls unchanged
    assert re.search(r"judged by instructions: unchanged \([+-]0\.00%", r.stdout), said
    assert re.search(r"judged by instructions: regressed \(\+2\d\.\d\d%", r.stdout), said   # one step in 5 more
    # the summary links to the dashboard's compare view of the slower commit, which the site holds:
    # against main's newest commit, the same verdict
    slower, main = ci_local.commit(2), ci_local.commit(0)
    assert f"({ci_local.DASHBOARD}/compare.html?b={slower})" in r.stdout
    pairs = json.loads((tmp_path / "site" / "data" / "compare" / "index.json").read_text())
    assert [main[:12], slower[:12]] in pairs
    view = json.loads((tmp_path / "site" / "data" / "compare" / f"{main[:12]}_{slower[:12]}.json").read_text())
    assert [row["status"] for row in view["rows"]] == ["regressed"] and view["exit_code"] == 1


@pytest.mark.parametrize("why", ["loaded", "throttled"])
def test_results_that_ran_beside_other_work_or_throttled_are_left_out_of_the_change_points(capsys, tmp_path, server, why):
    """Made-up runs over six commits, 30% slower from the fourth on. Measured quietly, that is a
    change at the fourth commit; measured while other work took 95% of the CPU the jobs wanted
    (the gate's "noisy"), or on a board that hit its soft temperature limit during each job, the
    slow results are left out of the change points, and counted."""
    store = Store(tmp_path)

    def series(busy: bool) -> list[dict]:
        db = server.new_database()
        for n, ms in enumerate((10.0, 10.0, 10.0, 13.0, 13.0, 13.0)):
            bad = busy and ms > 10
            results = [compare_runs.made_up_result(ms * (1 + 0.002 * i), repeat=i, threads=1,
                                                   load=compare_runs.load_at(0.95 if bad and why == "loaded" else 0.0))
                       for i in range(5)]
            for r in results:
                r["validity"] = validity.judge([compare_runs.thermal_sample(0x0), compare_runs.thermal_sample(
                    0x80008 if bad and why == "throttled" else 0x0)])
            run_id = compare_runs.made_up_run(store, results, f"2026-01-01T00:00:{n:02d}+00:00")
            assert cli(capsys, "push", run_id, "--store", db, "--results", tmp_path).returncode == 0
        r = cli(capsys, "history", "--store", db, "--format", "json")
        (found,) = json.loads(r.stdout)
        return found, cli(capsys, "history", "--store", db).stdout

    quiet, _ = series(busy=False)
    assert [(c["metric"], c["at"]) for c in quiet["changes"]] == [("step_time", 3)]
    busy, text = series(busy=True)
    assert busy["changes"] == [] and [p[why] if why == "loaded" else p["flagged"] for p in busy["points"]] == [0, 0, 0, 5, 5, 5]
    assert "step_time" not in busy["points"][3]["samples"] and len(busy["points"][3]["samples"]["peak_memory"]) == 5
    assert f"5 (5 {why})" in text
    # the time left out is shown with why, never a blank (issue 60); a quiet point's with its share
    points = [line for line in text.splitlines() if line.startswith("  20")]      # a run id for a commit
    assert len(points) == 6 and all("10.04 (10-10.08) [0% other]" in line for line in points[:3]), text
    assert all(("13.05 [⚠ 90% other: left out]" if why == "loaded" else "13.05 [⚠ throttled: left out]") in line
               for line in points[3:]), text


@pytest.mark.parametrize("damage, said", [
    ("DROP TABLE zobench_schema", "its schema cannot be brought up to date (relation \"runs\" already exists): a table "
                                  "zobench made was dropped or changed by hand; restore it, or use a new database"),
    ("DROP TABLE results", "the shared store: UndefinedTable: relation \"results\" does not exist")])
def test_a_store_damaged_by_hand_is_one_line_and_loses_nothing_local(capsys, tmp_path, url, damage, said):
    store = Store(tmp_path)
    run_id = compare_runs.made_up_run(store, [compare_runs.made_up_result(10.0)])
    assert cli(capsys, "push", run_id, "--store", url, "--results", tmp_path).returncode == 0
    before = sorted((f.name, f.read_bytes()) for f in (store.runs / run_id).rglob("*") if f.is_file())
    import psycopg
    with psycopg.connect(url) as c:
        c.execute(damage)
    for command in (["push", run_id, "--results", tmp_path], ["pull", run_id, "--results", tmp_path], ["history"]):
        r = cli(capsys, *command, "--store", url)
        assert r.returncode == 2 and said in r.stderr and len(r.stderr.strip().splitlines()) == 1, (command, r.stderr)
    assert sorted((f.name, f.read_bytes()) for f in (store.runs / run_id).rglob("*") if f.is_file()) == before


def test_a_result_whose_job_record_was_edited_is_kept_out_of_the_store_and_history(capsys, tmp_path, url):
    """Issue 61, item 11: a local result whose job record was edited (its lr_zo) no longer hashes to
    its spec_sha256: push names it and leaves it out, so history never counts it; a row whose stored
    result was edited the same way in the store is damaged to pull, which leaves it out."""
    from harness.planning.runs import spec_sha256
    store = Store(tmp_path / "a")
    results = [compare_runs.made_up_result(10.0, repeat=i) for i in range(3)]
    for r in results:
        r["spec_sha256"] = spec_sha256(r["job"])
    run_id = compare_runs.made_up_run(store, results, git={"commit": "a" * 40, "branch": "main", "dirty": False})
    edited = store.run_dir(run_id) / f"{results[2]['job']['job_id']}.json"
    text = json.loads(edited.read_text())
    text["job"]["hyper"]["lr_zo"] = 0.5
    edited.write_text(json.dumps(text))
    r = cli(capsys, "push", run_id, "--store", url, "--results", tmp_path / "a")
    assert r.returncode == 0 and f"{edited} is corrupt (its job record is not the spec it ran by: its hyper.lr_zo " \
        "differs" in r.stderr and "2 results added" in r.stderr, r.stderr
    r = cli(capsys, "history", "--store", url, "--format", "json")
    assert r.returncode == 0, r.stderr
    (series,) = json.loads(r.stdout)
    assert [p["results"] for p in series["points"]] == [2]
    import psycopg
    with psycopg.connect(url) as c:
        c.execute("UPDATE results SET result = jsonb_set(result, '{job,method}', '\"full-bp\"') WHERE job_id = %s",
                  (results[1]["job"]["job_id"],))
    r = cli(capsys, "pull", run_id, "--store", url, "--results", tmp_path / "b")
    assert f"job {results[1]['job']['job_id']} is damaged (its job record is not the spec it ran by: its method " \
        "differs" in r.stderr, r.stderr
    assert [x["job"]["job_id"] for x in Store(tmp_path / "b").results(run_id)] == [results[0]["job"]["job_id"]]


@pytest.mark.parametrize("whole", [True, False])
def test_a_row_under_a_job_the_run_never_planned_is_named_by_every_reader(capsys, tmp_path, url, whole):
    """A row added by hand under a job id the run's plan does not hold (a whole result of its own
    job id, or one whose result is no result): pull writes the planned results and exits 2 naming
    it, history and publish refuse in one line naming it; none counts it as a result."""
    store = Store(tmp_path / "a")
    run_id = compare_runs.made_up_run(store, [compare_runs.made_up_result(10.0)])
    assert cli(capsys, "push", run_id, "--store", url, "--results", tmp_path / "a").returncode == 0
    import psycopg
    with psycopg.connect(url) as c:
        c.execute("CREATE TEMP TABLE t AS SELECT * FROM results")
        c.execute("UPDATE t SET job_id = 'ghost.job', result = " + (
            "jsonb_set(result, '{job,job_id}', '\"ghost.job\"')" if whole else "'[1]'::jsonb"))
        c.execute("INSERT INTO results SELECT * FROM t")
    named = f"run {run_id} job ghost.job: " + (pgstore.UNPLANNED if whole else "")
    r = cli(capsys, "pull", run_id, "--store", url, "--results", tmp_path / "b")
    assert r.returncode == 2 and "1 results written" in r.stderr and named in r.stderr.strip().splitlines()[-1], r.stderr
    assert [x["job"]["job_id"] for x in Store(tmp_path / "b").results(run_id)] == \
        [x["job"]["job_id"] for x in store.results(run_id)]
    for command in (["history"], ["publish", "--out", tmp_path / "site", "--reports", "0"]):
        r = cli(capsys, *command, "--store", url)
        (line,) = r.stderr.strip().splitlines()
        assert r.returncode == 2 and named in line and "damaged" in line, (command, r.stderr)


def test_history_tracks_a_gpu_jobs_device_memory_as_the_gate_judges_it(capsys, tmp_path, server):
    """A made-up cuda series whose GPU allocation grows 30% from the fourth commit while its
    host RSS (mostly CUDA's libraries) stays: history finds the change in peak memory, from the
    device's number, as compare does; a store made before that column is backfilled from the
    stored results when it is migrated."""
    store, db = Store(tmp_path), server.new_database()
    ids = []
    for n, device_mib in enumerate((100.0, 100.0, 100.0, 130.0, 130.0, 130.0)):
        results = [compare_runs.made_up_result(10.0 * (1 + 0.002 * i), repeat=i, threads=1, peak_mib=2000.0)
                   for i in range(5)]
        for r in results:
            r["memory"]["device_peak_bytes"] = int(device_mib * 2 ** 20)
        ids.append(compare_runs.made_up_run(store, results, f"2026-01-01T00:00:{n:02d}+00:00"))
        assert cli(capsys, "push", ids[-1], "--store", db, "--results", tmp_path).returncode == 0
    (found,) = json.loads(cli(capsys, "history", "--store", db, "--format", "json").stdout)
    assert [(c["metric"], c["at"]) for c in found["changes"]] == [("peak_memory", 3)]
    assert found["points"][0]["samples"]["peak_memory"] == [100 * 2 ** 20] * 5
    gate = json.loads(cli(capsys, "compare", "--results", tmp_path, ids[0], ids[5], "--format", "json").stdout)
    (memory,) = [v["metrics"]["peak_memory"] for v in gate["verdicts"]]
    assert memory["measures"] == "device" and memory["change"] == pytest.approx(0.3)
    version = next(v for v, sql in enumerate(pgstore.MIGRATIONS, 1) if "ADD COLUMN peak_bytes" in sql)
    import psycopg
    with psycopg.connect(db) as c:      # the store as the version before this column left it (and those after)
        c.execute("ALTER TABLE results DROP COLUMN peak_bytes, DROP COLUMN test_only, DROP COLUMN instructions_per_step")
        c.execute("DELETE FROM zobench_schema WHERE version >= %s", (version,))
    with pgstore.SharedStore(db) as s:
        assert s.migrate() == len(pgstore.MIGRATIONS)
    assert set(rows(db, "SELECT peak_bytes FROM results")) == {(100 * 2 ** 20,), (130 * 2 ** 20,)}


def test_history_tracks_instructions_per_step_and_finds_their_change_by_the_gates_threshold(capsys, tmp_path, server):
    """Issue 60: instructions per step, counted on a run's first repeat, are a history series of
    their own: a count is the same for the same code, so a change is at the commit whose count
    moved past the gate's 1% (here +3% at the fourth commit, +0.5% at the sixth: not one), with no
    test, however loaded the runs were; their times, the same throughout, show no change. A store
    made before their column is filled from the stored results when it is migrated."""
    store, db = Store(tmp_path), server.new_database()
    for n, count in enumerate((15e6, 15e6, 15e6, 15.45e6, 15.45e6, 15.45e6 * 1.005)):
        results = [compare_runs.made_up_result(10.0 * (1 + 0.002 * i), repeat=i, threads=1,
                                               instructions=count if i == 0 else None,
                                               load=compare_runs.load_at(0.95 if n == 3 else 0.0)) for i in range(5)]
        run_id = compare_runs.made_up_run(store, results, f"2026-01-01T00:00:{n:02d}+00:00")
        assert cli(capsys, "push", run_id, "--store", db, "--results", tmp_path).returncode == 0
    (found,) = json.loads(cli(capsys, "history", "--store", db, "--format", "json").stdout)
    assert [(c["metric"], c["at"], c["p_value"]) for c in found["changes"]] == [("instructions", 3, None)]
    assert found["changes"][0]["change"] == pytest.approx(0.03)
    assert found["points"][3]["samples"]["instructions"] == [15.45e6], "a loaded run's count is kept"
    text = cli(capsys, "history", "--store", db).stdout
    assert "change at " in text and "instructions 15 -> 15.45 M/step (+3.0%, counted)" in text
    import psycopg
    with psycopg.connect(db) as c:      # the store as the version before this column left it
        c.execute("ALTER TABLE results DROP COLUMN instructions_per_step")
        c.execute("DELETE FROM zobench_schema WHERE version = %s", (len(pgstore.MIGRATIONS),))
    with pgstore.SharedStore(db) as s:
        assert s.migrate() == len(pgstore.MIGRATIONS)
    assert sorted(rows(db, "SELECT instructions_per_step FROM results WHERE instructions_per_step IS NOT NULL")) == \
        sorted([(15e6,)] * 3 + [(15.45e6,)] * 2 + [(15.45e6 * 1.005,)])


@settings(max_examples=15, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture])
@given(data=st.data())
def test_fuzzed_store_rows_are_named_never_a_traceback(capsys, tmp_path, server, data):
    """Issue 47: a result row or a run's plan in the store, damaged in any way (Hypothesis): pull
    and results --store are exit 0 or 2 with the damage named in one line, never a traceback."""
    import psycopg
    from testkit.damage import damage_json

    db = server.new_database()
    store = Store(tmp_path / "a")
    run_id = compare_runs.made_up_run(store, [compare_runs.made_up_result(2.0, repeat=i) for i in range(2)])
    assert cli(capsys, "push", run_id, "--store", db, "--results", tmp_path / "a").returncode == 0
    column, table = data.draw(st.sampled_from([("result", "results"), ("plan", "runs")]))
    with psycopg.connect(db) as c:
        value = c.execute(f"SELECT {column} FROM {table} LIMIT 1").fetchone()[0]
        damaged = json.dumps(damage_json(value, data.draw), allow_nan=True)
        assume("\\u0000" not in damaged and "NaN" not in damaged and "Infinity" not in damaged)   # jsonb holds neither
        c.execute(f"UPDATE {table} SET {column} = %s::jsonb WHERE ctid = (SELECT ctid FROM {table} LIMIT 1)",
                  (damaged,))
    for command in (["pull", run_id, "--results", tmp_path / "b"],      # --results: never the checkout's ./results
                    ["results", "--store", db, "--run", run_id, "--results", tmp_path / "c"], ["history", "--store", db]):
        r = cli(capsys, *command, *(["--store", db] if command[0] == "pull" else []))
        assert "Traceback" not in r.stderr and "unexpected error" not in r.stderr, (command, r.stderr)
        assert r.returncode in (0, 2), (command, r.stderr)
        if r.returncode == 2:
            assert r.stderr.strip().splitlines()[-1].startswith("zobench: error: "), (command, r.stderr)


def test_a_reproduction_pushes_each_run_as_it_ends_and_its_records_come_back_from_the_store(capsys, tmp_path, url,
                                                                                           native):
    """scripts/reproduce.py run --store: every zobench run of it pushed to the store as it ends (as
    `zobench run --store` does); the records made from the store alone, in a fresh folder, are the
    bytes of those made from the local runs."""
    reproduce = script("reproduce.py")
    doc = tmp_path / "reproduction.md"
    doc.write_text((REPO / "docs" / "reproduction.md").read_text())
    local = tmp_path / "local.jsonl.gz"
    rc = reproduce.main(["run", "--suite", "paper-fmnist", "--method", "full-zo", "--precision", "int8", "--seeds", "0,1",
                         "--set", "epochs=2", "--set", "train_samples=256", "--set", "test_samples=100",
                         "--results", str(tmp_path / "r"), "--records", str(local), "--doc", str(doc), "--store", url])
    err = capsys.readouterr().err
    assert rc == 0, err
    run_ids = json.loads((tmp_path / "r" / "reproduce.json").read_text())["runs"]
    assert len(run_ids) == 2 and all(f"run {i} -> store" in err for i in run_ids)     # seed 0's, seed 1's
    with pgstore.SharedStore(url) as shared:
        assert sorted(shared.run_ids()) == sorted(run_ids)
    pulled = tmp_path / "pulled.jsonl.gz"
    assert reproduce.main(["records", *run_ids, "--store", url, "--results", str(tmp_path / "fresh"),
                           "--records", str(pulled)]) == 0
    assert pulled.read_bytes() == local.read_bytes() and not (tmp_path / "fresh").exists()
