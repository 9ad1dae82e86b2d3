"""The results store: raw result files are the truth, SQLite is an index over them.

RESULTS/runs/<run_id>/run.json        the plan of the run (what --resume replays)
RESULTS/runs/<run_id>/<job_id>.json   one result per job, written atomically
RESULTS/runs/<run_id>/work/<job_id>/  spec, runner output and logs of a job
RESULTS/zobench.sqlite                rebuilt from the files by reindex() at any time
"""
from __future__ import annotations

import json
import secrets
import sqlite3
from datetime import datetime, timezone
from pathlib import Path

from workloads.runner import write_atomic as write_json_atomic

from .errors import UserError
from .plan import safe_name

COLUMNS = ("run_id", "job_id", "target", "runtime", "method", "bp_layers", "precision", "zo_loss",
           "model", "dataset", "repeat", "status", "error", "steps", "train_seconds", "step_seconds",
           "peak_rss_bytes", "test_accuracy", "train_loss", "started_at")


def summary(run_id: str, r: dict) -> dict:
    """The flat index row of a result."""
    job = r.get("job") or {}
    last = r["epochs"][-1] if r.get("epochs") else {}
    steps = r.get("steps") or 0
    return {
        "run_id": run_id, "job_id": job.get("job_id"), "target": job.get("target"),
        "runtime": job.get("runtime"), "method": job.get("method"), "bp_layers": job.get("bp_layers", 0),
        "precision": job.get("precision"), "zo_loss": job.get("zo_loss"),
        "model": (job.get("workload") or {}).get("model"), "dataset": (job.get("workload") or {}).get("dataset"),
        "repeat": job.get("repeat", 0), "status": r.get("status"), "error": r.get("error"), "steps": steps,
        "train_seconds": r.get("train_seconds"),
        "step_seconds": r["train_seconds"] / steps if steps else None,
        "peak_rss_bytes": (r.get("memory") or {}).get("peak_rss_bytes"),
        "test_accuracy": last.get("test_accuracy"), "train_loss": last.get("train_loss"),
        "started_at": r.get("started_at"),
    }


class Store:
    def __init__(self, root: Path):
        self.root = Path(root)
        self.runs = self.root / "runs"
        self.db_path = self.root / "zobench.sqlite"

    # -- runs ---------------------------------------------------------------
    def new_run(self, plan: dict) -> str:
        self.runs.mkdir(parents=True, exist_ok=True)
        run_id = datetime.now(timezone.utc).strftime("%Y%m%d-%H%M%S-") + secrets.token_hex(2)
        (self.runs / run_id / "work").mkdir(parents=True)
        write_json_atomic(self.runs / run_id / "run.json", {"run_id": run_id, **plan})
        with self._db() as db:
            _index_run(db, run_id, plan)
        return run_id

    def run_plan(self, run_id: str) -> dict:
        path = self.runs / run_id / "run.json"
        if not path.is_file():
            raise UserError(f"unknown run {run_id!r} in {self.root}; runs: {', '.join(self.run_ids()[-5:]) or 'none'}")
        return json.loads(path.read_text())

    def run_ids(self) -> list[str]:
        return sorted(p.name for p in self.runs.glob("*") if (p / "run.json").is_file()) if self.runs.is_dir() else []

    def latest(self) -> str:
        ids = self.run_ids()
        if not ids:
            raise UserError(f"no runs in {self.root}; start one with `zobench run`")
        return ids[-1]

    def save_probe(self, run_id: str, target: str, facts: dict) -> None:
        d = self.runs / run_id / "probes"
        d.mkdir(exist_ok=True)
        write_json_atomic(d / f"{safe_name(target)}.json", {"target": target, **facts})

    def work_dir(self, run_id: str, job_id: str) -> Path:
        d = self.runs / run_id / "work" / job_id
        d.mkdir(parents=True, exist_ok=True)
        return d

    # -- results ------------------------------------------------------------
    def add_result(self, run_id: str, result: dict) -> Path:
        """Write the raw result, then index it in one transaction."""
        path = self.runs / run_id / f"{result['job']['job_id']}.json"
        write_json_atomic(path, result)
        with self._db() as db:
            _index_result(db, run_id, result)
        return path

    def results(self, run_id: str, plan: dict | None = None) -> list[dict]:
        """Raw results of a run (the files, not the index), in plan order; `plan` is the run's
        run_plan() where the caller has read it already."""
        if plan is None:
            plan = self.run_plan(run_id)
        out = []
        for job in plan["jobs"]:
            p = self.runs / run_id / f"{job['job_id']}.json"
            if p.is_file():
                out.append(json.loads(p.read_text()))
        return out

    def reindex(self) -> int:
        """Rebuild the SQLite index from the raw files; returns the number of results."""
        if self.db_path.exists():
            self.db_path.unlink()
        n = 0
        with self._db() as db:
            for run_id in self.run_ids():
                _index_run(db, run_id, self.run_plan(run_id))
                for r in self.results(run_id):
                    _index_result(db, run_id, r)
                    n += 1
        return n

    def query(self, sql: str, args=()) -> list[sqlite3.Row]:
        with self._db() as db:
            db.row_factory = sqlite3.Row
            return db.execute(sql, args).fetchall()

    def _db(self) -> sqlite3.Connection:
        self.root.mkdir(parents=True, exist_ok=True)
        db = sqlite3.connect(self.db_path, timeout=30)
        db.execute("CREATE TABLE IF NOT EXISTS runs (run_id TEXT PRIMARY KEY, created_at TEXT, suite TEXT, jobs INTEGER)")
        db.execute("CREATE TABLE IF NOT EXISTS results (" + ", ".join(COLUMNS) + ", PRIMARY KEY (run_id, job_id))")
        return _Closing(db)


def _index_run(db, run_id: str, plan: dict) -> None:
    db.execute("INSERT OR REPLACE INTO runs VALUES (?, ?, ?, ?)",
               (run_id, plan.get("created_at"), plan.get("suite"), len(plan.get("jobs", []))))


def _index_result(db, run_id: str, result: dict) -> None:
    row = summary(run_id, result)
    db.execute(f"INSERT OR REPLACE INTO results ({', '.join(COLUMNS)}) VALUES ({', '.join('?' * len(COLUMNS))})",
               [row[c] for c in COLUMNS])


class _Closing:
    """sqlite3's context manager commits but never closes; this one does both."""

    def __init__(self, db):
        self.db = db

    def __enter__(self):
        return self.db

    def __exit__(self, exc_type, *exc):
        (self.db.commit if exc_type is None else self.db.rollback)()
        self.db.close()
        return False
