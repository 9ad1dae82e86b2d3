"""`zobench export`: a run's measurements as pytest-benchmark JSON or CSV."""
from __future__ import annotations

import sys
from pathlib import Path

from harness import guarded
from harness.stores.store import Store

from . import options


def add(sub) -> None:
    p = sub.add_parser("export", help="a run's measurements as pytest-benchmark JSON or CSV")
    options.add_results(p)
    options.add_store(p)
    p.add_argument("--format", choices=("pytest-benchmark", "csv"), required=True,
                   help="pytest-benchmark (its JSON, for CI dashboards that read it) or csv")
    p.add_argument("--run", help="run id (default: the latest)")
    p.add_argument("--out", type=Path, help="write here instead of stdout: a new file, or one export wrote (a file "
                                            "zobench did not write is refused)")
    p.set_defaults(main=main)


def main(args) -> int:
    from harness.analysis import export
    from harness.stores import measurements

    store = Store(args.results)
    run_id = options.one_run(args, store)
    plan = store.run_plan(run_id)      # a run of this store, not an exported file that measurements.load also reads
    out = args.out and guarded.own_file(args.out, "export", "export --out", export.exported)   # refused before the work
    _, found = measurements.load(run_id, args.results)
    if args.format == "pytest-benchmark":
        env = next((r.get("env") or {} for r in store.results(run_id, plan) if r["status"] == "ok"), {})
        text = export.pytest_benchmark(run_id, found, env, plan.get("git") or {})
    else:
        text = export.csv_text(run_id, found)
    if out:
        guarded.write_file(out, text, "export --out")
        print(f"{args.out}: {len(found)} job keys of run {run_id}", file=sys.stderr)
    else:
        sys.stdout.write(text if text.endswith("\n") else text + "\n")
    return 0
