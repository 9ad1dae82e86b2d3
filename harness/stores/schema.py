"""What a result file and a run's plan hold: the checks that a result follows the schema
(docs/results.md) before it enters the store and whenever it is read back from it, the one
function that brings an older result to this version's shape (upgrade), and the derived numbers
every table, chart and gate reads: ms/step and J/step.

A loss that is not finite (the runners write it as null, named under "nonfinite") leaves a
result valid and its status ok: the job did all its steps and its timing and memory are real
measurements; the divergence is the run's outcome, shown in the tables, not an error."""
from __future__ import annotations

import dataclasses
import json
import math
import re

from workloads import vocab
from workloads.result import skeleton
from workloads.spec import JobSpec

from harness.planning import counting
from harness.stores import convergence
from harness.stores import validity
from harness.planning.inventory import MEM_LIMIT
from harness.planning.runs import Job
from harness.planning.suites import TIMEOUT_S

NUMBER = (int, float)
REQUIRED = {
    "schema": int, "job": dict, "status": str, "started_at": str, "wall_seconds": NUMBER,
    "train_seconds": NUMBER, "steps": int, "phases": dict, "epochs": list, "memory": dict,
    "env": dict,
}
# What every command reads of a result's job (its spec): the table, the report and the job key.
JOB = {"job_id": str, "method": str, "runtime": str, "target": str, "bp_layers": int, "workload": dict}
# A job id names files (RESULTS/runs/<run>/<job_id>.json): no separator, no leading dot.
JOB_ID = re.compile(r"[A-Za-z0-9_-][A-Za-z0-9._-]*")
# The meters a result's energy can come from (workloads/energy.py, docs/results.md); null when
# none was read.
ENERGY_SOURCES = ("nvml", "rapl", "ina3221", "tegrastats")
# The optional figures a runner adds, null where it could not measure them (an older result
# lacks them: unknown). A GPU's memory only on a cuda job.
DEVICE_MEMORY = ("device_peak_bytes", "device_reserved_peak_bytes", "device_used_bytes")
ENERGY_FIGURES = ("joules", "joules_per_step", "avg_power_w")


VERSION = vocab.RESULT_SCHEMA
# What a result that records no energy says: one written before zobench measured it.
NO_ENERGY = "its result records no energy (written before zobench measured it)"
# The records the harness adds to a runner's result as the job ends (job.py); absent in one
# stored before each existed.
HARNESS_RECORDS = ("load", "lease", "validity", "convergence", "spec_sha256", "pool", "instructions")
# The records of a result in this version's shape: a runner's (workloads/result.py's skeleton;
# cpu_seconds is a figure, unknown where a result lacks it) and the harness's, and the memory
# figures a runner writes. A result that has them all is upgraded already.
RECORDS = tuple(k for k in skeleton(None, {}) if k != "cpu_seconds") + HARNESS_RECORDS
MEMORY_RECORDS = tuple(skeleton(None, {})["memory"])
# Every field of a job's spec at its default: what an older spec lacks (full_job)
SPEC_DEFAULTS = JobSpec(job_id="", method="").to_dict()


def full_job(job: dict) -> dict:
    """A job's spec with every field JobSpec has: its defaults where the spec was written before a
    field existed, and the warm-up resolved to its device's, as a runner resolves it (so the job's
    key is the one it always had)."""
    d = SPEC_DEFAULTS
    device = job.get("device") or d["device"]
    workload = {**d["workload"], **(job.get("workload") or {})}
    # a transformer job written before hyper.loss_chunk existed made its logits whole: -1, not
    # today's default, so its key and its predicted memory are those of what it ran
    whole = {"loss_chunk": -1} if (workload.get("architecture") or {}).get("kind") == "transformer" else {}
    return {**d, **job, "workload": workload,
            "hyper": {**d["hyper"], "warmup_steps": vocab.WARMUP_STEPS.get(device, 0), **whole,
                      **(job.get("hyper") or {})}}


def _whole_job(job: dict) -> bool:
    """Whether a job record has every field of the spec, its workload's and hyper's too."""
    return SPEC_DEFAULTS.keys() <= job.keys() and all(
        isinstance(job[part], dict) and SPEC_DEFAULTS[part].keys() <= job[part].keys() for part in ("workload", "hyper"))


