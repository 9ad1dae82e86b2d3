"""The ElasticZO paper's Table 2 setting, recovered by calibration (reports/calibration.py says
how): its fine-tuning data were "N images from train and test splits rotated by either A or B",
and N, A and B were lost from the text. Every job is paper-finetune's (its pretraining, rates and
50 epochs), run through `zobench run` on the C++ binary, one thread a job, two runs at a time.

    python scripts/calibrate_table2.py angles  [--grid -90:90:5]    # A, B from the w/o cells
    python scripts/calibrate_table2.py subset  --angles A,B [--sizes 250,500,...]   # N from Full BP FP32
    python scripts/calibrate_table2.py cells   --angles A,B --subset N [--seeds 0,1,2] [--name cells]   # every cell
        [--method M --precisions P]     # or one method's cells again, at a new rate
    python scripts/calibrate_table2.py show                          # the fits and tables, from what ran
    python scripts/calibrate_table2.py records [--records PATH]      # the runs' records, to commit
    python scripts/calibrate_table2.py show --records PATH           # ... the same, from the records alone

Each step's runs are kept under --results (default results/calibration) with what they are in
calibration.json, so `show` can be run again, and a step run again adds to what is there. Their
records (harness/stores/records.py; default docs/reproduction/calibration.jsonl.gz) keep what
`show` reads, each run under its step's name (its suite's), so the tables outlive the results folder."""
from __future__ import annotations

import argparse
import json
import re
import subprocess
import sys
import tempfile
import threading
import tomllib
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

REPO = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(REPO))

from harness.errors import UserError  # noqa: E402
from harness.planning import suites  # noqa: E402
from harness.stores import records  # noqa: E402
from harness.stores.store import Store  # noqa: E402
from reports import calibration, paper  # noqa: E402
from workloads.spec import JobSpec, Workload  # noqa: E402
from workloads.vocab import method_label, precision_label  # noqa: E402
from zobench.cli import guarded, runs_exit  # noqa: E402
from zobench.commands import options  # noqa: E402

DATA_SETS = ("mnist", "fashion-mnist")
PRECISIONS = ("fp32", "int8")
RUN = ["run", "--target", "local-1t", "--no-report", "--runtime", "cpp"]
TEST_IMAGES = 10_000        # MNIST's and Fashion-MNIST's test sets
RECORDS = REPO / "docs" / "reproduction" / "calibration.jsonl.gz"


def toml(table: dict, prefix: tuple = ()) -> str:
    """A TOML document of a suite's table (what tomllib read: strings, numbers, booleans, lists
    of them, and tables)."""
    def key(k: str) -> str:
        return k if re.fullmatch(r"[A-Za-z0-9_-]+", k) else json.dumps(k)

    def value(v) -> str:
        if isinstance(v, bool):
            return "true" if v else "false"
        if isinstance(v, list):
            return "[" + ", ".join(value(x) for x in v) + "]"
        return json.dumps(v) if isinstance(v, str) else repr(v)

    plain = [f"{key(k)} = {value(v)}" for k, v in table.items() if not isinstance(v, dict)]
    out = ([f"[{'.'.join(map(key, prefix))}]"] if prefix and plain else []) + plain
    for k, v in table.items():
        if isinstance(v, dict):
            out += ["", toml(v, (*prefix, k))]
    return "\n".join(out)


def suite_file(folder: Path, name: str, rotations: list[float], subset: int, seed: int,
               finetune_hyper: dict | None = None) -> Path:
    """paper-finetune as a suite of its own: these angles, this subset and seed, and over its
    fine-tuning jobs' [hyper] (never its pretraining's) finetune_hyper."""
    t = tomllib.loads(suites.find("paper-finetune").read_text())
    t.update(rotations=rotations, seed=seed, description=f"calibrate_table2: {name}")
    t["workload"] = {**t.get("workload", {}), "subset": subset}
    for m in t["methods"] if finetune_hyper else ():      # each method's table, over the suite's and
        t["hyper"].setdefault(m, {}).update(finetune_hyper)   # under its precisions' (none sets these)
    path = folder / f"{name}.toml"
    if not path.resolve().is_relative_to(folder.resolve()):     # --name is a plain name (parser()); and here
        raise UserError(f"{name!r}: a step's name makes a file in {folder}, not elsewhere")
    folder.mkdir(parents=True, exist_ok=True)
    path.write_text(toml(t) + "\n")
    return path


