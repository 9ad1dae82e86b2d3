"""Jobs that hang, crash, are killed, run out of memory or get lost, and boards that break, are
recorded with their reason; the run keeps the rest, and --resume finishes only what did not end ok."""
import json
import os
import re
import signal
import subprocess
import sys
import threading
import time
from pathlib import Path

import pytest

from zobench.cli import main
from harness.stores.store import Store
from harness.boards.transport import LocalTransport, TransportError
from testkit.runners import REPO, TINY, TINY_CPP, processes_mentioning, until, zobench



def results(root: Path, run_id: str) -> dict:
    return {r["job"]["method"]: r for r in Store(root).results(run_id)}


def test_hung_runner_times_out_is_killed_and_others_are_kept(tmp_path):
    rc = main(["run", "--results", str(tmp_path), "--no-report", "--method", "full-bp", "--method", "full-zo",
               "--set", "fault=hang@full-zo", "--timeout", "15", *TINY_CPP])
    assert rc == 1
    store = Store(tmp_path)
    run_id = store.latest()
    r = results(tmp_path, run_id)
    assert r["full-bp"]["status"] == "ok"
    assert r["full-zo"]["status"] == "timeout"
    assert "15 s timeout" in r["full-zo"]["error"] and "killed" in r["full-zo"]["error"]
    assert r["full-zo"]["steps"] >= 0
    assert processes_mentioning(str(store.runs / run_id)) == []     # nothing of the runner is left


def test_crashed_runner_is_failed_with_the_signal_and_others_are_kept(tmp_path):
    rc = main(["run", "--results", str(tmp_path), "--no-report", "--method", "full-bp", "--method", "full-zo",
               "--set", "fault=crash@full-bp", *TINY_CPP])
    assert rc == 1
    r = results(tmp_path, Store(tmp_path).latest())
    assert r["full-bp"]["status"] == "failed" and "SIGABRT" in r["full-bp"]["error"]
    assert r["full-zo"]["status"] == "ok" and r["full-zo"]["steps"] == 10


def test_resume_reruns_only_the_jobs_that_did_not_end_ok(tmp_path):
    assert main(["run", "--results", str(tmp_path), "--no-report", "--method", "full-bp",
                 "--method", "elastic-zo:1", *TINY_CPP]) == 0
    store = Store(tmp_path)
    run_id = store.latest()
    bp_file = store.runs / run_id / "local.cpp.full-bp.fp32.r0.json"
    ez_file = store.runs / run_id / "local.cpp.elastic-zo-k1.fp32.r0.json"
    lost = json.loads(ez_file.read_text())
    lost.update(status="lost", error="connection lost mid-job")
    ez_file.write_text(json.dumps(lost))
    bp_before = bp_file.read_bytes()

    assert main(["run", "--results", str(tmp_path), "--no-report", "--resume", run_id]) == 0
    assert bp_file.read_bytes() == bp_before                   # the ok job was not run again
    redone = json.loads(ez_file.read_text())
    assert redone["status"] == "ok" and redone["error"] is None
    assert redone["model"]["weights_sha256"] == lost["model"]["weights_sha256"]   # same job, same result
    assert store.run_ids() == [run_id]                        # no new run was made



def kill_when_training(root: Path, job: str) -> threading.Thread:
    """kill -9 the runner of `job` once it trains, as a user or another program might."""
    def watch():
        deadline = time.monotonic() + 300
        while time.monotonic() < deadline:
            for log in root.glob(f"runs/*/work/{job}/stdout.log"):
                lines = log.read_text().splitlines()
                if any('"start"' in line for line in lines):
                    os.kill(json.loads(lines[0])["pid"], signal.SIGKILL)
                    return
            time.sleep(0.05)
    watcher = threading.Thread(target=watch)
    watcher.start()
    return watcher


