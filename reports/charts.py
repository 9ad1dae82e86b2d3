"""The report's charts, in the shapes of the ElasticZO paper's figures.

Each chart takes `ok`: one row per job group that ended ok (report._chart_groups), with
its method label, precision, panel (runtime and target, plus workload when there are
several), phase times, memory, energy and loss curves. A method keeps one colour in every chart,
and a phase keeps one colour in every report. Every axis is labelled with its unit.
"""
from __future__ import annotations

import matplotlib as mpl
import pandas as pd
import seaborn as sns
from matplotlib.backends.backend_agg import FigureCanvasAgg
from matplotlib.colors import to_rgb
from matplotlib.figure import Figure
from matplotlib.lines import Line2D
from matplotlib.patches import Patch
from matplotlib.ticker import MaxNLocator

from harness.search import memory_model
from workloads.jsonfile import atomic
from workloads.vocab import PAPER_CONFIGS, PRECISION_LABELS, TRAIN_PHASES, method_label

MIB, KIB = 2 ** 20, 2 ** 10
DPI = 120
PHASE_COLORS = dict(zip(TRAIN_PHASES, sns.color_palette("Set2", len(TRAIN_PHASES))))
PART_COLORS = dict(zip(memory_model.PARTS, sns.color_palette("Pastel1", len(memory_model.PARTS))))


def save(fig, out, name: str) -> None:
    """A chart as out/name.png and out/name.svg, laid out; each whole or not at all (a full disk
    leaves no truncated image, and its error names the file). Both are cut to one box, the PNG's
    tight box (what bbox_inches="tight" finds at its DPI), found once: "tight" lays the figure
    out again for each file, a fifth of a report's drawing."""
    fig.tight_layout()
    fig.set_dpi(DPI)
    fig.draw_without_rendering()
    box = fig.get_tightbbox().padded(mpl.rcParams["savefig.pad_inches"])
    fig.set_layout_engine(None)         # laid out: savefig need not draw it once more first
    for ext in ("png", "svg"):
        with atomic(out / f"{name}.{ext}") as tmp:
            fig.savefig(tmp, format=ext, dpi=DPI, bbox_inches=box)


def figure(ncols: int, nrows: int = 1, width: float = 5.0, height: float = 4.2, sharey=False):
    fig = Figure(figsize=(width * ncols + 1.5, height * nrows))
    FigureCanvasAgg(fig)
    axes = fig.subplots(nrows, ncols, sharey=sharey, squeeze=False)
    return fig, axes


def _bar_label(method_label: str, precision: str) -> str:
    short = method_label.replace(" (ZO-Feat-", "\n(ZO-Feat-")
    return f"{short}\n{precision}"


def panel_axes(ok: pd.DataFrame, height: float):
    """One row of axes per panel (runtime and target), wide enough for its most bars; yields
    (axes, panel, its rows) and returns the figure."""
    panels = list(dict.fromkeys(ok["panel"]))
    widest = max((ok["panel"] == p).sum() for p in panels)
    fig, axes = figure(1, len(panels), width=max(6.0, 0.85 * widest + 1.0), height=height)
    return fig, axes, [(ax, panel, ok[ok["panel"] == panel]) for ax, panel in zip(axes.flat, panels)]


def label_bars(ax, g: pd.DataFrame, palette: dict) -> None:
    """Method and precision under each bar, in the method's colour; no vertical grid lines."""
    ax.set_xticks(range(len(g)), [_bar_label(m, p) for m, p in zip(g["mlabel"], g["precision"])], fontsize=7)
    for tick, m in zip(ax.get_xticklabels(), g["mlabel"]):
        tick.set_color(palette[m])
    ax.grid(axis="x", visible=False)


