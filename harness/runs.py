"""Executing a planned run: boards in parallel, one job at a time on each board."""
from __future__ import annotations

from collections import defaultdict
from concurrent.futures import ThreadPoolExecutor

from .execute import run_job
from .inventory import Target
from .plan import Job
from .progress import ProgressView
from .store import Store
from .transport import LocalTransport


def transport_for(target: Target):
    if target.transport == "local":
        return LocalTransport()
    raise NotImplementedError(f"target {target.name}: the {target.transport} transport is not available yet")


def execute(store: Store, run_id: str, jobs: list[Job], targets: dict[str, Target],
            view: ProgressView) -> list[dict]:
    """Run jobs, storing each result as soon as it exists; returns them in plan order."""
    by_target = defaultdict(list)
    for job in jobs:
        by_target[job.target].append(job)
    results = {}

    def board(name: str) -> None:
        target = targets[name]
        transport = transport_for(target)
        for job in by_target[name]:
            view.job_started(name, job.job_id)
            result = run_job(job, target, transport, store.work_dir(run_id, job.job_id),
                             on_event=lambda ev: view.event(name, ev))
            store.add_result(run_id, result)
            results[job.job_id] = result
            view.job_finished(name, result)

    with ThreadPoolExecutor(max_workers=len(by_target)) as pool:
        for f in [pool.submit(board, name) for name in by_target]:
            f.result()
    return [results[j.job_id] for j in jobs if j.job_id in results]
