"""The transformer section of a report, from real runs: the context chart (Katti et al. Fig. 3)
against the results and the memory model, and the fit table against the probes."""
import pytest

from zobench.cli import main
from harness.search import memory_model
from harness.stores.store import Store
from reports import build, report as rep, transformers
from workloads.models import MODELS

MIB = 2 ** 20
# one step of 8 sequences and one test batch a job: the peak RSS is the runner's high-water mark,
# which its warm-up steps already reach
SHORT = ["--runtime", "torch", "--set", "epochs=1", "--set", "train_samples=8", "--set", "test_samples=8"]


def section(md: str, title: str) -> list[list[str]]:
    """A table of report.md under `## title`, as rows of cells (the header first)."""
    text = md.split(f"## {title}", 1)[1].split("\n## ", 1)[0]
    lines = [l for l in text.splitlines() if l.startswith("|")]
    return [[c.strip() for c in l.strip("|").split("|")] for i, l in enumerate(lines) if i != 1]


def test_context_chart_draws_the_model_and_the_measured_increments(tmp_path):
    """Full BP and MeZO on gpt2-1m at T = 64, Full BP with checkpointing in a second run, and
    Full BP with SGD instead of Adam in a third."""
    quick = ["run", "--suite", "quick-transformer", "--results", str(tmp_path), "--no-report", *SHORT]
    assert main([*quick, "--method", "full-bp", "--method", "full-zo"]) == 0
    assert main([*quick, "--method", "full-bp", "--set", "checkpointing=true"]) == 0
    assert main([*quick, "--method", "full-bp", "--set", "optimizer=sgd"]) == 0
    store = Store(tmp_path)
    ids = store.run_ids()
    html = build(store, ids)
    out = html.parent
    assert (out / "context.png").read_bytes().startswith(b"\x89PNG") and (out / "context.svg").is_file()
    md = (out / "report.md").read_text()
    assert "context.png" in md and "Largest trainable model" not in md
    # BP with and without checkpointing, with Adam and with SGD, are rows of their own, not averaged
    head, *rows = section(md, "Results")
    setups = {(r[0], r[head.index("setup")]) for r in rows}
    assert setups == {("Full BP", "T=64 adam"), ("Full BP", "T=64 +ckpt adam"), ("Full BP", "T=64"), ("Full ZO", "T=64")}

    ids = ids[:2]       # the chart of the Adam runs (the SGD one adds a curve of its own)
    df = rep._load(store, ids, [store.run_plan(r) for r in ids])
    fig = transformers.context_chart(df, rep._method_palette(df))
    ax, twin = [a for a in fig.axes if a.get_title()], [a for a in fig.axes if not a.get_title()]
    assert [a.get_title() for a in ax] == ["gpt2-1m, batch 8, gpt2, fp32"] and len(twin) == 1
    points = {c.get_gid().removeprefix("measured|"): c.get_offsets().ravel().tolist() for c in ax[0].collections}
    want = {}
    for run in ids:
        for r in store.results(run):
            h, mem = r["job"]["hyper"], r["memory"]
            label = transformers.curve_label(r["job"]["method"], 0, h.get("checkpointing", False), h["optimizer"])
            want.setdefault(label, []).extend([64, (mem["peak_rss_bytes"] - mem["loaded_rss_bytes"]) / MIB])
    assert set(points) == set(want) == {"Full BP, Adam", "Full BP + checkpointing, Adam", "Full ZO"}
    for label, xy in want.items():
        assert points[label] == pytest.approx(xy)

    m = MODELS["gpt2-1m"]
    lines = {l.get_gid(): l for l in ax[0].get_lines()}
    for label, (method, ckpt) in {"Full BP, Adam": ("full-bp", False), "Full BP + checkpointing, Adam": ("full-bp", True),
                                  "Full ZO": ("full-zo", False)}.items():
        b = memory_model.breakdown(m, method, 8, "fp32", 0, "adam", 64, ckpt)
        for kind, value in (("peak", b.peak_bytes), ("total", b.total_bytes)):
            xs, ys = lines[f"{kind}|{label}"].get_data()
            assert list(xs) == [16, 32, 64, 128, 256]            # up to gpt2-1m's 256 learned positions
            assert ys[2] == pytest.approx(value / MIB)
    (ratio,) = twin[0].get_lines()
    bp, zo = (memory_model.breakdown(m, meth, 8, "fp32", 0, "adam", 256).peak_bytes for meth in ("full-bp", "full-zo"))
    assert ratio.get_linestyle() == "--" and ratio.get_ydata()[-1] == pytest.approx(zo / bp) and zo / bp < 0.5


def fit_rows(store: Store, run_ids: list[str], out) -> dict[str, dict]:
    md = (build(store, run_ids, out).parent / "report.md").read_text()
    head, *rows = section(md, "Largest trainable model (zobench fit)")
    return {r[0]: dict(zip(head, r)) for r in rows}


def largest_ok(store: Store, run_id: str):
    """The largest model whose probe ended ok, from the raw results."""
    ok = [MODELS[r["job"]["workload"]["model"]] for r in store.results(run_id) if r["status"] == "ok"]
    return max(ok, key=lambda m: m.params_total, default=None)


def test_fit_table_lists_the_largest_ok_model_per_method_and_the_ratio_to_bp(tmp_path):
    """zobench fit for Full BP and for Full ZO under one budget, then reports of both and of one."""
    for method in ("full-bp", "full-zo"):     # 1: nothing fits (RLIMIT_AS, no cgroup); the table says so too
        assert main(["fit", "--results", str(tmp_path), "--budget", "350M", "--context", "64",
                     "--method", method]) in (0, 1)
    store = Store(tmp_path)
    bp_run, zo_run = store.run_ids()
    rows = fit_rows(store, [bp_run, zo_run], tmp_path / "both")
    assert list(rows) == ["Full BP", "Full ZO"]
    bp, zo = largest_ok(store, bp_run), largest_ok(store, zo_run)
    for label, best in (("Full BP", bp), ("Full ZO", zo)):
        assert rows[label]["largest ok"] == (best.name if best else "none fits")
        assert rows[label]["budget"] == "350.0 MiB" and rows[label]["T"] == "64" and rows[label]["B"] == "8"
    if bp is None:
        pytest.skip("nothing fit under RLIMIT_AS (no memory cgroup here): no ratio to check")
    assert rows["Full BP"]["parameters"] == f"{bp.params_total / 1e6:.2f} M"
    assert rows["Full ZO"]["x Full BP (SGD)"] == f"{(zo.params_total if zo else 0) / bp.params_total:.2f}"
    assert rows["Full BP"]["x Full BP (SGD)"] == "1.00"
    # the next size up ended oom (or nothing larger was probed)
    nxt = rows["Full BP"]["next up"]
    assert nxt.endswith(": oom") or nxt.startswith("-")

    # a report of the Full ZO fit run alone: its table, no Full BP to compare with
    alone = fit_rows(store, [zo_run], tmp_path / "alone")
    assert list(alone) == ["Full ZO"] and alone["Full ZO"]["x Full BP (SGD)"] == "-"
    assert (tmp_path / "alone" / "context.png").is_file()      # the probes that ended ok are points
