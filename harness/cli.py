"""zobench: the command line. Exit 0 = all good, 1 = a job did not end ok,
2 = bad usage or configuration (one line on stderr, no traceback)."""
from __future__ import annotations

import argparse
import json
import sys
from datetime import datetime, timezone
from pathlib import Path

from workloads import datasets

from . import inventory, paths, plan, suites
from .build import build
from .deploy import sha256
from .errors import UserError
from .plan import Job
from .progress import ProgressView
from .probe import probe
from .runs import execute, transport_for
from .store import Store, summary
from .transport import TransportError


class Parser(argparse.ArgumentParser):
    def error(self, message):  # argparse's own errors: one line, exit 2
        raise UserError(f"{self.prog}: {message}")


def _add_results(p):
    p.add_argument("--results", type=Path, default=paths.DEFAULT_RESULTS, metavar="DIR",
                   help="results directory (default ./results)")


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
    p.add_argument("--set", action="append", default=[], metavar="KEY=VALUE", help="override a hyperparameter")
    p.add_argument("--timeout", type=float, help="per-job timeout in seconds (default: the suite's)")
    p.add_argument("--resume", metavar="RUN_ID", help="re-run the jobs of RUN_ID that did not end ok")
    p.add_argument("--no-report", action="store_true", help="do not write the report after the run")

    p = sub.add_parser("results", help="the results of a run as a table, CSV or JSON")
    _add_results(p)
    p.add_argument("--run", help="run id (default: the latest)")
    p.add_argument("--format", choices=("table", "csv", "json"), default="table")

    p = sub.add_parser("report", help="charts, report.md and report.html for runs")
    _add_results(p)
    p.add_argument("--run", action="append", default=[], help="run id (repeatable; default: the latest)")
    p.add_argument("--target", action="append", default=[], help="only these targets (repeatable)")
    p.add_argument("--method", action="append", default=[], help="only these methods (full-zo, elastic-zo:1, ...)")
    p.add_argument("--out", type=Path, help="output directory (default RESULTS/runs/<run>/report)")

    p = sub.add_parser("build", help="build zobench-train for a target (natively, or cross-compiled)")
    _add_results(p)
    p.add_argument("--target", required=True)
    p.add_argument("--inventory", type=Path)

    p = sub.add_parser("compare", help="per job key: significant and large changes in step time and peak memory")
    _add_results(p)
    p.add_argument("baseline", help="run id, or a file from `zobench export --format pytest-benchmark`")
    p.add_argument("current", help="run id, or an exported file")
    p.add_argument("--threshold", type=float, default=5.0, metavar="PCT",
                   help="smallest relative change that counts, in percent (default 5)")
    p.add_argument("--estimator", choices=("min", "median"), default="min",
                   help="each side's estimate the threshold applies to (default min: on a shared "
                        "machine noise only adds time)")
    p.add_argument("--fail-on-change", action="store_true",
                   help="also exit 1 on a significant improvement (time to update the baseline)")
    p.add_argument("--format", choices=("text", "markdown", "json"), default="text")

    p = sub.add_parser("export", help="a run's measurements as pytest-benchmark JSON or CSV")
    _add_results(p)
    p.add_argument("--format", choices=("pytest-benchmark", "csv"), required=True)
    p.add_argument("--run", help="run id (default: the latest)")
    p.add_argument("--out", type=Path, help="write here instead of stdout")

    p = sub.add_parser("memory", help="the paper's analytic memory model (Eqs. 2-5, 13-15) from layer shapes")
    p.add_argument("--model", default="lenet5", help="model name (workloads/models.py)")
    p.add_argument("--batch", type=int, required=True, help="batch size")
    p.add_argument("--precision", choices=("fp32", "int8"), default="fp32")
    p.add_argument("--method", choices=("full-bp", "full-zo", "elastic-zo"), help="one method (default: all four)")
    p.add_argument("--bp-layers", type=int, help="elastic-zo: how many final FC layers BP trains (default 1)")
    p.add_argument("--optimizer", choices=("sgd", "adam"), default="sgd", help="BP optimizer (adam: Eq. 5)")
    p.add_argument("--json", action="store_true", help="print a JSON list of breakdowns")

    p = sub.add_parser("targets", help="the targets zobench knows")
    _add_results(p)
    p.add_argument("--inventory", type=Path)
    p.add_argument("--json", action="store_true", help="probe: print the facts as JSON")
    p.add_argument("action", choices=("list", "probe"))
    p.add_argument("name", nargs="?", help="probe: the target to probe")
    return ap


