"""A run of a suite, from its request to its exit code: planning (or replaying a run's plan for
--resume), an [equal_memory] suite's fit, the run's record, executing its jobs on every board
while SIGINT and SIGTERM stop them, then pushing to a shared store and writing the report.

One function, run(), that the command line, the tests and the benchmarks all call; what it has
to say goes to `say` (the command line's stderr), so the library prints nothing itself."""
from __future__ import annotations

import contextlib
import shlex
import signal
import dataclasses
from dataclasses import dataclass, field
from pathlib import Path
from typing import Callable

from workloads.spec import Hyper, JobSpec, SpecError

from harness.search import equal_memory, fit
from harness.planning import inventory, plan, runs, suites
from harness import paths
from harness.stores import measurements, pgstore
from harness.execution import stages
from harness.preparation.bundle import prepare
from harness.analysis.compare import THRESHOLD
from harness.errors import UserError
from harness.execution.progress import ProgressView
from harness.planning.runs import Job
from harness.execution.scheduler import execute
from harness.stores.store import Store
from harness.boards.transport import Stop

# the exit codes of a run: every job ok; a job not ok; the results not pushed or not stored
OK, NOT_OK, UNSAVED = 0, 1, 2


@dataclass
class Request:
    """What `zobench run` was asked (its options, parsed)."""
    suite: str = "quick"
    targets: list = field(default_factory=list)
    inventory: Path | None = None
    methods: list = field(default_factory=list)
    runtimes: list = field(default_factory=list)
    precisions: list = field(default_factory=list)
    datasets: list = field(default_factory=list)
    zo_losses: list = field(default_factory=list)
    overrides: list = field(default_factory=list)    # --set KEY=VALUE, as given
    seed: int | None = None         # --seed, over the suite's
    timeout: float | None = None
    lease_timeout: float | None = None
    resume: str | None = None
    report: bool = True
    store: str | None = None        # --store, else $ZOBENCH_STORE or the config's
    instructions: bool = False      # --instructions: count on every target, whatever its own setting


@dataclass
class Outcome:
    run_id: str | None
    exit_code: int
    report: Path | None = None


@contextlib.contextmanager
def signals_stop():
    """SIGINT and SIGTERM, while the block runs, set a Stop (yielded with the list of the signals
    caught): a flag only, so each board kills its running job and starts no more. Later signals
    are ignored, so the killing always finishes and no runner is left orphaned."""
    stop, caught = Stop(), []

    def on_signal(signum, _frame):
        if not caught:
            caught.append(signum)
            stop.request(f"interrupted by {signal.Signals(signum).name}")

    before = {s: signal.signal(s, on_signal) for s in (signal.SIGINT, signal.SIGTERM)}
    try:
        yield stop, caught
    finally:
        for s, handler in before.items():
            signal.signal(s, handler)


def push(url: str, store: Store, run_ids: list[str], branch: str | None, say: Callable[[str], None]) -> bool:
    """Push runs; on a store that cannot be reached, say so and how to push them later."""
    try:
        with pgstore.SharedStore(url) as shared:
            for run_id in run_ids:
                n = shared.push(store, run_id, branch)
                moved = f"; moved from branch {n.moved_from!r} to {branch!r}" if n.moved_from is not None else ""
                say(f"run {run_id} -> store {pgstore.shown(url)}: {n.added} results added, {n.updated} updated, "
                    f"{n.unchanged} unchanged{moved}")
    except UserError as e:
        where = "" if store.root.resolve() == paths.DEFAULT_RESULTS.resolve() else f" --results {shlex.quote(str(store.root))}"
        say(f"zobench: error: {e}; the results are kept in {store.root}: push them later with "
            f"zobench push {' '.join(run_ids)} --store {shlex.quote(pgstore.shown(url))}{where}")
        return False
    return True


def counting(target):
    """A target (a pool's members too) that counts its cpp jobs' instructions (--instructions)."""
    return dataclasses.replace(target, instructions="callgrind", members=[counting(m) for m in target.members])