def run_all(results: Path, runs: list[tuple[str, Path, list[str]]]) -> int:
    """Each (name, suite, extra args) as a zobench run, two at a time; calibration.json records
    which run id is which as each run ends, so a step cut short keeps what finished. The step's
    exit, from the runs' (runs_exit: 2 when every run was refused)."""
    record, lock = results / "calibration.json", threading.Lock()

    def one(item):
        name, suite, extra = item
        p = subprocess.run([sys.executable, "-m", "zobench", *RUN, "--results", str(results / "runs"),
                            "--suite", str(suite), *extra], cwd=REPO, stderr=subprocess.PIPE, text=True)
        sys.stderr.write(p.stderr[-2000:])
        found = re.search(r"^run (\S+): \d+ jobs on", p.stderr, re.M)
        if found:
            with lock:
                kept = json.loads(record.read_text()) if record.is_file() else {}
                kept.setdefault(name, []).append(found[1])
                record.write_text(json.dumps(kept, indent=1) + "\n")
        return p.returncode

    with ThreadPoolExecutor(2) as pool:
        return runs_exit("calibrate_table2.py", list(pool.map(one, runs)))


def cells(ran: tuple[Store, dict], prefix: str) -> dict:
    """(data set, precision as a table names it, method label, angle, subset, seed) -> {"start": w/o
    fine-tuning %, "final": %} of every ok job of the runs ran (a store, and its run ids by name)
    keeps under names starting with prefix."""
    store, kept = ran
    out = {}
    for name, ids in kept.items():
        if not name.startswith(prefix):
            continue
        for run_id in ids:
            for r in store.results(run_id):
                job = r["job"]
                if r["status"] != "ok" or job.get("save_weights"):
                    continue
                w = job["workload"]
                precision = precision_label(job["precision"], job["zo_loss"], job["method"])
                label = method_label(job["method"], job["bp_layers"])
                key = (w["dataset"], precision, label, float(w["rotate"]), w["subset"], job["seed"])
                out[key] = {"start": 100 * (r["start_eval"] or {}).get("test_accuracy", float("nan")),
                            "final": 100 * r["epochs"][-1]["test_accuracy"]}
    return out


def paper_before(data_set: str, precision: str) -> tuple[float, float]:
    return tuple(paper.TABLE2[precision][data_set][i][0] for i in range(2))


def angles_step(a, results: Path) -> int:
    grid = a.grid
    # w/o fine-tuning is each job's start: one Full BP step of fine-tuning is enough to get it, on
    # the whole test set (a subset of all 10,000 test images: only 2 x 10,000 images are turned)
    runs = [(f"angles-{p}", suite_file(results / "suites", f"angles-{p}", grid, TEST_IMAGES, a.seed,
                                       {"epochs": 1, "train_samples": 32}),
             ["--method", "full-bp", "--precision", p]) for p in PRECISIONS]
    return run_all(results, runs)


def subset_step(a, results: Path) -> int:
    runs = [(f"subset-{n}", suite_file(results / "suites", f"subset-{n}", a.angles, n, a.seed),
             ["--method", "full-bp", "--precision", "fp32"]) for n in a.sizes]
    return run_all(results, runs)


def cells_step(a, results: Path) -> int:
    return run_all(results, cell_runs(a, results))


def cell_runs(a, results: Path) -> list[tuple[str, Path, list[str]]]:
    """A run per seed and precision, of every method or of those --method names."""
    methods = [arg for m in a.method for arg in ("--method", m)]
    return [(f"{a.name}-{p}-s{seed}", suite_file(results / "suites", f"{a.name}-{p}-s{seed}", a.angles, a.subset, seed),
             ["--precision", p, *methods])
            for seed in a.seeds for p in a.precisions.split(",")]


