"""Executing a planned run: boards in parallel, one job at a time on each board
(benchmarks must not share a board), every result stored as soon as it exists."""
from __future__ import annotations

import traceback
from collections import defaultdict
from concurrent.futures import ThreadPoolExecutor
from contextlib import closing

from .execute import failure, open_site, prepare, run_job
from .inventory import Target
from .plan import Job
from .probe import probe
from .progress import ProgressView
from .store import Store
from .transport import LocalTransport, TransportError


def transport_for(target: Target):
    if target.transport == "local":
        return LocalTransport()
    from .ssh import SshTransport   # paramiko and fabric take ~0.2 s to import: only a board pays it
    return SshTransport(target)


def execute(store: Store, run_id: str, jobs: list[Job], targets: dict[str, Target],
            view: ProgressView) -> list[dict]:
    """Run jobs; returns their results in plan order."""
    by_target = defaultdict(list)
    for job in jobs:
        by_target[job.target].append(job)
    results = {}

    def finish(name: str, result: dict) -> None:
        store.add_result(run_id, result)
        results[result["job"]["job_id"]] = result
        view.job_finished(name, result)

    prepared = prepare(by_target, targets)    # once, here: the boards' threads only deploy it

    def board(name: str) -> None:
        target, todo, prep = targets[name], by_target[name], prepared[name]
        if prep.build_error:      # no binary: its cpp jobs say why, the others still run
            for job in todo:
                if job.spec["runtime"] == "cpp":
                    finish(name, failure(job, "failed", prep.build_error))
            todo = [j for j in todo if j.spec["runtime"] != "cpp"]
            if not todo:
                return
        with closing(transport_for(target)) as transport:     # closed however the board ends
            try:
                facts = probe(transport, target)
                store.save_probe(run_id, name, facts)
                site = open_site(target, transport, prep, store.runs / run_id / "work", run_id)
            except TransportError as e:
                for job in todo:        # the board is unusable: every job of it says why
                    finish(name, failure(job, "failed", str(e)))
                return
            for job in todo:
                view.job_started(name, job.job_id)
                try:
                    result = run_job(job, target, site, store.work_dir(run_id, job.job_id),
                                     on_event=lambda ev: view.event(name, ev))
                except TransportError as e:
                    result = failure(job, "lost", str(e))
                except Exception as e:  # a harness bug must not take the other boards' results down
                    traceback.print_exc()
                    result = failure(job, "failed", f"harness error: {type(e).__name__}: {e}")
                result["env"]["probe"] = facts
                finish(name, result)

    with ThreadPoolExecutor(max_workers=len(by_target)) as pool:
        for f in [pool.submit(board, name) for name in by_target]:
            f.result()
    return [results[j.job_id] for j in jobs if j.job_id in results]
