"""Charts, report.md and report.html for one or more runs.

Everything comes from one DataFrame with a row per result, so the tables and
the charts cannot disagree about what a number means. Only jobs that ended ok
are charted (a failed job has no phases or epochs to draw), but every job is in
the table, with its error, so a bar missing from a chart is always explained.
Likewise a job without a power meter is left out of the energy chart and table
with the reason its result gives.
"""
from __future__ import annotations

import base64
import html
import math
import multiprocessing
import os
import threading
from functools import partial
from pathlib import Path

import pandas as pd
import seaborn as sns
from matplotlib.backends.backend_agg import FigureCanvasAgg
from matplotlib.figure import Figure

from harness.stores.metrics import instructions_per_step
from harness.stores import convergence
from harness.search import memory_model
from harness.stores import machine_load, validity
from harness.stores.measurements import KEY_IGNORES, changed_hyper, shown_hyper
from harness.errors import UserError
from harness.stores.schema import joules_per_step, step_seconds
from workloads import methods
from workloads.datasets import data_name
from workloads.jsonfile import atomic
from workloads.spec import JobSpec
from workloads.vocab import METHODS, PAPER_CONFIGS, PRECISION_LABELS, TRAIN_PHASES, method_label, precision_label

from . import charts, equal_memory, finetune, paper, transformers, tune, zo_optimizers
from .history import chart as history_chart

MIB = 2 ** 20
# A job group: its repeats (and the same job in several runs) are averaged.
GROUP = ["method", "bp_layers", "runtime", "precision", "target", "workload", "stage", "setup", "hyper"]
# Named in a chart label only when the report holds more than one of them.
VARIANTS = ["runtime", "precision", "target", "workload", "stage", "setup", "hyper"]
# The paper's four configurations first, so each keeps its colour in every report.
KNOWN = [method_label(m, k) for m, k in PAPER_CONFIGS]
CHARTS = {"time_breakdown": "Training time per optimizer step, by phase, per runtime and target (Fig. 7 shape)",
          "cross_device": "Step time normalised per board to its Full ZO FP32, for comparing boards",
          "memory": "Analytic memory by method and part (Figs. 4-5 shape), with the measured training increment "
                    "(INT8: the binary keeps one int32 accumulator where Eqs. 13-15 count one per layer, docs/int8.md)",
          "peak_memory": "Measured peak memory: a CPU job's RSS (before training plus the training increment), a "
                         "cuda job's GPU memory (torch's peak allocation, and NVML's used memory as nvidia-smi shows it)",
          "energy": "Energy per optimizer step of the timed training loop, per method and precision "
                    "(jobs with a power meter)",
          "loss": "Train and test loss per epoch, per precision (Figs. 2-3 shape)",
          "int8_ratios": "INT8 vs FP32: speed-up and memory ratio, measured and analytic",
          "finetune": "Fine-tuning: test accuracy on the shifted data per epoch, from the pretrained weights (epoch 0)",
          "context": "Transformer memory against context length (Katti et al. Fig. 3 shape): the memory model's "
                     "predicted peak per method (lines) and parts' total (light), the jobs' measured training increment "
                     "(points), MeZO over BP (dashed, right axis)",
          "history": "History of the run's job keys in the shared store: per key and machine, step time, peak memory, "
                     "energy and final accuracy against commits, with the changes detected (docs/store.md)",
          "zo_optimizers": "ZO optimizers (ZO-Bench): test accuracy at equal steps against measured memory (the "
                           "C++ binary's buffers, a GPU's peak allocation, else the peak RSS), each optimizer a point",
          "equal_memory": "Equal memory (Katti et al. Fig. 4 shape): test loss and accuracy against training seconds, "
                          "each method on the largest model within one budget",
          "tune": "zobench tune: each trial's last validation accuracy against the value searched (o whole, x pruned, "
                  "best in red, diverged or unstable in orange), its validation accuracy and its train loss per epoch"}
CSS = """body{font-family:system-ui,sans-serif;max-width:1100px;margin:2em auto;padding:0 1em;color:#222}
table{border-collapse:collapse;margin:1em 0;font-size:.9em}th,td{border:1px solid #ccc;padding:.3em .6em}
th{background:#f0f0f0}td{text-align:right}img{max-width:100%}figcaption{color:#555;font-size:.9em}"""


