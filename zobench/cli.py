"""zobench: the command line. Exit 0 = all good, 1 = a job did not end ok,
2 = bad usage or configuration (one line on stderr, no traceback)."""
from __future__ import annotations

import argparse
import contextlib
import dataclasses
import os
import shlex
import signal
import sys
from datetime import datetime, timezone
from pathlib import Path

from workloads import jsonfile, vocab
from workloads.models import MODELS, ModelError, Transformer
from workloads.spec import Bounds, Hyper, JobSpec, SpecError

from harness import equal_memory, fit, inventory, paths, pgstore, plan, stages, suites, tune, validity
from harness.artifacts import sha256
from harness.build import build, cpu_choice
from harness.bundle import prepare
from harness.compare import EXIT_CODES
from harness.errors import UserError
from harness.plan import Job
from harness.progress import ProgressView
from harness.probe import probe
from harness.scheduler import execute, reach, transport_for
from harness.store import Store, results_dir, summary
from harness.transport import Stop, TransportError


class Parser(argparse.ArgumentParser):
    def error(self, message):  # argparse's own errors: one line, exit 2
        raise UserError(f"{self.prog}: {message}")


def number(kind, bounds: Bounds):
    """An option's type: an int or float within bounds, refused in the shape of every other number."""
    def parse(text: str):
        try:
            value = kind(text)
        except ValueError:
            raise argparse.ArgumentTypeError(f"expected {'an integer' if kind is int else 'a number'}, "
                                             f"got {text!r}") from None
        problem = bounds.problem(value)
        if problem:
            raise argparse.ArgumentTypeError(problem)
        return value
    return parse


def _add_results(p):
    p.add_argument("--results", type=results_dir, default=paths.DEFAULT_RESULTS, metavar="DIR",
                   help="results directory (default ./results)")


def _add_store(p, what: str = "read the run from this shared store first (pulled into --results)"):
    p.add_argument("--store", metavar="URL", help=f"{what}: postgresql://USER@HOST[:PORT]/DB "
                                                  "(default $ZOBENCH_STORE or ~/.config/zobench/config.toml's [store])")


