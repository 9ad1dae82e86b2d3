"""Charts, report.md and report.html for one or more runs.

Everything comes from one DataFrame with a row per result, so the tables and
the charts cannot disagree about what a number means. Only jobs that ended ok
are charted (a failed job has no phases or epochs to draw), but every job is in
the table, with its error, so a bar missing from a chart is always explained.
"""
from __future__ import annotations

import base64
import html
import math
import textwrap
from pathlib import Path

import pandas as pd
import seaborn as sns
from matplotlib.backends.backend_agg import FigureCanvasAgg
from matplotlib.figure import Figure
from matplotlib.patches import Patch
from matplotlib.ticker import MaxNLocator

from workloads.vocab import METHODS, TRAIN_PHASES, method_label

MIB = 2 ** 20
# A job group: its repeats (and the same job in several runs) are averaged.
GROUP = ["method", "bp_layers", "runtime", "precision", "target", "workload"]
# Named in a chart label only when the report holds more than one of them.
VARIANTS = ["runtime", "precision", "target", "workload"]
# Fixed for every report, so a phase has the same colour in all of them.
PHASE_COLORS = dict(zip(TRAIN_PHASES, sns.color_palette("Set2", len(TRAIN_PHASES))))
# The paper's four configurations first, so each keeps its colour in every report.
KNOWN = [method_label(m, k) for m, k in (("full-bp", 0), ("full-zo", 0), ("elastic-zo", 1), ("elastic-zo", 2))]
CHARTS = {"time_breakdown.png": "Training time per optimizer step, by phase",
          "memory.png": "Peak resident memory: baseline before training plus the training increment",
          "loss.png": "Train and test loss per epoch"}
CSS = """body{font-family:system-ui,sans-serif;max-width:1100px;margin:2em auto;padding:0 1em;color:#222}
table{border-collapse:collapse;margin:1em 0;font-size:.9em}th,td{border:1px solid #ccc;padding:.3em .6em}
th{background:#f0f0f0}td{text-align:right}img{max-width:100%}figcaption{color:#555;font-size:.9em}"""


def build(store, run_ids: list[str], out: Path | None = None) -> Path:
    out = Path(out) if out is not None else store.runs / run_ids[-1] / "report"
    out.mkdir(parents=True, exist_ok=True)
    df = _load(store, run_ids)
    ok = _chart_groups(df)
    palette = _method_palette(df)
    with sns.axes_style("whitegrid"), sns.plotting_context("notebook", font_scale=0.85):
        for name, draw in (("time_breakdown.png", _time_chart), ("memory.png", _memory_chart),
                           ("loss.png", _loss_chart)):
            fig = draw(ok, palette) if len(ok) else _nothing_to_chart()
            fig.tight_layout()
            fig.savefig(out / name, dpi=120, bbox_inches="tight")
    blocks = _blocks(store, run_ids, df, ok)
    (out / "report.md").write_text(_markdown(blocks))
    (out / "report.html").write_text(_html(blocks, out, f"zobench report: {', '.join(run_ids)}"))
    return out / "report.html"


def _method_palette(df: pd.DataFrame) -> dict:
    """One colour per method label, shared by every chart of the report."""
    colors = sns.color_palette("colorblind", 10)
    others = [m for m in df["mlabel"].unique() if m not in KNOWN]
    return {m: colors[i % len(colors)] for i, m in enumerate(KNOWN + others)}


def precision_label(job: dict) -> str:
    """The paper's names: INT8 with the integer-only ZO loss is INT8*."""
    p = job.get("precision", "fp32")
    return f"{p}*" if p == "int8" and job.get("zo_loss") == "integer" and job["method"] != "full-bp" else p