def build(store, run_ids: list[str], out: Path | None = None, targets=(), methods=(),
          accuracy: float | None = None, history: list | None = None) -> Path:
    """The report of the runs' results, of only the given targets and methods when named
    (a method as full-zo, elastic-zo or elastic-zo:K); `accuracy` (%) is the test accuracy the
    energy-to-accuracy table counts up to (default: per workload, what every charted job reaches);
    `history`: the shared store's series of the runs' keys (harness/analysis/history.py), charted."""
    plans = [store.run_plan(r) for r in run_ids]    # first: an unknown run makes no folder
    df = _load(store, run_ids, plans)
    if targets:
        df = df[df["target"].isin(targets)]
    if methods:
        keys = df["method"] + ":" + df["bp_layers"].astype(str)
        df = df[df["method"].isin(methods) | keys.isin(methods)]
    if not len(df):
        raise UserError(f"report: no result of {', '.join(run_ids)} matches --target/--method")
    out = Path(out) if out is not None else store.runs / run_ids[-1] / "report"
    out.mkdir(parents=True, exist_ok=True)
    ok = _chart_groups(df)
    palette = _method_palette(df)
    ratios = _int8_ratios(ok)
    models = _models(df)
    studies = equal_memory.studies(run_ids, plans)
    searches = tune.studies(run_ids, plans)
    compared = zo_optimizers.groups(ok)
    draw = {"time_breakdown": lambda: charts.time_breakdown(ok, palette),
            "cross_device": lambda: charts.cross_device(ok, palette),
            "memory": lambda: charts.memory(ok, palette, models),
            "peak_memory": lambda: charts.peak_memory(ok, palette),
            "energy": lambda: charts.energy(ok[ok["j_step"].notna()], palette),
            "loss": lambda: charts.loss_curves(ok, palette),
            "int8_ratios": lambda: charts.int8_ratios(ratios, palette),
            "finetune": lambda: finetune.curves(ok, palette),
            "context": lambda: transformers.context_chart(df, palette),
            "equal_memory": lambda: equal_memory.chart(df, studies, palette),
            "history": lambda: history_chart(history),
            "tune": lambda: tune.chart(searches),
            "zo_optimizers": lambda: zo_optimizers.chart(compared, palette)}
    if not len(compared):
        del draw["zo_optimizers"]
    if not ok["j_step"].notna().any():      # the report says why in a line instead of an empty chart
        del draw["energy"]
    if not len(finetune.tuned(ok)):
        del draw["finetune"]
    if not models:
        del draw["memory"]
    if not len(transformers.trained(df)):
        del draw["context"]
    if not len(equal_memory.jobs(df, studies)):
        del draw["equal_memory"]
    if not history:
        del draw["history"]
    if not searches:
        del draw["tune"]
    _draw(draw if len(ok) else {name: _nothing_to_chart for name in draw}, out)
    blocks = _blocks(run_ids, plans, df, ok, ratios, accuracy) + [("img", name) for name in draw]
    for name, text in (("report.md", _markdown(blocks)),
                       ("report.html", _html(blocks, out, f"zobench report: {', '.join(run_ids)}"))):
        with atomic(out / name) as tmp:
            Path(tmp).write_text(text)
    return out / "report.html"


# a version's name where its key alone misleads: the C++ binary's "threads" is its thread pool's version
# ("zobench team 1"), not a count beside the job's threads
VERSION_NAMES = {"threads": "thread pool"}
_CHARTS: dict = {}      # the charts a forked drawer draws: what it inherits, closures and all


def _draw(draw: dict, out: Path) -> None:
    """Each chart drawn and saved (PNG and SVG), two at a time where there are cores to spare: laying
    out and rendering is most of a report's seconds (about 5 of `make run`'s 7). The drawers are
    forked, so they inherit the charts' data as it is; a process that runs other threads (which a
    fork would leave holding their locks) draws them one after another itself."""
    _CHARTS.clear()
    _CHARTS.update(draw)
    names = list(draw)
    if len(names) > 1 and (os.cpu_count() or 1) > 1 and threading.active_count() == 1:
        with multiprocessing.get_context("fork").Pool(2) as pool:
            pool.map(partial(_draw_one, out=out), names, chunksize=1)
    else:
        for name in names:
            _draw_one(name, out)
    _CHARTS.clear()


def _draw_one(name: str, out: Path) -> None:
    with sns.axes_style("whitegrid"), sns.plotting_context("notebook", font_scale=0.85):
        charts.save(_CHARTS[name](), out, name)


def _models(df: pd.DataFrame) -> dict:
    """Per layer model its description, most common batch and FP32 optimizer (adam adds Eq. 5's
    moments): the memory chart, the ElasticZO paper's Figs. 4-6, draws a row for each. A
    transformer's memory has other parts (docs/transformers.md) and no INT8 side."""
    fp32 = df[df["precision"] == "fp32"]
    return {name: (g["network"].iloc[0], int(g["batch"].mode()[0]),
                   fp32.loc[fp32["model"] == name, "optimizer"].mode().get(0, "sgd"))
            for name, g in df.groupby("model", sort=False) if g["network"].iloc[0].kind == "layers"}


def _method_palette(df: pd.DataFrame) -> dict:
    """One colour per method label, shared by every chart of the report."""
    colors = sns.color_palette("colorblind", 10)
    others = [m for m in df["mlabel"].unique() if m not in KNOWN]
    return {m: colors[i % len(colors)] for i, m in enumerate(KNOWN + others)}


def _nan(value) -> float:
    """A number of a result as pandas holds a missing one: the store writes a loss that was not
    finite as null (naming it under "nonfinite"), which is NaN here, a gap in a chart."""
    return math.nan if value is None else value


