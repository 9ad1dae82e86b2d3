"""`zobench report`: charts, report.md and report.html for runs (reports/)."""
from __future__ import annotations

from pathlib import Path

from workloads.spec import Bounds

from harness.stores import pgstore
from harness.errors import UserError
from harness.stores.store import Store

from .. import running
from . import options


def add(sub) -> None:
    p = sub.add_parser("report", help="charts, report.md and report.html for runs")
    options.add_results(p)
    options.add_store(p)
    p.add_argument("--run", action="append", default=[], help="run id (repeatable; default: the latest)")
    p.add_argument("--target", action="append", default=[], help="only these targets (repeatable)")
    p.add_argument("--method", action="append", default=[], help="only these methods (full-zo, elastic-zo:1, ...)")
    p.add_argument("--out", type=Path, help="output directory (default RESULTS/runs/<run>/report)")
    p.add_argument("--energy-accuracy", type=options.number(float, Bounds(0, 100.0)), metavar="PCT",
                   help="the test accuracy the energy-to-accuracy table counts up to (default: per workload, "
                        "the lowest final test accuracy of its charted jobs)")
    p.set_defaults(main=main)


def main(args) -> int:
    from reports import build as build_report
    from harness import guarded

    store = Store(args.results)
    runs = options.pulled(args, args.run)
    try:
        runs = runs or [store.latest()]
        out = args.out and guarded.own_folder(args.out, ".zobench-report", "report", "report --out")
        print(build_report(store, runs, out, targets=args.target, methods=args.method,
                           history=running.history_of(pgstore.url_from(args.store), store, runs,
                                                      options.say),
                           accuracy=args.energy_accuracy))
    except OSError as e:    # a read-only results folder or --out: the first write fails, nothing is half-made
        raise UserError(f"report: cannot write {e.filename or 'a report file'}: {e.strerror or e}") from None
    return 0
