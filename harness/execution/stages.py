"""Two-stage runs: pretraining jobs first, then the fine-tuning jobs that start from their
final weights (plan.make: a suite's [pretrain] table).

A pretraining job is an ordinary job whose runner writes its final weights beside its result
(save_weights); run_job fetches them into the job's work folder and checks them against the
result's weights_sha256. Before the fine-tuning jobs start, each gets the sha256 of its
pretraining job's weights (spec init_sha256): the file is put in the host's cache under that
hash and travels to a board like every other content-addressed file, and run_job checks that
the runner started from exactly those bytes. A fine-tuning job whose pretraining job did not
end ok, or left no such file, ends failed with that reason and never starts.
"""
from __future__ import annotations

import dataclasses
from pathlib import Path

from workloads import vocab

from harness.preparation.artifacts import content_id, pretrained_weights_file
from harness.planning.runs import Job, failure


def split(jobs: list[Job]) -> tuple[list[Job], list[Job]]:
    """(the jobs that start from nothing of the run, the jobs that start from a pretraining job's weights)."""
    return [j for j in jobs if not j.spec["pretrained_from"]], [j for j in jobs if j.spec["pretrained_from"]]


def weights_file(store, run_id: str, result: dict) -> Path | None:
    """The weights a pretraining job's ok result ended with, as fetched from its target, when
    the file is there and is what its result says (weights_sha256); None otherwise."""
    if result.get("status") != "ok":
        return None
    path = store.run_dir(run_id) / "work" / result["job"]["job_id"] / vocab.WEIGHTS_FILE
    want = (result.get("model") or {}).get("weights_sha256")
    return path if path.is_file() and content_id(path)[0] == want else None


def link(store, run_id: str, jobs: list[Job]) -> tuple[list[Job], list[dict]]:
    """The fine-tuning jobs ready to run (their specs name the weights they start from), and
    the failed results of those whose pretraining job did not end ok."""
    results = {r["job"]["job_id"]: r for r in store.results(run_id)}
    ready, failed = [], []
    for job in jobs:
        src = job.spec["pretrained_from"]
        r = results.get(src)
        path = weights_file(store, run_id, r) if r else None
        if path is None:
            why = ("has no result" if r is None else f"ended {r['status']}: {r.get('error')}" if r["status"] != "ok"
                   else f"left no {vocab.WEIGHTS_FILE} matching its result's weights_sha256")
            failed.append(failure(job, "failed", f"its pretraining job {src} {why}"))
            continue
        sha = r["model"]["weights_sha256"]
        pretrained_weights_file(path, sha)
        ready.append(dataclasses.replace(job, spec={**job.spec, "init_sha256": sha}))
    return ready, failed


def to_rerun(plan_jobs: list[dict], done: set[str], store, run_id: str) -> set[str]:
    """--resume: the jobs of a run to run again. A job not ended ok; a pretraining job whose
    weights file is gone or altered; and every fine-tuning job of a pretraining job run again,
    so each result still starts from the weights its pretraining job's result names."""
    results = {r["job"]["job_id"]: r for r in store.results(run_id)}
    again = {j["job_id"] for j in plan_jobs if j["job_id"] not in done}
    sources = {j["spec"]["pretrained_from"] for j in plan_jobs if j["spec"].get("pretrained_from")}
    again |= {s for s in sources if s in results and weights_file(store, run_id, results[s]) is None}
    return again | {j["job_id"] for j in plan_jobs if j["spec"].get("pretrained_from") in again}