def _load(store, run_ids: list[str], plans: list[dict]) -> pd.DataFrame:
    """One row per result, in the order methods are introduced in the paper."""
    rows = []
    for run_id, plan in zip(run_ids, plans):
        for r in store.results(run_id, plan):
            job, steps, mem, phases, energy = r["job"], r["steps"], r["memory"], r["phases"], r["energy"]
            last = (r["epochs"] or [{}])[-1]
            w = job["workload"]
            data = data_name(w["dataset"], w["rotate"], w["validation"], w["subset"])
            spec = JobSpec.from_dict(job)
            network = spec.model()
            context, checkpointing = transformers.shape(spec.hyper, network)
            zo_parts = spec.hyper.zo_parts(job["method"])
            rows.append({
                "run_id": run_id, "job_id": job["job_id"], "repeat": job["repeat"], "seed": job["seed"],
                **{k: job[k] for k in ("method", "bp_layers", "runtime", "target")},
                "precision": precision_label(job["precision"], job["zo_loss"], job["method"]),
                "data_set": data, "workload": f"{job['workload']['model']}/{data}",
                # lineage: the job a fine-tuning job started from, and the hashes of what it started and ended with
                "pretrained_from": job["pretrained_from"],
                "init_sha256": (r["model"] or {}).get("init_sha256"),
                "weights_sha256": (r["model"] or {}).get("weights_sha256"),
                "start_acc": 100 * _nan((r["start_eval"] or {}).get("test_accuracy")),
                "start_loss": _nan((r["start_eval"] or {}).get("test_loss")),
                "study": bool(plan.get("equal_memory")),    # an equal-memory study's job (reports/equal_memory.py)
                "mlabel": method_label(job["method"], job["bp_layers"]),
                "batch": spec.hyper.batch_size, "model": spec.workload.model, "optimizer": spec.hyper.optimizer,
                "network": network, "context": context, "checkpointing": checkpointing,
                "loss_chunk": spec.hyper.loss_chunk,
                # a transformer's context and checkpointing change its memory: jobs differing in them are not averaged
                # and the optimizer of a BP part: Adam's moments and update are other work than SGD's; and
                # the ZO part's estimator, queries and update rule where they are not MeZO's: another optimizer
                "setup": " ".join(filter(None, [f"T={context}" + (" +ckpt" if checkpointing else "") if context else "",
                                                "adam" if spec.hyper.optimizer == "adam" and job["method"] != "full-zo"
                                                else "",
                                                zo_parts])),
                # the ZO optimizer as its parts ("" = MeZO's step), its forwards a step, and the memory
                # model's prediction for the job (reports/zo_optimizers.py)
                "zo_parts": zo_parts,
                "forwards": methods.forwards_per_step(job["method"], spec.hyper),
                "predicted_mib": _predicted_bytes(spec, network) / MIB,
                "status": r["status"], "error": r["error"] or "", "steps": steps,
                "train_s": r["train_seconds"] or math.nan,
                # A runner that never trained reports 0 s and 0 bytes: unknown, not free.
                "ms_step": 1000 * step if (step := step_seconds(r)) else math.nan,
                # the share of the CPU it wanted that other work took while its steps ran (machine_load.flag)
                "load": _nan(machine_load.lost_share(r)),
                "peak_mib": (mem.get("peak_rss_bytes") or math.nan) / MIB,
                "baseline_mib": (mem.get("baseline_rss_bytes") or math.nan) / MIB,
                "loaded_mib": (mem.get("loaded_rss_bytes") or math.nan) / MIB,
                "buffers_mib": (mem.get("buffers_bytes") or math.nan) / MIB,
                # a cuda job's GPU memory: torch's peak allocation, and NVML's used (nvidia-smi's figure)
                "device_peak_mib": _nan(mem.get("device_peak_bytes")) / MIB,
                "device_used_mib": _nan(mem.get("device_used_bytes")) / MIB,
                "j_step": _nan(joules_per_step(r)), "energy_source": energy["source"],
                # instructions per step where they were counted (harness/execution/instructions.py), and their phases' shares
                "minstr_step": _nan(instructions_per_step(r)) / 1e6,
                "instr_phases": instruction_shares(r.get("instructions")),
                "no_energy": energy["unavailable"] or "",
                "steps_per_epoch": steps / len(r["epochs"]) if r["epochs"] else math.nan,
                **{p: 1000 * phases[p]["seconds"] / steps if steps and p in phases else math.nan
                   for p in TRAIN_PHASES},
                "train_loss": _nan(last.get("train_loss")), "test_loss": _nan(last.get("test_loss")),
                "test_acc": 100 * _nan(last.get("test_accuracy")),
                # a run whose loss exploded: its final accuracy is not the method's (harness/stores/convergence.py)
                "flag": convergence.flag(r) or "",
                # a repeat the board throttled: its time is the board's (harness/stores/validity.py)
                "validity": ", ".join(f"{validity.shown([f])} in r{job['repeat']}" for f in validity.flags_of(r)),
                "best_acc": 100 * _nan((r["convergence"] or {}).get("best_test_accuracy")),
                "epochs": [{**e, **{k: _nan(e.get(k)) for k in ("train_loss", "test_loss", "joules")},
                            "test_acc": 100 * _nan(e.get("test_accuracy"))} for e in r["epochs"]],
                "env": r["env"],
                # a pool's job: the member that ran it, and the attempts its members lost before (harness/execution/pool.py)
                "member": (r.get("pool") or {}).get("member") or "",
                "lost_attempts": len((r.get("pool") or {}).get("attempts") or []),
                "hyperparameters": shown_hyper(changed_hyper(job.get("hyper") or {}, job.get("device", "cpu"))),
                "hyper_values": job.get("hyper") or {},
            })
    if not rows:
        raise UserError(f"report: {', '.join(run_ids)} has no result yet "
                        "(`zobench run --resume RUN_ID` runs the jobs that have none)")
    df = pd.DataFrame(rows)
    sources = set(df["pretrained_from"])
    df["stage"] = ["pretrain" if j in sources else "fine-tune" if p else "" for j, p in zip(df.job_id, df.pretrained_from)]
    df["hyper"] = _differing(df)
    df["order"] = [(METHODS.index(m) if m in METHODS else len(METHODS), k) for m, k in zip(df.method, df.bp_layers)]
    df = df.sort_values(["order", *VARIANTS, "run_id", "repeat"], kind="stable").drop(columns="order")
    varying = [v for v in VARIANTS if df[v].nunique() > 1]
    df["setting"] = df[varying].astype(str).agg(" ".join, axis=1) if varying else ""
    df["label"] = df["mlabel"] + df["setting"].map(lambda v: f" · {v}" if v else "")
    where = ["runtime", "target"] + (["workload"] if df["workload"].nunique() > 1 else [])
    df["panel"] = df[where].astype(str).agg(" · ".join, axis=1)
    return df.reset_index(drop=True)


