"""The regression gate's target, measured on this machine: A/A comparisons of back-to-back
`ci` runs find no regression, and an injected 20% slowdown is caught in every trial.

Each trial runs the ci suite three times back to back: A, then A' (the same code), then S
(`--set inject_slowdown=0.2`, every step of every job 20% slower). It compares A -> A' (a
false alarm if any key regresses) and A' -> S (caught if the gate fails with a regression),
by the gate's default estimator (both: the minimum and the median must move) and by each
estimate alone. It prints one line per trial: each
run's load (median over its jobs of the share of the CPUs other work used) and each gate's exit
code and verdicts; then the totals against the target. --runtime, --precision and --method
narrow the suite for a shorter measurement (the suite's shape, five repeats of each key
interleaved, stays), and --set changes its hyperparameters. --slowdown sets the injected
slowdown (default 0.2) and --busy N runs N busy-loop processes beside every run of the trials
(the gate's rule under load: docs/compare.md); with --one-sided they run beside A' and S alone,
and the slowdown is judged A -> S: a quiet baseline against a loaded current run, CI's common
case. --results keeps the runs, and --evaluate judges kept runs again without running anything
(A -> S where the kept A ran quieter than A' by a tenth of the CPU, as --one-sided left it).

Issue 60's measure that load cannot move: --work makes S's slowdown of real work (`--set
inject_work=F`, extra steps on a restored state) rather than a busy-wait, and --instructions has
every run count its keys' instructions per step (docs/compare.md), which the gate then judges
beside the time. Each comparison is judged on the runs' five repeats a side, on their first
repeat alone (the "1 repeat" view, from the same runs) and, where they counted, by their
instructions alone (`compare --judge-by instructions`, a shared runner's gate); each cell is then the right verdict,
not judged (exit 3) or a wrong one (an A/A regression, a slowdown passed). --rerun S applies the
gate's rerun rule where the five repeats were not judged: `zobench compare --rerun S` beside the
same busy loops as the current side. Every count a run made is tallied by key: one value per key
over quiet and loaded runs is the goal. Asserts nothing. `--evaluate DIR... --record FILE`
writes the kept trials as one gzipped record to commit, which --evaluate judges again through
from_record (docs/compare.md's table: tests/test_compare.py rebuilds it).
"""
from __future__ import annotations

import argparse
import gzip
import statistics
import sys
import tempfile
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

import json  # noqa: E402

from harness.analysis import compare  # noqa: E402
from harness.stores import machine_load, measurements  # noqa: E402
from harness.stores.store import Store  # noqa: E402
from testkit.compare_runs import COMPARE_SIDES, run  # noqa: E402
from testkit.runners import busy_loops, zobench  # noqa: E402

# the gate's default first, then each estimate alone
ESTIMATORS = (compare.ESTIMATOR, *(e for e in compare.ESTIMATORS if e != compare.ESTIMATOR))


def side(store: Store, run_id: str, first: bool) -> dict:
    """A run's measurements: its five repeats, or its first repeat alone (first)."""
    return measurements.from_results([(run_id, r) for r in store.results(run_id)
                                      if not first or not r["job"].get("repeat")])


def gate(store: Store, base: str, cur: str, estimator: str, first: bool = False, by: str = "time") -> tuple[int, dict]:
    """The gate's exit code and verdict counts for base -> cur at the default thresholds (judged
    by: compare --judge-by), with the instructions' verdicts counted as "instructions <status>"."""
    verdicts = compare.compare(side(store, base, first), side(store, cur, first), compare.THRESHOLD, estimator,
                               by=by)
    ins = {}
    for v in verdicts:
        if v.instructions:
            ins[f"instructions {v.instructions.status}"] = ins.get(f"instructions {v.instructions.status}", 0) + 1
    return compare.exit_code(verdicts, False)[0], {**compare.counts(verdicts), **ins}