def _executed(store: Store, run_id: str, jobs: list[Job], targets: dict, prepared, req: Request, say):
    """The run's jobs run, with a bar per target: (results, the command that resumes it, and the
    Outcome it ended with where a signal or a full disk stopped it, else None)."""
    if req.instructions:
        targets = {name: counting(t) for name, t in targets.items()}
    counts: dict[str, int] = {}
    for j in jobs:
        counts[j.target] = counts.get(j.target, 0) + 1
    with signals_stop() as (stop, caught), ProgressView(counts) as view:
        results = execute(store, run_id, jobs, targets, prepared, view, stop, req.lease_timeout)
    resume = store.resume_command(run_id) + (f" --inventory {shlex.quote(str(req.inventory))}" if req.inventory else "")
    if caught:      # no report: what ended is stored, and the user asked to stop now
        stopped = sum(r["status"] == "interrupted" for r in results)
        say(f"run {run_id}: {stop.reason}: {len(results) - stopped} jobs ended, {stopped} interrupted, "
            f"{len(jobs) - len(results)} not started; finish it with: {resume}")
        return results, resume, Outcome(run_id, 128 + caught[0])
    if stop.is_set():       # the results could not be stored (harness/execution/scheduler.py): what ran unstored runs again
        say(f"run {run_id}: {stop.reason}; {len(results)} jobs stored, {len(jobs) - len(results)} not; "
            f"make room, then finish it with: {resume}")
        return results, resume, Outcome(run_id, UNSAVED)
    return results, resume, None


def more_repeats(store: Store, of: list[str], keys: set[str], repeats: dict[str, int], inventory_path: Path | None,
                 say) -> Outcome:
    """A new run of more repeats of the jobs of runs `of` whose key is in `keys` (compare --rerun): each
    key's spec as its first run planned it, `repeats[key]` more times, numbered after every repeat the
    runs hold; run.json names the runs it adds to ("repeats_of"). No report and no push: the gate
    judges the runs pooled."""
    plans = [store.run_plan(run_id) for run_id in of]
    first, last = {}, {}
    for j in (j for plan_ in plans for j in plan_["jobs"]):
        key = measurements.job_key(j["spec"])[0]
        if key in keys:
            first.setdefault(key, j)
            last[key] = max(last.get(key, -1), int(j["spec"].get("repeat", 0)))
    jobs = []
    for key, j in first.items():
        base = j["job_id"].rsplit(".r", 1)[0]
        for n in range(last[key] + 1, last[key] + 1 + repeats.get(key, 0)):
            job_id = f"{base}.r{n}"
            jobs.append(Job(**{**j, "job_id": job_id, "spec": {**j["spec"], "job_id": job_id, "repeat": n}}))
    if not jobs:
        raise UserError(f"compare --rerun: no job of {', '.join(of)} has the keys to measure again")
    targets = {t.name: t for t in inventory.resolve(sorted({j.target for j in jobs}), inventory_path)}
    saved = plans[0]
    try:
        prepared = _prepared(jobs, targets, say)
    except _Stopped as e:
        return Outcome(None, 128 + e.signum)
    run_id = store.new_run(runs.record(suite=saved.get("suite", ""), suite_path=saved.get("suite_path", ""),
                                       repeats_of=list(of), jobs=[j.to_dict() for j in jobs]))
    say(f"run {run_id}: {len(jobs)} more repeats of {len(first)} job keys of {', '.join(of)} "
        f"-> {store.runs / run_id}")
    results, _, ended = _executed(store, run_id, jobs, targets, prepared, Request(inventory=inventory_path), say)
    if ended is not None:
        return ended
    bad = [r for r in results if r["status"] != "ok"]
    return Outcome(run_id, NOT_OK if bad else OK)


def write_report(store: Store, run_id: str, say, history: list | None = None) -> Path | None:
    """The run's report (a run's, or a tune's search), its path; None, said with a command that makes it
    again, where it could not be written (a full disk: the results are stored all the same)."""
    from reports import build as build_report
    try:
        return build_report(store, [run_id], history=history).resolve()
    except OSError as e:
        say(f"zobench: error: run {run_id}: its results are stored, but its report could not be written "
            f"({e.filename or 'a report file'}: {e.strerror or e}); make room, then: {report_again(run_id, store)}")
        return None


