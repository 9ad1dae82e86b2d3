"""`zobench push`: copy local runs into the shared store."""
from __future__ import annotations

from harness.stores import pgstore
from harness.stores.store import Store

from .. import running
from . import options


def add(sub) -> None:
    p = sub.add_parser("push", help="copy local runs into the shared store (pushing twice changes nothing)")
    options.add_results(p)
    options.add_store(p, "the shared store")
    p.add_argument("--branch", help="record the runs under this branch (default: the branch they ran on)")
    p.add_argument("runs", nargs="+", metavar="RUN_ID")
    p.set_defaults(main=main)


def main(args) -> int:
    store = Store(args.results)
    for run_id in args.runs:
        store.run_plan(run_id)      # an unknown or corrupt run is refused before anything is sent
    return 0 if running.push(pgstore.required(args.store, "push"), store, args.runs, args.branch, options.say) else 2