def ran_in(results: Path) -> tuple[Store, dict]:
    """The calibration's runs in a results folder: its store, and its run ids by step name."""
    record = results / "calibration.json"
    if not record.is_file():
        raise UserError(f"{record}: no such file: no calibration step has run in {results}")
    return Store(results / "runs"), json.loads(record.read_text())


def named(store: Store, run_ids: list[str]) -> dict:
    """Run ids by their step's name (the name of the suite each ran)."""
    kept = {}
    for run_id in run_ids:
        kept.setdefault(store.run_plan(run_id)["suite"], []).append(run_id)
    return kept


def records_step(a, results: Path) -> int:
    store, kept = ran_in(results)
    recs = records.of_runs(store, [i for ids in kept.values() for i in ids])
    records.write(a.records, recs)
    print(f"{a.records}: {len(recs)} records of {len({r['run_id'] for r in recs})} runs")
    return 0


def show(a, results: Path) -> int:
    """The fits and every cell against the paper's, as docs/reproduction.md shows them: from the
    runs in results, or (--records given) from the records alone."""
    if a.records_given:
        with tempfile.TemporaryDirectory() as tmp:
            store, run_ids = records.store(records.read(a.records), Path(tmp))
            tables((store, named(store, run_ids)), a.name)
    else:
        tables(ran_in(results), a.name)
    return 0


def tables(ran: tuple[Store, dict], name: str) -> None:
    before = {(d, p): {} for d in DATA_SETS for p in PRECISIONS}
    for (d, p, label, angle, _, _), v in cells(ran, "angles-").items():
        if label == paper.METHODS[-1]:
            before[d, p][angle] = v["start"]
    curves = {g: c for g, c in before.items() if c}
    if curves:
        print("w/o fine-tuning, % by angle:\n")
        angles = sorted({x for c in curves.values() for x in c})
        print("| data, precision | " + " | ".join(f"{x:g}" for x in angles) + " |")
        print("|---" * (len(angles) + 1) + "|")
        for (d, p), c in curves.items():
            print(f"| {d} {p} | " + " | ".join(f"{c[x]:.2f}" if x in c else "-" for x in angles) + " |")
        fit = calibration.fit_angles(curves, {g: paper_before(*g) for g in curves})
        print(f"\nA, B = {fit.value[0]:g}, {fit.value[1]:g} degrees (residual sum of squares {fit.sse:.1f})\n")
        for (g, angle), r in fit.residuals.items():
            print(f"  {g[0]} {g[1]} at {angle:g}: {r:+.2f} points")
    bp = {}
    for (d, p, label, angle, n, _), v in cells(ran, "subset-").items():
        bp.setdefault(n, {})[d, angle] = v["final"]
    if bp:
        angles = sorted({angle for cells_ in bp.values() for _, angle in cells_})
        target = {(d, angles[0]): paper.TABLE2["fp32"][d][0][-1] for d in DATA_SETS}
        print("\nFull BP FP32 fine-tuned at A, % by subset size N:\n")
        for n in sorted(bp):
            print(f"  N = {n}: " + ", ".join(f"{d} {bp[n].get((d, angles[0]), float('nan')):.2f} "
                                            f"(paper {target[d, angles[0]]})" for d in DATA_SETS))
        fit = calibration.fit_subset(bp, {k: v for k, v in target.items() if all(k in c for c in bp.values())})
        print(f"\nN = {fit.value[0]} (residual sum of squares {fit.sse:.1f})")
    every = {}
    for (d, p, label, angle, n, seed), v in cells(ran, f"{name}-").items():
        every.setdefault((d, p), {}).setdefault(angle, {}).setdefault(label, []).append(v)
    if every:
        angles = sorted({angle for by_angle in every.values() for angle in by_angle})
        print("\n| data | precision | cell | " + " | ".join(f"{x:g}°: zobench (seeds) | paper | difference"
                                                       for x in angles) + " |")
        print("|---" * (3 + 3 * len(angles)) + "|")
        order = {d: i for i, d in enumerate(DATA_SETS)}
        for (d, p), by_angle in sorted(every.items(), key=lambda kv: (order[kv[0][0]], kv[0][1])):
            for label in (paper.BEFORE, *paper.METHODS):
                row = []
                for i, angle in enumerate(angles):
                    got = by_angle.get(angle, {})
                    values = [x["start"] for x in got.get(paper.METHODS[-1], [])] if label == paper.BEFORE \
                        else [x["final"] for x in got.get(label, [])]
                    theirs = None if p == "int8*" or len(angles) != 2 else \
                        paper.TABLE2[p][d][i][(paper.BEFORE, *paper.METHODS).index(label)]
                    if not values:
                        row += ["-", "-", "-"]
                        continue
                    mean, std = calibration.spread(values)
                    row += [f"{mean:.2f} ± {std:.2f} ({len(values)})", "-" if theirs is None else f"{theirs:.2f}",
                            "-" if theirs is None else f"{mean - theirs:+.2f}"]
                if any(x != "-" for x in row):
                    print(f"| {d} | {p.upper()} | {label} | " + " | ".join(row) + " |")


