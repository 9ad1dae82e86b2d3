"""zobench tune processes sharing one Optuna study through a real PostgreSQL server (the
session's, testkit/postgres.py), each on this machine as a board of its own (local-1t, which
takes no lease; or `local` under a lease file the test names). What the test needs to happen
at once it makes happen, never waits for: both processes queue on the study's ask lock, which
the test holds until both wait there, so each asks a trial before either can ask a second; an
interrupted or killed process's trial waits for a board lease the test holds, so the signal
always lands mid-trial; and a killed process's heartbeat is made as old as the grace period
in the database, where waiting would have made it so."""
import fcntl
import signal
import statistics
import tomllib

import pytest

from harness.search import study as shared
from harness.stores.store import Store
from testkit.runners import cli, in_process, processes_mentioning, start, until
from testkit.sshd import free_port

SECRET = "s3cret-tune"
# a grid of 4 learning rates whose order (seed 0) runs 1e-2, 1e-4, 1e-3 and then 1e-1, which
# falls behind the other three after its first epoch (validation accuracy 0.13 against 0.18-0.22)
SEARCH = ["tune", "--suite", "quick", "--method", "full-zo", "--epochs", "3", "--validation", "200",
          "--set", "train_samples=320", "--set", "test_samples=200", "--target", "local-1t", "--runtime", "cpp",
          "--sampler", "grid", "--grid-points", "4", "--param", "lr_zo=1e-4:1e-1", "--pruner", "median", "--no-report"]


@pytest.fixture
def storage(server):
    """A database of its own, its URL with a password (the server trusts loopback: it is taken
    and not needed), and a psycopg connection of the test's."""
    import psycopg

    url = server.new_database()
    with psycopg.connect(url, autocommit=True) as conn:
        yield url.replace("zobench@", f"zobench:{SECRET}@"), conn


def tune(tmp_path, name: str, url: str, study: str, trials: int, *extra, board: str = ""):
    """A zobench tune process as a user starts it, with results of its own, on a board (a lease
    file) of its own or board's."""
    return start(*SEARCH, "--results", tmp_path / name, "--storage", url, "--study", study, "--trials", trials,
                 *extra, env={"ZOBENCH_LOCAL_LEASE": str(tmp_path / f"lease-{board or name}")})


def ended(proc) -> tuple[str, str]:
    out, err = proc.communicate(timeout=300)
    assert proc.returncode == 0, err
    return out, err


def record(tmp_path, name: str) -> dict:
    store = Store(tmp_path / name)
    return store.run_plan(store.latest())


def waiting_to_ask(conn) -> int:
    return conn.execute("SELECT count(*) FROM pg_locks WHERE locktype = 'advisory' AND classid = %s "
                        "AND objid = %s AND NOT granted", (shared.KEY, shared.ASK)).fetchone()[0]


def trials_of(url: str, name: str) -> list:
    """The study's trials as Optuna holds them ([] before a process made it)."""
    import optuna

    try:
        return optuna.load_study(study_name=name, storage=shared.storage_url(url)).get_trials()
    except KeyError:
        return []


def test_two_processes_share_one_study_each_trial_once_pruned_on_both_and_the_same_best(tmp_path, storage, native):
    url, conn = storage
    conn.execute("SELECT pg_advisory_lock(%s, %s)", (shared.KEY, shared.ASK))
    a, b = tune(tmp_path, "a", url, "lr", 3), tune(tmp_path, "b", url, "lr", 3)
    until("both processes wait to ask",
          lambda: waiting_to_ask(conn) == 2 or a.poll() is not None or b.poll() is not None)
    assert a.poll() is None and b.poll() is None, a.communicate() + b.communicate()
    conn.execute("SELECT pg_advisory_unlock(%s, %s)", (shared.KEY, shared.ASK))
    (out_a, err_a), (out_b, err_b) = ended(a), ended(b)
    runs = {side: record(tmp_path, side) for side in "ab"}
    mine = {side: [t["number"] for t in runs[side]["tune"]["trials"]] for side in "ab"}
    assert mine["a"] and mine["b"] and sorted(mine["a"] + mine["b"]) == [0, 1, 2]     # each ran its own
    trials = trials_of(url, "lr")
    assert len(trials) == 3 and len({t.params["lr_zo"] for t in trials}) == 3         # no value twice
    assert {t.user_attrs["run"]["run"] for t in trials} == {Store(tmp_path / s).latest() for s in "ab"}
    # the same best, read at the end of either process: the study's, over both
    assert out_a.splitlines()[1:] == out_b.splitlines()[1:] and runs["a"]["tune"]["best"] == runs["b"]["tune"]["best"]
    assert tomllib.loads("\n".join(out_a.splitlines()[1:]))["hyper"]["full-zo"]["fp32"]["lr_zo"] == 1e-3
    # which study each joined, the password nowhere: not printed, not in any file either process wrote
    for side in "ab":
        assert runs[side]["tune"]["study"]["name"] == "lr" and SECRET not in runs[side]["tune"]["study"]["storage"]
        assert runs[side]["tune"]["study"]["storage"] == url.replace(f":{SECRET}", "")
    assert SECRET not in out_a + err_a + out_b + err_b
    assert not [f for f in tmp_path.rglob("*") if f.is_file() and SECRET.encode() in f.read_bytes()]

    # a third process asks for a fourth trial: the pruner stops it against the two others' epochs
    out_c, _ = ended(tune(tmp_path, "c", url, "lr", 4))
    (fourth,) = record(tmp_path, "c")["tune"]["trials"]
    assert fourth["state"] == "pruned" and fourth["values"]["lr_zo"] == pytest.approx(0.1)
    epoch = fourth["pruned_at"]
    judged = [t for t in trials_of(url, "lr") if t.state.name == "COMPLETE"]
    assert {t.user_attrs["run"]["run"] for t in judged} == {Store(tmp_path / s).latest() for s in "ab"}
    assert fourth["validation_accuracy"][-1] < statistics.median(t.intermediate_values[epoch] for t in judged)
    assert out_c.splitlines()[1:] == out_a.splitlines()[1:]          # the best is the same read from here
    assert "4 trials of study lr (1 pruned; this run's: 1 trials (1 pruned))" in out_c.splitlines()[0]
    # a study is one search: another's options are refused in one line, naming what differs
    r = in_process(*SEARCH[:5], "--epochs", "2", *SEARCH[7:], "--results", tmp_path / "d", "--storage", url,
                   "--study", "lr")
    assert r.returncode == 2 and len(r.stderr.splitlines()) == 1 and "Traceback" not in r.stderr
    assert "the study searches something else (epochs 3 in the study, 2 here)" in r.stderr and SECRET not in r.stderr
    assert Store(tmp_path / "d").run_ids() == []      # refused before any run


