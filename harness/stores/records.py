"""Compact run records: what a run's results folder holds that the reproduction's tables are built
from, small enough to commit, so the tables outlive the machine that ran them.

A results folder (harness/stores/store.py) is the only full copy of a run, and it stays on the
machine: when the machine goes, its runs go, and a table generated from them can no longer be
rebuilt. A record keeps, per job, what the tables read and what tells the job apart: its spec as
planned (checked against the result's spec_sha256), the commit and seed, its cell's key facts, every
epoch's losses and accuracy (the validation split's, where the job held one out: its data set is
named -valN), the starting weights' accuracy, the harness's judgement of the run (final and best
accuracy, flags), the run's id, suite and command line (and an equal-memory study's budget and
models), its status, its peak memory and the load its steps were timed under (the equal-memory
table shows both). Per-step phases and the machine's full probe stay in the results folder and
the shared store: no committed table reads them.

A records file is gzip'd JSON lines, one record a line, sorted by run and job, compressed with a
zero time stamp and no file name: writing the same records gives the same bytes, so a records file
in git changes only where its records do. `store(records, results)` writes records back as runs of
a results folder, so every table is built from records by the same code that builds it from runs.
"""
from __future__ import annotations

import gzip
import io
import json
import math
import os
import tempfile
import zlib
from pathlib import Path

from harness.errors import UserError
from harness.planning.runs import spec_sha256
from harness.stores.schema import VERSION as RESULT_SCHEMA, stored_problems
from harness.stores import machine_load
from harness.stores.store import RUN_ID, Store

# 2: memory and load (a version-1 record reads as one that measured neither)
VERSION = 2
# what a record holds, and the type of each (None: null allowed)
FIELDS = {"schema": (int,), "run_id": (str,), "job_id": (str,), "status": (str,), "error": (str, None),
          "spec_sha256": (str, None), "cell": (dict,), "run": (dict,), "job": (dict,), "started_at": (str,),
          "wall_seconds": (int, float), "train_seconds": (int, float), "steps": (int,), "epochs": (list,),
          "start_eval": (dict, None), "convergence": (dict, None), "model": (dict, None), "cpu_model": (str, None),
          "nonfinite": (list,), "memory": (dict, None), "load": (dict, None)}
# a run's facts each record of it carries: the tables' list of runs says what each one was, and
# an equal-memory study's table its budget and models (reports/equal_memory.py)
RUN_FACTS = ("suite", "argv", "git", "created_at", "equal_memory")
# the memory figures a record keeps of its result's (the tables' peak and baselines)
MEMORY = ("peak_rss_bytes", "baseline_rss_bytes", "loaded_rss_bytes", "device_peak_bytes")
# a timeout for the plans written back (a record is no job to run again; the plan needs one)
PLAN_TIMEOUT_S = 3600.0


def cell(job: dict, suite: str | None) -> dict:
    """A job's key facts, as a reader of a records file looks a cell up (and greps for it): the
    suite, data set, method, precision, ZO loss, runtime, seed and commit, and the drift a
    fine-tuning job trained on (rotation, subset) and a tuning split, where set. Derived from the
    job's spec: a record whose cell says otherwise is damaged."""
    w = job.get("workload") or {}
    facts = {"suite": suite, "dataset": w.get("dataset"), "model": w.get("model"), "method": job.get("method"),
             "bp_layers": job.get("bp_layers"), "precision": job.get("precision"), "zo_loss": job.get("zo_loss"),
             "runtime": job.get("runtime"), "target": job.get("target"), "seed": job.get("seed"),
             "harness_commit": job.get("harness_commit"), "pretrained_from": job.get("pretrained_from") or None}
    facts.update({k: w[k] for k in ("rotate", "subset", "validation") if w.get(k)})
    return facts


def record(run_id: str, plan: dict, result: dict) -> dict:
    """The record of one stored result (as Store.results reads it) of run_id, whose plan is plan. Its
    job is the spec as planned, the one its spec_sha256 is of, not as the machine filled it in (the
    paths of its data and weights there): a record says what ran, not where."""
    job = next((j["spec"] for j in plan["jobs"] if j["job_id"] == result["job"]["job_id"]), result["job"])
    return {
        "schema": VERSION, "run_id": run_id, "job_id": result["job"]["job_id"], "status": result["status"],
        "error": result["error"], "spec_sha256": result.get("spec_sha256"), "cell": cell(job, plan.get("suite")),
        "run": {**{k: plan[k] for k in RUN_FACTS if k in plan}, "jobs": len(plan["jobs"])},
        "job": job, "started_at": result["started_at"], "wall_seconds": result["wall_seconds"],
        "train_seconds": result["train_seconds"], "steps": result["steps"],
        "epochs": [{k: v for k, v in e.items() if k != "phases"} for e in result["epochs"]],
        "start_eval": result.get("start_eval"), "convergence": result.get("convergence"),
        "model": result.get("model"), "cpu_model": (result.get("env") or {}).get("cpu_model"),
        "nonfinite": result.get("nonfinite") or [],
        "memory": {k: result["memory"].get(k) for k in MEMORY}, "load": machine_load.of_steps(result),
    }


