"""Running one job on a target and turning however it ended into a schema-1 result.

The runner is trusted to report its own failures (status failed/oom with a
reason); everything it cannot report -- a hang, a crash, a signal, a missing or
corrupt result -- is classified here, so every job of a run ends with a result.
"""
from __future__ import annotations

import json
import signal
import time
from datetime import datetime, timezone
from pathlib import Path

from . import paths, schema
from .inventory import Target
from .plan import Job

RUNNER_MODULES = {"torch": "workloads.torch_runner"}


def failure(job: Job, status: str, error: str, started_at: str, wall: float, steps: int = 0) -> dict:
    """A schema-1 result for a job whose runner could not write one."""
    return {"schema": 1, "job": job.spec, "status": status, "error": error, "started_at": started_at,
            "wall_seconds": wall, "train_seconds": 0.0, "steps": steps, "phases": {}, "epochs": [],
            "memory": {"peak_rss_bytes": 0, "baseline_rss_bytes": 0, "device_peak_bytes": None},
            "model": None, "env": {"harness_commit": job.spec.get("harness_commit", "")}}


def _last_line(text: str) -> str:
    lines = [l.strip() for l in text.strip().splitlines() if l.strip()]
    return lines[-1][:300] if lines else ""


def classify(job: Job, outcome, result_path: Path, started_at: str, wall: float, steps: int) -> dict:
    def fail(status, error):
        return failure(job, status, error, started_at, wall, steps)

    if outcome.timed_out:
        return fail("timeout", f"no result within the {job.timeout_s:g} s timeout; "
                               "the runner's process group was killed")
    if result_path.is_file():
        try:
            r = json.loads(result_path.read_text())
        except (json.JSONDecodeError, UnicodeDecodeError) as e:
            return fail("failed", f"corrupt result file: {e}")
        bad = schema.problems(r)
        if bad:
            return fail("failed", "invalid result: " + "; ".join(bad[:3]))
        if (r.get("job") or {}).get("job_id") != job.job_id:
            return fail("failed", f"result is for job {(r.get('job') or {}).get('job_id')!r}, not {job.job_id!r}")
        return r
    rc = outcome.returncode
    why = _last_line(outcome.stderr_tail)
    if rc is not None and rc < 0:
        name = signal.Signals(-rc).name
        if -rc == signal.SIGKILL:
            return fail("oom", f"runner killed by {name} (the kernel's out-of-memory killer?)")
        return fail("failed", f"runner killed by {name}" + (f": {why}" if why else ""))
    return fail("failed", f"runner exited with code {rc} without a result" + (f": {why}" if why else ""))


def run_job(job: Job, target: Target, transport, work: Path, on_event=None) -> dict:
    """Launch the job's runner through the transport and return its (validated) result."""
    spec_path, result_path = work / "spec.json", work / "result.json"
    spec_path.write_text(json.dumps(job.spec, indent=1))
    result_path.unlink(missing_ok=True)
    argv = [target.python, "-m", RUNNER_MODULES[job.spec["runtime"]],
            "--spec", str(spec_path), "--out", str(result_path)]
    steps = 0

    def on_line(line: str) -> None:
        nonlocal steps
        try:
            ev = json.loads(line)
        except json.JSONDecodeError:
            return
        if isinstance(ev, dict) and "event" in ev:
            steps = ev.get("step", steps)
            if on_event:
                on_event(ev)

    started_at = datetime.now(timezone.utc).isoformat(timespec="seconds")
    t0 = time.perf_counter()
    outcome = transport.run(argv, cwd=paths.REPO, timeout=job.timeout_s, on_line=on_line,
                            stdout_path=work / "stdout.log", stderr_path=work / "stderr.log")
    return classify(job, outcome, result_path, started_at, time.perf_counter() - t0, steps)
