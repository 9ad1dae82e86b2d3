"""Katti et al.'s Fig. 4 at the scale two CPU cores allow (the katti-fig4-cpu suite,
docs/transformers.md "Equal memory"): its run kept as compact records in the repository, and the
doc's tables and chart drawn from them, so a fresh clone draws them again and
tests/test_equal_memory.py fails when the doc says anything the records do not.

    python scripts/katti_fig4.py records RUN_ID... [--results DIR]   # the runs' records into docs/transformers/
    python scripts/katti_fig4.py doc                               # the doc's block and chart from the records

The trend table is what the question "when would the ZO methods cross?" can be answered with
from one run: each job's test accuracy and loss fitted by a line over the second half of its
training seconds, and, where a ZO method's accuracy still rises, the seconds that line needs to
reach Full BP's best. A line is the plainest extrapolation, not a forecast: ZO curves flatten.
"""
from __future__ import annotations

import argparse
import sys
import tempfile
from pathlib import Path

import numpy as np

REPO = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(REPO))

from harness.errors import UserError  # noqa: E402
from harness.stores import records  # noqa: E402
from harness.stores.store import Store  # noqa: E402
from workloads.spec import JobSpec  # noqa: E402
from zobench.cli import guarded  # noqa: E402

DOC = REPO / "docs" / "transformers.md"
RECORDS = REPO / "docs" / "transformers" / "katti-fig4-cpu.jsonl.gz"
CHART = "katti-fig4-cpu"
BEGIN = "<!-- katti-fig4-cpu: begin (scripts/katti_fig4.py doc draws this block from its records) -->"
END = "<!-- katti-fig4-cpu: end -->"


def frame(recs: list[dict]):
    """The records as the report's rows and its equal-memory studies (run id -> budget and models):
    the same code that reads a results folder reads them."""
    from reports import equal_memory
    from reports import report as r

    with tempfile.TemporaryDirectory() as tmp:
        store, ids = records.store(recs, Path(tmp))
        plans = [store.run_plan(i) for i in ids]
        df = r._load(store, ids, plans).sort_values("run_id", kind="stable")
    found = equal_memory.studies(ids, plans)
    if not found:
        raise UserError("the records hold no equal-memory study (a run of the katti-fig4-cpu suite)")
    return df, found


def majority(recs: list[dict]) -> tuple[str, float]:
    """The study's test entries' most common topic and its share (%): what a classifier that says
    it for every entry scores, the floor a method must pass to have learnt anything (the 43 topics
    are far from equal, so chance, 1/43, is not). Read from the data set as the jobs read it."""
    from harness.preparation.artifacts import raw_idx
    from workloads import datasets

    job = JobSpec.from_dict(next(r["job"] for r in recs if r["job"]["pretrained_from"]))
    folder = str(raw_idx(job.workload.dataset, "").dir)
    split = datasets.load(job.workload.dataset, "test", job.hyper.test_samples, folder, context=job.hyper.context)
    counts = np.bincount(split.labels)
    return datasets.manifest(job.workload.dataset, folder)["topics"][counts.argmax()], 100 * counts.max() / len(split)


def trend(df, found) -> list[dict]:
    """Per study job: its best accuracy and when, and the slopes of a line through the second half
    of its curve (points and loss per 100 training seconds); for a method below Full BP's best
    with a rising line, the seconds that line reaches it at."""
    from reports import equal_memory

    jobs = equal_memory.jobs(df, found)
    rows = []
    for _, j in jobs.iterrows():
        t = np.cumsum([e["seconds"] for e in j["epochs"]])
        acc = np.array([e["test_acc"] for e in j["epochs"]])
        loss = np.array([e["test_loss"] for e in j["epochs"]])
        late = t >= t[-1] / 2 if len(t) else t
        fit = len(t[late]) >= 2
        rows.append({"job": j, "best": float(acc.max()) if len(acc) else float("nan"),
                     "best_at": float(t[acc.argmax()]) if len(acc) else float("nan"),
                     "acc_slope": 100 * np.polyfit(t[late], acc[late], 1)[0] if fit else float("nan"),
                     "loss_slope": 100 * np.polyfit(t[late], loss[late], 1)[0] if fit else float("nan"),
                     "end": float(acc[-1]) if len(acc) else float("nan"), "end_s": float(t[-1]) if len(t) else 0.0})
    bp = [r["best"] for r in rows if r["job"]["method"] == "full-bp"]
    for r in rows:
        if r["job"]["method"] == "full-bp" or not bp:
            r["reach"] = "-"
        elif r["best"] >= bp[0]:
            r["reach"] = f"reached ({r['best']:.1f} % at {r['best_at']:.0f} s)"
        elif not r["acc_slope"] > 0:
            r["reach"] = "never: not rising"
        else:
            r["reach"] = f"{r['end_s'] + 100 * (bp[0] - r['end']) / r['acc_slope']:,.0f} s"
    return rows


def block(recs: list[dict]) -> str:
    """The doc's generated block: the runs, each model's pretraining, the study's table and trend."""
    return _block(recs, *frame(recs), majority(recs))