def _predicted_bytes(spec: JobSpec, network) -> float:
    """The memory model's prediction for a job: a transformer's peak, a layer model's parts' total
    (the paper's), with the job's ZO parts; nan where the model has no answer."""
    h = spec.hyper
    try:
        b = memory_model.breakdown(network, spec.method, h.batch_size, spec.precision, spec.bp_layers, h.optimizer,
                                   h.context, h.checkpointing, h, h.loss_chunk)
    except ValueError:
        return math.nan
    return b.peak_bytes if b.peak_bytes is not None else b.total_bytes


def _differing(df: pd.DataFrame) -> list[str]:
    """Per job, the hyperparameters that differ between jobs of its method, precision and stage
    (a tuning run's trials): jobs that trained with other values are other groups, never
    averaged. What a method trains with throughout is the Hyperparameters table's."""
    same = df.groupby(["method", "bp_layers", "precision", "stage"], sort=False)["hyper_values"]
    varying = {name: sorted(k for k in set().union(*map(set, hypers)) if k not in KEY_IGNORES
                            and len({repr(h.get(k)) for h in hypers}) > 1) for name, hypers in same}
    return [shown_hyper((k, h.get(k)) for k in varying[key])
            for key, h in zip(zip(df.method, df.bp_layers, df.precision, df.stage), df.hyper_values)]


def _hyper_table(df: pd.DataFrame) -> pd.DataFrame:
    """What each method and precision trained with, where it differs from Hyper's defaults."""
    t = df[["mlabel", "precision", "stage", "hyperparameters"]].drop_duplicates()
    t = t.drop(columns=[] if t["stage"].astype(bool).any() else ["stage"])
    return t.rename(columns={"mlabel": "method", "hyperparameters": "hyperparameters (other than the defaults)"})


def _chart_groups(df: pd.DataFrame) -> pd.DataFrame:
    """The ok jobs, one row per group (the label names the group uniquely)."""
    ok = df[df["status"] == "ok"]
    means = ok.groupby("label", sort=False)[["ms_step", "peak_mib", "baseline_mib", "buffers_mib", "test_acc", "best_acc",
                                             "start_acc", "predicted_mib",
                                             "device_peak_mib", "device_used_mib", "j_step", "steps_per_epoch",
                                             *TRAIN_PHASES]].mean()
    firsts = ok.groupby("label", sort=False)[["mlabel", "method", "bp_layers", "precision", "runtime", "target",
                                              "workload", "panel", "setting", "batch", "model", "network", "optimizer",
                                              "data_set", "stage", "hyper", "pretrained_from", "study",
                                              "energy_source", "no_energy", "zo_parts", "forwards"]].first()
    curves = pd.Series({label: pd.DataFrame([e for es in s for e in es]).groupby("epoch")[
        ["train_loss", "test_loss", "test_acc", "joules", "seconds"]].mean()
        for label, s in ok.groupby("label", sort=False)["epochs"]}, name="curve", dtype=object)
    flags = ok.groupby("label", sort=False)["flag"].agg(worst_flag)
    # a group's accuracies over its seeds (each seed's repeats averaged first): how far one run
    # of the method can be from another; NaN for one seed
    per_seed = ok.groupby(["label", "seed"], sort=False)[["test_acc", "start_acc"]].mean().groupby("label", sort=False)
    seeds = pd.concat([per_seed["test_acc"].std().rename("test_acc_std"),
                       per_seed["start_acc"].std().rename("start_acc_std"),
                       per_seed["test_acc"].count().rename("seeds")], axis=1)
    return pd.concat([firsts, means, flags, seeds, curves], axis=1).rename_axis("label").reset_index()


def worst_flag(flags) -> str:
    """A group's convergence flag: its worst repeat's, "" when every one converged."""
    return convergence.worst(flags) or ""


def accuracy_cell(acc: float, flag: str, best: float) -> str:
    """A test accuracy (%) as the report's tables show it: with its flag and best epoch's beside it
    when the run diverged or was unstable."""
    pct = lambda v: "-" if pd.isna(v) else f"{v:.1f}"     # noqa: E731
    return convergence.annotate(pct(acc), flag, pct(best))