def running_trial_beats(conn) -> bool:
    """Whether a trial runs, its values suggested and its first heartbeat recorded (Optuna's
    tables: what a process that dies now leaves behind)."""
    return conn.execute("SELECT count(*) FROM trials t JOIN trial_heartbeats USING (trial_id) JOIN trial_params "
                        "USING (trial_id) WHERE t.state = 'RUNNING'").fetchone()[0] > 0


def test_an_interrupted_or_killed_process_fails_its_trial_and_another_runs_its_values_again(tmp_path, storage, native):
    url, conn = storage
    lease = tmp_path / "lease-a"
    leased = ["--pruner", "none", "--target", "local"]     # local-1t takes no lease; this machine does
    ended(tune(tmp_path, "a", url, "first", 1, *leased))    # its lease file, made by the launcher: the board's
    with open(lease) as held:
        fcntl.flock(held, fcntl.LOCK_EX)                     # the board is busy: a trial's job waits for it
        a = tune(tmp_path, "a", url, "again", 2, *leased)
        until("a trial runs", lambda: running_trial_beats(conn), a)
        a.send_signal(signal.SIGINT)
        _, err = a.communicate(timeout=300)
        assert a.returncode == 128 + signal.SIGINT and "interrupted by SIGINT" in err
        (lost,) = record(tmp_path, "a")["tune"]["trials"]
        assert lost["state"] == "interrupted"
        # the next process takes its values again, and dies without a word: its heartbeat stops
        k = tune(tmp_path, "k", url, "again", 2, *leased, board="a")
        until("the retry runs", lambda: running_trial_beats(conn), k)
        k.kill()
        k.wait()
    # its last beat as the grace period ago (Optuna's table): what waiting GRACE_S would make
    conn.execute("UPDATE trial_heartbeats SET heartbeat = heartbeat - make_interval(secs => %s)", (shared.GRACE_S + 1,))
    out, _ = ended(tune(tmp_path, "b", url, "again", 2, *leased))
    until("the killed process's job, orphaned, ends", lambda: not processes_mentioning(str(tmp_path / "k") + "/"))
    states = {t.number: (t.state.name, t.params["lr_zo"]) for t in trials_of(url, "again")}
    retry = next(t for t in record(tmp_path, "b")["tune"]["trials"] if t.get("retry_of") == lost["number"])
    assert states[lost["number"]] == ("FAIL", lost["values"]["lr_zo"]) and len(states) == 4
    assert [v for s, v in states.values() if s == "FAIL"] == [lost["values"]["lr_zo"]] * 2    # a's, then k's
    assert states[retry["number"]] == ("COMPLETE", lost["values"]["lr_zo"]) and retry["state"] == "complete"
    assert sorted(s for s, _ in states.values()) == ["COMPLETE", "COMPLETE", "FAIL", "FAIL"]     # 2 count, as asked


def test_bad_storage_and_study_options_are_one_line_and_never_the_password(tmp_path, capsys):
    nowhere = f"postgresql://zobench:{SECRET}@127.0.0.1:{free_port()}/db"
    for args, said in (([nowhere, "--study", "x"], "tune --storage postgresql://zobench@127.0.0.1:"),
                       ([nowhere], "tune --storage: name the study to create or join with --study NAME"),
                       (["mysql://x", "--study", "x"], "--storage: expected a PostgreSQL URL")):
        r = cli(capsys, *SEARCH, "--results", tmp_path, "--storage", *args)
        assert r.returncode == 2 and said in r.stderr and len(r.stderr.splitlines()) == 1, r.stderr
        assert SECRET not in r.stdout + r.stderr and "Traceback" not in r.stderr
    assert "cannot connect" in cli(capsys, *SEARCH, "--results", tmp_path, "--storage", nowhere, "--study", "x").stderr
    r = cli(capsys, *SEARCH, "--results", tmp_path, "--study", "x")
    assert r.returncode == 2 and "tune --study x: a study is shared through a database; give --storage" in r.stderr
    assert Store(tmp_path).run_ids() == []      # nothing was run


def test_the_storage_url_is_sqlalchemys_on_psycopg_from_any_form_libpq_takes():
    """A URL or key=value words, to the URL Optuna's storage takes; a password's braces survive
    RDBStorage's formatting of it."""
    from sqlalchemy.engine import make_url

    assert shared.storage_url("postgresql://u:p%40ss@h:5433/db?sslmode=disable") == \
        "postgresql+psycopg://u:p%40ss@h:5433/db?sslmode=disable"
    url = make_url(shared.storage_url("host=h port=5433 user=u dbname=db password='a {b}}'").format())
    assert (url.drivername, url.username, url.password, url.host, url.port, url.database) == \
        ("postgresql+psycopg", "u", "a {b}}", "h", 5433, "db")
