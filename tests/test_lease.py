"""One job per board at a time, between runs: two real `zobench run` processes on one board (a
real sshd board under two inventory names, and this machine) never train at once; the second
waits, says for whom, and records its wait outside every timing; a lease timeout ends a job
`busy` without losing anything else, and --resume runs it; a controller killed mid-job leaves
no stale lease.

Each board's `python` is a wrapper that logs when the runner starts and ends (inside the lease:
the launcher execs it with the lease held) and holds the runner until the test creates a file,
so the overlap is made by the test, not by timing."""
import getpass
import json
import os
import signal
import socket
import subprocess
import sys
from pathlib import Path

import pytest

from harness.planning import inventory
from harness.stores import machine_load
from harness.errors import UserError
from harness.stores.store import Store
from testkit.runners import REPO, TINY_ORT, held_python, processes_mentioning, until, zobench
from testkit.sshd import board_toml

ONE_JOB = ["--method", "full-zo", *TINY_ORT]     # a Python runner, which held_python holds


def launch(results: Path, *args, env: dict, log: Path) -> subprocess.Popen:
    """`zobench run` as a user starts it, its stderr in a file the test can read while it runs."""
    return subprocess.Popen([sys.executable, "-m", "zobench", "run", "--results", str(results), "--no-report", *map(str, args)],
                            cwd=REPO, stdout=subprocess.DEVNULL, stderr=open(log, "w"), text=True,
                            env={**os.environ, **env})


def runner_spans(log: Path) -> list[tuple[float, float, str]]:
    """(start, end, the runner's arguments) of each runner, from the wrapper's log."""
    starts, spans = {}, []
    for line in log.read_text().splitlines():
        word, t, args = line.split(" ", 2)
        if word == "start":
            starts[args] = float(t)
        else:
            spans.append((starts.pop(args), float(t), args))
    assert not starts, f"runners that never ended: {starts}"
    return sorted(spans)


def the_result(results: Path) -> dict:
    store = Store(results)
    (r,) = store.results(store.latest())
    return r


@pytest.fixture
def boards(farm, tmp_path):
    """An inventory with one board under two names (board-a's sshd, two workdirs), this machine
    with its own lease file, and board-b; every runner held until GO."""
    wrapper, log, go = held_python(tmp_path)
    inv = tmp_path / "targets.toml"
    a, key = farm["boards"]["board-a"], farm["key"]
    ort = {"runtimes": ["ort"]}
    inv.write_text(board_toml("pi", a, key, tmp_path / "pi", python=str(wrapper), **ort)
                   + board_toml("pi-again", a, key, tmp_path / "pi-again", python=str(wrapper), **ort)
                   + board_toml("other", farm["boards"]["board-b"], key, tmp_path / "other", **ort)
                   + f'[targets.here]\ntransport = "local"\npython = "{wrapper}"\nruntimes = ["ort"]\nthreads = 1\n'
                   + f'lease = "{tmp_path / "here.lease"}"\n')
    return {"inventory": inv, "log": log, "go": go, "env": farm["env"], "tmp": tmp_path}


@pytest.mark.parametrize("first, second", [("pi", "pi-again"), ("here", "here")])
def test_two_runs_on_one_board_never_overlap_and_the_second_says_whom_it_waits_for(boards, first, second):
    tmp, env = boards["tmp"], boards["env"]
    a = launch(tmp / "ra", "--inventory", boards["inventory"], "--target", first, *ONE_JOB, env=env, log=tmp / "a.err")
    until("the first run's runner holds the board", lambda: boards["log"].is_file(), a, tmp / "a.err")
    b = launch(tmp / "rb", "--inventory", boards["inventory"], "--target", second, *ONE_JOB, env=env, log=tmp / "b.err")
    waiting = until("the second run says it waits", lambda: "waiting for" in (tmp / "b.err").read_text(), b, tmp / "b.err")
    boards["go"].touch()
    assert a.wait(300) == 0 and b.wait(300) == 0, (tmp / "a.err").read_text() + (tmp / "b.err").read_text()

    ra, rb = the_result(tmp / "ra"), the_result(tmp / "rb")
    assert ra["status"] == rb["status"] == "ok"
    held = {"run": Store(tmp / "ra").latest(), "job": ra["job"]["job_id"], "host": socket.gethostname(),
            "user": getpass.getuser()}
    line = (f"waiting for {second}: leased by run {held['run']} job {held['job']} from host {held['host']} "
            f"(user {held['user']}) since ")
    assert waiting and line in (tmp / "b.err").read_text()
    assert ra["lease"]["waited_s"] == 0 and ra["lease"]["waited_for"] is None
    assert rb["lease"]["waited_s"] > 0 and {k: rb["lease"]["waited_for"][k] for k in held} == held
    assert rb["lease"]["file"] == ra["lease"]["file"]        # two names of one board: one lease
    # the runners, as the board saw them, one after the other
    (s1, e1, args1), (s2, e2, args2) = runner_spans(boards["log"])
    assert s2 >= e1 and held["run"] in args1 and Store(tmp / "rb").latest() in args2
    # the wait is no part of the second job's measurements: its load starts from the counters the
    # launcher read in its launch line, which it prints only once it holds the lease
    log = next((tmp / "rb").glob("runs/*/work/*/stdout.log")).read_text().splitlines()
    waits = [i for i, line in enumerate(log) if '"lease-wait"' in line]
    ((at, launched),) = [(i, json.loads(line)) for i, line in enumerate(log) if '"event": "launch"' in line]
    assert waits and max(waits) < at
    assert rb["load"]["loadavg_1m_start"] == machine_load.parse(launched["load"]).loadavg_1m


