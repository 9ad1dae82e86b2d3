"""`zobench compare`: the regression gate between two runs, or a run and a shared store's
baseline (harness/analysis/compare.py); its exit code is CI's verdict."""
from __future__ import annotations

import sys

from workloads.spec import Bounds

from harness.stores import pgstore
from harness.analysis.compare import EXIT_CODES, INSTRUCTION_THRESHOLD, JUDGED_BY, THRESHOLD
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
    p.add_argument("--instructions-threshold", type=options.number(float, Bounds(0, 1000.0)),
                   default=100 * INSTRUCTION_THRESHOLD, metavar="PCT",
                   help="smallest change of instructions per step that counts, in percent (default 1): "
                        "deterministic, judged on one count a side, no test")
    p.add_argument("--judge-by", choices=JUDGED_BY, default="time",
                   help="time (default): each key by its time, memory and energy, and its instructions per step "
                        "where counted; instructions: by its instructions per step and peak memory alone, "
                        "which other work on a shared CI runner cannot move, its time shown, not judged (both "
                        "sides counted: `zobench run --instructions`)")
    options.add_estimator(p)
    p.add_argument("--fail-on-change", action="store_true",
                   help="also exit 1 on a significant improvement (time to update the baseline)")
    p.add_argument("--allow-unjudged", action="store_true",
                   help="exit 0, not 3, when keys were not judged for noise or too few repeats and none of the "
                        "judged regressed (a noisy CI runner); a key not comparable, or a gate that judged no "
                        "key, still exits 3")
    p.add_argument("--rerun", type=options.number(float, Bounds(1, 7 * 86400.0)), metavar="SECONDS",
                   help="where keys come out not judged (too few repeats, or noisy), run more repeats of them on "
                        "the current side's targets, within SECONDS in all, and judge again, as often as the time "
                        "allows (the current side: run ids of this results folder)")
    options.add_inventory(p)
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
    verdicts = compare.compare(base, cur, args.threshold / 100, args.estimator, args.instructions_threshold / 100,
                               args.judge_by)
    if args.rerun:
        cur_name, verdicts, code = rerun(args, base, cur_name, cur, verdicts)
        if code is not None:
            return code
    print(compare.render(verdicts, args.format, base_name, cur_name, args.threshold / 100, args.estimator,
                         args.fail_on_change, args.allow_unjudged, args.instructions_threshold / 100, args.judge_by))
    code, why = compare.exit_code(verdicts, args.fail_on_change, args.allow_unjudged)
    if why:
        print(f"zobench: {why}", file=sys.stderr)
    return code


# what a round costs besides its jobs' own seconds: a run's planning, its preparation, and each job's runner
# starting (a torch runner's import alone is a second or two)
ROUND_S = 5.0


def rerun(args, base: dict, cur_name: str, cur: dict, verdicts: list):
    """compare --rerun: more repeats of the keys not judged, measured on the current side's targets as
    pyperf calibrates its runs, until every key is judged or the time is spent. A round first brings
    each such key to as many repeats as its baseline has (at least as many as the test can judge by:
    compare.repeats_to_judge), then, while it stays noisy, adds as many again;
    a round whose estimate (ROUND_S, and the key's mean job seconds times its repeats) does not fit the
    time left is not started. Says what it ran: the current side becomes the runs pooled. (name, verdicts, an exit
    code where a signal stopped it, else None)."""
    import time

    from harness.analysis import compare
    from harness.stores import measurements
    from harness.stores.store import Store

    from .. import running

    if any(side.endswith(".json") for side in cur_name.split(",")):
        raise UserError("compare --rerun: the current side must be runs of this results folder, not an export: "
                        "its repeats run again from their run's plan")
    store, runs = Store(args.results), cur_name.split(",")
    deadline, added = time.monotonic() + args.rerun, 0
    while True:
        open_keys = {v.key: v for v in verdicts if v.status in compare.UNJUDGED and v.key in cur}
        if not open_keys:
            break
        want = {k: compare.repeats_to_judge(len(base[k].step_s)) - cur[k].repeats for k in open_keys}
        want = {k: n if n > 0 else cur[k].repeats for k, n in want.items()}      # noisy: as many again
        cost = ROUND_S + sum(n * sum(cur[k].wall_s) / max(1, len(cur[k].wall_s)) for k, n in want.items())
        if cost > deadline - time.monotonic():
            options.say(f"zobench: compare --rerun: {len(open_keys)} keys still not judged; their next "
                        f"{sum(want.values())} repeats (about {cost:.0f} s) do not fit the {args.rerun:g} s given "
                        f"({added} repeats run)")
            break
        outcome = running.more_repeats(store, runs, set(open_keys), want, args.inventory, options.say)
        if outcome.run_id is None or outcome.exit_code >= 128:
            return cur_name, verdicts, outcome.exit_code
        runs.append(outcome.run_id)
        added += sum(want.values())
        cur_name, cur = measurements.load(",".join(runs), args.results)
        verdicts = compare.compare(base, cur, args.threshold / 100, args.estimator, args.instructions_threshold / 100,
                                   args.judge_by)
    if added:
        options.say(f"zobench: compare --rerun: {added} more repeats in {len(runs) - 1} runs; the current side is "
                    f"{cur_name}")
    return cur_name, verdicts, None