def _int8_ratios(ok: pd.DataFrame) -> pd.DataFrame:
    """Per (method, runtime, target): FP32 over INT8 step time, training memory increment, and
    the analytic memory ratio. INT8* (integer ZO loss) runs the same kernels, so INT8 stands for both."""
    rows = []
    for (label, panel), g in ok.groupby(["mlabel", "panel"], sort=False):
        f, i = g[g["precision"] == "fp32"], g[g["precision"] == "int8"]
        if not len(f) or not len(i):
            continue
        f, i = f.iloc[0], i.iloc[0]
        analytic = [memory_model.breakdown(f["network"], f["method"], int(f["batch"]), p, int(f["bp_layers"]),
                                           r["optimizer"]).total_bytes for p, r in (("fp32", f), ("int8", i))]
        # the binary reports its exact allocation, a cuda job its GPU's; a Python runtime on a CPU
        # only its whole process's peak RSS
        col = next((c for c in ("buffers_mib", "device_peak_mib") if pd.notna(f[c]) and pd.notna(i[c])), "peak_mib")
        name = label.split(" (")[0].replace("ElasticZO ", "ElasticZO\n")
        rows.append({"mlabel": label, "config": f"{name}\n{panel}", "panel": panel,
                     "fp32_ms": f["ms_step"], "int8_ms": i["ms_step"], "speedup": f["ms_step"] / i["ms_step"],
                     "memory": {"buffers_mib": "allocated buffers", "device_peak_mib": "GPU peak allocation",
                                "peak_mib": "peak RSS"}[col],
                     "fp32_mib": f[col], "int8_mib": i[col], "memory_ratio": f[col] / i[col],
                     "analytic_ratio": analytic[0] / analytic[1]})
    return pd.DataFrame(rows)


def _nothing_to_chart() -> Figure:
    fig = Figure(figsize=(6.5, 1.5))
    FigureCanvasAgg(fig)
    ax = fig.subplots()
    ax.text(0.5, 0.5, "no job ended ok: nothing to chart", ha="center", va="center")
    ax.set_axis_off()
    return fig


def _blocks(run_ids: list[str], plans: list[dict], df: pd.DataFrame, ok: pd.DataFrame,
            ratios: pd.DataFrame, accuracy: float | None) -> list[tuple[str, object]]:
    """The report up to its charts as a list of (kind, content), rendered once as Markdown and
    once as HTML."""
    runs = pd.DataFrame({"run": run_ids, "suite": [p.get("suite") for p in plans],
                         "created": [p.get("created_at") for p in plans],
                         "jobs": [len(p["jobs"]) for p in plans],
                         "ok": [int(((df.run_id == r) & (df.status == "ok")).sum()) for r in run_ids]})
    blocks = [("h1", f"zobench report: {', '.join(run_ids)}"), ("h2", "Runs"), ("table", runs),
              ("h2", "Machine"), _machine(df), ("h2", "Results"),
              ("p", "One row per job group (method, runtime, precision, target, workload; int8* is INT8 with the "
                    "integer-only ZO loss); repeats are averaged (n = how many). Jobs that did not end ok are listed "
                    "with their error and left out of the charts. A test accuracy marked diverged (the train loss "
                    "ended above its first epoch's, or was not finite) or unstable (it ended far above its lowest, or "
                    "the accuracy far below its best epoch's, in brackets) is not what the method reaches: that run "
                    "did not converge (docs/results.md, \"Convergence\")."),
              ("table", _results_table(df)), *_pool_blocks(df),
              ("h2", "Hyperparameters"),
              ("p", "The values each method trained with where they differ from zobench's defaults "
                    "(workloads/spec.py Hyper): a suite sets them per method and precision (its [hyper.METHOD.PRECISION] "
                    "tables, e.g. from zobench tune), --set over all; they are part of each job's key."),
              ("table", _hyper_table(df)), ("h2", "Where training time goes")]
    if len(ok):
        phases = ok.set_index("label")[list(TRAIN_PHASES)].fillna(0)
        share = phases.div(phases.sum(axis=1), axis=0).mul(100).map(lambda v: f"{v:.1f}" if v else "-")
        blocks += [("p", "Percentage of training time (eval excluded) spent in each phase."),
                   ("table", share.rename(columns=lambda p: f"{p} %").rename_axis("job group").reset_index())]
    else:
        blocks.append(("p", "No job ended ok, so there is no time to break down."))
    if len(ok):
        blocks += [("h2", "Accuracy"), ("p", "Final test accuracy (%) by method and precision, per runtime and target "
                                              "(the shape of the paper's Table 1)."), ("table", _accuracy_table(ok))]
    if len(ok) and paper.shown(plans):
        for name, t in (("Table 1", paper.table1(ok)), ("Table 2", paper.table2(ok))):
            if len(t):
                blocks += [("h2", f"Against the paper: {name}"),
                           ("p", f"Final test accuracy (%) of each job group beside the ElasticZO paper's {name} "
                                 "(INT8: the ZO gradient from the float loss, INT8*: from the integer loss), and the "
                                 "difference in points; the target is every cell within 2 (docs/reproduction.md)."),
                           ("table", t)]
    if len(ratios):
        t = ratios[["mlabel", "panel", "fp32_ms", "int8_ms", "speedup", "memory", "fp32_mib", "int8_mib",
                    "memory_ratio", "analytic_ratio"]].copy()
        for col in ("fp32_ms", "int8_ms", "speedup", "fp32_mib", "int8_mib", "memory_ratio", "analytic_ratio"):
            t[col] = t[col].map(lambda v: f"{v:.2f}")
        blocks += [("h2", "INT8 vs FP32"),
                   ("p", "Measured step time and memory: for the C++ binary its exact allocation "
                         "(memory.buffers_bytes), for a cuda job torch's peak allocation on the GPU "
                         "(memory.device_peak_bytes), for a Python runtime on a CPU its whole process's peak RSS, "
                         "most of which is the framework; and the analytic memory ratio of Eqs. 2-4 over 13-15. "
                         "Eqs. 13-15 count an int32 accumulator for every layer's output and every output kept; "
                         "the C++ binary computes each layer into one accumulator, the largest layer's, and keeps "
                         "only what a later layer or the BP part reads (docs/int8.md, \"Memory\"), so its INT8 "
                         "allocation is below the analytic one, and its memory ratio above the analytic ratio."),
                   ("table", t.rename(columns={"mlabel": "method", "panel": "runtime · target", "fp32_ms": "FP32 ms/step",
                                               "int8_ms": "INT8 ms/step", "speedup": "speed-up x",
                                               "fp32_mib": "FP32 MiB", "int8_mib": "INT8 MiB",
                                               "memory_ratio": "memory x", "analytic_ratio": "analytic memory x"}))]
    if len(finetune.tuned(df)):
        blocks += [("h2", "Fine-tuning"), *(("p", line) for line in finetune.lineage(df, finetune.tuned(df)))]
        if len(finetune.tuned(ok)):
            blocks += [("p", "Final test accuracy (%) on the shifted test set, and in brackets the gain in points "
                             f"over {finetune.BEFORE} (the pretrained weights on the same test set; the paper's "
                             "Table 2)."), ("table", finetune.table(ok))]
    found = equal_memory.studies(run_ids, plans)
    if found:
        blocks += [("h2", "Equal memory (Katti et al. Fig. 4)"),
                   ("p", "Under one memory budget each method trained the largest model that fits it (the suite's "
                         "choice, or zobench fit's on the target), every job under that budget, for the same "
                         "training seconds (hyper.max_train_seconds); start: the pretrained weights before the "
                         "first step (docs/transformers.md)."),
                   ("table", equal_memory.table(df, found)),
                   *(("p", line) for line in finetune.lineage(df, equal_memory.jobs(df, found)))]
    searches = tune.studies(run_ids, plans)
    if searches:
        blocks += [("h2", "Tuning"),
                   ("p", "Per zobench tune run: the hyperparameters searched, on the validation split (training samples "
                         "held out, never the test set), the trials (pruned: stopped when they fell behind the others), "
                         "and the values chosen, scored by the last epoch's validation accuracy (docs/reproduction.md)."),
                   ("table", tune.table(searches))]
        for run_id, study in searches.items():
            blocks += [("p", f"Trials of {tune.title(study)} (run {run_id}):"), ("table", tune.trials(study))]
    fits = transformers.fit_table(df, transformers.fit_runs(run_ids, plans))
    if len(fits):
        blocks += [("h2", "Largest trainable model (zobench fit)"),
                   ("p", "Per fit run: the largest configuration whose probe ended ok under the budget, the next "
                         "larger one probed and how it ended, and its parameters over those of Full BP's (SGD) largest "
                         "under the same budget, target, runtime, batch and context, where the report holds that run "
                         "(Katti et al.'s question; docs/transformers.md)."), ("table", fits)]
    compared = zo_optimizers.groups(ok)
    if len(compared):
        blocks += [("h2", "ZO optimizers (ZO-Bench's table)"),
                   ("p", "Per workload and runtime · target, each ZO optimizer (its estimator, queries, update rule "
                         "and sparsity; MeZO's step unless named, docs/zo-optimizers.md) beside BP: forward passes a "
                         "step (a Jacobian-vector product counted as one), the memory model's prediction for the job "
                         "(harness/search/memory_model.py, with the optimizer's state and buffers) and the measured "
                         "memory (the C++ binary's exact allocation, a cuda job's peak GPU allocation, else the "
                         "process's peak RSS, most of which is the framework), ms/step, J/step where a meter measured it, and the "
                         "final test accuracy (and loss) at equal steps and the accuracy at equal seconds: the last epoch "
                         "that ended within "
                         "the least training time of the rows compared (- where none did)."),
                   ("table", zo_optimizers.table(compared))]
    return blocks + (_energy_blocks(ok, accuracy) if len(ok) else []) + [("h2", "Charts")]