def of_runs(store, run_ids: list[str]) -> list[dict]:
    """The records of every stored result of these runs (a results folder, or the shared store)."""
    out = []
    for run_id in run_ids:
        plan = store.run_plan(run_id)
        out += [record(run_id, plan, r) for r in store.results(run_id, plan)]
    return out


def result(rec: dict) -> dict:
    """A record as a stored result: what it keeps, and the rest unmeasured (the schema's nulls)."""
    return {"schema": RESULT_SCHEMA, "job": rec["job"], "status": rec["status"], "error": rec["error"],
            "started_at": rec["started_at"], "wall_seconds": rec["wall_seconds"],
            "train_seconds": rec["train_seconds"], "steps": rec["steps"], "phases": {},
            "epochs": rec["epochs"], "start_eval": rec["start_eval"], "convergence": rec["convergence"],
            "model": rec["model"], "nonfinite": rec["nonfinite"], "spec_sha256": rec["spec_sha256"],
            "memory": {"peak_rss_bytes": 0, "baseline_rss_bytes": 0, **{k: v for k, v in (rec["memory"] or {}).items()
                                                                        if v is not None}},
            "timed_loop_load": rec["load"], "env": {"cpu_model": rec["cpu_model"]} if rec["cpu_model"] else {}}


def store(recs: list[dict], results: Path) -> tuple[Store, list[str]]:
    """Records written back as runs of a results folder (a fresh one): the store and its run ids,
    in order. Each run's plan has its recorded jobs, and its facts (suite, command line, commit)."""
    s, runs = Store(results), {}
    for rec in recs:
        runs.setdefault(rec["run_id"], []).append(rec)
    for run_id, rs in sorted(runs.items()):
        plan = {"run_id": run_id, **{k: rs[0]["run"][k] for k in RUN_FACTS if k in rs[0]["run"]},
                "planned_jobs": rs[0]["run"]["jobs"],
                "jobs": [{"job_id": r["job_id"], "target": r["job"]["target"], "timeout_s": PLAN_TIMEOUT_S,
                          "spec": r["job"]} for r in rs]}
        s.adopt_run(run_id, plan)
        for r in rs:
            s.add_result(run_id, result(r))
    return s, sorted(runs)


def key(rec: dict) -> tuple[str, str]:
    return rec["run_id"], rec["job_id"]


def line(rec: dict) -> str:
    return json.dumps(rec, sort_keys=True, separators=(",", ":"), allow_nan=False)


def write(path: Path, recs: list[dict]) -> None:
    """Write records to path, whole and at once (a temporary file renamed over it): sorted by run
    and job, gzip'd with no time stamp or name, so the same records always make the same bytes."""
    seen = {}
    for rec in recs:
        bad = problems(rec)
        if bad:
            raise UserError(f"{path}: record of run {rec.get('run_id')} job {rec.get('job_id')}: {bad[0]}; "
                            "nothing written")
        if key(rec) in seen:
            raise UserError(f"{path}: run {rec['run_id']} job {rec['job_id']} recorded twice; nothing written")
        seen[key(rec)] = rec
    text = "".join(line(seen[k]) + "\n" for k in sorted(seen))
    buf = io.BytesIO()
    with gzip.GzipFile(filename="", mode="wb", fileobj=buf, mtime=0, compresslevel=9) as gz:
        gz.write(text.encode())
    path.parent.mkdir(parents=True, exist_ok=True)
    fd, tmp = tempfile.mkstemp(dir=path.parent, prefix=f".{path.name}.")
    try:
        with os.fdopen(fd, "wb") as f:
            f.write(buf.getvalue())
        os.chmod(tmp, 0o644)        # a file to commit, read by everyone (mkstemp made it the owner's)
        os.replace(tmp, path)
    except OSError as e:
        Path(tmp).unlink(missing_ok=True)
        raise UserError(f"cannot write {path}: {e.strerror}") from None