def time_breakdown(ok: pd.DataFrame, palette: dict) -> Figure:
    """Fig. 7: a step's time by phase, stacked, one panel per runtime and target."""
    fig, axes, panels = panel_axes(ok, height=3.6)
    for ax, panel, g in panels:
        ms = g[list(TRAIN_PHASES)].fillna(0).to_numpy()
        bottom = [0.0] * len(g)
        for j, p in enumerate(TRAIN_PHASES):
            ax.bar(range(len(g)), ms[:, j], bottom=bottom, width=0.65, color=PHASE_COLORS[p], label=p)
            bottom = [b + v for b, v in zip(bottom, ms[:, j])]
        for x, total in enumerate(bottom):
            ax.annotate(f"{total:.2f}", (x, total), xytext=(0, 2), textcoords="offset points",
                        ha="center", va="bottom", fontsize=8, fontweight="bold")
        ax.set_ylim(0, 1.15 * max(bottom))
        label_bars(ax, g, palette)
        ax.set(title=panel, ylabel="time per optimizer step (ms)")
    axes.flat[0].legend(title="phase", loc="upper left", bbox_to_anchor=(1.01, 1), frameon=False, fontsize=8)
    fig.suptitle("Training time per optimizer step, by phase (Fig. 7); bar labels in ms")
    return fig


def cross_device(ok: pd.DataFrame, palette: dict) -> Figure:
    """Every board's step times divided by its own reference (Full ZO FP32 on the same runtime),
    so boards of very different speed share one axis; one panel per workload."""
    rows = []
    for panel, g in ok.groupby("panel", sort=False):
        ref = g[(g["method"] == "full-zo") & (g["precision"] == "fp32")]
        base = float(ref["ms_step"].iloc[0]) if len(ref) else float(g["ms_step"].iloc[0])
        ref_name = "Full ZO fp32" if len(ref) else f"{g['mlabel'].iloc[0]} {g['precision'].iloc[0]}"
        for _, r in g.iterrows():
            rows.append({"config": _bar_label(r["mlabel"], r["precision"]), "mlabel": r["mlabel"],
                         "workload": r["workload"], "relative": r["ms_step"] / base,
                         "board": f"{r['runtime']} · {r['target']}\n(1 = {ref_name}, {base:.2f} ms)"})
    t = pd.DataFrame(rows)
    workloads = list(dict.fromkeys(t["workload"]))
    widest = max(t[t["workload"] == w]["config"].nunique() for w in workloads)
    fig, axes = figure(1, len(workloads), width=max(7.0, 0.9 * widest), height=4.8)
    for ax, workload in zip(axes.flat, workloads):
        w = t[t["workload"] == workload]
        configs = list(dict.fromkeys(w["config"]))
        sns.barplot(w, x="config", y="relative", hue="board", order=configs, ax=ax, palette="colorblind")
        ax.axhline(1.0, color="0.3", linewidth=0.8, linestyle="--")
        where = f" ({workload})" if len(workloads) > 1 else ""
        ax.set(xlabel="", ylabel="step time relative to the board's reference (x)",
               title=f"Cross-device: step time normalised per board and runtime{where}")
        ax.tick_params(axis="x", labelsize=7)
        for tick, config in zip(ax.get_xticklabels(), configs):
            tick.set_color(palette[w.loc[w["config"] == config, "mlabel"].iloc[0]])
        ax.legend(title="board · runtime", loc="upper left", bbox_to_anchor=(1.01, 1), frameon=False, fontsize=8)
    return fig