def build_parser() -> Parser:
    ap = Parser(prog="zobench", description=__doc__)
    sub = ap.add_subparsers(dest="command", required=True, parser_class=Parser)

    p = sub.add_parser("run", help="plan and run a suite on targets, then write its report")
    _add_results(p)
    p.add_argument("--suite", default="quick", help="suite name (workloads/suites) or .toml path")
    p.add_argument("--target", action="append", default=[], help="run on these targets instead of the suite's")
    p.add_argument("--inventory", type=Path, help="inventory TOML (default ~/.config/zobench/targets.toml)")
    p.add_argument("--method", action="append", default=[], help="only these methods (full-zo, elastic-zo:1, ...)")
    p.add_argument("--runtime", action="append", default=[], help="only these runtimes")
    p.add_argument("--precision", action="append", default=[], help="only these precisions")
    p.add_argument("--dataset", action="append", default=[],
                   help="only these of the suite's data sets (mnist, or a variant: fashion-mnist-rot30)")
    p.add_argument("--zo-loss", action="append", default=[], help="int8: only these ZO losses (float, integer)")
    p.add_argument("--set", action="append", default=[], metavar="KEY=VALUE", help="override a hyperparameter")
    p.add_argument("--timeout", type=number(float, suites.TIMEOUT_S),
                   help="per-job timeout in seconds (default: the suite's)")
    p.add_argument("--lease-timeout", type=number(float, suites.LEASE_TIMEOUT_S), metavar="S",
                   help="seconds a job waits for a board another run holds, then ends busy "
                        "(default: the job's timeout; 0: do not wait)")
    p.add_argument("--resume", metavar="RUN_ID", help="re-run the jobs of RUN_ID that did not end ok")
    p.add_argument("--no-report", action="store_true", help="do not write the report after the run")
    _add_store(p, "push the run's results to this shared store when it ends")

    p = sub.add_parser("push", help="copy local runs into the shared store (pushing twice changes nothing)")
    _add_results(p)
    _add_store(p, "the shared store")
    p.add_argument("--branch", help="record the runs under this branch (default: the branch they ran on)")
    p.add_argument("runs", nargs="+", metavar="RUN_ID")

    p = sub.add_parser("history", help="per job key and fingerprint: step time, memory, energy and accuracy "
                                       "against commits, from the shared store, with the changes detected")
    _add_store(p, "the shared store")
    p.add_argument("keys", nargs="*", metavar="KEY", help="only job keys containing one of these (default: all)")
    p.add_argument("--target", help="only this target")
    p.add_argument("--since", metavar="REF", help="from the first run of this commit (a prefix) or run id on")
    p.add_argument("--branch", help="only runs of this branch")
    p.add_argument("--threshold", type=number(float, Bounds(0, 1000.0)), default=5.0, metavar="PCT",
                   help="smallest relative change that counts, in percent (default 5, as compare)")
    p.add_argument("--estimator", choices=("min", "median"), default="min")
    p.add_argument("--format", choices=("text", "markdown", "json"), default="text")
    p.add_argument("--out", type=Path, help="also write the chart here (history.png and .svg)")

    p = sub.add_parser("pull", help="copy runs of the shared store into the local results folder")
    _add_results(p)
    _add_store(p, "the shared store")
    p.add_argument("runs", nargs="+", metavar="RUN_ID")

    p = sub.add_parser("results", help="the results of a run as a table, CSV or JSON")
    _add_results(p)
    _add_store(p)
    p.add_argument("--run", help="run id (default: the latest)")
    p.add_argument("--format", choices=("table", "csv", "json"), default="table")

    p = sub.add_parser("report", help="charts, report.md and report.html for runs")
    _add_results(p)
    _add_store(p)
    p.add_argument("--run", action="append", default=[], help="run id (repeatable; default: the latest)")
    p.add_argument("--target", action="append", default=[], help="only these targets (repeatable)")
    p.add_argument("--method", action="append", default=[], help="only these methods (full-zo, elastic-zo:1, ...)")
    p.add_argument("--out", type=Path, help="output directory (default RESULTS/runs/<run>/report)")
    p.add_argument("--energy-accuracy", type=number(float, Bounds(0, 100.0)), metavar="PCT",
                   help="the test accuracy the energy-to-accuracy table counts up to (default: per workload, "
                        "the lowest final test accuracy of its charted jobs)")

    p = sub.add_parser("build", help="build zobench-train for a target's CPU: its pin, else this machine's "
                                     "(local) or the one probing the board finds")
    _add_results(p)
    p.add_argument("--target", required=True)
    p.add_argument("--inventory", type=Path)

    p = sub.add_parser("compare",
                       help="per job key: significant and large changes in step time, peak memory and energy",
                       epilog=f"{EXIT_CODES} (docs/compare.md)")
    _add_results(p)
    p.add_argument("runs", nargs="+", metavar="BASELINE CURRENT",
                   help="the baseline (a run id, several joined by commas, or a file from `zobench export "
                        "--format pytest-benchmark`) and the current side; with --baseline-from, the current only")
    _add_store(p, "read the named runs from this shared store first (pulled into --results)")
    p.add_argument("--baseline-from", metavar="URL",
                   help="take the baseline from this shared store: the same job keys and fingerprint in the "
                        "last --last runs of --branch")
    p.add_argument("--branch", default="main", help="--baseline-from's branch (default main)")
    p.add_argument("--last", type=number(int, Bounds(1, 1000)), default=5, metavar="N",
                   help="--baseline-from pools the last N runs of each key (default 5)")
    p.add_argument("--threshold", type=number(float, Bounds(0, 1000.0)), default=5.0, metavar="PCT",
                   help="smallest relative change that counts, in percent (default 5)")
    p.add_argument("--estimator", choices=("min", "median"), default="min",
                   help="each side's estimate the threshold applies to (default min: on a shared "
                        "machine noise only adds time)")
    p.add_argument("--fail-on-change", action="store_true",
                   help="also exit 1 on a significant improvement (time to update the baseline)")
    p.add_argument("--format", choices=("text", "markdown", "json"), default="text")

    p = sub.add_parser("export", help="a run's measurements as pytest-benchmark JSON or CSV")
    _add_results(p)
    _add_store(p)
    p.add_argument("--format", choices=("pytest-benchmark", "csv"), required=True)
    p.add_argument("--run", help="run id (default: the latest)")
    p.add_argument("--out", type=Path, help="write here instead of stdout")

    p = sub.add_parser("memory", help="analytic memory model: the paper's (Eqs. 2-5, 13-15) from layer shapes, "
                                      "a transformer's from its ops, with its step's predicted peak beside the "
                                      "total that bounds it (docs/transformers.md)")
    p.add_argument("--model", default="lenet5", choices=tuple(MODELS), help="the network (workloads/models.py)")
    p.add_argument("--points", type=number(int, Bounds(1)),
                   help="a point-cloud model: the number of points per cloud (default: the model's own)")
    p.add_argument("--context", type=number(int, Bounds(1, Hyper.BOUNDS["context"].hi)),
                   help="a transformer: tokens per sequence (default: the model's own)")
    p.add_argument("--batch", type=number(int, Hyper.BOUNDS["batch_size"]), required=True, help="batch size")
    p.add_argument("--precision", choices=("fp32", "int8"), default="fp32")
    p.add_argument("--method", choices=("full-bp", "full-zo", "elastic-zo"), help="one method (default: all four)")
    p.add_argument("--bp-layers", type=number(int, Bounds(1)),
                   help="elastic-zo: how many final FC layers (a transformer: units, the head then blocks) "
                        "BP trains (default 1)")
    p.add_argument("--optimizer", choices=("sgd", "adam"), default="sgd", help="BP optimizer (adam: Eq. 5)")
    p.add_argument("--checkpointing", action="store_true",
                   help="a transformer: per-block activation checkpointing of the BP part")
    p.add_argument("--json", action="store_true", help="print a JSON list of breakdowns")

    p = sub.add_parser("fit", help="the largest model (or batch, or context) a method trains on a target "
                                   "within a memory budget: predicted, then confirmed by short runs")
    _add_results(p)
    _add_store(p, "push the fit run (its probes) to this shared store when it ends")
    p.add_argument("--target", default="local", help="where the probes run (default: this machine)")
    p.add_argument("--inventory", type=Path)
    p.add_argument("--budget", help="memory budget, like 512M or 2G (default: the target's mem_limit)")
    p.add_argument("--model-family", default="gpt2", help="the ladder to climb (workloads/models.py)")
    p.add_argument("--model", help="--vary batch|context: the model whose batch or context grows")
    p.add_argument("--method", default="full-bp", help="full-bp, full-zo or elastic-zo:K")
    p.add_argument("--optimizer", choices=("sgd", "adam"), default="sgd")
    p.add_argument("--checkpointing", action="store_true", help="full-bp, elastic-zo: per-block checkpointing")
    p.add_argument("--context", type=number(int, Bounds(1, 1 << 20)),
                   help="tokens a sequence (default: each model's own context)")
    p.add_argument("--batch", type=number(int, Bounds(1, 1 << 20)), default=8, help="batch size (default 8)")
    p.add_argument("--vary", choices=fit.VARY, default="model", help="what grows (default: the model)")
    p.add_argument("--dataset", default="fortunes", help="the text the probes train on (default fortunes)")
    p.add_argument("--runtime", choices=("torch",), default="torch")
    p.add_argument("--timeout", type=number(float, suites.TIMEOUT_S), default=900.0, metavar="S",
                   help="seconds a probe may take (default 900)")

    p = sub.add_parser("tune", help="search a method's learning rates (INT8: its perturbation scale) on a "
                                    "validation split held out of the training set; prints the suite's TOML lines")
    _add_results(p)
    p.add_argument("--suite", default="paper-fmnist", help="the suite whose job is tuned (default paper-fmnist)")
    p.add_argument("--method", required=True, help="one of the suite's methods: full-bp, full-zo, elastic-zo:K")
    p.add_argument("--precision", choices=vocab.PRECISIONS, default="fp32")
    p.add_argument("--zo-loss", choices=vocab.ZO_LOSSES, default="float", help="int8: float (INT8) or integer (INT8*)")
    p.add_argument("--runtime", choices=vocab.RUNTIMES, default="cpp", help="where trials train (default cpp)")
    p.add_argument("--target", default="local", help="where trials run (default: this machine)")
    p.add_argument("--inventory", type=Path)
    p.add_argument("--dataset", default="", help="which of the suite's data sets (default: its first)")
    p.add_argument("--param", action="append", default=[], metavar="NAME=LOW:HIGH[:log|linear]",
                   help="a hyperparameter and its range (default: the paper's knobs for the method and precision)")
    p.add_argument("--trials", type=number(int, Bounds(1, 10_000)), default=12, help="trials at most (default 12)")
    p.add_argument("--epochs", type=number(int, Hyper.BOUNDS["epochs"]),
                   help="epochs a trial trains (default: FP32 10, INT8 50, at most the suite's)")
    p.add_argument("--validation", type=number(int, Bounds(1, Hyper.BOUNDS["train_samples"].hi)),
                   help="training samples held out to score on (default: a sixth of the training set)")
    p.add_argument("--sampler", choices=tune.SAMPLERS, default="tpe", help="tpe (default) or grid")
    p.add_argument("--grid-points", type=number(int, Bounds(1, 100)), default=5, help="grid: values per parameter")
    p.add_argument("--pruner", choices=tune.PRUNERS, default="median", help="median (default), halving or none")
    p.add_argument("--seed", type=number(int, Bounds(0, 2**32 - 1)), default=0, help="the sampler's seed")
    p.add_argument("--set", action="append", default=[], metavar="KEY=VALUE", help="override a hyperparameter")
    p.add_argument("--timeout", type=number(float, suites.TIMEOUT_S), metavar="S", help="seconds a trial may take")

    p = sub.add_parser("targets", help="the targets zobench knows")
    _add_results(p)
    p.add_argument("--inventory", type=Path)
    p.add_argument("--json", action="store_true", help="probe: print the facts as JSON")
    p.add_argument("action", choices=("list", "probe"))
    p.add_argument("name", nargs="?", help="probe: the target to probe")
    return ap