def cmd_run(args) -> int:
    store = Store(args.results)
    if args.resume:
        if args.suite != "quick" or args.method or args.runtime or args.precision or args.set or args.target:
            raise UserError("--resume replays the run's own plan; it takes no suite, target, filter or --set"
                            " (--timeout may be raised)")
        run_id = args.resume
        saved = store.run_plan(run_id)
        done = {r["job"]["job_id"] for r in store.results(run_id) if r["status"] == "ok"}
        jobs = [Job(**j) for j in saved["jobs"] if j["job_id"] not in done]
        if args.timeout:
            for j in jobs:
                j.timeout_s = args.timeout
        targets = {t.name: t for t in inventory.resolve(sorted({j.target for j in jobs}), args.inventory)}
        print(f"resuming run {run_id}: {len(jobs)} of {len(saved['jobs'])} jobs to run", file=sys.stderr)
    else:
        suite = suites.load(args.suite)
        chosen = inventory.resolve(args.target or suite.targets, args.inventory)
        jobs, notes = plan.make(suite, chosen, methods=args.method, runtimes=args.runtime,
                                precisions=args.precision, overrides=plan.parse_set(args.set),
                                timeout_s=args.timeout)
        for n in notes:
            print(f"note: left out {n}", file=sys.stderr)
        for name, data_dir in sorted({(j.spec["workload"]["dataset"], j.spec["workload"]["data_dir"]) for j in jobs}):
            try:
                datasets.check(name, data_dir)
            except datasets.DatasetError as e:
                raise UserError(f"{suite.path}: workload.dataset: {e}") from None
        targets = {t.name: t for t in chosen}
        run_id = store.new_run({"created_at": datetime.now(timezone.utc).isoformat(timespec="seconds"),
                                "suite": suite.name, "suite_path": str(suite.path), "argv": sys.argv[1:],
                                "jobs": [j.to_dict() for j in jobs]})
        print(f"run {run_id}: {len(jobs)} jobs on {', '.join(targets)} -> {store.runs / run_id}", file=sys.stderr)
    counts = {}
    for j in jobs:
        counts[j.target] = counts.get(j.target, 0) + 1
    with ProgressView(counts) as view:
        results = execute(store, run_id, jobs, targets, view)
    bad = [r for r in store.results(run_id) if r["status"] != "ok"]
    if not args.no_report:
        from reports import build
        print(f"report: {build(store, [run_id]).resolve()}")
    print(f"run {run_id}: {len(results)} jobs run, {len(bad)} not ok"
          + (f"; finish them with: zobench run --resume {run_id}" if bad else ""), file=sys.stderr)
    return 1 if bad else 0


def cmd_results(args) -> int:
    import pandas as pd

    store = Store(args.results)
    run_id = args.run or store.latest()
    rows = [summary(run_id, r) for r in store.results(run_id)]
    df = pd.DataFrame(rows)
    if args.format == "csv":
        df.to_csv(sys.stdout, index=False)
    elif args.format == "json":
        print(json.dumps(rows, indent=1))
    else:
        from rich.console import Console
        from rich.table import Table

        t = Table(title=f"run {run_id}")
        for col in ("job", "status", "steps", "ms/step", "train s", "peak RSS MiB", "test acc", "train loss"):
            t.add_column(col, justify="left" if col in ("job", "status") else "right")
        for r in rows:
            fmt = lambda v, f: "-" if v is None else format(v, f)
            t.add_row(r["job_id"], r["status"] if not r["error"] else f"{r['status']}: {r['error']}",
                      str(r["steps"]), fmt(r["step_seconds"] and 1000 * r["step_seconds"], ".2f"),
                      fmt(r["train_seconds"], ".1f"), fmt(r["peak_rss_bytes"] and r["peak_rss_bytes"] / 2**20, ".1f"),
                      fmt(r["test_accuracy"], ".3f"), fmt(r["train_loss"], ".3f"))
        Console(width=None if sys.stdout.isatty() else 160).print(t)
    return 0 if all(r["status"] == "ok" for r in rows) else 1