def _energy_blocks(ok: pd.DataFrame, accuracy: float | None) -> list[tuple[str, object]]:
    """The energy section: the energy-to-accuracy table of the jobs a power meter measured, and
    in one line the jobs it leaves out, each with its result's reason."""
    unmetered = ok[ok["j_step"].isna()]
    why = "; ".join(f"on {target} ({', '.join(dict.fromkeys(g['runtime']))}), {reason}"
                    for (target, reason), g in unmetered.groupby(["target", "no_energy"], sort=False))
    if len(unmetered) == len(ok):
        return [("h2", "Energy"), ("p", f"No job measured its energy, so there is no energy chart: {why}.")]
    goals = _accuracy_goals(ok, accuracy)
    how = ("--energy-accuracy" if accuracy is not None else
           "the lowest final test accuracy among its charted jobs, which every one of them reaches")
    caption = ("Energy of the timed training loop (eval excluded) until the first epoch whose test accuracy "
               "reached X: the sum of the epochs' measured joules, or J/step x steps per epoch x epochs where "
               "a job measured none per epoch; - where it never did. X = "
               + ", ".join(f"{x:.1f}% for {w}" for w, x in goals.items()) + f" ({how}).")
    left_out = [("p", f"Left out of the energy chart and table: {why}.")] if why else []
    return [("h2", "Energy"), ("p", caption), ("table", _energy_to_accuracy(ok, goals)), *left_out]


def _accuracy_goals(ok: pd.DataFrame, accuracy: float | None) -> dict:
    """Per workload with a metered job, the test accuracy (%) its energy is counted up to:
    `accuracy`, or the lowest final test accuracy among the workload's charted groups, which
    every method reaches, so that the table compares what each spent to get equally far."""
    goals = {}
    for workload, g in ok.groupby("workload", sort=False):
        if g["j_step"].notna().any():
            finals = [c["test_acc"].dropna().iloc[-1] for c in g["curve"] if c["test_acc"].notna().any()]
            goals[workload] = accuracy if accuracy is not None else min(finals, default=math.nan)
    return goals


