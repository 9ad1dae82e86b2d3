"""The results store: the files are the only copy of a run.

RESULTS/runs/<run_id>/run.json        the plan of the run (what --resume replays)
RESULTS/runs/<run_id>/<job_id>.json   one result per job, written atomically
RESULTS/runs/<run_id>/probes/         what each target was (one JSON file per target)
RESULTS/runs/<run_id>/work/<job_id>/  spec, runner output and logs of a job

Every command reads the result files themselves and checks each against the schema as it
reads it: a file that does not parse or validate is left out of the command's view, named
once on stderr, and counts as a job with no result (`run --resume` runs it again). There is
no index beside the files: a run is minutes to hours of board time, so a store holds
hundreds of result files, which read in well under a second, and a second copy could only
fall behind them.
"""
from __future__ import annotations

import os
import re
import secrets
import shlex
import shutil
import sys
import tempfile
from datetime import datetime, timezone
from json import JSONDecodeError
from pathlib import Path

from workloads.jsonfile import loads, write_atomic

from harness.stores import convergence, machine_load
from harness import paths
from harness.stores import validity
from harness.errors import UserError
from harness.planning.runs import FILLED_BY_THE_RUN, safe_name, spec_sha256
from harness.stores.schema import plan_problems, step_seconds, stored_problems, upgrade

# What new_run() names a run: the time it started (UTC) and 16 random bits. Nothing else is a
# run id, so a run id given on the command line can never name a path outside the store.
RUN_ID = re.compile(r"\d{8}-\d{6}-[0-9a-f]{4}")
RUN_ID_EXAMPLE = "20250101-120000-ab12"
# Corrupt files already named on stderr: once per process, and a command is one process.
_reported: set[str] = set()


def results_dir(path) -> Path:
    """path as a results folder: refused when it, or the nearest folder above it that exists,
    is not a folder (a folder that does not exist yet is made by the first run)."""
    root = Path(path)
    for p in (root, *root.parents):
        try:
            if not (p.exists() or p.is_symlink()):
                continue
            if not p.is_dir():
                raise UserError(f"results directory {root}" + (": " + str(p) if p != root else "")
                                + " is not a directory")
        except OSError as e:
            raise UserError(f"results directory {root}: {e.strerror}") from None
        break
    return root.absolute()      # a runner may start in another folder (the local transport's work dir)


def summary(run_id: str, r: dict) -> dict:
    """The flat row of a result as the store reads it (schema.upgrade's shape: every field there):
    the results table, CSV and JSON."""
    job, workload, last = r["job"], r["job"]["workload"], (r["epochs"] or [{}])[-1]
    model, judged = r["model"] or {}, r["convergence"] or {}
    return {
        "run_id": run_id, **{k: job[k] for k in ("job_id", "target", "runtime", "method", "bp_layers", "precision",
                                                  "zo_loss")},
        "model": workload["model"], "dataset": workload["dataset"], "rotate": workload["rotate"],
        "repeat": job["repeat"], "status": r["status"], "error": r["error"],
        "steps": r["steps"], "train_seconds": r["train_seconds"], "step_seconds": step_seconds(r),
        # the share of the CPU the job wanted that other work took while its steps ran (machine_load.flag)
        "load_other": None if (share := machine_load.lost_share(r)) is None else round(share, 3),
        "peak_rss_bytes": r["memory"]["peak_rss_bytes"],
        "test_accuracy": last.get("test_accuracy"), "train_loss": last.get("train_loss"),
        # diverged / unstable, or None (harness/stores/convergence.py), and the best epoch's accuracy beside the final one
        "flags": convergence.worst(judged.get("flags") or []), "best_test_accuracy": judged.get("best_test_accuracy"),
        # throttled, freq-capped, ... (harness/stores/validity.py): the board, not the code, set its time
        "validity": ",".join(validity.flags_of(r)) or None,
        "nonfinite": "; ".join(r["nonfinite"]) or None,
        # lineage: what the job started from and ended with (fine-tuning: its pretraining job's weights)
        "pretrained_from": job["pretrained_from"] or None,
        "init_sha256": model.get("init_sha256"), "weights_sha256": model.get("weights_sha256"),
        "start_accuracy": (r["start_eval"] or {}).get("test_accuracy"),
        "started_at": r["started_at"],
        # a pool's job: the member that ran it, and the attempts its members lost before (harness/execution/pool.py)
        "member": (r["pool"] or {}).get("member") or None, "lost_attempts": len((r["pool"] or {}).get("attempts") or []),
    }