def counts_by_key(store: Store, run_id: str) -> dict[str, float]:
    """The instructions per step each key of a run counted, the key named with its test-only
    settings (a slowed run's key is the real job's, its work is not)."""
    out = {}
    for r in store.results(run_id):
        if (r.get("instructions") or {}).get("per_step"):
            hyper = r["job"]["hyper"]
            fake = " ".join(f"{k}={hyper[k]}" for k in measurements.test_only(hyper))
            out[f"{measurements.job_key(r['job'])[0]} {fake}".rstrip()] = r["instructions"]["per_step"]
    return out


def rerun(store: Store, base: str, cur: str, seconds: float, loops: int) -> int:
    """The gate's exit code after `compare --rerun seconds` (its repeats beside `loops` busy loops)."""
    with busy_loops(loops):
        p = zobench("compare", "--results", store.root, base, cur, "--rerun", f"{seconds:g}", "--format", "json")
    return json.loads(p.stdout)["exit_code"] if p.stdout.strip() else p.returncode


def busy(store: Store, run_id: str) -> float:
    """The median over a run's jobs of the share of the CPUs other work used."""
    shares = [c for r in store.results(run_id) if (c := machine_load.contention(machine_load.of_steps(r))) is not None]
    return statistics.median(shares) if shares else float("nan")


VIEWS = ("5 repeats", "1 repeat", "judged by instructions")


class Tally:
    def __init__(self, rerun_s: float = 0.0, loops: int = 0):
        self.trials = 0
        self.false_alarms = dict.fromkeys(ESTIMATORS, 0)
        self.caught = dict.fromkeys(ESTIMATORS, 0)
        self.passed_slowdowns = dict.fromkeys(ESTIMATORS, 0)
        # the default estimator's exit codes per view and comparison: right, not judged (3) or wrong
        self.cells = {(view, c): [] for view in (*VIEWS, "after --rerun") for c in ("A/A", "slowdown")}
        self.counts: dict[str, set] = {}     # key -> the instruction counts its runs made
        self.rerun_s, self.loops = rerun_s, loops

    def trial(self, store: Store, a: str, a2: str, s: str, one_sided: bool = False) -> None:
        self.trials += 1
        cells = {}
        for estimator in ESTIMATORS:
            aa, as_ = gate(store, a, a2, estimator), gate(store, a if one_sided else a2, s, estimator)
            self.false_alarms[estimator] += aa[0] == compare.EXIT_REGRESSED
            self.caught[estimator] += as_[0] == compare.EXIT_REGRESSED
            self.passed_slowdowns[estimator] += as_[0] == 0
            cells[estimator] = (aa, as_)
        base = a if one_sided else a2
        one = gate(store, a, a2, ESTIMATORS[0], first=True), gate(store, base, s, ESTIMATORS[0], first=True)
        counts = [counts_by_key(store, r) for r in (a, a2, s)]
        # compare --judge-by instructions, a shared runner's gate: where the runs counted them
        by = (gate(store, a, a2, ESTIMATORS[0], by="instructions"),
              gate(store, base, s, ESTIMATORS[0], by="instructions")) if any(counts) else None
        for view, (x, y) in (("5 repeats", cells[ESTIMATORS[0]]), ("1 repeat", one),
                             *[("judged by instructions", by)] * bool(by)):
            self.cells[view, "A/A"].append(x[0])
            self.cells[view, "slowdown"].append(y[0])
        if self.rerun_s:        # the rerun rule where five repeats were not judged (the loops as the current side's)
            for c, (b, cur), code in (("A/A", (a, a2), cells[ESTIMATORS[0]][0][0]),
                                      ("slowdown", (base, s), cells[ESTIMATORS[0]][1][0])):
                self.cells["after --rerun", c].append(
                    rerun(store, b, cur, self.rerun_s, self.loops) if code == compare.EXIT_NOT_JUDGED else code)
        for counted in counts:
            for key, n in counted.items():
                self.counts.setdefault(key, set()).add(n)
        fmt = lambda code, n: f"exit {code}: " + ", ".join(f"{v} {k}" for k, v in n.items() if v)  # noqa: E731
        loads = "/".join(f"{100 * busy(store, r):.0f}%" for r in (a, a2, s))
        (aa, as_), others = cells[ESTIMATORS[0]], [cells[e] for e in ESTIMATORS[1:]]
        print(f"{self.trials:>5}  {loads:>14}  {fmt(*aa):<36} {fmt(*as_):<36} "
              + "; ".join(f"exit {x[0]}, exit {y[0]}" for x, y in others)
              + f" | 1 repeat: exit {one[0][0]}, exit {one[1][0]}"
              + (f" | by instructions: exit {by[0][0]}, exit {by[1][0]}" if by else "")
              + (f" | after --rerun: exit {self.cells['after --rerun', 'A/A'][-1]}, "
                 f"exit {self.cells['after --rerun', 'slowdown'][-1]}" if self.rerun_s else ""), flush=True)

    def totals(self, slowdown: float = 0.2) -> None:
        pct = f"{100 * slowdown:.0f}%"
        for what, counts, target in (("A/A comparisons with a regression", self.false_alarms, 0),
                                     (f"{pct} slowdowns caught (exit 1)", self.caught, self.trials),
                                     (f"{pct} slowdowns passed (exit 0)", self.passed_slowdowns, 0)):
            print(f"{what}: {counts[ESTIMATORS[0]]} of {self.trials} ("
                  + ", ".join(f"{e} alone: {counts[e]}" for e in ESTIMATORS[1:]) + f"); target {target}")
        right = {"A/A": 0, "slowdown": compare.EXIT_REGRESSED}
        for (view, c), codes in self.cells.items():
            if codes:
                ok, unjudged = sum(x == right[c] for x in codes), sum(x == compare.EXIT_NOT_JUDGED for x in codes)
                print(f"{view}, {c if c == 'A/A' else pct + ' slowdown'}: {ok} right, {unjudged} not judged, "
                      f"{len(codes) - ok - unjudged} wrong, of {len(codes)}")
        for key, seen in self.counts.items():
            print(f"instruction counts of {key}: {len(seen)} distinct "
                  + ", ".join(f"{n:.1f}" for n in sorted(seen)))


