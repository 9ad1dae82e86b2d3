"""`zobench compare`: the regression gate between two runs, or a run and a shared store's
baseline (harness/analysis/compare.py); its exit code is CI's verdict."""
from __future__ import annotations

import sys

from workloads.spec import Bounds

from harness.stores import pgstore
from harness.analysis.compare import EXIT_CODES, THRESHOLD
from harness.errors import UserError

from . import options


def add(sub) -> None:
    p = sub.add_parser("compare",
                       help="per job key: significant and large changes in step time, peak memory and energy",
                       epilog=f"{EXIT_CODES} (docs/compare.md)")
    options.add_results(p)
    p.add_argument("runs", nargs="+", metavar="BASELINE CURRENT",
                   help="the baseline (a run id, several joined by commas, or a file from `zobench export "
                        "--format pytest-benchmark`) and the current side; with --baseline-from, the current only")
    options.add_store(p, "read the named runs from this shared store first (pulled into --results)")
    p.add_argument("--baseline-from", metavar="URL",
                   help="take the baseline from this shared store: the same job keys and fingerprint in the "
                        "last --last runs of --branch")
    p.add_argument("--branch", default="main", help="--baseline-from's branch (default main)")
    p.add_argument("--last", type=options.number(int, Bounds(1, 1000)), default=5, metavar="N",
                   help="--baseline-from pools the last N runs of each key (default 5)")
    p.add_argument("--threshold", type=options.number(float, Bounds(0, 1000.0)), default=100 * THRESHOLD, metavar="PCT",
                   help="smallest relative change that counts, in percent (default 5)")
    options.add_estimator(p)
    p.add_argument("--fail-on-change", action="store_true",
                   help="also exit 1 on a significant improvement (time to update the baseline)")
    p.add_argument("--allow-unjudged", action="store_true",
                   help="exit 0, not 3, when keys were not judged for noise or too few repeats and none of the "
                        "judged regressed (a noisy CI runner); a key not comparable, or a gate that judged no "
                        "key, still exits 3")
    p.add_argument("--format", choices=("text", "markdown", "json"), default="text",
                   help="text (default), markdown (a CI comment) or json (for a program)")
    p.set_defaults(main=main)


def main(args) -> int:
    from harness.analysis import compare
    from harness.stores import measurements

    if len(args.runs) != (1 if args.baseline_from else 2):
        raise UserError("compare: expected BASELINE CURRENT" if not args.baseline_from else
                        "compare --baseline-from: expected the current run only, the baseline comes from the store")
    named = [r for side in args.runs if not side.endswith(".json") for r in side.split(",")]
    if named:
        options.pulled(args, named)
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
    print(compare.render(verdicts, args.format, base_name, cur_name, args.threshold / 100, args.estimator,
                         args.fail_on_change, args.allow_unjudged))
    code, why = compare.exit_code(verdicts, args.fail_on_change, args.allow_unjudged)
    if why:
        print(f"zobench: {why}", file=sys.stderr)
    return code
