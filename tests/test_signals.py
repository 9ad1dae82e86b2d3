"""Ctrl-C and SIGTERM during `zobench run`, sent for real to a real run, here and on boards
over SSH: the running jobs' process groups are killed and recorded `interrupted`, nothing
more starts, what ended is kept, zobench exits 130/143 with the --resume command, no
runner is left behind, and --resume then finishes exactly the rest."""
import json
import platform
import signal
import subprocess
import time
from pathlib import Path

from harness.stores.store import Store
from testkit.runners import TINY, TINY_CPP, processes_mentioning, start
from testkit.sshd import board_toml


def events(text: str) -> list[dict]:
    """The JSON events of a job's stdout.log (the launcher's, then its runner's: each runtime
    writes its own spacing), less a line still being written."""
    out = []
    for line in text.splitlines():
        try:
            out.append(json.loads(line))
        except ValueError:
            pass
    return out


def launched(results: Path, job: str, proc: subprocess.Popen, event: str, count: int = 1) -> list[dict]:
    """Wait until `count` jobs matching `job` have printed `event`; their launch events (the
    launcher's line: after the lease's, if it had to wait)."""
    deadline = time.monotonic() + 300
    while time.monotonic() < deadline:
        logs = [events(log.read_text()) for log in results.glob(f"runs/*/work/{job}/stdout.log")]
        found = [next(e for e in log if e.get("event") == "launch") for log in logs
                 if any(e.get("event") == event for e in log)]
        if len(found) >= count:
            return found
        assert proc.poll() is None, proc.communicate()
        time.sleep(0.05)
    raise AssertionError(f"no {event} event of {job}")


def stopped(proc: subprocess.Popen, *signals: int) -> tuple[int, str]:
    for sig in signals:
        proc.send_signal(sig)
    _, err = proc.communicate(timeout=120)
    return proc.returncode, err


def gone(pid: int) -> None:
    deadline = time.monotonic() + 60
    while Path(f"/proc/{pid}").exists():
        assert time.monotonic() < deadline, f"process {pid} is still there"
        time.sleep(0.01)


def assert_interrupted(err: str, results: Path, signame: str, ended: int) -> str:
    """The run's last line says what the signal left (one job interrupted, one never started)
    and how to finish it, with no traceback; returns the run id."""
    run_id = Store(results).latest()
    assert err.strip().splitlines()[-1] == (
        f"run {run_id}: interrupted by {signame}: {ended} jobs ended, 1 interrupted, 1 not started; "
        f"finish it with: zobench run --resume {run_id} --results {results}")
    assert "Traceback" not in err
    return run_id


def by_method(store: Store, run_id: str) -> dict:
    return {r["job"]["method"]: r for r in store.results(run_id)}


def test_ctrl_c_kills_the_running_job_keeps_the_rest_and_resume_finishes_it(tmp_path):
    proc = start("run", "--results", tmp_path, "--no-report", "--method", "full-bp", "--method", "full-zo",
                 "--method", "elastic-zo:1", *TINY)
    launched(tmp_path, "*.full-zo.*", proc, "launch")                # its runner is up (loading torch)
    rc, err = stopped(proc, signal.SIGINT)
    assert rc == 130
    store, run_id = Store(tmp_path), assert_interrupted(err, tmp_path, "SIGINT", ended=1)
    r = by_method(store, run_id)
    assert r["full-bp"]["status"] == "ok"
    assert r["full-zo"]["status"] == "interrupted"
    assert r["full-zo"]["error"] == "interrupted by SIGINT; the runner's process group was killed"
    assert "elastic-zo" not in r                                     # never started: nothing recorded
    assert processes_mentioning(str(store.runs / run_id)) == []      # the runner's command line names its spec there
    bp_before = (store.runs / run_id / "local.torch.full-bp.fp32.r0.json").read_bytes()

    rc, err = stopped(start("run", "--results", tmp_path, "--no-report", "--resume", run_id))
    assert rc == 0, err
    assert f"resuming run {run_id}: 2 of 3 jobs to run" in err
    r = by_method(store, run_id)
    assert {m: x["status"] for m, x in r.items()} == {"full-bp": "ok", "full-zo": "ok", "elastic-zo": "ok"}
    assert (store.runs / run_id / "local.torch.full-bp.fp32.r0.json").read_bytes() == bp_before