def memory(ok: pd.DataFrame, palette: dict, models: dict) -> Figure:
    """Figs. 4-6: the analytic memory of each method, stacked by part, per precision; one row of
    panels per model (models: name -> (Model, batch, FP32 optimizer)), each on its own scale. Each bar is
    labelled with its total and its overhead over Full ZO, so that the small BP overhead stays
    visible. Beside it, hatched, is what the C++ binary really allocates for the same job
    (memory.buffers_bytes), where the run has one."""
    precisions = [p for p in ("fp32", "int8") if p in set(ok["precision"].str.rstrip("*"))] or ["fp32"]
    methods = PAPER_CONFIGS
    labels = [method_label(meth, k) for meth, k in methods]
    fig, axes = figure(len(precisions), len(models), width=5.8, height=5.0)
    for row, (name, (m, batch, optimizer)) in zip(axes, models.items()):
        top = 0.0
        for ax, precision in zip(row, precisions):
            rows = [memory_model.breakdown(m, meth, batch, precision, k, optimizer if precision == "fp32" else "sgd")
                    for meth, k in methods]
            zo = rows[1].total_bytes
            bottom = [0.0] * len(rows)
            for part in memory_model.PARTS:
                vals = [r.parts[part] / MIB for r in rows]
                if any(vals):
                    ax.bar([x - 0.15 for x in range(len(rows))], vals, bottom=bottom, width=0.38,
                           color=PART_COLORS[part], edgecolor="0.4", linewidth=0.4)
                    bottom = [b + v for b, v in zip(bottom, vals)]
            for x, r in enumerate(rows):
                delta = r.total_bytes - zo
                size = f"{delta / KIB:+,.1f} KiB" if abs(delta) < MIB else f"{delta / MIB:+,.2f} MiB"
                extra = "" if r.method == "full-zo" else f"\n{size}\nvs Full ZO"
                ax.annotate(f"{r.total_bytes / MIB:.2f} MiB{extra}", (x - 0.15, r.total_bytes / MIB), xytext=(0, 3),
                            textcoords="offset points", ha="center", va="bottom", fontsize=7)
            cpp = ok[(ok["runtime"] == "cpp") & (ok["precision"] == precision) & ok["buffers_mib"].notna()
                     & (ok["model"] == name)]
            for x, label in enumerate(labels):
                got = cpp[cpp["mlabel"] == label]
                if len(got):
                    v = float(got["buffers_mib"].iloc[0])
                    ax.bar(x + 0.25, v, width=0.3, color=palette[label], hatch="///", edgecolor="0.2", alpha=0.8)
                    ax.annotate(f"{v:.2f}", (x + 0.25, v), xytext=(0, 2), textcoords="offset points",
                                ha="center", va="bottom", fontsize=7)
                    bottom[x] = max(bottom[x], v)
            top = max(top, *bottom)
            ax.set_xticks(range(len(labels)), [l.replace(" (", "\n(") for l in labels], fontsize=7)
            ax.grid(axis="x", visible=False)
            eqs = "13-15" if precision == "int8" else "2-5" if optimizer == "adam" else "2-4"
            ax.set(title=f"{name}, {precision.upper()}, batch {batch}: Eqs. {eqs}", ylabel="memory (MiB)")
        for ax in row:
            ax.set_ylim(0, 1.3 * top)
    handles = [Patch(facecolor=PART_COLORS[p], edgecolor="0.4", label=f"analytic: {p}") for p in memory_model.PARTS]
    handles.append(Patch(facecolor="white", hatch="///", edgecolor="0.2", label="C++ binary's buffers\n(exact, method colour)"))
    axes[0, -1].legend(handles=handles, loc="upper left", bbox_to_anchor=(1.01, 1), frameon=False, fontsize=8)
    fig.suptitle("Training memory by method: the analytic model and the C++ binary's allocation")
    return fig