HEADER = (f"{'trial':>5}  {'busy A/A/S':>14}  {f'A -> A ({ESTIMATORS[0]})':<36} {f'A -> S ({ESTIMATORS[0]})':<36} "
          + "; ".join(f"A->A, A->S ({e})" for e in ESTIMATORS[1:]))


def measure(trials: int, narrow: list[str], keep: Path | None, slowdown: float = 0.2, loops: int = 0,
            one_sided: bool = False, work: bool = False, rerun_s: float = 0.0) -> None:
    beside = "A' and S (A quiet; the slowdown judged A -> S)" if one_sided else "every run"
    print(f"ci suite {' '.join(narrow) or '(all 60 jobs)'}, {trials} trials of A, A' (same code), "
          f"S (+{100 * slowdown:.0f}%)" + (f", {loops} busy loops beside {beside}" if loops else ""))
    print(HEADER)
    knob = "inject_work" if work else "inject_slowdown"
    sides = [extra and ["--set", f"{knob}={slowdown}"] for _, extra in COMPARE_SIDES]
    tally, t0 = Tally(rerun_s, loops), time.perf_counter()

    def side(store: Store, i: int, extra: list) -> str:
        with busy_loops(loops if i or not one_sided else 0):
            return run(store, ["--suite", "ci", *narrow, *extra])

    with tempfile.TemporaryDirectory() as tmp:
        store = Store(keep or Path(tmp))
        for _ in range(trials):
            tally.trial(store, *(side(store, i, extra) for i, extra in enumerate(sides)), one_sided=one_sided)
    tally.totals(slowdown)
    print(f"{time.perf_counter() - t0:.0f} s for {3 * trials} runs")


def trial_runs(store: Store) -> list[str]:
    """A kept folder's trial runs in order, three a trial (--rerun's runs aside)."""
    return [r for r in store.run_ids() if not store.run_plan(r).get("repeats_of")]