def upgrade(r: dict) -> dict:
    """A valid result (problems() is empty) in this version's shape, however old: its job with
    every field of the spec (full_job), every record a runner writes (workloads/result.py's
    skeleton: null where it was not measured; the energy unavailable, NO_ENERGY) and the
    harness adds, and `convergence` judged where the harness stored none. The store calls it
    once as it reads a result, so no reader carries a default of its own (asv's results
    api_version)."""
    if r["schema"] == VERSION and all(k in r for k in RECORDS) and all(k in r["memory"] for k in MEMORY_RECORDS) \
            and (r["convergence"] is not None or r["status"] != "ok") and _whole_job(r["job"]):
        return r
    runner = {k: v for k, v in skeleton(None, {}).items() if k in RECORDS}    # fresh: no result shares a list
    out = {**runner, **dict.fromkeys(HARNESS_RECORDS), "energy": {**runner["energy"], "unavailable": NO_ENERGY},
           **{k: v for k, v in r.items() if k != "energy" or v}, "schema": VERSION, "job": full_job(r["job"]),
           "memory": {**runner["memory"], **r["memory"]},
           "epochs": [{"joules": None, **e} for e in r["epochs"]]}
    if out["convergence"] is None:
        out["convergence"] = convergence.of(out)
    return out


def problems(r) -> list[str]:
    """What is wrong with result r (empty when it is valid)."""
    if not isinstance(r, dict):
        return ["not a JSON object"]
    out = []
    for key, kind in REQUIRED.items():
        if key not in r:
            out.append(f"missing {key}")
        elif not isinstance(r[key], kind) or isinstance(r[key], bool):
            out.append(f"{key} has the wrong type")
        elif kind is NUMBER and not math.isfinite(r[key]):
            out.append(f"{key} is not finite")
    if out:
        return out
    if not isinstance(r.get("nonfinite", []), list) or not all(isinstance(x, str) for x in r.get("nonfinite", [])):
        out.append("nonfinite must be a list of strings")
    if not 1 <= r["schema"] <= VERSION:
        out.append(f"schema {r['schema']} is not one this zobench reads (1 to {VERSION}): "
                   + ("upgrade zobench" if r["schema"] > VERSION else "not a zobench result"))
    if r["status"] not in vocab.STATUSES:
        out.append(f"unknown status {r['status']!r}")
    if "error" not in r or not (r["error"] is None or isinstance(r["error"], str)):
        out.append("error must be null or a string")
    for name, p in r["phases"].items():
        if name not in vocab.PHASES:
            out.append(f"unknown phase {name!r}")
        elif not isinstance(p, dict) or not isinstance(p.get("seconds"), NUMBER) or not isinstance(p.get("calls"), int):
            out.append(f"phase {name} needs seconds and calls")
    for key in ("peak_rss_bytes", "baseline_rss_bytes"):
        if not isinstance(r["memory"].get(key), int):
            out.append(f"memory.{key} must be an integer")
    for key in (*DEVICE_MEMORY, "buffers_bytes"):
        out += _amount(r["memory"].get(key), f"memory.{key}", int)
    for key in ("buffers", "buffer_parts"):   # the binary's table of buffers: name -> bytes
        table = r["memory"].get(key)
        if table is not None and not isinstance(table, dict):
            out.append(f"memory.{key} must be null or an object of bytes")
        for name, n in (table or {}).items():
            out += _amount(n, f"memory.{key}.{name}", int)
    for i, e in enumerate(r["epochs"]):
        if not isinstance(e, dict) or not {"epoch", "seconds", "train_loss"} <= set(e):
            out.append("an epoch record lacks epoch, seconds or train_loss")
            break
        out += _amount(e.get("joules"), f"epochs[{i}].joules", NUMBER)
    out += _warmup(r.get("warmup")) + _energy(r.get("energy")) + _start_eval(r.get("start_eval"))
    out += _convergence(r.get("convergence")) + _validity(r.get("validity"))
    out += _timed_loop_load(r.get("timed_loop_load")) + _pool(r.get("pool"))
    if bad := counting.problem(r.get("instructions")):
        out.append(bad)
    h = r.get("spec_sha256")
    if h is not None and not (isinstance(h, str) and re.fullmatch(r"[0-9a-f]{64}", h)):
        out.append("spec_sha256 must be null or a sha256 in hex")
    if r["status"] == "ok" and not isinstance(r.get("model"), dict):
        out.append("an ok result needs model")
    return out