def peak_memory(ok: pd.DataFrame, palette: dict) -> Figure:
    """The measured peak memory, one panel per runtime and target: a CPU job's RSS, and a cuda
    job's GPU memory (its panel says so), each drawn as a whole (grey) and the part that is the
    method's (its colour)."""
    fig, axes, panels = panel_axes(ok, height=3.4)
    kinds = set()
    for ax, panel, g in panels:
        gpu = g["device_peak_mib"].notna().any()
        (_gpu_bars if gpu else _rss_bars)(ax, g, palette)
        ax.set(title=f"{panel}: GPU memory" if gpu else panel,
               ylabel="peak GPU memory (MiB)" if gpu else "peak resident memory (MiB)")
        label_bars(ax, g, palette)
        kinds.add(gpu)
    legend = {False: [Patch(facecolor=(0.5, 0.5, 0.5, 0.3), edgecolor="0.5",
                            label="RSS before training\n(runtime + data; method colour, light)"),
                      Patch(facecolor="0.5", edgecolor="0.3", label="training increment\n(method colour)")],
              True: [Patch(facecolor="0.85", edgecolor="0.5", hatch="..",
                           label="GPU: NVML used, as nvidia-smi\nshows it (context, caches)"),
                     Patch(facecolor="white", edgecolor="0.3", hatch="//",
                           label="GPU: torch's peak allocation\n(method colour)")]}
    axes.flat[-1].legend(handles=[h for gpu in (False, True) if gpu in kinds for h in legend[gpu]],
                         loc="upper left", bbox_to_anchor=(1.01, 1), frameon=False, fontsize=8)
    fig.suptitle("Measured peak memory: host RSS for CPU jobs, GPU memory for cuda jobs; bar labels in MiB")
    return fig


def _rss_bars(ax, g: pd.DataFrame, palette: dict) -> None:
    """The runtime's baseline RSS (the method's colour, light) plus what training adds (the method's
    colour): a C++ job adds a sliver to its few MiB, and its bar still says which method it is."""
    x = range(len(g))
    ax.bar(x, g["baseline_mib"], width=0.6, color=[(*to_rgb(palette[m]), 0.3) for m in g["mlabel"]], edgecolor="0.5")
    ax.bar(x, g["peak_mib"] - g["baseline_mib"], bottom=g["baseline_mib"], width=0.6,
           color=[palette[m] for m in g["mlabel"]], edgecolor="0.3")
    _annotate(ax, g["peak_mib"], "{:.1f}")
    ax.set_ylim(0, 1.15 * g["peak_mib"].max())


def _gpu_bars(ax, g: pd.DataFrame, palette: dict) -> None:
    """NVML's used memory (grey, where the runner read it: the CUDA context and torch's cache
    included, what the MeZO paper reports) behind torch's peak allocation (method colour)."""
    x = range(len(g))
    ax.bar(x, g["device_used_mib"].fillna(0), width=0.6, color="0.85", edgecolor="0.5", hatch="..")
    ax.bar(x, g["device_peak_mib"], width=0.4, color=[palette[m] for m in g["mlabel"]], edgecolor="0.3", hatch="//")
    _annotate(ax, g["device_used_mib"], "{:.0f}")
    _annotate(ax, g["device_peak_mib"], "{:.1f}")
    ax.set_ylim(0, 1.15 * g[["device_used_mib", "device_peak_mib"]].max().max())


def _annotate(ax, values: pd.Series, fmt: str) -> None:
    """Each known value above its bar."""
    for i, v in enumerate(values):
        if pd.notna(v):
            ax.annotate(fmt.format(v), (i, v), xytext=(0, 2), textcoords="offset points", ha="center",
                        va="bottom", fontsize=7)


def energy(metered: pd.DataFrame, palette: dict) -> Figure:
    """Energy per optimizer step of the timed training loop (eval excluded), one bar per method
    and precision, one panel per runtime and target (with its meter), like the step time's."""
    fig, axes, panels = panel_axes(metered, height=3.4)
    for ax, panel, g in panels:
        ax.bar(range(len(g)), g["j_step"], width=0.6, color=[palette[m] for m in g["mlabel"]], edgecolor="0.3")
        _annotate(ax, g["j_step"], "{:.3g}")
        ax.set_ylim(0, 1.15 * g["j_step"].max())
        label_bars(ax, g, palette)
        meters = ", ".join(dict.fromkeys(g["energy_source"].dropna()))
        ax.set(title=f"{panel} (meter: {meters})", ylabel="energy per optimizer step (J)")
    fig.suptitle("Energy per optimizer step of the timed training loop (eval excluded); bar labels in J")
    return fig


