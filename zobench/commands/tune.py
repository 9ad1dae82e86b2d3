"""`zobench tune`: a search of a method's learning rates on a validation split (harness/search/tune.py)."""
from __future__ import annotations

import sys

from workloads import vocab
from workloads.spec import Bounds, Hyper

from harness.planning import inventory, plan, suites
from harness.search import tune
from harness.errors import UserError
from harness.stores import pgstore
from harness.stores.store import Store

from .. import running
from . import options

# the longest study name Optuna's storage keeps
STUDY_NAME_MAX = 512


def add(sub) -> None:
    p = sub.add_parser("tune", help="search a method's learning rates (INT8: its perturbation scale) on a "
                                    "validation split held out of the training set; prints the suite's TOML lines")
    options.add_results(p)
    p.add_argument("--suite", default="paper-fmnist", help="the suite whose job is tuned (default paper-fmnist)")
    p.add_argument("--method", required=True, help="one of the suite's methods: full-bp, full-zo, elastic-zo:K")
    p.add_argument("--precision", choices=vocab.PRECISIONS, default="fp32", help="the precision tuned (default fp32)")
    p.add_argument("--zo-loss", choices=vocab.ZO_LOSSES, default="float", help="int8: float (INT8) or integer (INT8*)")
    p.add_argument("--runtime", choices=vocab.RUNTIMES, default="cpp", help="where trials train (default cpp)")
    p.add_argument("--target", default="local", help="where trials run (default: this machine)")
    options.add_inventory(p)
    p.add_argument("--dataset", default="", help="which of the suite's data sets, or one angle of it "
                                                 "(mnist-rot45; default: its first, at its first angle)")
    p.add_argument("--param", action="append", default=[], metavar="NAME=LOW:HIGH[:log|linear]",
                   help="a hyperparameter and its range (default: the paper's knobs for the method and precision)")
    p.add_argument("--trials", type=options.number(int, Bounds(1, 10_000)), default=12, help="trials at most (default 12)")
    p.add_argument("--epochs", type=options.number(int, Hyper.BOUNDS["epochs"]),
                   help="epochs a trial trains (default: FP32 10, INT8 50, at most the suite's)")
    p.add_argument("--validation", type=options.number(int, Bounds(1, Hyper.BOUNDS["train_samples"].hi)),
                   help="training samples held out to score on (default: a sixth of the training set)")
    p.add_argument("--sampler", choices=tune.SAMPLERS, default="tpe", help="tpe (default) or grid")
    p.add_argument("--grid-points", type=options.number(int, Bounds(1, 100)), default=5, help="grid: values per parameter")
    p.add_argument("--pruner", choices=tune.PRUNERS, default="median", help="median (default), halving or none")
    p.add_argument("--seed", type=options.number(int, Bounds(0, 2**32 - 1)), default=0, help="the sampler's seed")
    p.add_argument("--optimizer", default="", help="one of the suite's [optimizers]: its ZO parts and hyper, "
                                                   "over which the trials search")
    p.add_argument("--set", action="append", default=[], metavar="KEY=VALUE", help="override a hyperparameter")
    p.add_argument("--timeout", type=options.number(float, suites.TIMEOUT_S), metavar="S", help="seconds a trial may take")
    p.add_argument("--storage", metavar="URL", default="",
                   help="share the search with other zobench tune processes, on any host, through this PostgreSQL "
                        "database (postgresql://USER@HOST[:PORT]/DB; the password in ~/.pgpass or $PGPASSWORD): "
                        "Optuna's storage (default: this process's own study, in memory)")
    p.add_argument("--study", metavar="NAME", default="",
                   help="with --storage: the study to create, or to join where it exists (the same search's options); "
                        "--trials is then the study's total")
    p.add_argument("--score-epochs", type=options.number(int, Bounds(1, Hyper.BOUNDS["epochs"].hi)), default=1,
                   metavar="N", help="score a trial by its last N epochs' mean validation accuracy (default 1: "
                                     "the last epoch's)")
    p.add_argument("--no-report", action="store_true", help="do not write the search's report after it")
    p.set_defaults(main=main)


def shared_study(args) -> tuple[str, str]:
    """(--storage as the store's URLs are taken, --study): both or neither, a name Optuna keeps."""
    if args.study and not args.storage:
        raise UserError(f"tune --study {args.study}: a study is shared through a database; give --storage "
                        "postgresql://USER@HOST/DB too (without either, the search's study is its own, in memory)")
    if args.storage and not args.study:
        raise UserError("tune --storage: name the study to create or join with --study NAME")
    if len(args.study) > STUDY_NAME_MAX or args.study != args.study.strip():
        raise UserError(f"tune --study {args.study!r}: expected a name of at most {STUDY_NAME_MAX} characters, "
                        "without leading or trailing spaces")
    return (pgstore.url_from(args.storage, "--storage") or "") if args.storage else "", args.study


def main(args) -> int:
    suite = suites.load(args.suite)
    try:
        choice = suites.MethodChoice.parse(args.method)
    except ValueError as e:
        raise UserError(f"tune --method {args.method!r}: {e}") from None
    (target,) = inventory.resolve([args.target], args.inventory)
    pretrain = running.pretrain_target(suite, [target], args.inventory)
    params = [tune.Param.parse(p) for p in args.param] or tune.default_params(choice, args.precision)
    overrides = plan.parse_set(args.set)
    if (both := sorted({p.name for p in params} & set(overrides))):
        raise UserError(f"tune --set {both[0]}: it is the parameter searched; leave it out of --set")
    storage, study = shared_study(args)
    opts = tune.Options(choice, args.precision, args.zo_loss if args.precision == "int8" else "float", args.runtime,
                        args.dataset, params, args.trials, args.epochs or tune.default_epochs(suite, args.precision),
                        args.validation or 0, args.sampler,
                        args.grid_points, args.pruner, args.seed, overrides, args.timeout, args.optimizer,
                        args.score_epochs, storage, study)
    with running.signals_stop() as (stop, caught):     # the trial in progress is stopped, and no other starts
        outcome = tune.run(Store(args.results), suite, target, opts, stop,
                           show=options.say, pretrain_target=pretrain)
    run_id, best = outcome.run_id, outcome.record["best"]
    if caught:
        print(f"tune run {run_id}: {outcome.interrupted} after {len(outcome.record['trials'])} trials"
              + ("; the best so far:" if best else "; no trial completed"), file=sys.stderr)
    if best is None:
        why = f" ({outcome.interrupted})" if outcome.interrupted and not caught else ""
        print(f"tune run {run_id}: no trial completed, nothing chosen{why}", file=sys.stderr)
        return 128 + caught[0] if caught else 1
    print("\n".join(tune.toml_lines(run_id, outcome.record)))
    if not caught and not args.no_report:     # the search as the report charts it: each trial, its curves, the choice
        store = Store(args.results)
        report = running.write_report(store, run_id, options.say)
        if report is None:
            return 1
        print(f"report: {report}", file=sys.stderr)
    return 128 + caught[0] if caught else 0
