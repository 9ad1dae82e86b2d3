"""`zobench export`: a run's measurements for other tools.

- pytest-benchmark: the JSON that `pytest --benchmark-json` writes, one benchmark per job key.
  One round is one repeat's mean step time, in seconds. `stats.data` holds the rounds, so
  pytest-benchmark's `compare` and any other reader of that format work on it. Under
  `extra_info.zobench` it also carries what `zobench compare` needs to read the file back as
  a baseline: the key, each repeat's peak RSS, GPU peak allocation (cuda jobs), energy per step
  (where measured) and machine's load, and the target's fingerprint.
- csv: one row per job key, with medians, for spreadsheets.

A run with no ok result, or one whose repeats disagree on the fingerprint (resumed after an
upgrade), is refused: a baseline that compares nothing, or mixes two machines, would make
every later gate wrong.
"""
from __future__ import annotations

import csv
import io
import json
import statistics
from datetime import datetime, timezone
from pathlib import Path

from workloads import jsonfile

from harness.errors import UserError
from harness.stores.measurements import Measurement

PYTEST_BENCHMARK_VERSION = "4.0.0"


def _stats(data: list[float]) -> dict:
    n = len(data)
    q1, _, q3 = statistics.quantiles(data, n=4, method="inclusive") if n > 1 else (data[0],) * 3
    iqr = q3 - q1
    mean = statistics.fmean(data)
    sd = statistics.stdev(data) if n > 1 else 0.0
    lo, hi = q1 - 1.5 * iqr, q3 + 1.5 * iqr
    return {"min": min(data), "max": max(data), "mean": mean, "stddev": sd, "rounds": n,
            "median": statistics.median(data), "iqr": iqr, "q1": q1, "q3": q3,
            "iqr_outliers": sum(not lo <= x <= hi for x in data),
            "stddev_outliers": sum(abs(x - mean) > sd for x in data) if sd else 0,
            "outliers": f"{sum(abs(x - mean) > sd for x in data) if sd else 0};{sum(not lo <= x <= hi for x in data)}",
            "ld15iqr": min(x for x in data if x >= lo), "hd15iqr": max(x for x in data if x <= hi),
            "ops": 1.0 / mean, "total": sum(data), "data": list(data), "iterations": 1}


def check(source: str, measurements: dict[str, Measurement]) -> None:
    if not measurements:
        raise UserError(f"export: run {source} has no ok result to export")
    for m in measurements.values():
        if m.disagreement:
            raise UserError(f"export: {source}: the repeats of {m.key!r} disagree: {m.disagreement}")


def machine_info(env: dict) -> dict:
    """pytest-benchmark's machine_info of the target that ran the jobs (its result's env, as
    workloads/envinfo.facts recorded it there), never the machine that exports: a baseline made
    on a laptop from a board's run describes the board. What the target did not record is
    empty, not this machine's."""
    python = (env.get("versions") or {}).get("python") or ""
    return {"node": env.get("hostname") or "", "processor": env.get("arch") or "", "machine": env.get("arch") or "",
            "python_implementation": "CPython" if python else "", "python_version": python, "python_compiler": "",
            "release": env.get("kernel") or "", "system": "Linux",
            "cpu": {"brand_raw": env.get("cpu_model") or "", "count": env.get("cores") or 0}}


def commit_info(git: dict, harness_commit: str) -> dict:
    """pytest-benchmark's commit_info from the run's git facts (run.json's `git`, runs.git_facts):
    its commit, branch and dirtiness; a run recorded without them falls back to the harness
    commit its results name, and no branch."""
    commit = git.get("commit") or harness_commit
    return {"id": commit, "time": None, "author_time": None,
            "dirty": bool(git.get("dirty")) if "dirty" in git else commit.endswith("-dirty"),
            "project": "zobench", "branch": git.get("branch") or None}


def pytest_benchmark(source: str, measurements: dict[str, Measurement], env: dict, git: dict) -> str:
    """The export of a run: env, the env of one of its ok results (the target that ran it); git,
    its run.json's git facts."""
    check(source, measurements)
    first = next(iter(measurements.values()))     # check() refused a run with none
    doc = {
        "machine_info": machine_info(env),
        "commit_info": commit_info(git, first.harness_commit),
        "benchmarks": [{
            "group": m.facts["workload"], "name": m.key, "fullname": f"zobench::{source}::{m.key}",
            "params": m.facts, "param": m.key,
            "extra_info": {"zobench": {"key": m.key, "facts": m.facts, "peak_rss_bytes": m.peak_rss,
                                       "device_peak_bytes": m.device_peak, "joules_per_step": m.joules_per_step,
                                       "per_epoch": m.per_epoch, "load": m.load, "validity": m.validity,
                                       "adaptive": m.adaptive, "instructions": m.instructions,
                                       "instruction_builds": m.instruction_builds,
                                       "fingerprint": m.fingerprint,
                                       "binary_sha256": m.binary_sha256, "harness_commit": m.harness_commit}},
            "options": {"disable_gc": False, "timer": "time.perf_counter", "min_rounds": len(m.step_s),
                        "max_time": 0.0, "min_time": 0.0, "warmup": False},
            "stats": _stats(m.step_s),
        } for m in measurements.values()],
        "datetime": datetime.now(timezone.utc).isoformat(),
        "version": PYTEST_BENCHMARK_VERSION,
    }
    return jsonfile.dumps(doc)


# the CSV's header: its first line, by which a file is known as one export wrote (exported())
CSV_HEADER = ["workload", "method", "precision", "runtime", "target", "threads", "hyper", "repeats", "median_ms_per_step",
              "min_ms_per_step", "max_ms_per_step", "median_peak_rss_mib", "median_device_peak_mib",
              "median_joules_per_step", "cpu_model", "harness_commit"]


def exported(path: Path) -> bool:
    """Whether a file is one export wrote, which export --out may replace: a pytest-benchmark JSON
    whose commit_info names zobench as its project, or a CSV whose first line is CSV_HEADER.
    Anything unreadable is not."""
    try:
        with open(path, newline="") as f:
            text = f.read(1 << 26)
    except (OSError, UnicodeDecodeError):
        return False
    if text.lstrip().startswith("{"):
        try:
            doc = json.loads(text)
        except ValueError:
            return False
        return isinstance(doc, dict) and isinstance(doc.get("commit_info"), dict) \
            and doc["commit_info"].get("project") == "zobench"
    return next(csv.reader(io.StringIO(text)), None) == CSV_HEADER


def csv_text(source: str, measurements: dict[str, Measurement]) -> str:
    check(source, measurements)
    out = io.StringIO()
    w = csv.writer(out)
    w.writerow(CSV_HEADER)
    for m in measurements.values():
        f = m.facts
        w.writerow([f["workload"], f["method"], f["precision"], f["runtime"], f["target"], f["threads"], f["hyper"],
                    len(m.peak_rss),
                    f"{1000 * statistics.median(m.step_s):.4f}", f"{1000 * min(m.step_s):.4f}",
                    f"{1000 * max(m.step_s):.4f}", f"{statistics.median(m.peak_rss) / 2 ** 20:.2f}",
                    f"{statistics.median(m.device_peak) / 2 ** 20:.2f}" if m.device_peak else "",
                    f"{statistics.median(m.joules_per_step):.6g}" if m.joules_per_step else "",
                    m.fingerprint.get("cpu_model") or "", m.harness_commit])
    return out.getvalue()
