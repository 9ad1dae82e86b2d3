"""However a runner ends, the harness records a schema-valid result with the reason."""
import json
import signal

import pytest

from harness.stores import schema
from workloads import launch
from harness.execution.job import Evidence, classify
from harness.planning.runs import Job
from harness.boards.transport import Outcome


@pytest.fixture
def job():
    return Job("j1", "board", 30.0, {"job_id": "j1", "method": "full-zo", "runtime": "torch"})


def outcome_of(tmp_path, job, content, rc=0, evidence=None, **kw):
    path = tmp_path / "result.json"
    if content is not None:
        path.write_text(content)
    r = classify(job, Outcome(rc, **kw), path, "2026-01-01T00:00:00+00:00", 1.0, 3, evidence)
    assert schema.problems(r) == [], r
    return r


# What a kernel logged for a real cgroup OOM kill on the development machine (dmesg), and what
# the cgroup's counters read after it: v1 memory.oom_control, v2 memory.events.
KERNEL_LOG = """\
[  560.934706] oom-kill:constraint=CONSTRAINT_MEMCG,nodemask=(null),cpuset=/,mems_allowed=0,oom_memcg=/zobench-6758,task_memcg=/zobench-6758,task=python3,pid=8947,uid=0
[  560.934749] Memory cgroup out of memory: Killed process 8947 (python3) total-vm:448320kB, anon-rss:101716kB, file-rss:7912kB, shmem-rss:0kB, UID:0 pgtables:328kB oom_score_adj:0
"""
V1_OOM_CONTROL = "oom_kill_disable 0\nunder_oom 0\noom_kill 1\n"
V2_EVENTS = "low 0\nhigh 0\nmax 212\noom 1\noom_kill 1\noom_group_kill 0\n"


def test_corrupt_invalid_and_foreign_results_are_failed(tmp_path, job):
    assert "corrupt result file" in outcome_of(tmp_path, job, '{"schema": 1, "sta')["error"]
    r = outcome_of(tmp_path, job, json.dumps({"schema": 1, "status": "ok"}))
    assert r["status"] == "failed" and r["error"].startswith("invalid result: missing job")
    other = {"schema": 1, "job": {"job_id": "j2"}, "status": "ok", "error": None, "started_at": "x",
             "wall_seconds": 1.0, "train_seconds": 1.0, "steps": 1, "phases": {}, "epochs": [],
             "memory": {"peak_rss_bytes": 1, "baseline_rss_bytes": 1}, "env": {}, "model": {}}
    assert "result is for job 'j2'" in outcome_of(tmp_path, job, json.dumps(other))["error"]


def test_missing_result_names_the_exit_or_signal(tmp_path, job):
    r = outcome_of(tmp_path, job, None, rc=3, stderr_tail="Traceback...\nValueError: boom\n")
    assert r["status"] == "failed" and r["error"] == "runner exited with code 3 without a result: ValueError: boom"
    r = outcome_of(tmp_path, job, None, rc=-signal.SIGSEGV)
    assert r["status"] == "failed" and "SIGSEGV" in r["error"]
    r = outcome_of(tmp_path, job, None, rc=-signal.SIGKILL)     # anyone's kill -9: no evidence of memory
    assert r["status"] == "failed" and r["error"] == "runner killed by SIGKILL" and r["steps"] == 3


@pytest.mark.parametrize("counters", [V1_OOM_CONTROL, V2_EVENTS])
def test_sigkill_is_oom_when_the_cgroup_counted_an_oom_kill(tmp_path, job, counters):
    ev = Evidence({"event": "launch", "pid": 8947, "monotonic": 555.0, "method": "cgroup-v1"}, "120M", counters)
    r = outcome_of(tmp_path, job, None, rc=-signal.SIGKILL, evidence=ev)
    assert r["status"] == "oom"
    assert r["error"] == "runner killed by SIGKILL: out of memory (the OOM killer fired in its 120M memory cgroup: oom_kill 1)"
    ev.cgroup_counters = counters.replace("oom_kill 1", "oom_kill 0")   # the limit was hit, but nobody was killed
    assert outcome_of(tmp_path, job, None, rc=-signal.SIGKILL, evidence=ev)["status"] == "failed"


def test_sigkill_is_oom_when_the_kernel_log_names_the_runner_since_its_launch(tmp_path, job):
    launched = {"event": "launch", "pid": 8947, "monotonic": 555.0}
    r = outcome_of(tmp_path, job, None, rc=-signal.SIGKILL, evidence=Evidence(launched, kernel_log=KERNEL_LOG))
    assert r["status"] == "oom"
    assert r["error"].startswith("runner killed by SIGKILL: out of memory (kernel: Memory cgroup out of memory: "
                                 "Killed process 8947 (python3)")
    # the same log for another pid, or for an earlier process that had this pid: not this job's OOM
    for launch in ({**launched, "pid": 894}, {**launched, "monotonic": 600.0}):
        r = outcome_of(tmp_path, job, None, rc=-signal.SIGKILL, evidence=Evidence(launch, kernel_log=KERNEL_LOG))
        assert r["status"] == "failed" and r["error"] == "runner killed by SIGKILL"
    # a kernel OOM line only explains a SIGKILL
    r = outcome_of(tmp_path, job, None, rc=-signal.SIGSEGV, evidence=Evidence(launched, kernel_log=KERNEL_LOG))
    assert r["status"] == "failed"


