"""A run's plain data: its jobs, their file-safe names, the result of a job that has none of its
runner's, and the record a run's run.json starts from. No I/O but asking git what ran: the
planner, the store, the scheduler and the gate all import it, and it imports none of them."""
from __future__ import annotations

import hashlib
import json
import os
import re
import subprocess
import sys
from dataclasses import dataclass
from datetime import datetime, timezone

from workloads.result import skeleton

from harness import paths
from harness.store_url import shown_argv


@dataclass
class Job:
    job_id: str
    target: str
    timeout_s: float
    spec: dict
    # a memory budget of the job's own ("700M"), in place of its target's mem_limit: fit's probes
    # and an equal-memory study run under one budget while their pretraining job on the same
    # target does not; "" = the target's
    mem_limit: str = ""

    def to_dict(self) -> dict:
        return {"job_id": self.job_id, "target": self.target, "timeout_s": self.timeout_s, "spec": self.spec,
                **({"mem_limit": self.mem_limit} if self.mem_limit else {})}


def safe_name(text: str) -> str:
    """A file-name-safe version of a target or job name (the real name stays in the spec)."""
    return re.sub(r"[^A-Za-z0-9._-]+", "_", text).strip("._") or "_"


def failure(job: Job, status: str, error: str, started_at: str = "", wall: float = 0.0, steps: int = 0) -> dict:
    """The result of a job whose runner could not write one."""
    r = skeleton(job.spec, {"harness_commit": job.spec.get("harness_commit", "")}, status, error)
    return {**r, "started_at": started_at or r["started_at"], "wall_seconds": wall, "steps": steps,
            "spec_sha256": spec_sha256(job.spec)}


# the spec's fields a run fills in as it goes, after run.json is written: a fine-tuning job's
# init_sha256, its pretraining job's weights (harness/execution/stages.py link)
FILLED_BY_THE_RUN = ("init_sha256",)


def spec_sha256(spec: dict) -> str:
    """The hash of a job's spec as the plan wrote it (run.json), less FILLED_BY_THE_RUN: its result
    carries it, so a reader can tell a run.json edited after the run from the one its results ran by."""
    planned = {k: v for k, v in spec.items() if k not in FILLED_BY_THE_RUN}
    return hashlib.sha256(json.dumps(planned, sort_keys=True, separators=(",", ":")).encode()).hexdigest()


def _git(*args: str) -> str:
    try:
        rev = subprocess.run(["git", "-C", str(paths.REPO), *args], capture_output=True, text=True, timeout=10)
        return rev.stdout.strip() if rev.returncode == 0 else ""
    except (OSError, subprocess.SubprocessError):
        return ""


def harness_commit() -> str:
    return _git("describe", "--always", "--dirty", "--abbrev=12")


def git_facts() -> dict:
    """The commit and branch a run's code came from: a shared store orders history by them and
    takes a CI baseline from a branch's runs. $ZOBENCH_BRANCH names the branch where a CI
    checkout is detached (git says HEAD there), $ZOBENCH_COMMIT the commit where the code came
    without its .git (an unpacked artifact); a dirty tree is said so, since its commit is not
    what ran."""
    branch = os.environ.get("ZOBENCH_BRANCH") or _git("rev-parse", "--abbrev-ref", "HEAD")
    return {"commit": os.environ.get("ZOBENCH_COMMIT") or _git("rev-parse", "HEAD"),
            "branch": "" if branch == "HEAD" else branch, "dirty": harness_commit().endswith("-dirty")}


def record(**fields) -> dict:
    """A new run's run.json: when it was made, the command line that made it (every form of a
    password hidden) and the code's commit and branch, then the command's own FIELDS (suite,
    jobs, a search's record). zobench run, fit and tune all start here, so a pushed run of any
    of them has its commit."""
    return {"created_at": datetime.now(timezone.utc).isoformat(timespec="seconds"),
            "argv": shown_argv(sys.argv[1:]), "git": git_facts(), **fields}