def _amount(x, where: str, kind) -> list[str]:
    """What is wrong with x as an optional measured amount: null (unknown) or a finite number >= 0."""
    if x is None:
        return []
    if isinstance(x, bool) or not isinstance(x, kind) or not math.isfinite(x) or x < 0:
        return [f"{where}: {json.dumps(x)[:40]} is not {'an integer' if kind is int else 'a finite number'} >= 0"]
    return []


def _warmup(w) -> list[str]:
    """The untimed warm-up before training: absent or null in a result written before there was one."""
    if w is None:
        return []
    if not isinstance(w, dict) or not isinstance(w.get("steps"), int) or not isinstance(w.get("seconds"), NUMBER):
        return ["warmup needs steps (an integer) and seconds"]
    return _amount(w["steps"], "warmup.steps", int) + _amount(w["seconds"], "warmup.seconds", NUMBER)


def _start_eval(s) -> list[str]:
    """The starting weights' test loss and accuracy (job.eval_start): null without it, absent in a
    result written before there was one; a diverged loss is null, as in an epoch."""
    if s is None:
        return []
    if not isinstance(s, dict) or set(s) != {"test_loss", "test_accuracy"}:
        return ["start_eval must be null or hold exactly test_loss and test_accuracy"]
    acc = s["test_accuracy"]
    if isinstance(acc, bool) or not isinstance(acc, NUMBER) or not 0 <= acc <= 1:
        return [f"start_eval.test_accuracy: {json.dumps(acc)[:40]} is not a number in [0, 1]"]
    return _amount(s["test_loss"], "start_eval.test_loss", NUMBER)


def _timed_loop_load(t) -> list[str]:
    """The machine's load over the timed loops (workloads/timed_loop_load.py): null where the runner
    could not read it, absent in a result written before it did."""
    if t is None:
        return []
    if not isinstance(t, dict) or not isinstance(t.get("cores"), int) or isinstance(t["cores"], bool) or t["cores"] < 1:
        return ["timed_loop_load needs cores (an integer >= 1)"]
    return [problem for key in ("wall_seconds", "cpu_seconds_other", "steal_seconds")
            for problem in _amount(t.get(key), f"timed_loop_load.{key}", NUMBER)]


def _pool(p) -> list[str]:
    """A pool job's member and the attempts its members ended before (harness/execution/pool.py):
    null for a lone board's job, absent in a result stored before there were pools."""
    if p is None:
        return []
    attempt = {"member": str, "status": str, "error": (str, type(None)), "started_at": str, "wall_seconds": NUMBER}
    if not isinstance(p, dict) or not isinstance(p.get("member"), str) or not isinstance(p.get("attempts"), list):
        return ["pool needs member (a string) and attempts (a list)"]
    if not all(isinstance(a, dict) and all(isinstance(a.get(k), kind) for k, kind in attempt.items())
               for a in p["attempts"]):
        return [f"pool.attempts: each needs {', '.join(attempt)}"]
    return []


def _validity(v) -> list[str]:
    """The board's throttling during the job (harness/stores/validity.py): absent in a result stored
    before zobench sampled it; its flags are what compare and history read."""
    if v is None:
        return []
    if not isinstance(v, dict) or not isinstance(v.get("flags"), list) \
            or not all(f in validity.FLAGS for f in v["flags"]):
        return [f"validity needs flags, a list of {', '.join(validity.FLAGS)}"]
    clock = v.get("clock")
    if clock is not None and not isinstance(clock, dict):
        return ["validity.clock is not null or a table"]
    return _amount((clock or {}).get("slowdown_explained"), "validity.clock.slowdown_explained", NUMBER)


def _convergence(c) -> list[str]:
    """The harness's judgement of the epochs (harness/stores/convergence.py): absent in a result stored
    before there was one, null for a job with no epochs."""
    if c is None:
        return []
    if not isinstance(c, dict) or not isinstance(c.get("flags"), list) \
            or not all(f in convergence.FLAGS for f in c["flags"]):
        return [f"convergence needs flags, a list of {', '.join(convergence.FLAGS)}"]
    out = []
    for key in ("first_train_loss", "min_train_loss", "final_train_loss"):
        x = c.get(key)
        if x is not None and (isinstance(x, bool) or not isinstance(x, NUMBER) or not math.isfinite(x)):
            out.append(f"convergence.{key}: {json.dumps(x)[:40]} is not null or a finite number")
    for key in ("best_test_accuracy", "final_test_accuracy"):
        x = c.get(key)
        if x is not None and (isinstance(x, bool) or not isinstance(x, NUMBER) or not 0 <= x <= 1):
            out.append(f"convergence.{key}: {json.dumps(x)[:40]} is not null or a number in [0, 1]")
    return out + _amount(c.get("best_epoch"), "convergence.best_epoch", int)