# the bounds of what the options name, the suites' own
ANGLE, SUBSET, SEED = Workload.BOUNDS["rotate"], Workload.BOUNDS["subset"], JobSpec.BOUNDS["seed"]


def parser() -> options.Parser:
    """zobench's parser and option types (zobench/commands/options.py): a bad value is one line."""
    ap = options.Parser(prog="calibrate_table2.py", description=__doc__,
                        formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("step", choices=("angles", "subset", "cells", "show", "records"))
    ap.add_argument("--results", type=Path, default=REPO / "results" / "calibration")
    ap.add_argument("--records", type=Path, help="records: the file the runs' records are written to (default "
                                                 "docs/reproduction/calibration.jsonl.gz); show: read the runs' "
                                                 "records from it, not the results folder")
    ap.add_argument("--grid", type=options.grid(ANGLE), default="-90:90:5",
                    help="angles: first:last:step, degrees (both signs: which way the paper turned)")
    ap.add_argument("--angles", type=options.numbers(float, ANGLE, 2), help="subset, cells: A,B")
    ap.add_argument("--sizes", type=options.numbers(int, SUBSET), default="250,500,1000,2000,5000,10000",
                    help="subset: the N to try")
    ap.add_argument("--subset", type=options.number(int, SUBSET), help="cells: N")
    ap.add_argument("--seed", type=options.number(int, SEED), default=0, help="angles, subset: the suite's seed")
    ap.add_argument("--seeds", type=options.numbers(int, SEED), default="0,1,2", help="cells: the seeds of every cell")
    ap.add_argument("--method", action="append", default=[], help="cells: only this method (repeatable; default every "
                                                                   "method of the suite), as zobench run --method")
    ap.add_argument("--precisions", default=",".join(PRECISIONS), help="cells: the precisions (default %(default)s)")
    ap.add_argument("--name", type=options.plain_name, default="cells",
                    help="cells, show: the name the cells' runs are kept under (a round with other rates beside an "
                         "earlier one); one path component, no '/' nor '..'")
    return ap


def main(argv=None) -> int:
    """The step, inside zobench's error boundary: a bad value or a missing file is one line and
    exit 2, a step whose runs were all refused exits 2, one with a job not ok 1."""
    return guarded("calibrate_table2.py", "", lambda: step(argv))


def step(argv) -> int:
    ap = parser()
    a = ap.parse_args(argv)
    if a.step in ("subset", "cells") and not a.angles or a.step == "cells" and a.subset is None:
        ap.error(f"{a.step} needs --angles" + (" and --subset" if a.step == "cells" else ""))
    if a.records and a.step not in ("show", "records"):
        ap.error(f"--records is show's and records' option, not {a.step}'s")
    if other := sorted(set(a.precisions.split(",")) - set(PRECISIONS)):
        ap.error(f"--precisions: expected some of {', '.join(PRECISIONS)}, got {other[0]!r}")
    a.records_given, a.records = a.records is not None, a.records or RECORDS
    if a.step not in ("show", "records"):
        a.results.mkdir(parents=True, exist_ok=True)
    return {"angles": angles_step, "subset": subset_step, "cells": cells_step, "show": show,
            "records": records_step}[a.step](a, a.results)


if __name__ == "__main__":
    sys.exit(main())