def write_record(folders: list[Path], out: Path) -> None:
    """The trials kept in folders as one committed record (gzip, a line per run: its round, id,
    plan and results), from which --evaluate judges them again: docs/compare.md's tables are
    rebuilt from it by tests/test_compare.py. --rerun's runs are not in it (that column is not)."""
    with gzip.open(out, "wt", compresslevel=9) as f:
        for folder in folders:
            store = Store(folder)
            for run_id in trial_runs(store):
                f.write(json.dumps({"round": folder.name, "run_id": run_id, "plan": store.run_plan(run_id),
                                    "results": store.results(run_id)}, separators=(",", ":")) + "\n")


def from_record(record: Path, round_: str, root: Path) -> Store:
    """A round of a record (write_record) as a results folder under root, to be judged again."""
    store = Store(root / round_)
    with gzip.open(record, "rt") as f:
        for line in f:
            run = json.loads(line)
            if run["round"] == round_:
                store.adopt_run(run["run_id"], run["plan"])
                for r in run["results"]:
                    store.add_result(run["run_id"], r)
    return store


def evaluate(folder: Path | Store) -> Tally:
    """Judge again the trials kept in folder (or a record's round, from_record): its runs in order,
    three a trial; prints them and their totals, and returns the tally."""
    store = folder if isinstance(folder, Store) else Store(folder)
    ids = trial_runs(store)
    print(f"{store.root}: {len(ids) // 3} trials kept")
    print(HEADER)
    tally, slowdown = Tally(), None
    for i in range(0, len(ids) - 2, 3):
        a, a2, s = (max(store.results(r)[0]["job"]["hyper"].get(k, 0) for k in ("inject_slowdown", "inject_work"))
                    for r in ids[i:i + 3])
        assert a == a2 == 0 < s == (slowdown or s), f"{ids[i:i + 3]} are not a trial (inject_slowdown {a}, {a2}, {s})"
        slowdown = s
        quiet_a = busy(store, ids[i]) + 0.1 < busy(store, ids[i + 1])
        tally.trial(store, *ids[i:i + 3], one_sided=quiet_a)
    tally.totals(slowdown or 0.2)
    return tally


if __name__ == "__main__":
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--trials", type=int, default=10)
    ap.add_argument("--runtime", action="append", default=[], help="only these runtimes of the ci suite")
    ap.add_argument("--precision", action="append", default=[], help="only these precisions")
    ap.add_argument("--method", action="append", default=[], help="only these methods")
    ap.add_argument("--set", action="append", default=[], metavar="KEY=VALUE",
                    help="override a hyperparameter of the suite (e.g. train_samples=6400: longer jobs)")
    ap.add_argument("--slowdown", type=float, default=0.2, help="the slowdown S injects (default 0.2)")
    ap.add_argument("--work", action="store_true", help="S's slowdown of real work (inject_work), not a busy-wait")
    ap.add_argument("--instructions", action="store_true", help="every run counts its keys' instructions per step")
    ap.add_argument("--rerun", type=float, default=0.0, metavar="S",
                    help="where five repeats were not judged, compare --rerun S (beside the current side's loops)")
    ap.add_argument("--busy", type=int, default=0, metavar="N", help="N busy-loop processes beside every run")
    ap.add_argument("--one-sided", action="store_true", help="the busy loops beside A' and S alone; the slowdown judged A -> S")
    ap.add_argument("--results", type=Path, help="keep the runs in this results folder (default: a temporary one)")
    ap.add_argument("--evaluate", type=Path, metavar="DIR", help="judge the trials kept in DIR; run nothing")
    ap.add_argument("--record", type=Path, metavar="FILE.jsonl.gz",
                    help="with --evaluate DIR...: write those folders' trials to FILE, a record to commit")
    ap.add_argument("more", nargs="*", type=Path, metavar="DIR", help="more folders for --record")
    a = ap.parse_args()
    if a.record:
        write_record([a.evaluate, *a.more], a.record)
    elif a.evaluate:
        evaluate(a.evaluate)
    else:
        measure(a.trials, [f"--{k}={v}" for k in ("runtime", "precision", "method", "set") for v in getattr(a, k)]
                + ["--instructions"] * a.instructions, a.results, a.slowdown, a.busy, a.one_sided, a.work, a.rerun)
