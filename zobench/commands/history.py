"""`zobench history`: a key's step time, memory, energy and accuracy against commits, from the
shared store, with the changes detected (harness/analysis/history.py)."""
from __future__ import annotations

import dataclasses
import sys
from pathlib import Path

from workloads import jsonfile
from workloads.spec import Bounds

from harness.stores import pgstore
from harness.analysis.compare import THRESHOLD
from harness.errors import UserError

from . import options


def add(sub) -> None:
    p = sub.add_parser("history", help="per job key and fingerprint: step time, memory, energy and accuracy "
                                       "against commits, from the shared store, with the changes detected")
    options.add_store(p, "the shared store")
    p.add_argument("keys", nargs="*", metavar="KEY", help="only job keys containing one of these (default: all)")
    p.add_argument("--target", help="only this target")
    p.add_argument("--since", metavar="REF", help="from the first run of this commit (a prefix) or run id on")
    p.add_argument("--branch", help="only runs of this branch")
    p.add_argument("--threshold", type=options.number(float, Bounds(0, 1000.0)), default=100 * THRESHOLD, metavar="PCT",
                   help="smallest relative change that counts, in percent (default 5, as compare)")
    options.add_estimator(p)
    p.add_argument("--format", choices=("text", "markdown", "json"), default="text",
                   help="text (default), markdown (a CI comment) or json (for a program)")
    p.add_argument("--out", type=Path, help="also write the chart here (history.png and .svg)")
    p.set_defaults(main=main)


def main(args) -> int:
    from harness.analysis import history

    with pgstore.SharedStore(pgstore.required(args.store, "history")) as shared:
        rows, facts = shared.history(args.keys, args.target, args.since, args.branch)
        shared.refuse_damaged("history", args.keys, args.target)
        faked = shared.test_only_runs(args.keys, args.target, args.since, args.branch)
    if faked:
        print(f"zobench: history: note: left out {len(faked)} run{'s' if len(faked) > 1 else ''} with a test-only "
              "setting, never a point of a series: " + ", ".join(f"{run_id} ({', '.join(what)})"
                                                           for run_id, what in faked.items()), file=sys.stderr)
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

        from harness import guarded

        try:
            out = guarded.own_folder(args.out, ".zobench-history", "history chart", "history --out")
            save(chart(found, args.estimator), out, "history")
        except OSError as e:    # a folder zobench may not write, a full disk
            raise UserError(f"history --out {args.out}: cannot write {e.filename or ''}: {e.strerror or e}") from None
        print(f"chart: {out / 'history.png'}", file=sys.stderr)
    return 0