def cmd_report(args) -> int:
    from reports import build

    store = Store(args.results)
    print(build(store, args.run or [store.latest()], args.out, targets=args.target, methods=args.method))
    return 0


def cmd_build(args) -> int:
    (target,) = inventory.resolve([args.target], args.inventory)
    binary = build(target)
    print(f"{binary}  sha256 {sha256(binary)}")
    return 0


def cmd_compare(args) -> int:
    from . import compare, measurements

    if not 0 <= args.threshold < 1000:
        raise UserError(f"compare --threshold {args.threshold:g}: expected a percentage >= 0")
    base_name, base = measurements.load(args.baseline, args.results)
    cur_name, cur = measurements.load(args.current, args.results)
    if not base or not cur:
        raise UserError(f"compare: {base_name if not base else cur_name} has no ok result to compare")
    verdicts = compare.compare(base, cur, args.threshold / 100, args.estimator)
    print(compare.render(verdicts, args.format, base_name, cur_name, args.threshold / 100, args.estimator))
    return compare.exit_code(verdicts, args.fail_on_change)


def cmd_export(args) -> int:
    from . import export, measurements

    store = Store(args.results)
    run_id = args.run or store.latest()
    _, found = measurements.load(run_id, args.results)
    text = export.pytest_benchmark(run_id, found) if args.format == "pytest-benchmark" else export.csv_text(found)
    if args.out:
        args.out.write_text(text)
        print(f"{args.out}: {len(found)} job keys of run {run_id}", file=sys.stderr)
    else:
        sys.stdout.write(text if text.endswith("\n") else text + "\n")
    return 0


def cmd_memory(args) -> int:
    from workloads.models import MODELS

    from . import memory_model

    if args.model not in MODELS:
        raise UserError(f"memory --model {args.model!r}: expected one of {', '.join(MODELS)}")
    if args.batch < 1:
        raise UserError(f"memory --batch {args.batch}: expected a batch size >= 1")
    if args.bp_layers is not None and args.method != "elastic-zo":
        raise UserError("memory --bp-layers: only with --method elastic-zo")
    model = MODELS[args.model]
    try:
        rows = [memory_model.breakdown(model, m, args.batch, args.precision, k, args.optimizer)
                for m, k in memory_model.configurations(model, args.method, args.bp_layers)]
    except ValueError as e:
        raise UserError(f"memory --bp-layers {args.bp_layers}: {e}") from None
    print(json.dumps([r.to_dict() for r in rows], indent=1) if args.json else memory_model.table(rows))
    return 0


def cmd_targets(args) -> int:
    if args.action == "probe":
        if not args.name:
            raise UserError("targets probe: name the target to probe")
        (target,) = inventory.resolve([args.name], args.inventory)
        transport = transport_for(target)
        try:
            facts = probe(transport, target)
        except TransportError as e:
            print(f"zobench: {target.name}: {e}", file=sys.stderr)
            return 1
        finally:
            transport.close()
        if args.json:
            print(json.dumps(facts, indent=1))
        else:
            for key, value in facts.items():
                print(f"{key:20} {', '.join(f'{k} {v}' for k, v in value.items()) if isinstance(value, dict) else value}")
        return 0
    for t in inventory.load(args.inventory).values():
        where = "this machine" if t.transport == "local" else \
            f"{t.user + '@' if t.user else ''}{t.host}{':' + str(t.port) if t.port else ''}"
        print(f"{t.name:20} {where:28} {t.arch:8} {','.join(t.runtimes):16} {t.device:5} {t.source}")
    return 0


def main(argv=None) -> int:
    try:
        args = build_parser().parse_args(argv)
        return {"run": cmd_run, "results": cmd_results, "report": cmd_report, "targets": cmd_targets,
                "build": cmd_build, "memory": cmd_memory, "compare": cmd_compare,
                "export": cmd_export}[args.command](args)
    except UserError as e:
        print(f"zobench: error: {e}", file=sys.stderr)
        return 2
    except KeyboardInterrupt:
        print("zobench: interrupted; finish the run later with --resume", file=sys.stderr)
        return 130


if __name__ == "__main__":
    sys.exit(main())
