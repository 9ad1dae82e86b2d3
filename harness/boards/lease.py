"""One job per board at a time: the lease a job's launcher takes on the board before its runner
starts (workloads/launch.py holds it, as flock(2) on the target's `lease` file, for the runner's
life).

Two `zobench run`s, two people or a CI job beside a terminal, would otherwise train on one board
at once and both time each other's work. The lease lives on the board, not in the controller,
so runs from different machines see it too, and a controller that dies or loses its connection
never leaves it taken. A job waits for it (the wait is never timed) up to its lease timeout, and
then ends `busy`, for `--resume` to run later.
"""
from __future__ import annotations

import getpass
import json
import socket
from dataclasses import dataclass


@dataclass(frozen=True)
class Terms:
    """What a run asks of every board's lease: who it is, and how long a job may wait."""
    run_id: str
    timeout_s: float | None = None      # None: each job's own timeout

    def holder(self, job_id: str) -> dict:
        """What a waiting run is told about this job, written into the lease file."""
        try:
            user = getpass.getuser()
        except (KeyError, OSError):     # no passwd entry for this uid (a container)
            user = "?"
        return {"run": self.run_id, "job": job_id, "host": socket.gethostname(), "user": user}

    def wait_s(self, job_timeout_s: float) -> float:
        return job_timeout_s if self.timeout_s is None else self.timeout_s


def launcher_args(file: str, terms: Terms, job_id: str, job_timeout_s: float) -> list[str]:
    """The launcher's lease options; none where the target leases nothing (`lease = false`)."""
    if not file:
        return []
    return ["--lease", file, "--lease-timeout", f"{terms.wait_s(job_timeout_s):g}",
            "--holder", json.dumps(terms.holder(job_id), separators=(",", ":"))]


def describe(holder) -> str:
    """"run R job J from host H (user U) since T", from what the holder wrote; it may be
    anything (the file is on the board), so only strings are shown."""
    if not isinstance(holder, dict):
        return "another job (its holder not written yet)"
    s = {k: v for k, v in holder.items() if isinstance(v, str)}
    return (f"run {s.get('run', '?')} job {s.get('job', '?')} from host {s.get('host', '?')} "
            f"(user {s.get('user', '?')}) since {s.get('since', '?')}")
