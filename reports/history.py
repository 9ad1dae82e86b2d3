"""The history chart (harness/analysis/history.py): per series a row of panels, step time, peak memory,
energy where measured, and the final test accuracy, against commit order; each point's results
as a band (min to max) around the estimate, and the detected changes as vertical lines."""
from __future__ import annotations

from matplotlib.figure import Figure

from harness.analysis.compare import ESTIMATOR, point_estimate
from harness.analysis.history import Series
from harness.stores.metrics import METRICS

from . import charts

MAX_SERIES = 24     # a chart of more rows is unreadable: the text output lists them all


def chart(all_series: list[Series], estimator: str = ESTIMATOR) -> Figure:
    _, estimate = point_estimate(estimator)
    shown = all_series[:MAX_SERIES]
    panels = [m for m in METRICS if any(p.samples.get(m.name) for s in shown for p in s.points)]
    fig, axes = charts.figure(len(panels) + 1, len(shown), width=4.2, height=2.8)
    for row, s in zip(axes, shown):
        xs = list(range(len(s.points)))
        labels = [p.commit[:7] for p in s.points]
        for ax, m in zip(row, panels):
            name, title, unit, scale = m.name, m.title, m.unit, m.scale
            got = [(x, p.samples[name]) for x, p in zip(xs, s.points) if p.samples.get(name)]
            if got:
                x, v = zip(*got)
                ax.fill_between(x, [min(a) * scale for a in v], [max(a) * scale for a in v], alpha=0.25, color="C0")
                ax.plot(x, [estimate(a) * scale for a in v], marker="o", markersize=3, color="C0", gid=f"{name}|{s.key}")
            for c in s.changes:
                if c.metric == name:
                    ax.axvline(c.at - 0.5, color="C3", linestyle="--", linewidth=1.2,
                               gid=f"change|{name}|{c.commit}")
            ax.set(title=f"{title} ({unit})", ylabel=unit)
        acc = row[len(panels)]
        got = [(x, p.accuracy) for x, p in zip(xs, s.points) if p.accuracy]
        if got:
            x, v = zip(*got)
            acc.plot(x, [100 * sum(a) / len(a) for a in v], marker="o", markersize=3, color="C2")
        acc.set(title="final test accuracy (%)")
        for ax in row:
            ax.set_xticks(xs, labels, rotation=60, fontsize=7)
        row[0].annotate(f"{s.key}\n{s.target} · {s.fingerprint[:8]}", (0, 1.18), xycoords="axes fraction",
                        fontsize=8, ha="left")
    fig.suptitle("History per job key and fingerprint: estimate (line), results' range (band), detected "
                 "changes (dashed, at the first commit of the new level)")
    return fig