def test_sigterm_then_a_second_signal_kill_a_hung_runner_and_exit_143(tmp_path):
    proc = start("run", "--results", tmp_path, "--no-report", "--method", "full-zo", "--method", "elastic-zo:1",
                 "--set", "fault=hang@full-zo", *TINY_CPP)
    (launch,) = launched(tmp_path, "*.full-zo.*", proc, "start")    # training, then hung after its first step
    proc.send_signal(signal.SIGTERM)
    gone(launch["pid"])
    rc, err = stopped(proc, signal.SIGINT)                           # a second signal, during the shutdown
    assert rc == 143
    store, run_id = Store(tmp_path), assert_interrupted(err, tmp_path, "SIGTERM", ended=0)
    (r,) = store.results(run_id)
    assert r["job"]["method"] == "full-zo" and r["status"] == "interrupted"
    assert r["error"] == "interrupted by SIGTERM; the runner's process group was killed"
    assert processes_mentioning(str(store.runs / run_id)) == []


def test_sigterm_kills_the_runners_on_every_board_over_ssh(farm, tmp_path):
    inv = tmp_path / "inventory.toml"
    # the C++ binary on both boards: the signal's way to a board's runners is the same for every runtime
    inv.write_text("".join(board_toml(n, farm["boards"][n], farm["key"], tmp_path / n, runtimes=["cpp"],
                                      arch=platform.machine()) for n in ("board-a", "board-b")))
    proc = start("run", "--results", tmp_path / "res", "--inventory", inv, "--no-report", "--target", "board-a",
                 "--target", "board-b", "--method", "full-bp", "--method", "full-zo", "--set", "fault=hang@full-zo",
                 *TINY_CPP, env=farm["env"])
    launched(tmp_path / "res", "board-*.full-zo.*", proc, "start", count=2)   # one hung runner on each board
    rc, err = stopped(proc, signal.SIGTERM)
    store = Store(tmp_path / "res")
    run_id = store.latest()
    assert rc == 143
    assert err.strip().splitlines()[-1] == (f"run {run_id}: interrupted by SIGTERM: 2 jobs ended, 2 interrupted, 0 not started; "
                                           f"finish it with: zobench run --resume {run_id} --results {tmp_path / 'res'} "
                                           f"--inventory {inv}")
    results = {(r["job"]["target"], r["job"]["method"]): r for r in store.results(run_id)}
    for board in ("board-a", "board-b"):
        assert results[board, "full-bp"]["status"] == "ok"
        assert results[board, "full-zo"]["status"] == "interrupted"
        assert results[board, "full-zo"]["error"] == "interrupted by SIGTERM; the runner's process group was killed"
    # the boards are this machine: the runners and their shells there are gone
    assert processes_mentioning(f"jobs/{run_id}") == []


def test_sigterm_during_fit_kills_its_probe_and_says_so(tmp_path):
    """zobench fit runs probes outside `run`'s job phase: the first signal kills the probe's
    runner as `run` does, and the search ends with its reason (it cannot be resumed)."""
    proc = start("fit", "--results", tmp_path, "--budget", "700M", "--context", "128", "--timeout", "600")
    launched(tmp_path, "fit.*", proc, "launch")                       # the first probe's runner is up
    rc, err = stopped(proc, signal.SIGTERM)
    run_id = Store(tmp_path).latest()
    assert rc == 143, err
    assert err.strip().splitlines()[-1].startswith(f"fit run {run_id}: interrupted by SIGTERM during probe fit.")
    assert err.strip().endswith("its runner killed; nothing is concluded from a search cut short: run it again")
    (r,) = Store(tmp_path).results(run_id)
    assert r["status"] == "interrupted" and "Traceback" not in err
    assert processes_mentioning(str(Store(tmp_path).runs / run_id)) == []
