"""The transformer section of a report (docs/transformers.md): Katti et al.'s Fig. 3, memory
against context length for BP, BP with checkpointing and MeZO on one model, and the largest
model each method trains within a budget (zobench fit).

The chart's lines are the memory model's, since no run measures every context; its points are
what jobs measured, so each point says how far the model is from this runtime on this board.
The fit table recomputes each answer from the run's probes rather than trusting a printed line:
a report is made from the store, and the probes are what the store keeps.
"""
from __future__ import annotations

import pandas as pd
from matplotlib.figure import Figure
from matplotlib.lines import Line2D

from harness.search import memory_model
from harness.planning.suites import MethodChoice
from workloads.models import Transformer
from workloads.vocab import METHODS, method_label

from . import charts

MIB, GIB = charts.MIB, 2 ** 30
# Fig. 3's curves, drawn on every panel whether or not a job ran them: (method, bp_layers, checkpointing)
FIG3 = (("full-bp", 0, False), ("full-bp", 0, True), ("full-zo", 0, False))
SHORTEST = 16           # the shortest context drawn, as zobench fit --vary context starts
REFERENCE = ("full-bp", 0, "sgd", False)    # the fit table's ratios are to Full BP with SGD


def shape(hyper, network) -> tuple[int, bool]:
    """A job's (context, checkpointing): what, beside its method, decides a transformer's memory,
    so the report must not average two jobs that differ in them. (0, False) for a layer model."""
    if network.kind != Transformer.kind:
        return 0, False
    return hyper.context or network.context, hyper.checkpointing


def trained(df: pd.DataFrame) -> pd.DataFrame:
    """The transformer jobs that ended ok with a measured peak: the chart's points."""
    ok = df[(df["status"] == "ok") & df["peak_mib"].notna()]
    return ok[[n.kind == Transformer.kind for n in ok["network"]]]


def increment_mib(rows: pd.DataFrame) -> pd.Series:
    """What training added to the runner's resident set: its peak less what was resident once the
    runtime, the data and the weights were loaded, before warm-up (loaded_rss_bytes; after
    warm-up the allocator already holds a step's memory); baseline_rss_bytes in results written
    before it existed, and the whole peak where a runner measured neither."""
    return rows["peak_mib"] - rows["loaded_mib"].fillna(rows["baseline_mib"]).fillna(0)


def curve_label(method: str, bp_layers: int, checkpointing: bool, optimizer: str) -> str:
    """The method's report name, with what changes its memory; no optimizer for MeZO, which has
    no BP part for one to keep state for."""
    adam = ", Adam" if optimizer == "adam" and method != "full-zo" else ""
    return method_label(method, bp_layers) + (" + checkpointing" if checkpointing else "") + adam


def _contexts(m: Transformer, measured) -> list[int]:
    """Powers of two from SHORTEST to the model's learned positions, and for a llama-style model
    (rotary positions, no table) on to 4x its context, as Fig. 3 goes past the trained length;
    with every context a job used, so that each point has the line's value at its x."""
    top = m.context if m.style == "gpt2" else 4 * m.context
    return sorted({1 << i for i in range(SHORTEST.bit_length() - 1, top.bit_length())} | set(measured))