def test_a_lease_timeout_ends_the_job_busy_and_loses_nothing_else(boards):
    tmp, env, inv = boards["tmp"], boards["env"], boards["inventory"]
    a = launch(tmp / "ra", "--inventory", inv, "--target", "pi", *ONE_JOB, env=env, log=tmp / "a.err")
    until("the first run's runner holds the board", lambda: boards["log"].is_file(), a, tmp / "a.err")
    b = zobench("run", "--results", tmp / "rb", "--no-report", "--inventory", inv, "--target", "pi-again",
                "--target", "other", "--lease-timeout", "1", *ONE_JOB, env=env, timeout=600)
    run_b = Store(tmp / "rb").latest()
    got = {r["job"]["target"]: r for r in Store(tmp / "rb").results(run_b)}
    assert b.returncode == 1 and "Traceback" not in b.stderr
    assert got["other"]["status"] == "ok"
    busy = got["pi-again"]
    run_a = Store(tmp / "ra").latest()
    job_a = Store(tmp / "ra").run_plan(run_a)["jobs"][0]["job_id"]
    assert busy["status"] == "busy" and busy["error"].startswith(f"pi-again was leased by run {run_a} job {job_a} from host ")
    assert f"for the whole {busy['lease']['waited_s']:g} s this job could wait (--lease-timeout)" in busy["error"]
    assert busy["lease"]["waited_s"] >= 1 and busy["train_seconds"] == 0
    assert f"finish them with: zobench run --resume {run_b}" in b.stderr

    boards["go"].touch()
    assert a.wait(300) == 0
    again = zobench("run", "--results", tmp / "rb", "--no-report", "--inventory", inv, "--resume", run_b, env=env,
                    timeout=600)
    assert again.returncode == 0, again.stderr
    assert "resuming run" in again.stderr and "1 of 2 jobs to run" in again.stderr
    after = {r["job"]["target"]: r for r in Store(tmp / "rb").results(run_b)}
    assert after["pi-again"]["status"] == "ok" and after["other"] == got["other"]


def test_a_controller_killed_mid_job_leaves_no_stale_lease(boards):
    """SIGKILL gives the controller no chance to clean up, and drops its SSH connection: the
    lease is the runner's, so the next run takes the board once that runner has ended."""
    tmp, env, inv = boards["tmp"], boards["env"], boards["inventory"]
    a = launch(tmp / "ra", "--inventory", inv, "--target", "pi", *ONE_JOB, env=env, log=tmp / "a.err")
    until("the first run's runner holds the board", lambda: boards["log"].is_file(), a, tmp / "a.err")
    a.send_signal(signal.SIGKILL)
    a.wait(60)
    b = launch(tmp / "rb", "--inventory", inv, "--target", "pi-again", *ONE_JOB, env=env, log=tmp / "b.err")
    until("the second run waits for the orphaned runner", lambda: "waiting for" in (tmp / "b.err").read_text(), b)
    boards["go"].touch()       # the orphan finishes, and with it the lease
    assert b.wait(300) == 0, (tmp / "b.err").read_text()
    rb = the_result(tmp / "rb")
    assert rb["status"] == "ok" and rb["lease"]["waited_for"]["run"] == Store(tmp / "ra").latest()
    assert not processes_mentioning(str(tmp / "pi") + "/"), "a runner was left behind"