def _energy(e) -> list[str]:
    """The timed loop's energy: absent or null in a result written before zobench measured it; a
    figure may be null only where `unavailable` says why, and a number needs the meter it came from."""
    if e is None:
        return []
    if not isinstance(e, dict):
        return ["energy must be an object"]
    out = [p for key in ENERGY_FIGURES for p in _amount(e.get(key), f"energy.{key}", NUMBER)]
    if e.get("source") is not None and e["source"] not in ENERGY_SOURCES:
        out.append(f"energy.source {e['source']!r} is not null or one of {', '.join(ENERGY_SOURCES)}")
    if not (e.get("unavailable") is None or isinstance(e["unavailable"], str)):
        out.append("energy.unavailable must be null or a string")
    elif e.get("joules") is None and not e.get("unavailable"):
        out.append("energy.joules is null and energy.unavailable gives no reason")
    elif e.get("joules") is not None and e.get("source") is None:
        out.append("energy.joules needs its source")
    return out


def stored_problems(r, job_id: str) -> list[str]:
    """What is wrong with r as the stored result of job job_id: problems(), and the job as
    the harness planned it (a runner run by hand may get a spec without them)."""
    out = problems(r)
    if out:
        return out
    for key, kind in JOB.items():
        if not isinstance(r["job"].get(key), kind) or isinstance(r["job"].get(key), bool):
            out.append(f"job.{key} is missing or has the wrong type")
    if not out and r["job"]["job_id"] != job_id:
        out.append(f"it holds the result of job {r['job']['job_id']!r}")
    return out


def plan_problems(plan) -> list[str]:
    """What is wrong with a run's run.json (empty when --resume and the reports can use it)."""
    if not isinstance(plan, dict) or not isinstance(plan.get("jobs"), list):
        return ["not a JSON object with a list of jobs"]
    keys = {f.name for f in dataclasses.fields(Job)}
    needed = {f.name for f in dataclasses.fields(Job) if f.default is dataclasses.MISSING}
    for i, j in enumerate(plan["jobs"]):
        if not isinstance(j, dict) or not needed <= set(j) <= keys:
            return [f"jobs[{i}] needs {', '.join(sorted(needed))}"
                    f" (and may have {', '.join(sorted(keys - needed))}), nothing else"]
        limit = j.get("mem_limit", "")
        if not isinstance(limit, str) or (limit and not MEM_LIMIT.match(limit)):
            return [f"jobs[{i}].mem_limit {limit!r} is not a size like 512M"]
        if not isinstance(j["job_id"], str) or not JOB_ID.fullmatch(j["job_id"]):
            return [f"jobs[{i}].job_id {j['job_id']!r} is not a file name"]
        if not isinstance(j["spec"], dict) or j["spec"].get("job_id") != j["job_id"]:
            return [f"jobs[{i}].spec is not the spec of job {j['job_id']}"]
        timeout = j["timeout_s"]    # a deadline --resume computes with: an edited one is refused here
        if isinstance(timeout, bool) or not isinstance(timeout, (int, float)) or TIMEOUT_S.problem(timeout):
            return [f"jobs[{i}].timeout_s {timeout!r} is not a number of seconds ({TIMEOUT_S})"]
    return []


def step_seconds(r: dict) -> float | None:
    """Training seconds per optimizer step; None when the job has no timed training (a job
    that failed or timed out before its runner reported a training time): unknown, not 0."""
    steps, seconds = r.get("steps") or 0, r.get("train_seconds") or 0.0
    return seconds / steps if steps > 0 and seconds > 0 else None


def joules_per_step(r: dict) -> float | None:
    """Energy of the timed training loop per optimizer step; None where no meter measured it
    (a CPU job, the C++ runner, a result written before zobench measured energy): unknown."""
    return (r.get("energy") or {}).get("joules_per_step")
