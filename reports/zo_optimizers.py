"""The report's ZO optimizers section, in the shape of ZO-Bench's tables (Zhang et al., ICML 2024):
per model and runtime · target, each optimizer (estimator, update rule, sparsity: the job's ZO
parts, docs/zo-optimizers.md) with its forwards a step, predicted and measured memory, ms/step,
J/step where measured, and test accuracy (and loss) at equal steps and accuracy at equal seconds; and a chart of
accuracy against memory with each optimizer a point, the trade-off a user chooses on.

It reads report._chart_groups' rows (ok job groups), whose label keeps optimizers apart, and is
shown where a workload's runs compare more than one ZO optimizer.
"""
from __future__ import annotations

import math

import pandas as pd
from matplotlib.lines import Line2D

from . import charts

MEZO = "MeZO (two-point, sgd)"


def groups(ok: pd.DataFrame) -> pd.DataFrame:
    """The ok groups of the workloads whose ZO jobs ran more than one optimizer (and those
    workloads' full-bp groups, FO-SGD's row of ZO-Bench's tables)."""
    zo = ok[ok["method"] != "full-bp"]
    compared = [w for w, g in zo.groupby("workload", sort=False) if g["zo_parts"].nunique() > 1]
    return ok[ok["workload"].isin(compared)]


def optimizer(parts: str, method: str) -> str:
    return "BP" if method == "full-bp" else parts or MEZO


def at_seconds(curve: pd.DataFrame, seconds: float) -> float:
    """The test accuracy of the last epoch that ended within `seconds` of training, nan if none did."""
    if not curve["seconds"].notna().all():
        return math.nan
    ended = curve["seconds"].cumsum() <= seconds * (1 + 1e-9)
    return float(curve.loc[ended, "test_acc"].iloc[-1]) if ended.any() else math.nan


def table(g: pd.DataFrame) -> pd.DataFrame:
    """One row per group: what ZO-Bench reports, per runtime · target (and workload). Equal
    seconds: the least total training time among the rows of a workload and panel."""
    rows = []
    for (workload, panel), p in g.groupby(["workload", "panel"], sort=False):
        budget = min(c["seconds"].sum() for c in p["curve"])
        for _, r in p.iterrows():
            rows.append({
                "workload": workload, "runtime · target": panel, "method": r["mlabel"],
                "optimizer": optimizer(r["zo_parts"], r["method"]), "precision": r["precision"],
                "forwards/step": int(r["forwards"]),
                "predicted MiB": _f(r["predicted_mib"], 2), "measured MiB": _f(measured(r)[0], 2),
                "ms/step": _f(r["ms_step"], 3), "J/step": _f(r["j_step"], 4),
                "acc % (equal steps)": _f(r["test_acc"], 1), "test loss (equal steps)": _f(_last(r["curve"], "test_loss"), 4),
                "acc % (equal seconds)": _f(at_seconds(r["curve"], budget), 1),
                "equal seconds": _f(budget, 1)})
    return pd.DataFrame(rows)


def _last(curve: pd.DataFrame, column: str) -> float:
    return float(curve[column].iloc[-1]) if len(curve) else math.nan


def measured(r) -> tuple[float, str]:
    """What a job measurably held (MiB) and what that is: the C++ binary's exact allocation, a
    cuda job's peak GPU allocation, else the process's peak resident set, most of it the framework
    (an increment over the baseline would be the allocator's history as much as the optimizer's:
    it can be negative)."""
    if r["runtime"] == "cpp" and not math.isnan(r["buffers_mib"]):
        return r["buffers_mib"], "C++ buffers"
    if not math.isnan(r["device_peak_mib"]):
        return r["device_peak_mib"], "GPU peak allocation"
    return r["peak_mib"], "peak RSS"


def chart(g: pd.DataFrame, palette: dict):
    """Test accuracy against measured memory, one panel per workload and runtime · target, each
    optimizer a point in its method's colour, named beside it."""
    panels = list(dict.fromkeys(zip(g["workload"], g["panel"])))
    fig, axes = charts.figure(min(len(panels), 3), math.ceil(len(panels) / 3), width=5.2, height=4.2)
    for ax, (workload, panel) in zip(axes.flat, panels):
        p = g[(g["workload"] == workload) & (g["panel"] == panel)]
        for _, r in p.iterrows():
            x, what = measured(r)       # a panel is one runtime on one target: one kind of measure
            ax.scatter([x], [r["test_acc"]], color=palette[r["mlabel"]], s=36, edgecolor="0.2", zorder=3)
            ax.annotate(f"{optimizer(r['zo_parts'], r['method'])} {r['precision']}", (x, r["test_acc"]),
                        fontsize=6.5, xytext=(4, 3), textcoords="offset points")
        ax.set(title=f"{workload} · {panel}", xlabel=f"measured memory: {what} (MiB)", ylabel="test accuracy (%)")
    for ax in list(axes.flat)[len(panels):]:
        ax.set_visible(False)
    methods = list(dict.fromkeys(g["mlabel"]))
    axes.flat[min(len(panels), 3) - 1].legend(
        handles=[Line2D([], [], marker="o", linestyle="", color=palette[m], markeredgecolor="0.2", label=m)
                 for m in methods], loc="upper left", bbox_to_anchor=(1.01, 1), frameon=False, fontsize=8)
    fig.suptitle("ZO optimizers: accuracy at equal steps against memory (up and left is better)")
    return fig


def _f(v: float, digits: int) -> str:
    return "-" if v is None or (isinstance(v, float) and math.isnan(v)) else f"{v:.{digits}f}"