def test_targets_that_are_one_board_share_one_lease(tmp_path, monkeypatch):
    monkeypatch.delenv("ZOBENCH_LOCAL_LEASE", raising=False)
    inv = tmp_path / "targets.toml"
    inv.write_text('[targets.a]\nhost = "pi.lan"\nuser = "pi"\nworkdir = "/srv/a"\n'
                   '[targets.b]\nhost = "pi.lan"\nuser = "pi"\nworkdir = "/srv/b"\n'
                   '[targets.c]\nhost = "pi.lan"\nuser = "pi"\nport = 2222\n'
                   '[targets.d]\nhost = "pi.lan"\nuser = "pi"\nlease = "/run/lock/pi.lease"\n'
                   '[targets.e]\nhost = "pi.lan"\nuser = "pi"\nlease = false\n'
                   '[targets.mine]\ntransport = "local"\nworkdir = "/tmp/x"\n')
    t = inventory.load(inv)
    assert t["a"].lease == t["b"].lease == "/srv/a/lease"
    assert t["c"].lease == "~/zobench/lease"           # another port: another board
    assert t["d"].lease == "/run/lock/pi.lease" and t["e"].lease == ""
    assert t["local"].lease == t["mine"].lease == "~/zobench/lease" and t["local-1t"].lease == ""
    monkeypatch.setenv("ZOBENCH_LOCAL_LEASE", "/tmp/elsewhere")
    assert inventory.load(inv)["mine"].lease == "/tmp/elsewhere"
    inv.write_text('[targets.a]\nhost = "pi.lan"\nlease = true\n')
    with pytest.raises(UserError, match=r"targets.toml: targets.a.lease: expected a file path on the board, or false"):
        inventory.load(inv)


def launch_with_lease(lease: Path) -> subprocess.CompletedProcess:
    """The board's launcher (workloads/launch.py, as every job on every board starts) taking `lease`."""
    return subprocess.run([sys.executable, "-m", "workloads.launch", "--lease", str(lease), "--lease-timeout", "5",
                           "--holder", json.dumps({"run": "r", "job": "j", "host": "h", "user": "u"}), "--", "true"],
                          cwd=REPO, capture_output=True, text=True, timeout=60)


def test_a_lease_file_zobench_did_not_make_is_refused_and_left_as_it_was(tmp_path):
    """Issue 47: a user's file, an empty file, a folder, a symlink to a user's file: the launcher
    refuses each in one line (exit 78) and writes nothing; a new path is made with zobench's mark
    and taken again on the next job."""
    mine = tmp_path / "passwd"
    mine.write_text("root:x:0:0:root:/root:/bin/bash\n")
    empty = tmp_path / "empty"
    empty.write_text("")
    (tmp_path / "folder").mkdir()
    (tmp_path / "link").symlink_to(mine)
    for lease, why in ((mine, "holds 32 bytes zobench did not write"), (empty, "holds 0 bytes zobench did not write"),
                       (tmp_path / "folder", "cannot be used (Is a directory)"),
                       (tmp_path / "link", "cannot be used (Too many levels of symbolic links)")):
        r = launch_with_lease(lease)
        assert r.returncode == 78 and r.stderr.strip() == (
            f"lease {lease}: {why}; give the target's lease a file of zobench's own, or lease = false"), r.stderr
        assert "launch" not in r.stdout
    assert mine.read_text() == "root:x:0:0:root:/root:/bin/bash\n" and empty.read_text() == ""
    new = tmp_path / "leases" / "board.lease"
    for _ in range(2):
        r = launch_with_lease(new)
        assert r.returncode == 0, r.stderr
        held = json.loads(new.read_text())
        assert held["zobench"] == "lease" and held["run"] == "r"
    assert sorted(p.name for p in new.parent.iterdir()) == ["board.lease"]    # no leftover of its making


@pytest.mark.parametrize("lease,why", [("/etc/passwd", "not one in /etc"), ("/dev/null", "not one in /dev"),
                                       ("/proc/self/status", "not one in /proc"),
                                       ("../../x", "an absolute path or one under ~/"),
                                       ("~/zobench/../../x", "without '..'")])
def test_a_lease_path_that_can_only_harm_is_refused_when_the_inventory_is_read(tmp_path, lease, why):
    inv = tmp_path / "inv.toml"
    inv.write_text(f'[targets.here]\nprofile = "local"\nlease = {json.dumps(lease)}\n')
    with pytest.raises(UserError, match=rf"targets\.here\.lease: expected .*{why}.*, got '{lease}'"):
        inventory.load(inv)
