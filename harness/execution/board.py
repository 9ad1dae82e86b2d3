"""A board made ready for jobs: reached (a labgrid place reserved first), connected, probed, sent
its bundle and binary; then each job's result, however the job ended. A lone board's jobs
(harness/execution/scheduler.py) and a pool's members (harness/execution/pool.py) both run
through it."""
from __future__ import annotations

import contextlib
import traceback
from contextlib import closing, nullcontext
from dataclasses import dataclass

from harness.boards import lease
from harness.boards.probe import probe
from harness.boards.transport import LocalTransport, Stop, TransportError
from harness.execution.job import reason, run_job
from harness.execution.progress import ProgressView
from harness.planning.inventory import Target
from harness.planning.runs import Job, failure
from harness.preparation.bundle import Prepared, open_site
from harness.stores.store import Store


def transport_for(target: Target, stop: Stop | None = None):
    if target.transport == "local":
        return LocalTransport(stop)
    from harness.boards.ssh import SshTransport   # paramiko and fabric take ~0.2 s to import: only a board pays it
    return SshTransport(target, stop=stop)


def reach(target: Target, stop: Stop, on_wait=None):
    """The target to connect to for the block: a labgrid target's place reserved, acquired and
    released around it (harness/boards/labgrid_place.py); any other, as it is."""
    if not target.labgrid:
        return nullcontext(target)
    from harness.boards import labgrid_place      # labgrid is optional: only a labgrid target imports it

    return labgrid_place.place(target, stop, on_wait)


@contextlib.contextmanager
def connected(name: str, target: Target, prep: Prepared, store: Store, run_id: str, view: ProgressView, stop: Stop,
              judge=None):
    """A board reached, probed and deployed to, for its jobs: yields (target as reached, Board),
    or None where the run was stopped meanwhile (its jobs left for --resume). judge(target,
    facts) may refuse the board after its probe (a pool's member that differs from its
    siblings) by raising. The board's connection is closed however the block ends."""
    with reach(target, stop, lambda line: view.waiting(name, line)) as target, \
            closing(transport_for(target, stop)) as transport:
        facts = probe(transport, target)
        store.save_probe(run_id, target.name, facts)
        if judge:
            judge(target, facts)
        # the binary for the CPU the probe found (built once a run per CPU, whichever board asks first)
        binary = prep.binary(target, facts, stop) if prep.binaries else None
        if stop.is_set():       # stopped while it built (Ctrl-C ends the compiler too): --resume runs its jobs
            yield None
            return
        usable = None if binary and binary.error else binary
        counter = prep.counter(target, binary, facts, stop) if binary else None
        site = open_site(target, transport, prep, usable, store.runs / run_id / "work", run_id, counter)
        yield target, Board(target, site, facts, binary.error if binary else "")


@dataclass
class Board:
    """A board ready to run jobs on: its site, its probe's facts, and why its cpp jobs cannot run
    ("" where they can)."""
    target: Target
    site: object
    facts: dict
    binary_error: str = ""

    def run(self, job: Job, store: Store, run_id: str, on_event, terms: lease.Terms) -> dict:
        """One job's result, however it ended: a transport that went away is `lost`, a harness
        bug in one job `failed` with its reason (the board's next jobs still run)."""
        if self.binary_error and job.spec["runtime"] == "cpp":     # no binary: its cpp jobs say why
            return failure(job, "failed", self.binary_error)
        try:
            result = run_job(job, self.target, self.site, store.work_dir(run_id, job.job_id), on_event=on_event,
                             terms=terms)
        except TransportError as e:
            result = failure(job, "lost", reason(e))
        except OSError as e:    # this machine's files (a full disk): said once, by finish()
            result = failure(job, "failed", f"on this machine: {e.strerror or e}: {e.filename or ''}")
        except Exception as e:  # a harness bug in one job
            traceback.print_exc()
            result = failure(job, "failed", f"harness error: {reason(e)}")
        result["env"]["probe"] = self.facts
        return result