def _energy_to_accuracy(ok: pd.DataFrame, goals: dict) -> pd.DataFrame:
    """Per metered job group: the energy its timed training spent up to its first epoch whose
    test accuracy reached its workload's goal."""
    rows = []
    for _, g in ok[ok["j_step"].notna()].iterrows():
        c = g["curve"]
        # the epochs' own measurements where the runner took them, else the loop's mean per step
        spent = (c["joules"].cumsum() if c["joules"].notna().all()
                 else g["j_step"] * g["steps_per_epoch"] * pd.Series(range(1, len(c) + 1), index=c.index))
        reached = c.index[c["test_acc"] >= goals[g["workload"]]]
        rows.append({"method": g["mlabel"], "runtime · target": g["panel"], "precision": g["precision"],
                     "epoch reached": str(reached[0]) if len(reached) else "-",
                     "energy to reach J": f"{spent[reached[0]]:.2f}" if len(reached) else "-",
                     "J/step": f"{g['j_step']:.4g}", "meter": g["energy_source"]})
    return pd.DataFrame(rows)


def _accuracy_table(ok: pd.DataFrame) -> pd.DataFrame:
    rows = ["mlabel", "panel", *(["hyper"] if ok["hyper"].astype(bool).any() else [])]   # a tuning run's trials apart
    t = ok.pivot_table(index=rows, columns="precision", values="test_acc", sort=False)
    t = t[[p for p in PRECISION_LABELS if p in t.columns]]
    # beside each cell its flag and best epoch's accuracy (a group's worst repeat's flag)
    best, flags = (ok.pivot_table(index=rows, columns="precision", values=v, aggfunc=f, sort=False)
                   .reindex(index=t.index, columns=t.columns) for v, f in (("best_acc", "mean"), ("flag", worst_flag)))
    t = t.apply(lambda col: pd.Series([accuracy_cell(a, f, b) for a, f, b in zip(col, flags[col.name], best[col.name])],
                                      index=col.index, dtype=object))
    return t.rename(columns=str.upper).reset_index().rename(columns={"mlabel": "method", "panel": "runtime · target"})


def _machine(df: pd.DataFrame) -> tuple[str, object]:
    flags = df["validity"] if "validity" in df else [""] * len(df)
    envs = [{"target": t, **env, "throttling": v} for t, env, v in zip(df["target"], df["env"], flags)
            if env.get("cpu_model")]
    if not envs:
        return ("p", "No job reported its machine.")
    m = pd.DataFrame(envs)
    # what the board did during the run's jobs, once per target: the flags, else "none seen"
    seen = m.groupby("target")["throttling"].agg(lambda v: "; ".join(dict.fromkeys(x for x in v if x)) or "none seen")
    m["throttling"] = m["target"].map(seen)
    m["versions"] = m["versions"].map(lambda v: "; ".join(f"{VERSION_NAMES.get(k, k)}: {x}" for k, x in (v or {}).items()))
    cols = ["target", "hostname", "arch", "cpu_model", "cores", "governor", "kernel", "versions", "throttling"]
    # the C++ binary's build CPU and kernel paths, where some job recorded them (a run without
    # one keeps the table's shape)
    if "build_cpu" in m and m["build_cpu"].notna().any():
        m["build_cpu"] = m["build_cpu"].fillna("-")
        cols.append("build_cpu")
    if "kernels" in m and m["kernels"].map(lambda k: isinstance(k, dict)).any():
        m["kernels"] = m["kernels"].map(lambda k: ", ".join(f"{kind} {path}" for kind, path in k.items())
                                        if isinstance(k, dict) else "-")
        cols.append("kernels")
    return ("table", m[cols].astype(str).drop_duplicates().rename(columns={"cpu_model": "cpu",
                                                                            "build_cpu": "built for"}))


# a member this much slower than its siblings on the same job groups is named so
SLOWER_MEMBER = 1.10


def _pool_blocks(df: pd.DataFrame) -> list[tuple[str, object]]:
    """Per pool, its members: the jobs each ran, the attempts each lost, and its speed against its
    siblings on the job groups that ran on more than one member (a board slower than its
    siblings is what a lab wants to see); nothing for a run without pools."""
    pooled = df[df["member"] != ""]
    if not len(pooled):
        return []
    ok = pooled[pooled.status == "ok"].copy()
    group = ok.groupby(["target", "label", "panel"])
    ok["spread"] = ok["ms_step"] / group["ms_step"].transform("median")
    ok["members_in_group"] = group["member"].transform("nunique")
    rows = []
    for (target, member), jobs in pooled.groupby(["target", "member"], sort=True):
        mine = ok[(ok.target == target) & (ok.member == member) & (ok.members_in_group > 1)]
        ratio = mine["spread"].median() if len(mine) else math.nan
        rows.append({"pool": target, "member": member, "jobs": len(jobs), "ok": int((jobs.status == "ok").sum()),
                     "ms/step against its siblings": "-" if math.isnan(ratio) else
                     f"{ratio:.2f}x over {len(mine)} jobs" + (" (slower)" if ratio > SLOWER_MEMBER else "")})
    lost = pooled.groupby("target")["lost_attempts"].sum()
    return [("h2", "Pool members"),
            ("p", "Each pool's jobs by the member that ran them, and each member's step time over the median of the "
                  "same job group's on every member (- where no group of its jobs ran on a sibling too: repeats, or "
                  f"another run, show it). Attempts lost to a member and run again elsewhere: "
                  + ", ".join(f"{t} {n}" for t, n in lost.items()) + "."),
            ("table", pd.DataFrame(rows))]