def cmd_run(args) -> int:
    store = Store(args.results)
    shared = pgstore.url_from(args.store)
    if shared:      # told now, not after hours of board time; the run goes on and pushes at its end
        try:
            pgstore.SharedStore(shared).close()
        except UserError as e:
            print(f"zobench: warning: {e}; the run goes on, its results kept in {store.root}", file=sys.stderr)
    if args.resume:
        if args.suite != "quick" or args.target or args.set or any((args.method, args.runtime, args.precision,
                                                                    args.dataset, args.zo_loss)):
            raise UserError("--resume replays the run's own plan; it takes no suite, target, filter or --set"
                            " (--timeout and --lease-timeout may be given)")
        run_id = args.resume
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
            print(f"run {run_id}: nothing to resume: all {len(saved['jobs'])} jobs ended ok", file=sys.stderr)
            return 0
        store.check_writable(run_id)
        if args.timeout:
            for j in jobs:
                j.timeout_s = args.timeout
        targets = {t.name: t for t in inventory.resolve(sorted({j.target for j in jobs}), args.inventory)}
        prepared = prepare(jobs, targets)
        print(f"resuming run {run_id}: {len(jobs)} of {len(saved['jobs'])} jobs to run", file=sys.stderr)
    else:
        suite = suites.load(args.suite)
        chosen = inventory.resolve(args.target or suite.targets, args.inventory)
        pretrain = suite.pretrain and (next((t for t in chosen if t.name == suite.pretrain.target), None)
                                       or inventory.resolve([suite.pretrain.target], args.inventory)[0])
        overrides, study, fitted = plan.parse_set(args.set), {}, []
        if suite.equal_memory is not None:
            if len(chosen) != 1:
                raise UserError("--target: an equal_memory suite fits its models to one target; give one")
            with _signals_stop() as (stop, caught):
                try:
                    methods, fit_runs, fitted, found = equal_memory.models(
                        store, suite, chosen[0], overrides, plan.select_methods(suite, args.method), args.timeout, stop)
                except fit.Stopped as e:     # before the run itself was made: nothing to resume
                    print(f"{e}; the suite's run was not started", file=sys.stderr)
                    return 128 + caught[0]
            for line in found:
                print(line, file=sys.stderr)
            study = {"equal_memory": {"budget": suite.equal_memory.budget, "family": suite.equal_memory.family,
                                      "models": methods, "fit_runs": fit_runs}}
            args.method = list(methods)     # a method nothing fits is left out, its note printed below
        jobs, notes = plan.make(suite, chosen, methods=args.method, runtimes=args.runtime,
                                precisions=args.precision, data=args.dataset, zo_losses=args.zo_loss,
                                overrides=overrides, timeout_s=args.timeout,
                                pretrain_target=pretrain or None, models=study and study["equal_memory"]["models"])
        for n in fitted + notes:
            print(f"note: left out {n}", file=sys.stderr)
        targets = {t.name: t for t in [*chosen, *([pretrain] if pretrain else [])]}
        prepared = prepare(jobs, targets)
        run_id = store.new_run({"created_at": datetime.now(timezone.utc).isoformat(timespec="seconds"),
                                "suite": suite.name, "suite_path": str(suite.path),
                                "argv": pgstore.shown_argv(sys.argv[1:]),
                                "git": plan.git_facts(), **study, "jobs": [j.to_dict() for j in jobs]})
        print(f"run {run_id}: {len(jobs)} jobs on {', '.join(targets)} -> {store.runs / run_id}", file=sys.stderr)
    counts = {}
    for j in jobs:
        counts[j.target] = counts.get(j.target, 0) + 1
    with _signals_stop() as (stop, caught), ProgressView(counts) as view:
        results = execute(store, run_id, jobs, targets, prepared, view, stop, args.lease_timeout)
    resume = store.resume_command(run_id) + (f" --inventory {shlex.quote(str(args.inventory))}" if args.inventory else "")
    if caught:      # no report: what ended is stored, and the user asked to stop now
        stopped = sum(r["status"] == "interrupted" for r in results)
        print(f"run {run_id}: {stop.reason}: {len(results) - stopped} jobs ended, {stopped} interrupted, "
              f"{len(jobs) - len(results)} not started; finish it with: {resume}", file=sys.stderr)
        return 128 + caught[0]
    if stop.is_set():       # the results could not be stored (harness/scheduler.py): what ran unstored runs again
        print(f"run {run_id}: {stop.reason}; {len(results)} jobs stored, {len(jobs) - len(results)} not; "
              f"make room, then finish it with: {resume}", file=sys.stderr)
        return 2
    bad = [r for r in store.results(run_id) if r["status"] != "ok"]
    pushed = not shared or _push(shared, store, [run_id], None)     # first: the report charts its history
    if not args.no_report:
        from reports import build as build_report
        history = _history_of(shared, store, [run_id]) if shared and pushed else None
        print(f"report: {build_report(store, [run_id], history=history).resolve()}")
    print(f"run {run_id}: {len(results)} jobs run, {len(bad)} not ok"
          + (f"; finish them with: {resume}" if bad else ""), file=sys.stderr)
    return 2 if not pushed else 1 if bad else 0