def report_again(run_id: str, store: Store) -> str:
    """The command that makes a run's report again, as the user types it (tests run it)."""
    return f"zobench report --run {run_id}" + (
        f" --results {shlex.quote(str(store.root))}" if store.root.resolve() != paths.DEFAULT_RESULTS.resolve() else "")


def history_of(url: str | None, store: Store, run_ids: list[str], say: Callable[[str], None]) -> list | None:
    """The shared store's series of the runs' job keys, for their report; None without a store,
    or when it cannot be reached (said: a report never fails for its history)."""
    if not url:
        return None
    from harness.analysis import history
    from harness.stores import measurements

    keys = sorted({measurements.job_key(r["job"])[0] for run_id in run_ids for r in store.results(run_id)})
    try:
        with pgstore.SharedStore(url) as shared:
            rows, facts = shared.history(keys, None, None, None, exact=True)
    except UserError as e:
        say(f"zobench: warning: {e}: the report has no history chart")
        return None
    return history.series(rows, facts, THRESHOLD)


def _resumed(store: Store, req: Request, say) -> tuple[str, list[Job], dict] | None:
    """The jobs of run req.resume that did not end ok, and their targets; None: nothing to do."""
    if req.suite != "quick" or req.targets or req.overrides or req.seed is not None or any(
            (req.methods, req.runtimes, req.precisions, req.datasets, req.zo_losses)):
        raise UserError("--resume replays the run's own plan; it takes no suite, target, filter, --set or --seed"
                        " (--timeout and --lease-timeout may be given)")
    run_id = req.resume
    saved = store.run_plan(run_id)
    for search in ("fit", "tune"):
        if search in saved:
            raise UserError(f"run {run_id} is a zobench {search} search: each {'probe' if search == 'fit' else 'trial'} "
                            f"followed from the last, so it is not resumed; run zobench {search} again")
    done = {r["job"]["job_id"] for r in store.results(run_id, saved) if r["status"] == "ok"}
    again = stages.to_rerun(saved["jobs"], done, store, run_id)
    jobs = [Job(**j) for j in saved["jobs"] if j["job_id"] in again]
    for j in jobs:      # the plan was checked when it was made; run.json may have been edited since
        try:
            JobSpec.from_dict(j.spec)
        except SpecError as e:
            raise UserError(f"{store.run_dir(run_id) / 'run.json'}: job {j.job_id}: {e}") from None
    if not jobs:
        say(f"run {run_id}: nothing to resume: all {len(saved['jobs'])} jobs ended ok")
        return None
    store.check_writable(run_id)
    if req.timeout:
        for j in jobs:
            j.timeout_s = req.timeout
    targets = {t.name: t for t in inventory.resolve(sorted({j.target for j in jobs}), req.inventory)}
    say(f"resuming run {run_id}: {len(jobs)} of {len(saved['jobs'])} jobs to run")
    return run_id, jobs, targets


class _Stopped(Exception):
    """Stopped by a signal before the run itself was made: nothing to resume."""

    def __init__(self, signum: int):
        self.signum = signum


def pretrain_target(suite: suites.Suite, chosen: list, inventory_path: Path | None):
    """The target a suite's [pretrain] stage runs on (one of chosen where it names one), or None
    for a suite without one: zobench run's and zobench tune's alike."""
    if suite.pretrain is None:
        return None
    name = suite.pretrain.target
    return next((t for t in chosen if t.name == name), None) or inventory.resolve([name], inventory_path)[0]


