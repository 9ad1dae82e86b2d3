"""`zobench pull`: copy runs of the shared store into the local results folder."""
from __future__ import annotations

import sys

from harness.errors import UserError
from harness.stores import pgstore
from harness.stores.store import Store

from . import options


def add(sub) -> None:
    p = sub.add_parser("pull", help="copy runs of the shared store into the local results folder")
    options.add_results(p)
    options.add_store(p, "the shared store")
    p.add_argument("runs", nargs="+", metavar="RUN_ID")
    p.set_defaults(main=main)


def main(args) -> int:
    store = Store(args.results)
    with pgstore.SharedStore(pgstore.required(args.store, "pull")) as shared:
        for run_id in args.runs:
            n, kept = shared.pull(run_id, store)
            print(f"run {run_id} -> {store.runs / run_id}: {n} results written"
                  + (f"; kept {len(kept)} local results newer than the store's ({', '.join(kept)}): push them with "
                     f"zobench push {run_id}" if kept else ""), file=sys.stderr)
        if shared.damaged:      # what was whole is pulled; a damaged row is no success
            raise UserError(f"pull: {len(shared.damaged)} damaged row{'s' if len(shared.damaged) > 1 else ''} in the store "
                            f"left out ({shared.damaged[0]}{', …' if len(shared.damaged) > 1 else ''})")
    return 0