def loss_curves(ok: pd.DataFrame, palette: dict) -> Figure:
    """Figs. 2-3: train and test loss per epoch, one column per precision, one line per method
    (line style: runtime and target); two rows per workload, whose losses never share an axis
    (40 classes start higher than 10)."""
    precisions = [p for p in PRECISION_LABELS if p in set(ok["precision"])]
    workloads = list(dict.fromkeys(ok["workload"]))
    fig, axes = figure(len(precisions), 2 * len(workloads), width=4.6, height=3.4)
    styles = dict(zip(dict.fromkeys(ok["runtime"] + " · " + ok["target"]), ["-", "--", ":", "-."] * 8))
    for w, workload in enumerate(workloads):
        for col, precision in enumerate(precisions):
            for _, g in ok[(ok["precision"] == precision) & (ok["workload"] == workload)].iterrows():
                for row, key in enumerate(("train_loss", "test_loss")):
                    axes[2 * w + row, col].plot(g["curve"].index, g["curve"][key], marker="o", markersize=3,
                                                color=palette[g["mlabel"]],
                                                linestyle=styles[f"{g['runtime']} · {g['target']}"])
            for row, name in enumerate(("train", "test")):
                ax = axes[2 * w + row, col]
                where = f"{workload}, " if len(workloads) > 1 else ""
                ax.set(title=f"{where}{precision}: {name} loss", xlabel="epoch", ylabel="cross-entropy loss (nats)")
                ax.xaxis.set_major_locator(MaxNLocator(integer=True))
    handles = [Line2D([], [], color=c, label=m) for m, c in palette.items() if m in set(ok["mlabel"])]
    handles += [Line2D([], [], color="0.4", linestyle=s, label=p) for p, s in styles.items()]
    axes[0, -1].legend(handles=handles, loc="upper left", bbox_to_anchor=(1.02, 1), frameon=False, fontsize=8)
    fig.suptitle("Loss per epoch (Figs. 2-3)")
    return fig


def int8_ratios(ratios: pd.DataFrame, palette: dict) -> Figure:
    """INT8 against FP32 for the same method, runtime and target: speed-up and memory ratio."""
    fig, axes = figure(2, width=max(5.2, 0.85 * len(ratios)), height=4.2)
    if not len(ratios):
        for ax in axes.flat:
            ax.text(0.5, 0.5, "no method ran in both fp32 and int8", ha="center", va="center")
            ax.set_axis_off()
        return fig
    for ax, col, title in ((axes[0, 0], "speedup", "INT8 speed-up over FP32 (x)"),
                           (axes[0, 1], "memory_ratio", "FP32 / INT8 memory (x)")):
        sns.barplot(ratios, x="config", y=col, hue="mlabel", palette=palette, dodge=False, ax=ax, legend=False)
        if col == "memory_ratio":
            ax.scatter(range(len(ratios)), ratios["analytic_ratio"], marker="_", s=400, color="0.2", zorder=3,
                       label="analytic (Eqs. 2-4 / 13-15)")
            ax.legend(loc="upper left", bbox_to_anchor=(1.01, 1), frameon=False, fontsize=8)
        ax.axhline(1.0, color="0.3", linewidth=0.8, linestyle="--")
        ax.set(title=title, xlabel="", ylabel=title.split(" (")[0] + " (x)")
        ax.tick_params(axis="x", labelsize=7, rotation=0)
        for x, v in enumerate(ratios[col]):
            ax.annotate(f"{v:.2f}", (x, v), xytext=(0, 2), textcoords="offset points", ha="center", fontsize=7)
    fig.suptitle("INT8 vs FP32 for the same method, runtime and target\n"
                 "(memory: the C++ binary's allocated buffers; a Python runtime's whole peak RSS)")
    return fig
