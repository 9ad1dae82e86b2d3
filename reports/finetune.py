"""The fine-tuning section of a report (the ElasticZO paper's Table 2): what each fine-tuning
job started from, its accuracy against "w/o fine-tuning", and accuracy per epoch.

"w/o fine-tuning" is the pretrained weights' accuracy on the fine-tuning test set, which every
fine-tuning job measures before its first step (result start_eval): the same number for each
method of a column, so the gain of a method is its final accuracy minus it, in points.
"""
from __future__ import annotations

import pandas as pd
from matplotlib.figure import Figure
from matplotlib.lines import Line2D
from matplotlib.ticker import MaxNLocator

from harness.stores import convergence
from workloads.vocab import method_label

from . import charts

BEFORE = "w/o fine-tuning"
# Table 2's rows, in its order: from none of the network trained by BP to all of it (k=1 is its
# ZO-Feat-Cls2, k=2 its ZO-Feat-Cls1)
ROWS = [BEFORE] + [method_label(m, k) for m, k in (("full-zo", 0), ("elastic-zo", 1), ("elastic-zo", 2),
                                                   ("full-bp", 0))]


def tuned(df: pd.DataFrame) -> pd.DataFrame:
    """The fine-tuning jobs of a report's rows, but an equal-memory study's (reports/equal_memory.py):
    its methods fine-tune different models, so no one "w/o fine-tuning" row is theirs."""
    return df[df["pretrained_from"].astype(bool) & ~df["study"]]


def column(row: pd.Series, varying: list[str]) -> str:
    """A Table 2 column: the data (set and angle) and precision, with runtime and target when
    the report holds several."""
    return " · ".join([row["data_set"], row["precision"].upper(), *(str(row[v]) for v in varying)])


def lineage(df: pd.DataFrame, rows: pd.DataFrame) -> list[str]:
    """One line per pretraining job of rows: what its fine-tuning jobs started from, and whether
    each of them did (the hash its result records against the pretraining job's final one)."""
    lines = []
    for src, g in rows[rows["pretrained_from"].astype(bool)].groupby("pretrained_from", sort=False):
        pre = df[df["job_id"] == src]
        sha = pre["weights_sha256"].iloc[0] if len(pre) and pre["weights_sha256"].iloc[0] else None
        started = g["init_sha256"].dropna()
        same = int((started == sha).sum()) if sha else 0
        acc = (", final test accuracy " + convergence.annotate(f"{pre['test_acc'].iloc[0]:.1f}%", pre["flag"].iloc[0],
                                                               f"{pre['best_acc'].iloc[0]:.1f}%")
               if len(pre) and pd.notna(pre["test_acc"].iloc[0]) else "")
        lines.append(f"{len(g)} job{'s' * (len(g) != 1)} fine-tuned from {src} {sha[:12] if sha else '(no weights: it did not end ok)'}"
                     f"{acc}; {same} of them started from exactly its final weights (sha256)")
    return lines


def _columned(ok: pd.DataFrame) -> tuple[pd.DataFrame, list[str]]:
    """The fine-tuning jobs, each with its Table 2 column (runtime and target named where they
    vary), and the columns in order."""
    t = tuned(ok)
    varying = [v for v in ("runtime", "target") if t[v].nunique() > 1]
    t = t.assign(column=[column(r, varying) for _, r in t.iterrows()])
    return t, list(dict.fromkeys(t["column"]))


def table(ok: pd.DataFrame) -> pd.DataFrame:
    """Table 2: final test accuracy (%) per method, with the gain over "w/o fine-tuning" in points,
    and where a method's run diverged or was unstable, its flag and best epoch's accuracy."""
    t, cols = _columned(ok)
    before = t.groupby("column")["start_acc"].mean()
    cells = t.groupby(["mlabel", "column"])
    final, best = cells["test_acc"].mean(), cells["best_acc"].mean()
    flags = cells["flag"].agg(lambda f: convergence.worst(f) or "")
    out = {BEFORE: {c: f"{before[c]:.1f}" if pd.notna(before.get(c)) else "-" for c in cols}}
    for label in [r for r in ROWS[1:] if r in set(t["mlabel"])] + [m for m in dict.fromkeys(t["mlabel"]) if m not in ROWS]:
        out[label] = {}
        for c in cols:
            acc, base, top = final.get((label, c)), before.get(c), best.get((label, c))
            out[label][c] = "-" if acc is None or pd.isna(acc) else convergence.annotate(
                f"{acc:.1f} ({acc - base:+.1f})" if pd.notna(base) else f"{acc:.1f}",
                flags.get((label, c)), "-" if top is None or pd.isna(top) else f"{top:.1f}")
    return pd.DataFrame.from_dict(out, orient="index", columns=cols).rename_axis("method").reset_index()


def curves(ok: pd.DataFrame, palette: dict) -> Figure:
    """Test accuracy per epoch of the fine-tuning jobs, epoch 0 being the pretrained weights,
    one panel per data set, angle and precision (Table 2's columns)."""
    t, cols = _columned(ok)
    ncols = min(4, len(cols))
    fig, axes = charts.figure(ncols, -(-len(cols) // ncols), width=4.2, height=3.4, sharey=True)
    for ax, c in zip(axes.flat, cols):
        for _, g in t[t["column"] == c].iterrows():
            epochs = [0, *g["curve"].index]
            ax.plot(epochs, [g["start_acc"], *g["curve"]["test_acc"]], marker="o", markersize=3,
                    color=palette[g["mlabel"]])
        ax.set(title=c, xlabel="fine-tuning epoch (0: pretrained)", ylabel="test accuracy (%)")
        ax.xaxis.set_major_locator(MaxNLocator(integer=True))
    for ax in list(axes.flat)[len(cols):]:
        ax.set_axis_off()
    handles = [Line2D([], [], color=c, label=m) for m, c in palette.items() if m in set(t["mlabel"])]
    axes[0, -1].legend(handles=handles, loc="upper left", bbox_to_anchor=(1.02, 1), frameon=False, fontsize=8)
    fig.suptitle("Fine-tuning: test accuracy on the shifted data per epoch (Table 2's columns)")
    return fig
