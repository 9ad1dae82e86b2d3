"""Executing a planned run: boards in parallel, one job at a time on each board
(benchmarks must not share a board: within a run by this order, between runs by each board's
lease, harness/boards/lease.py), every result stored as soon as it exists.

Whatever goes wrong on one board -- an unreachable host, a probe or deploy that fails or
raises, a harness bug in one job -- ends only that board's jobs (status failed, lost or
timeout, with the reason in one line); the other boards run on. A pool's jobs are spread over
its members (harness/execution/pool.py), where a lost member costs only its attempt. A Stop (a signal) starts
no more jobs anywhere and kills the running ones (status interrupted); jobs that never
started get no result, so --resume runs them."""
from __future__ import annotations

from collections import defaultdict
from concurrent.futures import ThreadPoolExecutor, wait

from harness.boards import lease
from harness.execution import pool, stages
from harness.execution.board import connected
from harness.preparation.bundle import Prepared
from harness.execution.job import reason
from harness.planning.inventory import Target
from harness.planning.runs import Job, failure
from harness.execution.progress import ProgressView
from harness.stores.store import Store
from harness.boards.transport import POLL_S, Stop


def execute(store: Store, run_id: str, jobs: list[Job], targets: dict[str, Target],
            prepared: dict[str, Prepared], view: ProgressView, stop: Stop | None = None,
            lease_timeout: float | None = None) -> list[dict]:
    """Run jobs with what bundle.prepare made for their targets; returns their results in plan
    order (a job that never started has none). Pretraining jobs and the jobs that start from
    nothing run first; then the fine-tuning jobs, each from its pretraining job's weights. A job
    waits for its board's lease up to lease_timeout seconds (None: its own timeout)."""
    stop = stop or Stop()
    terms = lease.Terms(run_id, lease_timeout)
    results = {}

    def finish(name: str, result: dict) -> None:
        try:
            store.add_result(run_id, result)
        except OSError as e:    # a full disk, a folder gone read-only: nothing more can be kept, so nothing more runs
            stop.request(f"cannot store results in {store.runs / run_id}: {e.strerror or e}")
            return
        results[result["job"]["job_id"]] = result
        view.job_finished(name, result)

    first, then = stages.split(jobs)
    _wave(store, run_id, first, targets, prepared, view, stop, results, finish, terms)
    if then and not stop.is_set():
        ready, failed = stages.link(store, run_id, then)
        for r in failed:
            finish(r["job"]["target"], r)
        prepared = {name: p.with_pretrained([j for j in ready if j.target == name]) for name, p in prepared.items()}
        _wave(store, run_id, ready, targets, prepared, view, stop, results, finish, terms)
    return [results[j.job_id] for j in jobs if j.job_id in results]


def _wave(store: Store, run_id: str, jobs: list[Job], targets: dict[str, Target], prepared: dict[str, Prepared],
          view: ProgressView, stop: Stop, results: dict, finish, terms: lease.Terms) -> None:
    """Boards (and pools) in parallel, each board running its jobs of this wave in turn."""
    by_target = defaultdict(list)
    for job in jobs:
        by_target[job.target].append(job)

    def run_board(name: str) -> None:
        target, todo, prep = targets[name], by_target[name], prepared[name]
        if not todo or stop.is_set():
            return
        with connected(name, target, prep, store, run_id, view, stop) as ready:
            if ready is None:
                return
            _, board = ready
            for job in todo:
                if stop.is_set():
                    return
                view.job_started(name, job.job_id)
                finish(name, board.run(job, store, run_id, lambda ev: view.event(name, ev), terms))

    def board(name: str) -> None:
        if targets[name].pool:
            return pool.run(targets[name], by_target[name], prepared[name], store, run_id, view, stop, finish,
                            terms)
        try:
            run_board(name)
        except Exception as e:  # the board is unusable (probe, deploy, ...): its jobs say why, the others run on
            why = reason(e)
            for job in by_target[name]:
                if job.job_id not in results and not stop.is_set():
                    finish(name, failure(job, "failed", why))

    with ThreadPoolExecutor(max_workers=len(by_target) or 1) as threads:
        futures = [threads.submit(board, name) for name in by_target]
        # in short waits: Python runs a signal handler only when the main thread runs bytecode, and
        # a signal the kernel gave to a board's thread does not wake a main thread blocked for good
        while wait(futures, timeout=POLL_S).not_done:
            pass
        for f in futures:
            f.result()