@contextlib.contextmanager
def _signals_stop():
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


def _push(url: str, store: Store, run_ids: list[str], branch: str | None) -> bool:
    """Push runs; on a store that cannot be reached, say so and how to push them later."""
    try:
        with pgstore.SharedStore(url) as shared:
            for run_id in run_ids:
                n = shared.push(store, run_id, branch)
                moved = f"; moved from branch {n.moved_from!r} to {branch!r}" if n.moved_from is not None else ""
                print(f"run {run_id} -> store {pgstore.shown(url)}: {n.added} results added, {n.updated} updated, "
                      f"{n.unchanged} unchanged{moved}", file=sys.stderr)
    except UserError as e:
        where = "" if store.root.resolve() == paths.DEFAULT_RESULTS.resolve() else f" --results {shlex.quote(str(store.root))}"
        print(f"zobench: error: {e}; the results are kept in {store.root}: push them later with "
              f"zobench push {' '.join(run_ids)} --store {shlex.quote(pgstore.shown(url))}{where}", file=sys.stderr)
        return False
    return True


def cmd_push(args) -> int:
    store = Store(args.results)
    for run_id in args.runs:
        store.run_plan(run_id)      # an unknown or corrupt run is refused before anything is sent
    return 0 if _push(pgstore.required(args.store, "push"), store, args.runs, args.branch) else 2