def context_chart(df: pd.DataFrame, palette: dict) -> Figure:
    """Fig. 3: one panel per transformer and batch the report trained. Lines: the memory model's
    predicted peak at each context for Full BP, Full BP with checkpointing, MeZO (Full ZO) and
    any other configuration a job ran, and lighter its parts' total, the paper's way of counting
    (a bound, but where a small batch meets a large vocabulary: docs/transformers.md); points:
    each job's training increment at its context (fit probes included: they are jobs too);
    dashed, on the right axis, MeZO's predicted peak over Full BP's."""
    rows = trained(df).assign(increment=increment_mib)
    panels = sorted(rows.groupby(["model", "batch", "precision"]),
                    key=lambda p: (p[1]["network"].iloc[0].params_total, p[0][1], p[0][2]))
    fig, axes = charts.figure(1, len(panels), width=7.5, height=4.6)
    for ax, ((name, batch, precision), g) in zip(axes.flat, panels):
        m = g["network"].iloc[0]
        bp = g[g["method"] != "full-zo"]
        optimizer = bp["optimizer"].mode()[0] if len(bp) else "sgd"
        # a MeZO job's optimizer names nothing it uses: it joins the panel's curve
        g = g.assign(opt=[o if meth != "full-zo" else optimizer for meth, o in zip(g["method"], g["optimizer"])])
        ran = g[["method", "bp_layers", "checkpointing", "opt"]].itertuples(index=False, name=None)
        curves = dict.fromkeys([(meth, k, c, optimizer) for meth, k, c in FIG3] + list(ran))
        xs = _contexts(m, g["context"])
        # the loss as the panel's jobs made it: in chunks, or (a job before hyper.loss_chunk) whole
        chunk = int(g["loss_chunk"].mode()[0]) if "loss_chunk" in g else 0
        model = {c: [memory_model.breakdown(m, c[0], int(batch), precision, int(c[1]), c[3], x, bool(c[2]),
                                            loss_chunk=chunk) for x in xs]
                 for c in curves}
        unit, size = ("GiB", GIB) if max(b.total_bytes for bs in model.values() for b in bs) > 2 * GIB else ("MiB", MIB)
        for (meth, k, ckpt, opt), bs in model.items():
            color, style = palette.get(method_label(meth, k), "0.3"), ":" if ckpt else "-"
            label = curve_label(meth, k, ckpt, opt)
            ax.plot(xs, [b.peak_bytes / size for b in bs], color=color, linestyle=style, linewidth=1.7,
                    label=f"model peak: {label}", gid=f"peak|{label}")
            ax.plot(xs, [b.total_bytes / size for b in bs], color=color, linestyle=style, linewidth=1.0, alpha=0.35,
                    gid=f"total|{label}")
            got = g[(g["method"] == meth) & (g["bp_layers"] == k) & (g["checkpointing"] == ckpt) & (g["opt"] == opt)]
            if len(got):
                ax.scatter(got["context"], got["increment"] * MIB / size, color=color, edgecolor="0.2", zorder=3,
                           marker="s" if ckpt else "o", label=f"measured: {label}", gid=f"measured|{label}")
        ax.set_xscale("log", base=2)
        ax.set(title=f"{name}, batch {batch}, {m.style}, {precision}", xlabel="context length (tokens, log2)",
               ylabel=f"memory ({unit})")
        ax.set_ylim(bottom=0)
        twin = ax.twinx()
        zo, full = model[("full-zo", 0, False, optimizer)], model[("full-bp", 0, False, optimizer)]
        twin.plot(xs, [z.peak_bytes / b.peak_bytes for z, b in zip(zo, full)], color="0.35", linestyle="--",
                  linewidth=1.2, label=f"MeZO / {curve_label('full-bp', 0, False, optimizer)}\n(model peaks, right axis)")
        twin.set(ylim=(0, 1.05), ylabel="MeZO / BP memory (model peaks)")
        twin.grid(False)
        bound = Line2D([], [], color="0.3", linewidth=1.0, alpha=0.35, label="model total, the parts' sum\n"
                                                                              "(light, each method's colour)")
        handles = ax.get_legend_handles_labels()[0] + [bound] + twin.get_legend_handles_labels()[0]
        ax.legend(handles=handles, loc="upper left", bbox_to_anchor=(1.12, 1), frameon=False, fontsize=7)
    fig.suptitle("Memory against context length (Katti et al. Fig. 3): the memory model's predicted peak (lines) and\n"
                 "parts' total (light), the jobs' training increments, peak RSS less RSS before training (points)")
    return fig


def fit_runs(run_ids: list[str], plans: list[dict]) -> dict[str, dict]:
    """The report's zobench fit runs: run id -> the run's fit table (family, method, budget...)."""
    return {r: p["fit"] for r, p in zip(run_ids, plans) if p.get("fit")}


def _size(row: pd.Series) -> tuple:
    """How probes are ordered: by parameters, then batch, then context (a fit run grows one)."""
    return row["network"].params_total, row["batch"], row["context"]


def _largest(probe: pd.Series, vary: str) -> str:
    """What a fit run grew, as its answer names it: the model, or the model at its batch or context."""
    return probe["model"] if vary == "model" else \
        f"{probe['model']} B={probe['batch']}" if vary == "batch" else f"{probe['model']} T={probe['context']}"


def fit_table(df: pd.DataFrame, fits: dict[str, dict]) -> pd.DataFrame:
    """Per fit run (a method, its optimizer and checkpointing, under a budget on a target): the
    largest configuration that ended ok, the next larger probe and how it ended, and its
    parameters over those of Full BP's (SGD) largest under the same budget, target, runtime,
    batch and context, where the report holds such a run."""
    found = []
    for run_id, meta in fits.items():
        probes = sorted((p for _, p in df[df["run_id"] == run_id].iterrows()), key=_size)
        if not probes:                  # left out by --target or --method
            continue
        ok = [p for p in probes if p["status"] == "ok"]
        best = ok[-1] if ok else None
        nxt = next((p for p in probes if best is None or _size(p) > _size(best)), None)
        at = best if best is not None else probes[0]
        choice = MethodChoice.parse(meta["method"])
        found.append({
            "key": (meta["target"], meta["budget_bytes"], meta["runtime"], meta["dataset"], at["batch"], at["context"]),
            "config": (choice.method, choice.bp_layers, meta["optimizer"], meta["checkpointing"]),
            "params": best["network"].params_total if best is not None else 0,
            "method": curve_label(choice.method, choice.bp_layers, meta["checkpointing"], meta["optimizer"]),
            "budget": memory_model.human(meta["budget_bytes"]), "target": meta["target"],
            "B": at["batch"], "T": at["context"],
            "largest ok": _largest(best, meta.get("vary", "model")) if best is not None else "none fits",
            "parameters": f"{best['network'].params_total / 1e6:.2f} M" if best is not None else "-",
            "next up": f"{_largest(nxt, meta.get('vary', 'model'))}: {nxt['status']}" if nxt is not None
                       else "- (none probed)",
            "run": run_id})
    reference = {f["key"]: f["params"] for f in found if f["config"] == REFERENCE}
    for f in found:
        ref = reference.get(f["key"])
        f["x Full BP (SGD)"] = f"{f['params'] / ref:.2f}" if ref else "-"
    found.sort(key=lambda f: (f["key"][1], METHODS.index(f["config"][0]), f["config"][1:]))
    return pd.DataFrame(found).drop(columns=["key", "config", "params"], errors="ignore")