def test_a_runner_killed_by_sigkill_without_evidence_of_memory_is_failed_not_oom(tmp_path):
    watcher = kill_when_training(tmp_path, "*.full-zo.*")
    rc = main(["run", "--results", str(tmp_path), "--no-report", "--method", "full-zo", "--method", "elastic-zo:1",
               "--set", "fault=hang@full-zo", *TINY_CPP])
    watcher.join()
    assert rc == 1
    store = Store(tmp_path)
    r = results(tmp_path, store.latest())
    assert r["full-zo"]["status"] == "failed" and r["full-zo"]["error"] == "runner killed by SIGKILL"
    assert r["elastic-zo"]["status"] == "ok"                       # the board ran on
    assert processes_mentioning(str(store.runs / store.latest())) == []


@pytest.mark.parametrize("limit", ["120M", "64M"])
def test_a_runner_over_its_memory_limit_is_oom_on_the_evidence_this_machine_gives(tmp_path, limit):
    """Torch alone needs more than either limit. Under a cgroup the kernel's OOM killer ends it,
    or, where its libraries' pages are what the kernel reclaims (64M of a v1 cgroup on the
    development machine: it thrashed for the whole 900 s timeout), the launcher's watchdog does."""
    inv = tmp_path / "inventory.toml"
    inv.write_text(f'[targets.small]\ntransport = "local"\nmem_limit = "{limit}"\n')
    out = zobench("run", "--results", tmp_path, "--inventory", inv, "--no-report", "--target", "small",
                  "--method", "full-zo", *TINY)
    assert out.returncode == 1, out.stderr
    store = Store(tmp_path)
    run_id = store.latest()
    (r,) = store.results(run_id)
    launch = json.loads((store.runs / run_id / "work" / r["job"]["job_id"] / "stdout.log").read_text().splitlines()[0])
    assert r["status"] == "oom", r["error"]
    if launch["method"].startswith("cgroup"):   # the kernel's OOM killer, counted by the job's cgroup, or the watchdog
        assert r["error"] == f"runner killed by SIGKILL: out of memory (the OOM killer fired in its {limit} memory " \
            "cgroup: oom_kill 1)" or re.fullmatch(
                rf"runner killed by SIGKILL: out of memory \(it thrashed at its {limit} memory cgroup's limit: \d+ major "
                rf"page faults in 1\d s at {limit[:-1]} MiB, \d+\.\d% of its CPU time in its own code; killed\)", r["error"]), r
        assert not Path(launch["cgroup"]).exists()                  # and the cgroup is gone
    else:                                       # RLIMIT_AS: an allocation failed
        assert f"out of memory (an allocation failed under its {limit} address-space limit)" in r["error"]
    assert out.stderr.strip().splitlines()[-1] == \
        f"run {run_id}: 1 jobs run, 1 not ok; finish them with: zobench run --resume {run_id} --results {tmp_path} --inventory {inv}"


def test_a_board_that_breaks_ends_its_own_jobs_with_the_literal_reason_and_the_others_run(tmp_path):
    # a "python" whose error is not UTF-8 and reads as rich markup: each once took the whole run down
    broken = tmp_path / "python"
    broken.write_bytes(b"#!/bin/sh\nprintf 'cannot load [/usr/lib/zobench] \\377\\n' >&2\nexit 1\n")
    broken.chmod(0o755)
    inv = tmp_path / "inventory.toml"
    inv.write_text(f'[targets.broken]\ntransport = "local"\npython = {json.dumps(str(broken))}\nruntimes = ["cpp"]\n')
    out = zobench("run", "--results", tmp_path / "res", "--inventory", inv, "--no-report", "--target", "broken",
                  "--target", "local", "--method", "full-zo", *TINY_CPP)
    assert out.returncode == 1, out.stderr
    store = Store(tmp_path / "res")
    r = {x["job"]["target"]: x for x in store.results(store.latest())}
    assert r["local"]["status"] == "ok"
    why = f"this machine: probe with {broken} failed: cannot load [/usr/lib/zobench] \ufffd"
    assert r["broken"]["status"] == "failed" and r["broken"]["error"] == why
    assert f"failed broken.cpp.full-zo.fp32.r0  {why}" in out.stderr   # printed literally, on one line
    assert "Traceback" not in out.stderr