def cmd_pull(args) -> int:
    store = Store(args.results)
    with pgstore.SharedStore(pgstore.required(args.store, "pull")) as shared:
        for run_id in args.runs:
            n, kept = shared.pull(run_id, store)
            print(f"run {run_id} -> {store.runs / run_id}: {n} results written"
                  + (f"; kept {len(kept)} local results newer than the store's ({', '.join(kept)}): push them with "
                     f"zobench push {run_id}" if kept else ""), file=sys.stderr)
    return 0


def cmd_history(args) -> int:
    from harness import history

    with pgstore.SharedStore(pgstore.required(args.store, "history")) as shared:
        rows, facts = shared.history(args.keys, args.target, args.since, args.branch)
    found = history.series(rows, facts, args.threshold / 100, args.estimator)
    if not found:
        raise UserError("history: no ok result in the store matches" + (f" {' '.join(args.keys)}" if args.keys else ""))
    if args.format == "json":
        print(jsonfile.dumps([dataclasses.asdict(s) for s in found]))
    else:
        print(history.render(found, args.format, args.estimator), end="")
    if args.out:
        from reports.history import chart

        from reports.charts import save

        try:
            args.out.mkdir(parents=True, exist_ok=True)
        except OSError as e:    # a regular file by that name, or a folder zobench may not write
            raise UserError(f"history --out {args.out}: {e.strerror or e}; expected a folder for the chart") from None
        save(chart(found, args.estimator), args.out, "history")
        print(f"chart: {(args.out / 'history.png').resolve()}", file=sys.stderr)
    return 0


def _history_of(url: str | None, store: Store, run_ids: list[str]) -> list | None:
    """The shared store's series of the runs' job keys, for their report; None without a store,
    or when it cannot be reached (said on stderr: a report never fails for its history)."""
    if not url:
        return None
    from harness import history, measurements

    keys = sorted({measurements.job_key(r["job"])[0] for run_id in run_ids for r in store.results(run_id)})
    try:
        with pgstore.SharedStore(url) as shared:
            rows, facts = shared.history(keys, None, None, None, exact=True)
    except UserError as e:
        print(f"zobench: warning: {e}: the report has no history chart", file=sys.stderr)
        return None
    return history.series(rows, facts, 0.05)


def _pulled(args, run_ids: list[str]) -> list[str]:
    """A reading command's runs, pulled from --store first where one is given (the latest of the
    store where none is named), or from $ZOBENCH_STORE's (or the config's) store where a named run
    is not here; the local results folder then serves the command as ever."""
    url = pgstore.url_from(args.store)
    local = Store(args.results)
    here = all((local.runs / r / "run.json").is_file() for r in run_ids) if run_ids else bool(local.run_ids())
    if not url or (here and not args.store):
        return run_ids
    with pgstore.SharedStore(url) as shared:
        run_ids = run_ids or shared.run_ids()[-1:]
        if not run_ids:
            raise UserError(f"store {pgstore.shown(url)} has no runs")
        for run_id in run_ids:
            shared.pull(run_id, local)
    return run_ids