class Store:
    def __init__(self, root: Path):
        self.root = results_dir(root)
        self.runs = self.root / "runs"

    # -- runs ---------------------------------------------------------------
    def run_dir(self, run_id: str) -> Path:
        """The folder of run_id, which must be a run id (checked before it becomes a path)."""
        if not isinstance(run_id, str) or not RUN_ID.fullmatch(run_id):
            raise UserError(f"unknown run {run_id!r}: a run id looks like {RUN_ID_EXAMPLE}; {self._listing()}")
        return self.runs / run_id

    def new_run(self, plan: dict) -> str:
        self.check_writable()
        made = None
        try:
            while made is None:
                run_id = datetime.now(timezone.utc).strftime("%Y%m%d-%H%M%S-") + secrets.token_hex(2)
                try:
                    self.run_dir(run_id).mkdir()
                    made = self.run_dir(run_id)
                except FileExistsError:     # another run started the same second with the same 16 bits
                    pass
            (made / "work").mkdir()
            write_atomic(made / "run.json", {"run_id": run_id, **plan})
        except OSError as e:
            if made is not None:        # no run folder without its plan
                shutil.rmtree(made, ignore_errors=True)
            raise UserError(f"cannot write a run to {self.runs}: {e.strerror}") from None
        return run_id

    def adopt_run(self, run_id: str, plan: dict) -> None:
        """Keep a run made elsewhere (zobench pull) under its own id: its folder and plan, once;
        a run of that id here with another plan is refused, never overwritten."""
        d = self.run_dir(run_id)
        if (d / "run.json").is_file():
            if self.run_plan(run_id) != plan:
                raise UserError(f"run {run_id} in {self.root} has another plan than the one pulled: "
                                "left as it is")
            return
        self.check_writable()
        (d / "work").mkdir(parents=True, exist_ok=True)
        write_atomic(d / "run.json", plan)

    def extend_plan(self, run_id: str, jobs: list[dict]) -> None:
        """Add jobs to a run whose next job depends on the last one's outcome (zobench fit, tune)."""
        self._change_plan(run_id, lambda plan: plan["jobs"].extend(jobs))

    def set_in_plan(self, run_id: str, key: str, value) -> None:
        """Record what a search found so far in its run.json (zobench tune's study)."""
        self._change_plan(run_id, lambda plan: plan.__setitem__(key, value))

    def _change_plan(self, run_id: str, change) -> None:
        plan = self.run_plan(run_id)
        change(plan)
        write_atomic(self.run_dir(run_id) / "run.json", plan)

    def check_writable(self, run_id: str | None = None) -> None:
        """Refuse a store that cannot take a file (a read-only mount, a folder without
        permission) before a command writes any part of a run or runs a job."""
        d = self.run_dir(run_id) if run_id else self.runs
        try:
            d.mkdir(parents=True, exist_ok=True)
            fd, probe = tempfile.mkstemp(dir=d, prefix=".zobench-write-test-")
            os.close(fd)
            os.unlink(probe)
        except OSError as e:
            raise UserError(f"cannot write to {d}: {e.strerror}") from None

    def run_plan(self, run_id: str) -> dict:
        """run.json of run_id; a missing or corrupt one is a one-line UserError naming it."""
        path = self.run_dir(run_id) / "run.json"
        if not path.parent.is_dir():
            raise UserError(f"unknown run {run_id!r}; {self._listing()}")
        try:
            plan = loads(path.read_text(encoding="utf-8"))
        except FileNotFoundError:
            raise UserError(f"{path} is missing: run {run_id} has no plan to read or resume") from None
        except (OSError, ValueError, RecursionError) as e:
            raise UserError(f"{path} is corrupt ({_unreadable(e)})") from None
        bad = plan_problems(plan)
        if bad:
            raise UserError(f"{path} is corrupt ({bad[0]})")
        return plan

    def run_ids(self) -> list[str]:
        if not self.runs.is_dir():
            return []
        return sorted(p.name for p in self.runs.iterdir() if RUN_ID.fullmatch(p.name) and (p / "run.json").is_file())

    def latest(self) -> str:
        ids = self.run_ids()
        if not ids:
            raise UserError(f"no runs in {self.root}; start one with `zobench run`")
        # an id names its second, then a random suffix: of the runs begun in the last second (a
        # refused run ends in less), the one whose plan was written last
        second = [i for i in ids if i[:15] == ids[-1][:15]]
        return max(second, key=lambda i: (self.runs / i / "run.json").stat().st_mtime_ns)

    def resume_command(self, run_id: str) -> str:
        """The command that runs the jobs of run_id that have no ok result."""
        where = "" if self.root.resolve() == paths.DEFAULT_RESULTS.resolve() else f" --results {shlex.quote(str(self.root))}"
        return f"zobench run --resume {run_id}{where}"

    def save_probe(self, run_id: str, target: str, facts: dict) -> None:
        d = self.run_dir(run_id) / "probes"
        d.mkdir(exist_ok=True)
        write_atomic(d / f"{safe_name(target)}.json", {"target": target, **facts})

    def work_dir(self, run_id: str, job_id: str) -> Path:
        d = self.run_dir(run_id) / "work" / job_id
        d.mkdir(parents=True, exist_ok=True)
        return d

    def _listing(self) -> str:
        return f"runs in {self.root}: {', '.join(self.run_ids()[-5:]) or 'none'}"

    # -- results ------------------------------------------------------------
    def add_result(self, run_id: str, result: dict) -> Path:
        path = self.run_dir(run_id) / f"{result['job']['job_id']}.json"
        write_atomic(path, result)
        return path

    def results(self, run_id: str, plan: dict | None = None) -> list[dict]:
        """The valid results of a run, in plan order; `plan` is the run's run_plan() where the
        caller has read it already, each in this version's shape (schema.upgrade). A job with no
        file has no result yet; a file that does not parse or validate is left out and named once
        on stderr with how to run its job again."""
        if plan is None:
            plan = self.run_plan(run_id)
        out = []
        for job in plan["jobs"]:
            path = self.run_dir(run_id) / f"{job['job_id']}.json"
            try:
                r = loads(path.read_text(encoding="utf-8"))
            except FileNotFoundError:
                continue
            except (OSError, ValueError, RecursionError) as e:
                self._corrupt(run_id, path, _unreadable(e))
                continue
            bad, edited = checked(r, job)
            if bad:
                self._corrupt(run_id, path, "; ".join(bad[:3]))
                continue
            if edited:
                self._edited(run_id, job["job_id"])
            out.append(upgrade(r))
        return out

    def not_run(self, run_id: str, plan: dict) -> list[str]:
        """The jobs of a run with no result file yet (an interrupted run)."""
        return [j["job_id"] for j in plan["jobs"] if not (self.run_dir(run_id) / f"{j['job_id']}.json").exists()]

    def _edited(self, run_id: str, job_id: str) -> None:
        path = self.run_dir(run_id) / "run.json"
        if f"{path}:{job_id}" not in _reported:
            _reported.add(f"{path}:{job_id}")
            print(f"zobench: warning: {path}: job {job_id}'s spec is not the one it ran by (its result's spec_sha256 "
                  "differs: run.json was changed after the run); its result stands as it ran, its own job record "
                  "says how", file=sys.stderr)

    def _corrupt(self, run_id: str, path: Path, why: str) -> None:
        if str(path) not in _reported:
            _reported.add(str(path))
            print(f"zobench: warning: {path} is corrupt ({why}): left out; `{self.resume_command(run_id)}` re-runs it",
                  file=sys.stderr)