def _load(store, run_ids: list[str]) -> pd.DataFrame:
    """One row per result, in the order methods are introduced in the paper."""
    rows = []
    for run_id in run_ids:
        for r in store.results(run_id):
            job, steps, mem = r["job"], r.get("steps") or 0, r.get("memory") or {}
            phases, last = r.get("phases") or {}, (r.get("epochs") or [{}])[-1]
            rows.append({
                "run_id": run_id, "job_id": job["job_id"], "repeat": job.get("repeat", 0),
                **{k: job[k] for k in ("method", "bp_layers", "runtime", "target")},
                "precision": precision_label(job),
                "workload": "{model}/{dataset}".format(**job["workload"]),
                "mlabel": method_label(job["method"], job["bp_layers"]),
                "status": r["status"], "error": r.get("error") or "", "steps": steps,
                "train_s": r.get("train_seconds") or math.nan,
                # A runner that never trained reports 0 s and 0 bytes: unknown, not free.
                "ms_step": 1000 * r["train_seconds"] / steps if steps and r.get("train_seconds") else math.nan,
                "peak_mib": (mem.get("peak_rss_bytes") or math.nan) / MIB,
                "baseline_mib": (mem.get("baseline_rss_bytes") or math.nan) / MIB,
                **{p: 1000 * phases[p]["seconds"] / steps if steps and p in phases else math.nan
                   for p in TRAIN_PHASES},
                "train_loss": last.get("train_loss", math.nan), "test_loss": last.get("test_loss", math.nan),
                "test_acc": 100 * last.get("test_accuracy", math.nan),
                "epochs": r.get("epochs") or [], "env": r.get("env") or {},
            })
    df = pd.DataFrame(rows)
    df["order"] = [(METHODS.index(m) if m in METHODS else len(METHODS), k) for m, k in zip(df.method, df.bp_layers)]
    df = df.sort_values(["order", *VARIANTS, "run_id", "repeat"], kind="stable").drop(columns="order")
    varying = [v for v in VARIANTS if df[v].nunique() > 1]
    df["variant"] = df[varying].astype(str).agg(" ".join, axis=1) if varying else ""
    df["label"] = df["mlabel"] + df["variant"].map(lambda v: f" · {v}" if v else "")
    return df.reset_index(drop=True)


def _chart_groups(df: pd.DataFrame) -> pd.DataFrame:
    """The ok jobs, one row per group (the label names the group uniquely)."""
    ok = df[df["status"] == "ok"]
    means = ok.groupby("label", sort=False)[["peak_mib", "baseline_mib", *TRAIN_PHASES]].mean()
    firsts = ok.groupby("label", sort=False)[["mlabel", "variant"]].first()
    curves = pd.Series({label: pd.DataFrame([e for es in s for e in es]).groupby("epoch")[["train_loss", "test_loss"]]
                        .mean() for label, s in ok.groupby("label", sort=False)["epochs"]}, name="curve", dtype=object)
    return pd.concat([firsts, means, curves], axis=1).rename_axis("label").reset_index()


def _figure(width: float, height: float = 4.8, ncols: int = 1, sharey: bool = False):
    fig = Figure(figsize=(width, height))
    FigureCanvasAgg(fig)
    return fig, fig.subplots(1, ncols, sharey=sharey)


def _bar_figure(n_bars: int):
    """Width grows with the bars so wrapped labels never collide; no vertical grid through the bars."""
    fig, ax = _figure(max(6.5, 1.4 * n_bars + 3.5))
    ax.grid(axis="x", visible=False)
    return fig, ax


def _wrap(labels) -> list[str]:
    """Narrow tick labels, with the variant on a line of its own."""
    return ["\n".join(textwrap.fill(part, 16, break_long_words=False, break_on_hyphens=False)
                      for part in s.split(" · ")) for s in labels]


def _time_chart(ok: pd.DataFrame, palette: dict) -> Figure:
    """The shape of the ElasticZO paper's Fig. 7: where a step's time goes."""
    fig, ax = _bar_figure(len(ok))
    ms = ok.set_index("label")[list(TRAIN_PHASES)].fillna(0)
    totals = ms.cumsum(axis=1)
    for p in TRAIN_PHASES:
        ax.bar(range(len(ms)), ms[p], bottom=totals[p] - ms[p], width=0.6, color=PHASE_COLORS[p], label=p)
    totals = totals[TRAIN_PHASES[-1]]
    for x, total in enumerate(totals):
        ax.annotate(f"{total:.2f} ms", (x, total), xytext=(0, 3), textcoords="offset points",
                    ha="center", va="bottom", fontweight="bold")
    ax.set_ylim(0, 1.12 * totals.max())
    ax.set_xticks(range(len(ms)), _wrap(ms.index))
    ax.set(ylabel="time per step (ms)", title=CHARTS["time_breakdown.png"])
    ax.legend(title="phase", loc="upper left", bbox_to_anchor=(1.01, 1), frameon=False)
    return fig