def merged(old: list[dict], new: list[dict]) -> list[dict]:
    """old with the runs of new in place of any of theirs (a run's records are replaced whole)."""
    runs = {r["run_id"] for r in new}
    return [r for r in old if r["run_id"] not in runs] + new


def read(path: Path) -> list[dict]:
    """Every record of a records file, checked: a damaged record, or one of a newer version than
    this zobench reads, is one UserError naming the file and its line; nothing is read around it."""
    try:
        text = gzip.decompress(Path(path).read_bytes())
    except FileNotFoundError:
        raise UserError(f"{path}: no such records file") from None
    except OSError as e:
        if e.strerror:
            raise UserError(f"{path}: cannot read it: {e.strerror}") from None
        raise UserError(f"{path}: damaged: not a whole gzip file ({e})") from None
    except (EOFError, zlib.error) as e:
        raise UserError(f"{path}: damaged: not a whole gzip file ({e or 'it ends early'})") from None
    out, seen = [], {}
    for n, raw in enumerate(text.split(b"\n"), 1):
        if not raw:
            continue
        try:
            rec = json.loads(raw.decode(), parse_constant=_no_constant)
        except (UnicodeDecodeError, ValueError) as e:
            raise UserError(f"{path} line {n}: damaged: not a JSON record ({e})") from None
        schema = rec.get("schema") if isinstance(rec, dict) else None
        if isinstance(schema, int) and not isinstance(schema, bool) and schema > VERSION:
            raise UserError(f"{path} line {n}: a record of version {schema}, newer than this zobench reads "
                            f"({VERSION}): upgrade zobench")
        bad = problems(rec := upgrade(rec))
        if bad:
            raise UserError(f"{path} line {n}: damaged: {bad[0]}")
        if key(rec) in seen:
            raise UserError(f"{path} line {n}: damaged: run {rec['run_id']} job {rec['job_id']} is recorded "
                            f"on line {seen[key(rec)]} too")
        seen[key(rec)] = n
        out.append(rec)
    return out


def upgrade(rec):
    """A record of an older version in this version's shape, read as what it was: version 1 kept
    no memory and no load, unknown rather than zero (asv's results api_version). Anything else
    (not a record, or a newer one) is left for problems() to name."""
    if isinstance(rec, dict) and rec.get("schema") == 1 and not isinstance(rec.get("schema"), bool):
        return {**rec, "schema": VERSION, "memory": None, "load": None}
    return rec


def _no_constant(name: str):
    raise ValueError(f"{name} is no number a record holds")


def problems(rec) -> list[str]:
    """What is wrong with rec as a record of this version (empty when it is whole)."""
    if not isinstance(rec, dict):
        return ["not a JSON object"]
    out = []
    for k, kinds in FIELDS.items():
        if k not in rec:
            out.append(f"missing {k}")
        elif not any(v is None and rec[k] is None or v is not None and isinstance(rec[k], v)
                     and not isinstance(rec[k], bool) for v in kinds):
            out.append(f"{k} has the wrong type")
    if out:
        return out
    if rec["schema"] != VERSION:
        return [f"schema {rec['schema']} is not a records version (1 to {VERSION})"]
    unknown = sorted(set(rec) - set(FIELDS))
    if unknown:
        return [f"unknown field {unknown[0]}"]
    if not RUN_ID.fullmatch(rec["run_id"]):
        return [f"run_id {rec['run_id']!r} is not a run id"]
    if not isinstance(rec["run"].get("jobs"), int) or not all(k in RUN_FACTS or k == "jobs" for k in rec["run"]):
        return ["run must hold the run's facts (" + ", ".join(RUN_FACTS) + ") and its number of jobs"]
    if rec["job"].get("job_id") != rec["job_id"]:
        return [f"its job is not job {rec['job_id']}"]
    if rec["spec_sha256"] is not None and rec["spec_sha256"] != spec_sha256(rec["job"]):
        return ["its job is not the spec it ran by (spec_sha256 differs)"]
    if rec["cell"] != cell(rec["job"], rec["run"].get("suite")):
        return ["its cell is not its job's"]
    if any(isinstance(x, float) and not math.isfinite(x) for e in rec["epochs"] if isinstance(e, dict)
           for x in e.values()):
        return ["an epoch holds a number that is not finite"]
    bad = stored_problems(result(rec), rec["job_id"])
    return [f"not a result zobench reads: {bad[0]}"] if bad else []