# benchmarks/gpu_scale.py's rows: its method labels -> (method, bp_layers, optimizer, checkpointing)
SCALE_METHODS = {"full-bp": ("full-bp", 0, "sgd", False), "full-bp adam": ("full-bp", 0, "adam", False),
                 "full-bp +ckpt": ("full-bp", 0, "sgd", True), "full-zo": ("full-zo", 0, "sgd", False),
                 "elastic-zo:1": ("elastic-zo", 1, "sgd", False)}


def scale_figure(data: dict) -> Figure | None:
    """Katti et al.'s Fig. 3 from benchmarks/gpu_scale.py's JSON: per model and precision
    measured, the memory model's peak against the context for every method the run measured
    (lines), the measured peaks (points: the device's tensors on a GPU, the resident set's
    increment on a CPU), and MeZO's predicted peak over Full BP's (dashed, right axis). None
    when the JSON has no measured point yet."""
    from workloads.models import MODELS
    rows = [r for part in ("memory", "contexts") for r in data["parts"].get(part) or [] if r.get("status") == "ok"]
    panels = sorted({(r["model"], r["precision"], r["batch"]) for r in rows}, key=lambda p: (MODELS[p[0]].params_total, p[1]))
    if not panels:
        return None
    fig, axes = charts.figure(min(len(panels), 3), -(-len(panels) // 3), width=5.5, height=4.2)
    palette = dict(zip(SCALE_METHODS, ("C3", "C1", "C5", "C0", "C2")))
    for ax, (name, precision, batch) in zip(axes.flat, panels):
        m = MODELS[name]
        got = [r for r in rows if (r["model"], r["precision"], r["batch"]) == (name, precision, batch)]
        xs = _contexts(m, [r["context"] for r in got])
        labels = [l for l in SCALE_METHODS if l in {r["method"] for r in got}]
        # the loss as the run made it: rows before hyper.loss_chunk (the H200's of issue 63) made
        # the logits whole
        chunk = got[0].get("loss_chunk", -1)
        peaks = {l: [memory_model.breakdown(m, SCALE_METHODS[l][0], batch, precision, SCALE_METHODS[l][1],
                                            SCALE_METHODS[l][2], x, SCALE_METHODS[l][3],
                                            loss_chunk=chunk).peak_bytes / GIB for x in xs]
                 for l in labels}
        for label in labels:
            ax.plot(xs, peaks[label], color=palette[label], linewidth=1.5, label=f"model: {label}")
            pts = [r for r in got if r["method"] == label]
            ax.scatter([r["context"] for r in pts], [r["peak_bytes"] / GIB for r in pts], color=palette[label],
                       edgecolor="0.2", zorder=3, label=f"measured: {label}")
        ax.set_xscale("log", base=2)
        ax.set(title=f"{name}, {precision}, batch {batch}", xlabel="context (tokens, log2)", ylabel="memory (GiB)")
        ax.set_ylim(bottom=0)
        if "full-zo" in peaks and "full-bp" in peaks:
            twin = ax.twinx()
            twin.plot(xs, [z / b for z, b in zip(peaks["full-zo"], peaks["full-bp"])], color="0.35", linestyle="--",
                      linewidth=1.1, label="MeZO / Full BP (model, right axis)")
            twin.set(ylim=(0, 1.05), ylabel="MeZO / BP memory")
            twin.grid(False)
        ax.legend(loc="upper left", frameon=False, fontsize=6)
    for ax in list(axes.flat)[len(panels):]:
        ax.set_visible(False)
    where = "CPU dry run" if data.get("dry_run") else (data.get("gpu") or {}).get("name") or data.get("device")
    fig.subplots_adjust(wspace=0.5)
    fig.suptitle(f"Memory against context (Katti et al. Fig. 3), {where}: the memory model's peak (lines), measured (points)")
    return fig