# The job record's fields the run fills in for its target after planning: where its files are
# there (bundle.Site.job_spec) and a GPU job's device-memory cap (job.device_limit). They say where,
# not what ran, and a result's spec_sha256 is of the spec as planned: its job record is hashed with
# them as run.json planned them (or as a plan leaves them, unset).
FILLED_FOR_THE_TARGET = {"init_weights": "", "onnx_model": "", "device_mem_limit": 0}     # each as a plan leaves it
FILLED_IN_THE_WORKLOAD = {"data_dir": ""}


def checked(r, job: dict) -> tuple[list[str], bool]:
    """What is wrong with r as the stored result of the run.json job `job` (empty when nothing),
    and whether run.json's spec of it was changed after the run (r stands as it ran). What is
    wrong: schema.stored_problems, then its own job record against its spec_sha256, so that a
    result whose job record was edited (its method, its lr_zo) is corrupt, not compared, exported
    or pushed under values it never ran with. Every reader of stored results goes through here:
    the results folder (Store.results) and the shared store (pgstore.SharedStore.results)."""
    bad = stored_problems(r, job["job_id"])
    if bad:
        return bad, False
    planned = job.get("spec") if isinstance(job.get("spec"), dict) else None
    h = r.get("spec_sha256")
    if not h or planned is None:        # a result from before zobench hashed its spec, or a runner's own
        return [], False
    edited = h != spec_sha256(planned)
    why = _job_record(r["job"], planned, h, edited)
    return ([why] if why else []), edited