def _the_run(args, store: Store) -> str:
    """A command's one run: --run (pulled from a store first where one is given), else the
    latest of the store or of the results folder."""
    return (_pulled(args, [args.run] if args.run else []) or [None])[0] or store.latest()


def cmd_results(args) -> int:
    import pandas as pd

    from harness import convergence

    store = Store(args.results)
    run_id = _the_run(args, store)
    saved = store.run_plan(run_id)
    rows = [summary(run_id, r) for r in store.results(run_id, saved)]
    not_run = store.not_run(run_id, saved)
    df = pd.DataFrame(rows)
    if args.format == "csv":
        df.to_csv(sys.stdout, index=False)
    elif args.format == "json":
        print(jsonfile.dumps(rows))
    else:
        from rich.console import Console
        from rich.table import Table

        t = Table(title=f"run {run_id}")
        for col in ("job", "status", "steps", "ms/step", "train s", "peak RSS MiB", "test acc", "train loss"):
            t.add_column(col, justify="left" if col in ("job", "status") else "right")
        for r in rows:
            fmt = lambda v, f: "-" if v is None else format(v, f)
            t.add_row(r["job_id"], f"{r['status']}: {r['error']}" if r["error"] else
                      f"{r['status']}; not finite: {r['nonfinite']}" if r["nonfinite"] else r["status"],
                      str(r["steps"]), fmt(r["step_seconds"] and 1000 * r["step_seconds"], ".2f")
                      + (f" ({validity.shown(r['validity'].split(','))})" if r["validity"] else ""),
                      fmt(r["train_seconds"], ".1f"), fmt(r["peak_rss_bytes"] and r["peak_rss_bytes"] / 2**20, ".1f"),
                      convergence.annotate(fmt(r["test_accuracy"], ".3f"), r["flags"], fmt(r["best_test_accuracy"], ".3f")),
                      fmt(r["train_loss"], ".3f"))
        console = Console(width=None if sys.stdout.isatty() else 160)
        console.print(t)
        for r in rows:
            if r["pretrained_from"]:
                console.print(f"{r['job_id']}: fine-tuned from {r['pretrained_from']} "
                              f"{(r['init_sha256'] or 'unknown weights')[:12]}", markup=False, highlight=False)
    if not_run:
        print(f"run {run_id}: {len(not_run)} of {len(saved['jobs'])} jobs have no result yet; "
              f"{store.resume_command(run_id)} runs them", file=sys.stderr)
    # a job whose file is missing or corrupt has not ended ok either
    return 0 if len(rows) == len(saved["jobs"]) and all(r["status"] == "ok" for r in rows) else 1


def cmd_report(args) -> int:
    from reports import build as build_report

    store = Store(args.results)
    runs = _pulled(args, args.run)
    try:
        runs = runs or [store.latest()]
        print(build_report(store, runs, args.out, targets=args.target, methods=args.method,
                           history=_history_of(pgstore.url_from(args.store), store, runs),
                           accuracy=args.energy_accuracy))
    except OSError as e:    # a read-only results folder or --out: the first write fails, nothing is half-made
        raise UserError(f"report: cannot write {e.filename}: {e.strerror}") from None
    return 0


def cmd_build(args) -> int:
    (target,) = inventory.resolve([args.target], args.inventory)
    choice = cpu_choice(target)
    if choice is None:      # a board whose CPU is not pinned: built for the one its probe finds, as a run does
        transport = transport_for(target)
        try:
            choice = cpu_choice(target, probe(transport, target))
        except TransportError as e:
            print(f"zobench: {target.name}: {e}; pin its CPU (cpu = NAME, docs/targets.md) to build without it",
                  file=sys.stderr)
            return 1
        finally:
            transport.close()
    binary = build(target, choice.cpu)
    print(f"{binary}  sha256 {sha256(binary)}  cpu {choice.cpu}: {choice.why}")
    return 0


def cmd_compare(args) -> int:
    from harness import compare, measurements

    if len(args.runs) != (1 if args.baseline_from else 2):
        raise UserError("compare: expected BASELINE CURRENT" if not args.baseline_from else
                        "compare --baseline-from: expected the current run only, the baseline comes from the store")
    named = [r for side in args.runs if not side.endswith(".json") for r in side.split(",")]
    if named:
        _pulled(args, named)
    cur_name, cur = measurements.load(args.runs[-1], args.results)
    if args.baseline_from:
        url = pgstore.url_from(args.baseline_from, "--baseline-from")
        with pgstore.SharedStore(url) as shared:
            base, runs = shared.baseline(cur, args.branch, args.last, cur_name.split(","))
        base_name = f"{args.branch} ({', '.join(runs) or 'no run'})"
    else:
        base_name, base = measurements.load(args.runs[0], args.results)
    if not base or not cur:
        raise UserError(f"compare: {base_name if not base else cur_name} has no ok result to compare")
    verdicts = compare.compare(base, cur, args.threshold / 100, args.estimator)
    print(compare.render(verdicts, args.format, base_name, cur_name, args.threshold / 100, args.estimator))
    code, why = compare.exit_code(verdicts, args.fail_on_change)
    if why:
        print(f"zobench: {why}", file=sys.stderr)
    return code