def instruction_shares(rec) -> str:
    """A count's phases as shares of its step, largest first ("forward 92%, zo_perturb 4%"); why
    not, where it was asked for and not counted; "" where it was not asked for."""
    if not isinstance(rec, dict):
        return ""
    if not rec.get("per_step"):
        return f"not counted: {rec.get('why')}"
    shares = sorted(((n / rec["per_step"], p) for p, n in (rec.get("phases") or {}).items()), reverse=True)
    return ", ".join(f"{p} {100 * s:.0f}%" for s, p in shares if s >= 0.005) + f" ({rec.get('build')})"


def _results_table(df: pd.DataFrame) -> pd.DataFrame:
    t = (df.groupby(["mlabel", *GROUP[2:], "status", "error"], sort=False)
         .agg(n=("job_id", "size"), steps=("steps", "mean"), ms_step=("ms_step", "mean"), train_s=("train_s", "mean"),
              peak_mib=("peak_mib", "mean"), device_peak_mib=("device_peak_mib", "mean"), j_step=("j_step", "mean"),
              train_loss=("train_loss", "mean"), test_loss=("test_loss", "mean"), test_acc=("test_acc", "mean"),
              best_acc=("best_acc", "mean"), flag=("flag", worst_flag), load=("load", "max"),
              minstr_step=("minstr_step", "median"), instr_phases=("instr_phases", "first"),
              validity=("validity", lambda v: "; ".join(x for x in v if x)))
         .reset_index())
    t["test_acc"] = [accuracy_cell(a, f, b) for a, f, b in zip(t.pop("test_acc"), t.pop("flag"), t.pop("best_acc"))]
    # the time of a group one of whose repeats ran throttled is not the code's alone: said beside it
    # and so is one whose repeats ran beside other work: the busiest repeat's load flag beside it
    t["ms_step"] = [v if pd.isna(v) or not (said := "; ".join(filter(None, [
                        "" if pd.isna(load) else machine_load.flag(load), flags]))) else f"{v:.2f} ({said})"
                    for v, load, flags in zip(t["ms_step"], t.pop("load"), t.pop("validity"))]
    # a GPU's memory and the energy only where some job measured them, a stage or a transformer's
    # setup only where some job has one: a CPU-only report of layer models keeps its shape
    t = t.drop(columns=[c for c in ("device_peak_mib", "j_step", "minstr_step") if t[c].isna().all()]
               + [c for c in ("instr_phases",) if not t[c].astype(bool).any()]
               + [c for c in ("stage", "setup", "hyper") if not t[c].astype(bool).any()])
    formats = {"steps": ".0f", "ms_step": ".2f", "train_s": ".2f", "peak_mib": ".1f", "device_peak_mib": ".1f",
               "j_step": ".4g", "train_loss": ".3f", "test_loss": ".3f", "minstr_step": ".3f"}
    for col, f in formats.items():
        if col in t:
            t[col] = t[col].map(lambda v: v if isinstance(v, str) else "-" if pd.isna(v) else format(v, f))
    return t.rename(columns={"mlabel": "method", "ms_step": "ms/step", "train_s": "train s",
                             "peak_mib": "peak RSS MiB", "device_peak_mib": "GPU peak MiB", "j_step": "J/step",
                             "minstr_step": "M instr/step", "instr_phases": "instructions by phase",
                             "train_loss": "final train loss",
                             "test_loss": "final test loss", "test_acc": "test accuracy %"})


def _markdown(blocks) -> str:
    def table(t: pd.DataFrame) -> str:
        cell = lambda v: str(v).replace("|", "\\|").replace("\n", " ")
        lines = [list(t.columns), ["---"] * len(t.columns), *t.astype(str).values.tolist()]
        return "\n".join("| " + " | ".join(map(cell, line)) + " |" for line in lines)

    render = {"h1": lambda x: f"# {x}", "h2": lambda x: f"## {x}", "p": str, "table": table,
              "img": lambda name: f"![{CHARTS[name]}]({name}.png)\n\n*{CHARTS[name]}* ([SVG]({name}.svg))"}
    return "\n\n".join(render[kind](x) for kind, x in blocks) + "\n"


def _html(blocks, out: Path, title: str) -> str:
    def img(name: str) -> str:
        data = base64.b64encode((out / f"{name}.png").read_bytes()).decode("ascii")
        return (f'<figure><img src="data:image/png;base64,{data}" alt="{html.escape(CHARTS[name])}">'
                f"<figcaption>{html.escape(CHARTS[name])}</figcaption></figure>")

    render = {"h1": lambda x: f"<h1>{html.escape(x)}</h1>", "h2": lambda x: f"<h2>{html.escape(x)}</h2>",
              "p": lambda x: f"<p>{html.escape(x)}</p>", "img": img,
              "table": lambda t: t.to_html(index=False, border=0, na_rep="-")}
    body = "\n".join(render[kind](x) for kind, x in blocks)
    return (f'<!DOCTYPE html>\n<html lang="en"><head><meta charset="utf-8"><title>{html.escape(title)}</title>'
            f"<style>{CSS}</style></head>\n<body>\n{body}\n</body></html>\n")