def test_a_local_command_past_its_timeout_is_a_transport_error_and_leaves_nothing_running():
    marker = f"{os.getpid()}.{time.monotonic_ns() % 1000}"    # a sleep only this test starts
    with pytest.raises(TransportError, match=r"^this machine: `sleep .*` did not end within 1 s; its process group was killed$"):
        LocalTransport().exec(f"sleep {marker} & sleep {marker}; echo never", timeout=1)
    assert processes_mentioning(f"sleep {marker}") == []


def test_a_cuda_target_without_cuda_fails_its_jobs_with_the_reason_and_the_others_run(tmp_path):
    import torch
    if torch.cuda.is_available():
        pytest.skip("this machine has CUDA: nothing to refuse")
    inv = tmp_path / "inventory.toml"
    inv.write_text('[targets.gpu]\ntransport = "local"\ndevice = "cuda"\nruntimes = ["torch"]\n')
    out = zobench("run", "--results", tmp_path / "res", "--inventory", inv, "--no-report", "--target", "gpu",
                  "--target", "local", "--method", "full-zo", *TINY)
    assert out.returncode == 1, out.stderr
    store = Store(tmp_path / "res")
    r = {x["job"]["target"]: x for x in store.results(store.latest())}
    assert r["local"]["status"] == "ok" and r["local"]["steps"] == 10
    why = f"device: CUDA not available on gpu: torch {torch.__version__}"
    assert r["gpu"]["status"] == "failed" and r["gpu"]["error"] == why and r["gpu"]["steps"] == 0
    assert "Traceback" not in out.stderr
    work = store.runs / store.latest() / "work" / "gpu.torch.full-zo.fp32.r0"
    logs = sorted(work.glob("*.log"))
    assert [p.name for p in logs] == ["stderr.log", "stdout.log"]
    assert "Traceback" not in "".join(p.read_text() for p in logs)


def test_a_full_disk_under_the_results_stops_the_run_in_one_line_and_resume_finishes_it(tmp_path):
    """A 1 MiB tmpfs as the results folder, filled once the first job's result is in: the next
    result cannot be stored, so nothing more runs; one line says why and how to finish, no
    traceback; once there is room, --resume runs exactly the jobs not stored."""
    small = tmp_path / "small"
    small.mkdir()
    if subprocess.run(["mount", "-t", "tmpfs", "-o", "size=1m", "tmpfs", str(small)], capture_output=True).returncode:
        pytest.skip("mounting a tmpfs needs root")
    try:
        proc = subprocess.Popen([sys.executable, "-m", "zobench", "run", "--results", str(small), "--no-report",
                                 "--method", "full-bp", "--method", "full-zo", "--method", "elastic-zo:1", *TINY],
                                cwd=REPO, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
        until("the first result", lambda: list(small.glob("runs/*/*.r0.json")), proc)
        filler = small / "filler"
        with open(filler, "wb") as f:          # every byte that is left
            try:
                while True:
                    f.write(b"\0" * 65536)
                    f.flush()
            except OSError:
                pass
        _, err = proc.communicate(timeout=600)
        run_id = Store(small).latest()
        assert proc.returncode == 2 and "Traceback" not in err, err
        last = err.strip().splitlines()[-1]
        stored = len(Store(small).results(run_id))     # the first, and the second if it beat the filler
        assert stored in (1, 2) and last == (
            f"run {run_id}: cannot store results in {small / 'runs' / run_id}: No space left on device; {stored} jobs "
            f"stored, {3 - stored} not; make room, then finish it with: zobench run --resume {run_id} --results {small}")
        filler.unlink()
        again = subprocess.run([sys.executable, "-m", "zobench", "run", "--results", str(small), "--no-report",
                                "--resume", run_id], cwd=REPO, capture_output=True, text=True, timeout=600)
        assert again.returncode == 0 and f"{3 - stored} of 3 jobs to run" in again.stderr, again.stderr
        assert [r["status"] for r in Store(small).results(run_id)] == ["ok"] * 3
    finally:
        subprocess.run(["umount", "-l", str(small)], capture_output=True)