def _memory_chart(ok: pd.DataFrame, palette: dict) -> Figure:
    """Baseline and increment stacked, because the baseline (runtime + data) dwarfs what training adds."""
    fig, ax = _bar_figure(len(ok))
    x = range(len(ok))
    increment = ok["peak_mib"] - ok["baseline_mib"]
    ax.bar(x, ok["baseline_mib"], width=0.6, color="0.8", edgecolor="0.5")
    ax.bar(x, increment, bottom=ok["baseline_mib"], width=0.6, color=[palette[m] for m in ok["mlabel"]],
           edgecolor="0.3")
    for i, (peak, inc) in enumerate(zip(ok["peak_mib"], increment)):
        ax.annotate(f"{peak:.0f} MiB\n(+{inc:.0f} training)", (i, peak), xytext=(0, 3),
                    textcoords="offset points", ha="center", va="bottom")
    ax.set_ylim(0, 1.18 * ok["peak_mib"].max())
    ax.set_xticks(list(x), _wrap(ok["label"]))
    ax.set(ylabel="peak resident memory (MiB)", title="Peak resident memory (RSS)")
    ax.legend(handles=[Patch(facecolor="0.8", edgecolor="0.5", label="baseline before training\n(runtime + data)"),
                       Patch(facecolor="white", edgecolor="0.3", label="training increment\n(method colour)")],
              loc="upper left", bbox_to_anchor=(1.01, 1), frameon=False)
    return fig


def _loss_chart(ok: pd.DataFrame, palette: dict) -> Figure:
    """Train and test side by side with a shared y axis, so overfitting shows as a gap."""
    fig, axes = _figure(11, height=4.2, ncols=2, sharey=True)
    styles = dict(zip(ok["variant"].unique(), ["-", "--", ":", "-."] * len(ok)))
    for _, g in ok.iterrows():
        for ax, col in zip(axes, ("train_loss", "test_loss")):
            ax.plot(g["curve"].index, g["curve"][col], marker="o", label=g["label"],
                    color=palette[g["mlabel"]], linestyle=styles[g["variant"]])
    for ax, name in zip(axes, ("train", "test")):
        ax.set(title=f"{name} loss", xlabel="epoch")
        ax.xaxis.set_major_locator(MaxNLocator(integer=True))
    axes[0].set_ylabel("cross-entropy loss")
    axes[1].legend(loc="upper left", bbox_to_anchor=(1.02, 1), frameon=False)
    return fig


def _nothing_to_chart() -> Figure:
    fig, ax = _figure(6.5, height=1.5)
    ax.text(0.5, 0.5, "no job ended ok: nothing to chart", ha="center", va="center")
    ax.set_axis_off()
    return fig


def _blocks(store, run_ids: list[str], df: pd.DataFrame, ok: pd.DataFrame) -> list[tuple[str, object]]:
    """The report as a list of (kind, content), rendered once as Markdown and once as HTML."""
    plans = [store.run_plan(r) for r in run_ids]
    runs = pd.DataFrame({"run": run_ids, "suite": [p.get("suite") for p in plans],
                         "created": [p.get("created_at") for p in plans],
                         "jobs": [len(p["jobs"]) for p in plans],
                         "ok": [int(((df.run_id == r) & (df.status == "ok")).sum()) for r in run_ids]})
    blocks = [("h1", f"zobench report: {', '.join(run_ids)}"), ("h2", "Runs"), ("table", runs),
              ("h2", "Machine"), _machine(df), ("h2", "Results"),
              ("p", "One row per job group (method, runtime, precision, target, workload; int8* is INT8 with the "
                    "integer-only ZO loss); repeats are averaged (n = how many). Jobs that did not end ok are listed "
                    "with their error and left out of the charts."),
              ("table", _results_table(df)), ("h2", "Where training time goes")]
    if len(ok):
        phases = ok.set_index("label")[list(TRAIN_PHASES)].fillna(0)
        share = phases.div(phases.sum(axis=1), axis=0).mul(100).map(lambda v: f"{v:.1f}" if v else "-")
        blocks += [("p", "Percentage of training time (eval excluded) spent in each phase."),
                   ("table", share.rename(columns=lambda p: f"{p} %").rename_axis("job group").reset_index())]
    else:
        blocks.append(("p", "No job ended ok, so there is no time to break down."))
    return blocks + [("h2", "Charts")] + [("img", name) for name in CHARTS]


