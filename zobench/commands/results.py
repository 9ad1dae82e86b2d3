"""`zobench results`: a run's results as a table, CSV or JSON."""
from __future__ import annotations

import sys

from workloads import jsonfile

from harness.stores import machine_load, validity
from harness.stores.store import Store, summary

from . import options


def add(sub) -> None:
    p = sub.add_parser("results", help="the results of a run as a table, CSV or JSON")
    options.add_results(p)
    options.add_store(p)
    p.add_argument("--run", help="run id (default: the latest)")
    p.add_argument("--format", choices=("table", "csv", "json"), default="table",
                   help="table (default), csv or json (one object a result)")
    p.set_defaults(main=main)


def main(args) -> int:
    import pandas as pd

    from harness.stores import convergence

    store = Store(args.results)
    run_id = options.one_run(args, store)
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
        pooled = any(r["member"] for r in rows)     # a pool's run: which member ran each job
        for col in ("job", *(("member",) if pooled else ()), "status", "steps", "ms/step", "train s", "peak RSS MiB",
                    "test acc", "train loss"):
            t.add_column(col, justify="left" if col in ("job", "member", "status") else "right")
        for r in rows:
            fmt = lambda v, f: "-" if v is None else format(v, f)
            member = [(r["member"] or "-") + (f" ({r['lost_attempts']} lost before)" if r["lost_attempts"] else "")]
            t.add_row(r["job_id"], *(member if pooled else []), f"{r['status']}: {r['error']}" if r["error"] else
                      f"{r['status']}; not finite: {r['nonfinite']}" if r["nonfinite"] else r["status"],
                      str(r["steps"]), fmt(r["step_seconds"] and 1000 * r["step_seconds"], ".2f")
                      + "".join(f" ({x})" for x in (r["step_seconds"] and machine_load.flag(r["load_other"]),
                                                    r["validity"] and validity.shown(r["validity"].split(","))) if x),
                      fmt(r["train_seconds"], ".1f"), fmt(r["peak_rss_bytes"] and r["peak_rss_bytes"] / 2**20, ".1f"),
                      convergence.annotate(fmt(r["test_accuracy"], ".3f"), r["flags"], fmt(r["best_test_accuracy"], ".3f")),
                      fmt(r["train_loss"], ".3f"))
        # off a terminal no cell wraps: each row is one line a log or grep reads whole
        console = Console(width=None if sys.stdout.isatty() else 1000)
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