def cmd_export(args) -> int:
    from harness import export, measurements

    store = Store(args.results)
    run_id = _the_run(args, store)
    store.run_plan(run_id)      # a run of this store, not an exported file that measurements.load also reads
    _, found = measurements.load(run_id, args.results)
    text = export.pytest_benchmark(run_id, found) if args.format == "pytest-benchmark" else export.csv_text(run_id, found)
    if args.out:
        try:
            args.out.write_text(text)
        except OSError as e:
            raise UserError(f"export --out {args.out}: {e.strerror}") from None
        print(f"{args.out}: {len(found)} job keys of run {run_id}", file=sys.stderr)
    else:
        sys.stdout.write(text if text.endswith("\n") else text + "\n")
    return 0


def cmd_memory(args) -> int:
    from harness import memory_model

    if args.bp_layers is not None and args.method != "elastic-zo":
        raise UserError("memory --bp-layers: only with --method elastic-zo")
    model = MODELS[args.model]
    if args.points is not None:
        if model.kind == Transformer.kind:
            raise UserError(f"memory --points: {model.name} is a transformer; it takes --context")
        try:
            model = model.with_points(args.points)
        except ModelError as e:
            raise UserError(f"memory --points: {e}") from None
    try:
        # without --method, checkpointing applies to the methods that have a BP part to checkpoint
        rows = [memory_model.breakdown(model, m, args.batch, args.precision, k, args.optimizer, args.context or 0,
                                       args.checkpointing and (m != "full-zo" or args.method is not None))
                for m, k in memory_model.configurations(model, args.method, args.bp_layers)]
    except ValueError as e:
        raise UserError(f"memory: {e}") from None
    print(jsonfile.dumps([r.to_dict() for r in rows]) if args.json else memory_model.table(rows))
    return 0


def cmd_targets(args) -> int:
    if args.action == "probe":
        if not args.name:
            raise UserError("targets probe: name the target to probe")
        (target,) = inventory.resolve([args.name], args.inventory)
        try:
            # Ctrl-C raises here (main says so): the place is released on the way out
            with reach(target, Stop(), lambda line: print(line, file=sys.stderr)) as there, \
                    contextlib.closing(transport_for(there)) as transport:
                facts = probe(transport, there)
        except TransportError as e:
            print(f"zobench: {target.name}: {e}", file=sys.stderr)
            return 1
        if args.json:
            print(jsonfile.dumps(facts))
        else:
            for key, value in facts.items():
                shown = ", ".join(f"{k} {v}" for k, v in value.items()) if isinstance(value, dict) else \
                    " ".join(value) if isinstance(value, list) else value
                print(f"{key:20} {shown}")
        return 0
    for t in inventory.load(args.inventory).values():
        where = "this machine" if t.transport == "local" else \
            f"{t.user + '@' if t.user else ''}{t.host}{':' + str(t.port) if t.port else ''}"
        where = f"labgrid {t.labgrid['coordinator']} {t.labgrid['place'] or t.labgrid['tags']}" if t.labgrid else where
        print(f"{t.name:20} {where:28} {t.arch:8} {','.join(t.runtimes):16} {t.device:5} {t.source}")
    return 0


