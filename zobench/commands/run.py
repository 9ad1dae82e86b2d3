"""`zobench run`: plan and run a suite on targets (or resume a run), then push and report; the
work itself is zobench/running.py's."""
from __future__ import annotations


from harness.planning import suites
from harness.stores.store import Store
from workloads.spec import JobSpec

from .. import running
from . import options


def add(sub) -> None:
    p = sub.add_parser("run", help="plan and run a suite on targets, then write its report")
    options.add_results(p)
    p.add_argument("--suite", default="quick", help="suite name (workloads/suites) or .toml path")
    p.add_argument("--target", action="append", default=[], help="run on these targets instead of the suite's")
    options.add_inventory(p)
    p.add_argument("--method", action="append", default=[], help="only these methods (full-zo, elastic-zo:1, ...)")
    p.add_argument("--runtime", action="append", default=[], help="only these runtimes")
    p.add_argument("--precision", action="append", default=[], help="only these precisions")
    p.add_argument("--dataset", action="append", default=[],
                   help="only these of the suite's data sets (mnist, or a variant: fashion-mnist-rot30)")
    p.add_argument("--zo-loss", action="append", default=[], help="int8: only these ZO losses (float, integer)")
    p.add_argument("--set", action="append", default=[], metavar="KEY=VALUE", help="override a hyperparameter")
    p.add_argument("--seed", type=options.number(int, JobSpec.BOUNDS["seed"]),
                   help="the seed of every job, over the suite's (a cell over seeds: one run per seed)")
    p.add_argument("--timeout", type=options.number(float, suites.TIMEOUT_S),
                   help="per-job timeout in seconds (default: the suite's)")
    p.add_argument("--lease-timeout", type=options.number(float, suites.LEASE_TIMEOUT_S), metavar="S",
                   help="seconds a job waits for a board another run holds, then ends busy "
                        "(default: the job's timeout; 0: do not wait)")
    p.add_argument("--resume", metavar="RUN_ID", help="re-run the jobs of RUN_ID that did not end ok")
    p.add_argument("--instructions", action="store_true",
                   help="count each cpp job's instructions per step under Valgrind after it (a target's "
                        "`instructions = \"callgrind\"` does so always; docs/compare.md)")
    p.add_argument("--no-report", action="store_true", help="do not write the report after the run")
    options.add_store(p, "push the run's results to this shared store when it ends")
    p.set_defaults(main=main)


def request(args) -> running.Request:
    return running.Request(suite=args.suite, targets=args.target, inventory=args.inventory, methods=args.method,
                           runtimes=args.runtime, precisions=args.precision, datasets=args.dataset,
                           zo_losses=args.zo_loss, overrides=args.set, seed=args.seed, timeout=args.timeout,
                           lease_timeout=args.lease_timeout, resume=args.resume, report=not args.no_report,
                           store=args.store, instructions=args.instructions)


def main(args) -> int:
    outcome = running.run(Store(args.results), request(args), options.say)
    if outcome.report is not None:
        print(f"report: {outcome.report}")
    return outcome.exit_code
