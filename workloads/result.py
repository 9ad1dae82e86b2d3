"""A runner's result before it has done anything: the one skeleton every writer of a result
starts from (the Python runners, the harness for a job whose runner wrote none, the tests'
made-up results), each record present and null until measured. The C++ binary writes the
same fields (workloads/cpp/train.cpp main; tests/test_cpp.py holds the two equal)."""
from __future__ import annotations

from datetime import datetime, timezone

from . import vocab

NO_TIMED_LOOP = "no timed loop ran"


def now() -> str:
    return datetime.now(timezone.utc).isoformat(timespec="seconds")


def skeleton(job, env: dict, status: str = "failed", error: str | None = None) -> dict:
    """A result of `job` (its spec, or None before it is read) that did nothing yet."""
    return {"schema": vocab.RESULT_SCHEMA, "job": job, "status": status, "error": error, "started_at": now(),
            "wall_seconds": 0.0, "train_seconds": 0.0, "cpu_seconds": 0.0, "steps": 0, "phases": {}, "epochs": [],
            "warmup": None, "start_eval": None, "timed_loop_load": None, "nonfinite": [],
            "memory": {"peak_rss_bytes": 0, "baseline_rss_bytes": 0, "loaded_rss_bytes": None, "buffers_bytes": None,
                       "buffers": None, "buffer_parts": None, "device_peak_bytes": None,
                       "device_reserved_peak_bytes": None, "device_used_bytes": None},
            "energy": {"source": None, "joules": None, "joules_per_step": None, "avg_power_w": None,
                       "unavailable": NO_TIMED_LOOP},
            "model": None, "env": env}