def _planned(store: Store, req: Request, say) -> tuple[list[Job], dict, dict]:
    """A new run of req.suite: its jobs planned (an equal-memory suite's models fitted first),
    their targets, and the run's record (run.json), to be written once they are prepared."""
    suite = suites.load(req.suite)
    if req.seed is not None:
        suite = dataclasses.replace(suite, seed=req.seed)
    chosen = inventory.resolve(req.targets or suite.targets, req.inventory)
    pretrain = pretrain_target(suite, chosen, req.inventory)
    overrides, study, fitted, methods = plan.parse_set(req.overrides), {}, [], req.methods
    if suite.equal_memory is not None:
        if len(chosen) != 1:
            raise UserError("--target: an equal_memory suite fits its models to one target; give one")
        with signals_stop() as (stop, caught):
            try:
                models, fit_runs, fitted, found = equal_memory.models(
                    store, suite, chosen[0], overrides, plan.select_methods(suite, req.methods), req.timeout, stop)
            except fit.Stopped as e:
                say(f"{e}; the suite's run was not started")
                raise _Stopped(caught[0]) from None
        for line in found:
            say(line)
        study = {"equal_memory": {"budget": suite.equal_memory.budget, "family": suite.equal_memory.family,
                                  "models": models, "fit_runs": fit_runs}}
        methods = list(models)     # a method nothing fits is left out, its note said below
    jobs, notes = plan.make(suite, chosen, methods=methods, runtimes=req.runtimes, precisions=req.precisions,
                            data=req.datasets, zo_losses=req.zo_losses, overrides=overrides,
                            timeout_s=req.timeout, pretrain_target=pretrain or None,
                            models=study and study["equal_memory"]["models"])
    for n in fitted + notes:
        say(f"note: left out {n}")
    for line in idle_settings(jobs):
        say(f"zobench: warning: {line}: it changes no job of this run")
    targets = {t.name: t for t in [*chosen, *([pretrain] if pretrain else [])]}
    return jobs, targets, runs.record(suite=suite.name, suite_path=str(suite.path), **study,
                                      jobs=[j.to_dict() for j in jobs])


def _prepared(jobs: list[Job], targets: dict, say):
    """prepare(), with SIGINT and SIGTERM stopping a binary's build under way (its compilers killed,
    the line said): raises _Stopped, for the run to end with 128 + the signal, nothing recorded."""
    with signals_stop() as (stop, caught):
        prepared = prepare(jobs, targets, stop)
    if caught:
        say(f"zobench: {stop.reason} while the binary built; its compilers were stopped, and no run was started")
        raise _Stopped(caught[0])
    return prepared


def idle_settings(jobs: list[Job]) -> list[str]:
    """The settings that change nothing in any job of a plan (Hyper.idle: a part's constant without
    its part), each with why: a typo'd --set or a part left off is said once, not silently run."""
    per_job = [dict(line.split(": ", 1) for line in Hyper(**j.spec["hyper"]).idle(j.spec["method"])) for j in jobs]
    keys = set.intersection(*(set(d) for d in per_job)) if per_job else set()
    return [f"{k} = {jobs[0].spec['hyper'][k]!r} is set, but {per_job[0][k]}" for k in sorted(keys)]


def run(store: Store, req: Request, say: Callable[[str], None]) -> Outcome:
    """Plan (or resume) and run, then push and report: the run's id, exit code and report.
    A signal stops every board's job and returns 128 + its number, with the line that resumes."""
    shared = pgstore.url_from(req.store)
    if shared:      # told now, not after hours of board time; the run goes on and pushes at its end
        try:
            pgstore.SharedStore(shared).close()
        except UserError as e:
            say(f"zobench: warning: {e}; the run goes on, its results kept in {store.root}")
    if req.resume:
        resumed = _resumed(store, req, say)
        if resumed is None:
            return Outcome(req.resume, OK)
        run_id, jobs, targets = resumed
        try:
            prepared = _prepared(jobs, targets, say)
        except _Stopped as e:
            return Outcome(run_id, 128 + e.signum)
    else:
        try:
            jobs, targets, record = _planned(store, req, say)
            prepared = _prepared(jobs, targets, say)
        except _Stopped as e:
            return Outcome(None, 128 + e.signum)
        run_id = store.new_run(record)
        say(f"run {run_id}: {len(jobs)} jobs on {', '.join(targets)} -> {store.runs / run_id}")
    results, resume, ended = _executed(store, run_id, jobs, targets, prepared, req, say)
    if ended is not None:
        return ended
    bad = [r for r in store.results(run_id) if r["status"] != "ok"]
    pushed = not shared or push(shared, store, [run_id], None, say)     # first: the report charts its history
    report = None
    if req.report:
        report = write_report(store, run_id, say, history_of(shared, store, [run_id], say) if shared and pushed else None)
        if report is None:
            return Outcome(run_id, UNSAVED)
    say(f"run {run_id}: {len(results)} jobs run, {len(bad)} not ok" + (f"; finish them with: {resume}" if bad else ""))
    return Outcome(run_id, UNSAVED if not pushed else NOT_OK if bad else OK, report)
