"""The report of zobench tune runs: what each search tried, how each trial scored on the
validation split, and which values it chose (harness/search/tune.py keeps the study in run.json)."""
from __future__ import annotations

import math

import pandas as pd

from workloads.vocab import precision_label

from harness.stores.measurements import shown_hyper

from . import charts

STATE_MARKERS = {"complete": "o", "pruned": "x", "failed": "s", "interrupted": "s"}


def studies(run_ids: list[str], plans: list[dict]) -> dict[str, dict]:
    """The report's tune runs: run id -> its study record."""
    return {r: p["tune"] for r, p in zip(run_ids, plans) if p.get("tune")}


def title(study: dict) -> str:
    precision = precision_label(study["precision"], study["zo_loss"], study["method"].partition(":")[0])
    return f"{study['method']} {precision} · {study['runtime']} · {study['target']}"


def table(found: dict[str, dict]) -> pd.DataFrame:
    """One row per search: what it searched, its trials, and the values it chose."""
    rows = []
    for run_id, s in found.items():
        states = [t["state"] for t in s["trials"]]
        best = s.get("best") or {}
        rows.append({"run": run_id, "search": title(s), "data": f"{s['dataset']}, {s['validation']} held out",
                     "searched": ", ".join(f"{p['name']} {p['low']:g}..{p['high']:g}" + (" log" if p["log"] else "")
                                           for p in s["params"]),
                     "trials": f"{len(states)} ({states.count('complete')} whole, {states.count('pruned')} pruned)",
                     "epochs": s["epochs"], "chose": shown_hyper(best["values"].items()) if best else "-",
                     "validation accuracy %": f"{100 * best['score']:.2f}" if best else "-"})
    return pd.DataFrame(rows)


def trials(study: dict) -> pd.DataFrame:
    """One row per trial: its values, how it ended and its validation accuracy per epoch (%)."""
    rows = []
    for t in study["trials"]:
        acc = [math.nan if a is None else 100 * a for a in t["validation_accuracy"]]
        rows.append({"trial": t["number"], "values": shown_hyper(t["values"].items()), "state": t["state"],
                     "flags": ", ".join(t.get("flags") or []), "epochs": len(acc),
                     "validation accuracy %": f"{acc[-1]:.2f}" if acc else "-",
                     "best epoch %": f"{max(acc):.2f}" if acc and not all(map(math.isnan, acc)) else "-"})
    return pd.DataFrame(rows)


def chart(found: dict[str, dict]):
    """Per search: the score of every trial against the (first) value searched, pruned ones at
    the accuracy they were stopped at; each trial's validation accuracy and train loss per epoch."""
    fig, axes = charts.figure(3, len(found), width=4.6, height=3.8)
    for (score_ax, curve_ax, loss_ax), s in zip(axes, found.values()):
        name = s["params"][0]["name"]
        best = (s.get("best") or {}).get("number")
        for t in s["trials"]:
            acc = [math.nan if a is None else 100 * a for a in t["validation_accuracy"]]
            if not acc:
                continue
            marker = STATE_MARKERS.get(t["state"], "s")
            colour = ("C3" if t["number"] == best else "0.55" if t["state"] != "complete"
                      else "C1" if t.get("flags") else "C0")
            score_ax.scatter([t["values"][name]], [acc[-1]], marker=marker, color=colour, zorder=3)
            style = {"color": colour, "marker": ".", "alpha": 0.9, "linestyle": "-" if t["state"] == "complete" else ":",
                     "linewidth": 1.6 if t["number"] == best else 1}
            curve_ax.plot(range(1, len(acc) + 1), acc, **style)
            loss = [math.nan if x is None else x for x in t["train_loss"]]
            loss_ax.plot(range(1, len(loss) + 1), loss, **style)
        if s["params"][0]["log"]:
            score_ax.set_xscale("log")
        score_ax.set(xlabel=name, ylabel="validation accuracy at the last epoch (%)", title=title(s))
        curve_ax.set(xlabel="epoch", ylabel="validation accuracy (%)",
                     title="per trial: best red, diverged or unstable orange, pruned dotted grey")
        loss_ax.set(xlabel="epoch", ylabel="train loss (nats, log scale)", yscale="log", title="train loss per trial")
    return fig