def cmd_fit(args) -> int:
    (target,) = inventory.resolve([args.target], args.inventory)
    if not args.budget and not target.mem_limit:
        raise UserError(f"fit: no --budget, and target {target.name} has no mem_limit to default to")
    budget = fit.parse_budget(args.budget or target.mem_limit)
    if args.vary == "model":
        if args.model:
            raise UserError("fit --model: only --vary batch or context grows one model; --vary model climbs "
                            "--model-family")
        model = None
    else:
        model = MODELS.get(args.model or "")
        if not isinstance(model, Transformer):
            raise UserError(f"fit --vary {args.vary}: --model names one of the transformers: "
                            f"{', '.join(n for n, m in MODELS.items() if isinstance(m, Transformer))}")
    if args.model_family not in {m.family for m in MODELS.values() if isinstance(m, Transformer)}:
        raise UserError(f"fit --model-family {args.model_family!r}: expected one of "
                        f"{', '.join(sorted({m.family for m in MODELS.values() if isinstance(m, Transformer)}))}")
    try:
        choice = suites.MethodChoice.parse(args.method)
    except ValueError as e:
        raise UserError(f"fit --method {args.method!r}: {e}") from None
    if args.checkpointing and choice.method == "full-zo":
        raise UserError("fit --checkpointing: full-zo keeps no activations to checkpoint")
    method = fit.Method(choice, args.optimizer, args.checkpointing)
    candidates = fit.configs(args.vary, args.model_family, model, args.batch, args.context or 0)
    store = Store(args.results)
    with _signals_stop() as (stop, caught):
        try:
            best, probes, run_id = fit.run(store, target, candidates, method, budget, vary=args.vary,
                                           dataset=args.dataset, runtime=args.runtime, timeout_s=args.timeout,
                                           stop=stop)
        except fit.Stopped as e:
            print(e, file=sys.stderr)
            return 128 + caught[0]
    pushed = not (url := pgstore.url_from(args.store)) or _push(url, store, [run_id], None)
    human = fit.memory_model.human
    print(f"{'probe':40} {'params':>10} {'predicted':>11} {'peak RSS':>11}  status")
    for p in probes:
        peak = human(p.peak_rss_bytes) if p.peak_rss_bytes else "-"
        print(f"{p.config.label:40} {p.config.model.params_total / 1e6:9.2f}M {human(p.predicted_bytes):>11} "
              f"{peak:>11}  {p.status}{': ' + p.error if p.error and p.status != 'ok' else ''}")
    what = f"{choice} on {target.name} within {human(budget)}"
    if best is None:
        print(f"fit: nothing trains: {what} is too small for {candidates[0].label}, the smallest "
              f"(run {run_id})", file=sys.stderr)
        return 1 if pushed else 2
    print(f"largest: {best.label} ({best.model.params_total / 1e6:.2f}M parameters) trains {what} (run {run_id})")
    return 0 if pushed else 2


def cmd_tune(args) -> int:
    suite = suites.load(args.suite)
    try:
        choice = suites.MethodChoice.parse(args.method)
    except ValueError as e:
        raise UserError(f"tune --method {args.method!r}: {e}") from None
    (target,) = inventory.resolve([args.target], args.inventory)
    params = [tune.Param.parse(p) for p in args.param] or tune.default_params(choice, args.precision)
    overrides = plan.parse_set(args.set)
    if (both := sorted({p.name for p in params} & set(overrides))):
        raise UserError(f"tune --set {both[0]}: it is the parameter searched; leave it out of --set")
    opts = tune.Options(choice, args.precision, args.zo_loss if args.precision == "int8" else "float", args.runtime,
                        args.dataset, params, args.trials, args.epochs or tune.default_epochs(suite, args.precision),
                        args.validation or 0, args.sampler,
                        args.grid_points, args.pruner, args.seed, overrides, args.timeout)
    with _signals_stop() as (stop, caught):     # the trial in progress is stopped, and no other starts
        outcome = tune.run(Store(args.results), suite, target, opts, stop,
                           show=lambda line: print(line, file=sys.stderr))
    run_id, best = outcome.run_id, outcome.record["best"]
    if caught:
        print(f"tune run {run_id}: {outcome.interrupted} after {len(outcome.record['trials'])} trials"
              + ("; the best so far:" if best else "; no trial completed"), file=sys.stderr)
    if best is None:
        print(f"tune run {run_id}: no trial completed, nothing chosen", file=sys.stderr)
        return 128 + caught[0] if caught else 1
    print("\n".join(tune.toml_lines(run_id, outcome.record)))
    return 128 + caught[0] if caught else 0


def main(argv=None) -> int:
    try:
        args = build_parser().parse_args(argv)
        return {"run": cmd_run, "results": cmd_results, "report": cmd_report, "targets": cmd_targets,
                "build": cmd_build, "memory": cmd_memory, "compare": cmd_compare,
                "export": cmd_export, "fit": cmd_fit, "tune": cmd_tune, "push": cmd_push, "pull": cmd_pull, "history": cmd_history}[args.command](args)
    except UserError as e:
        print(f"zobench: error: {e}", file=sys.stderr)
        return 2
    except KeyboardInterrupt:   # `zobench run` handles its own (cmd_run); elsewhere nothing is left running
        print("zobench: interrupted", file=sys.stderr)
        return 130
    except BrokenPipeError:     # `zobench results | head`: the reader has all it wanted
        os.dup2(os.open(os.devnull, os.O_WRONLY), sys.stdout.fileno())   # no second error at exit
        return 0
    except Exception as e:      # the shared store's driver: a table dropped or changed by hand under a query
        if type(e).__module__.split(".")[0] != "psycopg":
            raise
        said = str(e).strip().splitlines()[0] if str(e).strip() else type(e).__name__
        print(f"zobench: error: the shared store: {type(e).__name__}: {said}", file=sys.stderr)
        return 2


if __name__ == "__main__":
    sys.exit(main())
