"""However a runner ends, the harness records a schema-valid result with the reason."""
import json
import signal

import pytest

from harness import schema
from harness.execute import classify
from harness.plan import Job
from harness.transport import Outcome


@pytest.fixture
def job():
    return Job("j1", "board", 30.0, {"job_id": "j1", "method": "full-zo", "runtime": "torch"})


def outcome_of(tmp_path, job, content, rc=0, **kw):
    path = tmp_path / "result.json"
    if content is not None:
        path.write_text(content)
    r = classify(job, Outcome(rc, **kw), path, "2026-01-01T00:00:00+00:00", 1.0, 3)
    assert schema.problems(r) == [], r
    return r


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
    r = outcome_of(tmp_path, job, None, rc=-signal.SIGKILL)
    assert r["status"] == "oom" and "SIGKILL" in r["error"] and r["steps"] == 3


def test_allocation_failure_under_a_memory_limit_is_oom(tmp_path, job):
    r = classify(job, Outcome(1, stderr_tail="OSError: libtorch_cpu.so: failed to map segment from shared object"),
                 tmp_path / "none.json", "t", 1.0, 0, mem_limit="256M")
    assert r["status"] == "oom" and "256M" in r["error"]


def test_timeout_and_lost_win_over_a_stale_file(tmp_path, job):
    stale = json.dumps({"schema": 1})
    assert outcome_of(tmp_path, job, stale, rc=None, timed_out=True)["status"] == "timeout"
    r = outcome_of(tmp_path, job, stale, rc=None, lost=True, error="connection to b lost mid-job")
    assert r["status"] == "lost" and r["error"] == "connection to b lost mid-job"