def test_sigkill_is_oom_when_the_launchers_watchdog_saw_the_runner_thrash_at_its_limit(tmp_path, job):
    """The watchdog (workloads/launch.py) kills a runner that thrashes at its cgroup's limit and
    says so on stderr first; on what it samples it tells thrashing from a job that streams its
    data near the limit, one well under it, or too short a watch."""
    limit, mib = 64 << 20, 1 << 20

    def watched(faults_s, user, used=63 * mib, seconds=10.0, cores=1.0):
        """Samples every 0.5 s of a job keeping `cores` busy, `user` of it its own code (ticks of 10 ms)."""
        ticks = 50 * cores      # a 0.5 s sample's CPU, in ticks
        return [(100.0 + 0.5 * i, used, (1000 + int(faults_s * 0.5 * i), 50 + int(user * ticks * i),
                                         80 + int((1 - user) * ticks * i))) for i in range(int(seconds / 0.5) + 1)]

    line = launch.thrashing(watched(faults_s=100, user=0.02), limit)
    assert line == f"{launch.THRASHED}: 1000 major page faults in 10 s at 64 MiB, 2.0% of its CPU time in its own code; killed"
    assert launch.thrashing(watched(faults_s=100, user=0.5), limit) == "", "it computes between its faults: streaming"
    assert launch.thrashing(watched(faults_s=5, user=0.02), limit) == "", "few faults: waiting, not thrashing"
    assert launch.thrashing(watched(faults_s=100, user=0.02, used=40 * mib), limit) == "", "well under its limit"
    assert launch.thrashing(watched(faults_s=100, user=0.02, seconds=9.5), limit) == "", "not for THRASH_S yet"
    assert launch.thrashing(watched(faults_s=100, user=0.02, cores=0.05), limit) == "", "waiting on a slow disk"
    assert launch.thrashing(watched(faults_s=100, user=0.02, cores=0.3), limit).startswith(launch.THRASHED)
    ev = Evidence({"event": "launch", "pid": 8947, "monotonic": 555.0, "method": "cgroup-v1"}, "64M",
                  "oom_kill_disable 0\nunder_oom 0\noom_kill 0\n")
    r = outcome_of(tmp_path, job, None, rc=-signal.SIGKILL, evidence=ev, stderr_tail=f"importing torch\n{line}\n")
    assert r["status"] == "oom"
    assert r["error"] == ("runner killed by SIGKILL: out of memory (it thrashed at its 64M memory cgroup's limit: 1000 "
                          "major page faults in 10 s at 64 MiB, 2.0% of its CPU time in its own code; killed)")
    killed = "bash: line 1: 11386 Killed                  env PYTHONPATH=/w/bundles/7080 python -m workloads.launch"
    r = outcome_of(tmp_path, job, None, rc=-signal.SIGKILL, evidence=ev, stderr_tail=f"{line}\n{killed}\n")
    assert r["status"] == "oom", "an SSH board's shell says Killed after it"
    assert r["error"].startswith("runner killed by SIGKILL: out of memory (it thrashed at its 64M memory cgroup's limit: ")
    assert r["error"].endswith(f"; killed): {killed}")
    r = outcome_of(tmp_path, job, None, rc=1, evidence=ev, stderr_tail=line)   # not killed: not the watchdog's doing
    assert r["status"] == "failed"


def test_allocation_failure_is_oom_and_other_memory_words_are_not(tmp_path, job):
    under_rlimit = Evidence({"event": "launch", "pid": 1, "monotonic": 1.0, "method": "rlimit-as"}, "256M")
    r = outcome_of(tmp_path, job, None, rc=1, evidence=under_rlimit,
                   stderr_tail="OSError: libtorch_cpu.so: failed to map segment from shared object")
    assert r["status"] == "oom"
    assert r["error"] == ("runner exited with code 1 without a result: out of memory (an allocation failed under its "
                          "256M address-space limit): OSError: libtorch_cpu.so: failed to map segment from shared object")
    r = outcome_of(tmp_path, job, None, rc=-signal.SIGABRT,
                   stderr_tail="terminate called after throwing an instance of 'std::bad_alloc'\n  what():  std::bad_alloc")
    assert r["status"] == "oom" and r["error"].startswith("runner killed by SIGABRT: out of memory (an allocation failed)")
    r = outcome_of(tmp_path, job, None, rc=1, evidence=under_rlimit,
                   stderr_tail="RuntimeError: channels_last memory format needs a 4-d tensor")
    assert r["status"] == "failed" and "memory format" in r["error"]


def test_an_interrupted_runner_is_interrupted_with_the_reason(tmp_path, job):
    r = outcome_of(tmp_path, job, None, rc=-signal.SIGTERM, interrupted=True,
                   error="interrupted by SIGINT; the runner's process group was killed")
    assert r["status"] == "interrupted" and r["error"] == "interrupted by SIGINT; the runner's process group was killed"


def test_timeout_and_lost_win_over_a_stale_file(tmp_path, job):
    stale = json.dumps({"schema": 1})
    assert outcome_of(tmp_path, job, stale, rc=None, timed_out=True)["status"] == "timeout"
    r = outcome_of(tmp_path, job, stale, rc=None, lost=True, error="connection to b lost mid-job")
    assert r["status"] == "lost" and r["error"] == "connection to b lost mid-job"