def _machine(df: pd.DataFrame) -> tuple[str, object]:
    envs = [{"target": t, **env} for t, env in zip(df["target"], df["env"]) if env.get("cpu_model")]
    if not envs:
        return ("p", "No job reported its machine.")
    m = pd.DataFrame(envs)
    m["versions"] = m["versions"].map(lambda v: ", ".join(f"{k} {x}" for k, x in (v or {}).items()))
    cols = ["target", "hostname", "arch", "cpu_model", "cores", "governor", "kernel", "versions"]
    return ("table", m[cols].astype(str).drop_duplicates().rename(columns={"cpu_model": "cpu"}))


def _results_table(df: pd.DataFrame) -> pd.DataFrame:
    t = (df.groupby(["mlabel", *GROUP[2:], "status", "error"], sort=False)
         .agg(n=("job_id", "size"), steps=("steps", "mean"), ms_step=("ms_step", "mean"), train_s=("train_s", "mean"),
              peak_mib=("peak_mib", "mean"), train_loss=("train_loss", "mean"), test_loss=("test_loss", "mean"),
              test_acc=("test_acc", "mean"))
         .reset_index())
    formats = {"steps": ".0f", "ms_step": ".2f", "train_s": ".2f", "peak_mib": ".1f",
               "train_loss": ".3f", "test_loss": ".3f", "test_acc": ".1f"}
    for col, f in formats.items():
        t[col] = t[col].map(lambda v: "-" if pd.isna(v) else format(v, f))
    return t.rename(columns={"mlabel": "method", "ms_step": "ms/step", "train_s": "train s",
                             "peak_mib": "peak RSS MiB", "train_loss": "final train loss",
                             "test_loss": "final test loss", "test_acc": "test accuracy %"})


def _markdown(blocks) -> str:
    def table(t: pd.DataFrame) -> str:
        cell = lambda v: str(v).replace("|", "\\|").replace("\n", " ")
        lines = [list(t.columns), ["---"] * len(t.columns), *t.astype(str).values.tolist()]
        return "\n".join("| " + " | ".join(map(cell, line)) + " |" for line in lines)

    render = {"h1": lambda x: f"# {x}", "h2": lambda x: f"## {x}", "p": str, "table": table,
              "img": lambda name: f"![{CHARTS[name]}]({name})"}
    return "\n\n".join(render[kind](x) for kind, x in blocks) + "\n"


def _html(blocks, out: Path, title: str) -> str:
    def img(name: str) -> str:
        data = base64.b64encode((out / name).read_bytes()).decode("ascii")
        return (f'<figure><img src="data:image/png;base64,{data}" alt="{html.escape(CHARTS[name])}">'
                f"<figcaption>{html.escape(CHARTS[name])}</figcaption></figure>")

    render = {"h1": lambda x: f"<h1>{html.escape(x)}</h1>", "h2": lambda x: f"<h2>{html.escape(x)}</h2>",
              "p": lambda x: f"<p>{html.escape(x)}</p>", "img": img,
              "table": lambda t: t.to_html(index=False, border=0, na_rep="-")}
    body = "\n".join(render[kind](x) for kind, x in blocks)
    return (f'<!DOCTYPE html>\n<html lang="en"><head><meta charset="utf-8"><title>{html.escape(title)}</title>'
            f"<style>{CSS}</style></head>\n<body>\n{body}\n</body></html>\n")