def _block(recs: list[dict], df, found, floor: tuple[str, float]) -> str:
    from reports import report as r

    topic, floor = floor
    pre = df[df["stage"] == "pretrain"]
    meta = found[next(iter(found))]
    cpu = sorted({x["cpu_model"] for x in recs if x["cpu_model"]})
    commits = sorted({(x["job"].get("harness_commit") or "?")[:7] for x in recs})
    lines = [f"Budget {meta['budget']}; commit {', '.join(commits)}; {', '.join(cpu) or 'cpu unknown'}:", ""]
    for run_id in found:
        mine = [x for x in recs if x["run_id"] == run_id]
        lines.append(f"- `{run_id}`: `zobench {' '.join(mine[0]['run'].get('argv', []))}`, {len(mine)} jobs, "
                     f"{sum(x['wall_seconds'] for x in mine) / 60:.0f} minutes of job time")
    lines += ["",
             "Pretraining, Full BP with Adam on the same fortunes sequences for every model (its test set: "
             "fortunes' test stream, next-token cross-entropy):", ""]
    lines += [r._markdown([("table", _pretraining(pre))]).strip(), "",
              "Fine-tuning on fortunes-topics, each job under the budget (peak RSS counts the shared "
              "libraries' pages too; load: the share of the CPU that other work took from the job's timed steps):",
              "", r._markdown([("table", _study_table(df, found))]).strip(), "",
              f"Saying `{topic}` for every test entry scores {floor:.1f} %: the floor a method must pass to have "
              "learnt anything (chance, 1/43, is not one: the topics are far from equal).", "",
              "The trend, a line through the second half of each curve (points of test accuracy and test loss "
              "per 100 training seconds), and where a ZO method is below Full BP's best and still rising, the "
              "training seconds that line reaches it at:", ""]
    lines += [r._markdown([("table", _trend_table(trend(df, found)))]).strip(), "",
              f"![Test loss and accuracy against training seconds](transformers/{CHART}.png)"]
    return "\n".join(lines) + "\n"


def _study_table(df, found):
    """The report's equal-memory table, each row with its run (a later run is a method again)."""
    from reports import equal_memory

    t = equal_memory.table(df, found)
    t.insert(0, "run", equal_memory.jobs(df, found)["run_id"].to_numpy())
    return t


def _pretraining(pre):
    import pandas as pd

    return pd.DataFrame([{"run": p["run_id"], "model": p["model"], "parameters": f"{p['network'].params_total / 1e6:.2f} M",
                          "sequences": int(p["steps"] * p["batch"]),
                          "steps": p["steps"], "training s": f"{p['train_s']:.0f}", "ms/step": f"{p['ms_step']:.1f}",
                          "LM test loss": f"{p['test_loss']:.3f}", "next-token test acc %": f"{p['test_acc']:.1f}"}
                         for _, p in pre.iterrows()])


def _trend_table(rows):
    import pandas as pd

    show = lambda v, fmt: "-" if not np.isfinite(v) else format(v, fmt)     # noqa: E731
    return pd.DataFrame([{"run": x["job"]["run_id"], "method": x["job"]["mlabel"], "model": x["job"]["model"],
                          "best test acc % (at s)": f"{show(x['best'], '.1f')} ({show(x['best_at'], '.0f')})",
                          "acc points / 100 s": show(x["acc_slope"], "+.2f"),
                          "test loss / 100 s": show(x["loss_slope"], "+.4f"),
                          "Full BP's best, on that line": x["reach"]} for x in rows])


def doc(recs: list[dict], framed=None, path: Path = DOC) -> None:
    """The doc's block between its markers, and the chart beside the doc; framed: frame(recs),
    where the caller has it already."""
    from reports import charts, equal_memory
    from reports import report as r

    text = path.read_text()
    if BEGIN not in text or END not in text:
        raise UserError(f"{path}: no block between {BEGIN!r} and {END!r} to write")
    df, found = framed or frame(recs)
    floor = majority(recs)
    head, _, rest = text.partition(BEGIN)
    path.write_text(head + BEGIN + "\n" + _block(recs, df, found, floor) + END + rest.partition(END)[2])
    df = df.copy()
    # one panel: a later run (a method again, for longer, or on another model) in a colour of its own
    first = next(iter(found))
    later = df["run_id"] != first
    df.loc[later, "mlabel"] = [f"{m} [{s:,.0f} s]" for m, s in zip(df.loc[later, "mlabel"], df.loc[later, "train_s"])]
    df["run_id"] = first
    with tempfile.TemporaryDirectory() as tmp:      # the PNG alone: the doc shows it
        charts.save(equal_memory.chart(df, {first: found[first]}, r._method_palette(df), floor=floor),
                    Path(tmp), CHART)
        (path.parent / "transformers" / f"{CHART}.png").write_bytes((Path(tmp) / f"{CHART}.png").read_bytes())


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(prog="katti_fig4.py", description=__doc__.split("\n\n")[0])
    ap.add_argument("command", choices=("records", "doc"))
    ap.add_argument("runs", nargs="*", help="records: the runs of the katti-fig4-cpu suite (the first the whole "
                                            "study; a later one a method again for longer)")
    ap.add_argument("--results", type=Path, default=REPO / "results", help="records: its results folder "
                                                                           "(default %(default)s)")

    def step() -> int:
        args = ap.parse_args(argv)
        if args.command == "records":
            if not args.runs:
                ap.error("records takes the runs' ids")
            recs = records.of_runs(Store(args.results), args.runs)
            framed = frame(recs)        # refused before anything is written: not a study
            records.write(RECORDS, recs)
            doc(recs, framed)
        elif args.runs:
            ap.error("doc takes no run: it reads the committed records")
        else:
            doc(records.read(RECORDS))
        return 0
    return guarded("katti_fig4.py", "", step)


if __name__ == "__main__":
    sys.exit(main())