def _as_planned(record: dict, values: dict, workload: dict) -> dict:
    """A job record with the fields filled in for its target set to values (one absent from them, or
    None: unset, as a plan leaves it)."""
    out = {k: v for k, v in record.items() if k not in FILLED_FOR_THE_TARGET}
    out.update({k: v for k, v in values.items() if v is not None})
    if isinstance(record.get("workload"), dict):
        w = {k: v for k, v in record["workload"].items() if k not in FILLED_IN_THE_WORKLOAD}
        out["workload"] = {**w, **{k: v for k, v in workload.items() if v is not None}}
    return out


def _job_record(record: dict, planned: dict, h: str, plan_edited: bool) -> str:
    """Why a result's job record is not the spec it ran by ("" when it is): hashed with its target's
    paths as run.json planned them, or as a plan leaves them (a run.json whose paths alone were
    changed after the run)."""
    plan_w = planned.get("workload") if isinstance(planned.get("workload"), dict) else {}
    as_planned = _as_planned(record, {k: planned.get(k) for k in FILLED_FOR_THE_TARGET},
                             {k: plan_w.get(k) for k in FILLED_IN_THE_WORKLOAD})
    if h in (spec_sha256(as_planned), spec_sha256(_as_planned(record, FILLED_FOR_THE_TARGET, FILLED_IN_THE_WORKLOAD))):
        return ""
    fields = [f for f in _differing(as_planned, planned) if f not in FILLED_BY_THE_RUN]
    named = ", ".join(fields[:3]) + (", ..." if len(fields) > 3 else "")
    if not plan_edited:
        return (f"its job record is not the spec it ran by: its {named} differ{'s' * (len(fields) == 1)} from its "
                "spec_sha256 and run.json (edited after the run)")
    if fields:
        return (f"its job record is not the spec it ran by (its spec_sha256 matches neither it nor run.json, "
                f"itself changed after the run; they differ in {named})")
    return ("its job record is not the spec it ran by: neither it nor run.json's spec of it hashes to its "
            "spec_sha256 (both changed after the run)")


def _differing(a, b, at: str = "") -> list[str]:
    """The fields (dotted: hyper.lr_zo) where two job records differ."""
    if isinstance(a, dict) and isinstance(b, dict):
        return [f for k in sorted(set(a) | set(b), key=str) if a.get(k, _ABSENT) != b.get(k, _ABSENT)
                for f in (_differing(a.get(k), b.get(k), f"{at}{k}.") if k in a and k in b else [f"{at}{k}"])]
    return [at.rstrip(".")] if a != b or type(a) is not type(b) else []


_ABSENT = object()


def _unreadable(e: Exception) -> str:
    """Why a JSON file could not be read, in a few words."""
    if isinstance(e, JSONDecodeError):
        return f"not valid JSON: {e}"
    if isinstance(e, UnicodeDecodeError):
        return f"not UTF-8 text: byte {e.object[e.start]:#04x} at offset {e.start}"
    if isinstance(e, OSError):
        return f"cannot read it: {e.strerror}"
    return str(e)
