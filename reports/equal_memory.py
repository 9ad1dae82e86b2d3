"""The equal-memory section of a report (Katti et al.'s Fig. 4, harness/search/equal_memory.py): under
one budget each method trained the largest model that fits for the same wall-clock seconds, so
the chart's x is training seconds, not steps or epochs: a method whose steps are slower, or whose
model is larger, gets fewer of them, as it would on the board.
"""
from __future__ import annotations

import math

import pandas as pd
from matplotlib.figure import Figure
from matplotlib.lines import Line2D

from harness.stores import convergence, machine_load
from harness.planning.suites import MethodChoice

from . import charts


def studies(run_ids: list[str], plans: list[dict]) -> dict[str, dict]:
    """The report's equal-memory runs: run id -> its equal_memory table (budget, models, fit runs)."""
    return {r: p["equal_memory"] for r, p in zip(run_ids, plans) if p.get("equal_memory")}


def jobs(df: pd.DataFrame, found: dict[str, dict]) -> pd.DataFrame:
    """The study's own jobs (not their pretraining)."""
    return df[df["run_id"].isin(found) & (df["stage"] != "pretrain")]


def _name(row: pd.Series) -> str:
    return f"{row['mlabel']}: {row['model']} ({row['network'].params_total / 1e6:.1f}M)"


def table(df: pd.DataFrame, found: dict[str, dict]) -> pd.DataFrame:
    """Per job: its method and model, how much of the budget it used, and where its loss and
    accuracy went in the seconds it had."""
    out = []
    for _, r in jobs(df, found).iterrows():
        meta = found[r["run_id"]]
        out.append({
            "method": r["mlabel"], "model": r["model"], "parameters": f"{r['network'].params_total / 1e6:.2f} M",
            "fitted by": f"fit run {meta['fit_runs'][key]}" if (key := _key(r)) in meta.get("fit_runs", {}) else "the suite",
            "budget": meta["budget"],
            "peak RSS (MiB)": "-" if math.isnan(r["peak_mib"]) else f"{r['peak_mib']:.0f}",
            "status": r["status"], "steps": r["steps"],
            "training s": "-" if math.isnan(r["train_s"]) else f"{r['train_s']:.0f}",
            "ms/step": "-" if math.isnan(r["ms_step"]) else f"{r['ms_step']:.1f}",
            # the seconds are the x axis: a job that other work slowed got fewer steps of them
            "load": machine_load.flag(None if math.isnan(r["load"]) else r["load"]) or "unknown",
            "test acc % (start → end)": convergence.annotate(_pair(r["start_acc"], r["test_acc"], ".1f"), r["flag"],
                                                             "-" if math.isnan(r["best_acc"]) else f"{r['best_acc']:.1f}"),
            "test loss (start → end)": _pair(r["start_loss"], r["test_loss"], ".3f"),
        })
    return pd.DataFrame(out)


def _key(row: pd.Series) -> str:
    """The method as a suite writes it, the key of the study's models and fit runs."""
    return str(MethodChoice(row["method"], row["bp_layers"]))


def _pair(a: float, b: float, fmt: str) -> str:
    show = lambda v: "-" if math.isnan(v) else format(v, fmt)     # noqa: E731
    return f"{show(a)} → {show(b)}"


def chart(df: pd.DataFrame, found: dict[str, dict], palette: dict, floor: tuple[str, float] | None = None) -> Figure:
    """Test loss and test accuracy against training seconds, one line per job (x = 0: the
    pretrained weights, before the first step), one row of panels per study; floor: the test
    set's most common class and its share (%), drawn dashed where the caller knows it."""
    fig, axes = charts.figure(2, len(found), width=5.2, height=3.8)
    for row, (run_id, meta) in zip(axes, found.items()):
        mine = jobs(df, {run_id: meta})
        for _, r in mine.iterrows():
            seconds = [0.0, *pd.Series([e["seconds"] for e in r["epochs"]]).cumsum()]
            for ax, start, key in ((row[0], r["start_loss"], "test_loss"), (row[1], r["start_acc"], "test_acc")):
                ax.plot(seconds, [start, *(e[key] for e in r["epochs"])], marker="o", markersize=2.5,
                        color=palette[r["mlabel"]], label=_name(r), gid=f"{key}|{r['job_id']}")
        classes = {r["network"].classes for _, r in mine.iterrows()} - {0}
        for c in classes:
            row[1].axhline(100 / c, color="0.5", linestyle=":", linewidth=1)
        row[0].set(xlabel="training seconds", ylabel="test loss", title=f"within {meta['budget']} ({run_id})")
        row[1].set(xlabel="training seconds", ylabel="test accuracy (%)", title="accuracy; dotted: chance")
        if floor:
            row[1].axhline(floor[1], color="0.4", linestyle="--", linewidth=1)
        seen = {}
        for h, lab in zip(*row[0].get_legend_handles_labels()):
            seen.setdefault(lab, h)
        chance = [Line2D([], [], color="0.5", linestyle=":", label="chance")] if classes else []
        chance += [Line2D([], [], color="0.4", linestyle="--", label=f"'{floor[0]}' for every entry")] if floor else []
        row[1].legend(handles=list(seen.values()) + chance, loc="upper left", bbox_to_anchor=(1.02, 1),
                      frameon=False, fontsize=8)
    fig.suptitle("Equal memory (Katti et al. Fig. 4): each method's largest model within the budget, "
                 "for the same training seconds")
    return fig
