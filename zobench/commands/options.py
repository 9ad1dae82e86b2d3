"""What the commands share: the parser that turns argparse's errors into one line, the types of
bounded numbers, the --results and --store options, and the runs a reading command reads
(pulled from a shared store first where one is given)."""
from __future__ import annotations

import argparse
import re
import sys
from pathlib import Path

from workloads.spec import Bounds

from harness import paths
from harness.stores import pgstore
from harness.errors import UserError
from harness.store_url import scrub
from harness.stores.store import Store, results_dir


class Parser(argparse.ArgumentParser):
    def error(self, message):  # argparse's own errors: one line, exit 2
        """A subcommand's error names it (`zobench: error: zobench run: ...`); the program's own
        does not say its name twice (the boundary's `PROG: error:` says it)."""
        raise UserError(f"{self.prog}: {message}" if " " in self.prog else message)


def add_zo_parts(p) -> None:
    """--set KEY=VALUE for the ZO parts (docs/zo-optimizers.md): what a memory prediction counts."""
    p.add_argument("--set", action="append", default=[], metavar="KEY=VALUE", dest="zo_parts",
                   help="a ZO part, e.g. --set zo_update=adam (docs/zo-optimizers.md): its state and buffers "
                        "are counted")


def zo_parts(command: str, items: list[str]) -> dict:
    """The ZO parts --set names, checked as a suite's hyper is; a UserError for another key."""
    from harness.planning.plan import parse_set
    from workloads.spec import ZO_PART_FIELDS
    parts = parse_set(items)
    if other := sorted(set(parts) - set(ZO_PART_FIELDS)):
        raise UserError(f"{command} --set {other[0]}: only the ZO parts are taken here ({', '.join(ZO_PART_FIELDS)}); "
                        f"the batch, optimizer and context have options of their own")
    return parts


def number(kind, bounds: Bounds):
    """An option's type: an int or float within bounds, refused in the shape of every other number."""
    def parse(text: str):
        try:
            value = kind(text)
        except ValueError:
            raise argparse.ArgumentTypeError(f"expected {'an integer' if kind is int else 'a number'}, "
                                             f"got {text!r}") from None
        problem = bounds.problem(value)
        if problem:
            raise argparse.ArgumentTypeError(problem)
        return value
    return parse


# a name zobench makes a file or a folder of (a calibration step's suite): one path component,
# never '..', so nothing named leaves the folder it is made in
NAME = re.compile(r"[A-Za-z0-9][A-Za-z0-9_.-]{0,63}")


def plain_name(text: str) -> str:
    """An option's type: a name that is one path component (NAME)."""
    if not NAME.fullmatch(text) or ".." in text:
        raise argparse.ArgumentTypeError(f"expected a name of up to 64 letters, digits, '.', '-' and '_' (it names "
                                         f"files; no '/' nor '..'), got {text!r}")
    return text


def numbers(kind, bounds: Bounds, count: int | None = None):
    """An option's type: numbers separated by commas, each as number() takes it; count: exactly
    that many, all different (two angles A,B)."""
    one = number(kind, bounds)

    def parse(text: str) -> list:
        values = [one(x.strip()) for x in text.split(",")]
        if count and (len(values) != count or len(set(values)) != count):
            raise argparse.ArgumentTypeError(f"expected {count} different values separated by commas, got {text!r}")
        return values
    return parse


def grid(bounds: Bounds, least: int = 2):
    """An option's type: first:last:step, the values from first up to last (last included where
    a step lands on it); step > 0, first <= last and at least `least` values, so a grid never
    runs backwards, divides by zero or is a single point."""
    ends, step = number(float, bounds), number(float, Bounds(0.0, open_lo=True))

    def parse(text: str) -> list[float]:
        parts = text.split(":")
        if len(parts) != 3:
            raise argparse.ArgumentTypeError(f"expected first:last:step, got {text!r}")
        lo, hi, by = ends(parts[0]), ends(parts[1]), step(parts[2])
        if hi < lo:
            raise argparse.ArgumentTypeError(f"expected first <= last, got {text!r}")
        values = [lo + i * by for i in range(int((hi - lo) / by + 1e-9) + 1)]
        if len(values) < least:
            raise argparse.ArgumentTypeError(f"expected a grid of {least} values or more, got {text!r} ({len(values)})")
        return values
    return parse


def say(line: str) -> None:
    """What the library has to tell the user (notes, progress lines, warnings): on stderr, through
    the scrubber every printed message goes through (a store's password never reaches a log)."""
    print(scrub(line), file=sys.stderr)


def add_inventory(p):
    p.add_argument("--inventory", type=Path, help="inventory TOML of the targets (default "
                                                  "~/.config/zobench/targets.toml)")


def add_estimator(p):
    """--estimator, as compare, history and publish read it (harness/analysis/compare.py)."""
    from harness.analysis.compare import ESTIMATOR, ESTIMATORS
    p.add_argument("--estimator", choices=tuple(ESTIMATORS), default=ESTIMATOR,
                   help="each side's estimates the threshold applies to (default both: the fastest repeat and the "
                        "median must both move past it)")


def add_results(p):
    p.add_argument("--results", type=results_dir, default=paths.DEFAULT_RESULTS, metavar="DIR",
                   help="results directory (default ./results)")


def add_store(p, what: str = "read the run from this shared store first (pulled into --results)"):
    p.add_argument("--store", metavar="URL", help=f"{what}: postgresql://USER@HOST[:PORT]/DB "
                                                  "(default $ZOBENCH_STORE or ~/.config/zobench/config.toml's [store])")


def pulled(args, run_ids: list[str]) -> list[str]:
    """A reading command's runs, pulled from --store first where one is given (the latest of the
    store where none is named), or from $ZOBENCH_STORE's (or the config's) store where a named run
    is not here; the local results folder then serves the command as ever."""
    url = pgstore.url_from(args.store)
    local = Store(args.results)
    here = all((local.runs / r / "run.json").is_file() for r in run_ids) if run_ids else bool(local.run_ids())
    if not url or (here and not args.store):
        return run_ids
    with pgstore.SharedStore(url) as shared:
        run_ids = run_ids or shared.run_ids()[-1:]
        if not run_ids:
            raise UserError(f"store {pgstore.shown(url)} has no runs")
        for run_id in run_ids:
            shared.pull(run_id, local)
        if shared.damaged:      # pulled what was whole; no reading of a run with a hole in it passes as whole
            raise UserError(f"store {pgstore.shown(url)}: {len(shared.damaged)} damaged row"
                            f"{'s' if len(shared.damaged) > 1 else ''} left out ({shared.damaged[0]}"
                            f"{', …' if len(shared.damaged) > 1 else ''})")
    return run_ids


def one_run(args, store: Store) -> str:
    """A command's one run: --run (pulled from a store first where one is given), else the
    latest of the store or of the results folder."""
    return (pulled(args, [args.run] if args.run else []) or [None])[0] or store.latest()
