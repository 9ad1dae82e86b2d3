"""The report of a real run: files, tables that agree with the raw results, self-contained HTML."""
import base64
import re

import matplotlib.colors
import pytest

from zobench.cli import main
from harness.search import memory_model
from harness.stores import machine_load
from harness.stores.store import Store
from reports import build
from reports.report import CHARTS
from workloads.vocab import PAPER_CONFIGS

from testkit.runners import python, zobench

PNG = b"\x89PNG\r\n\x1a\n"
# the C++ binary: a report reads every runtime's results alike, and a C++ job costs about 2 s of
# CPU less than one that imports torch
TINY = ["--runtime", "cpp", "--precision", "fp32", "--set", "epochs=2", "--set", "train_samples=320", "--set", "test_samples=64"]


@pytest.fixture(scope="module")
def report(native, tmp_path_factory):
    root = tmp_path_factory.mktemp("report")
    assert main(["run", "--results", str(root), "--no-report", "--method", "full-bp", "--method", "full-zo",
                 *TINY]) == 0
    store = Store(root)
    (ok_run,) = store.run_ids()
    assert main(["run", "--results", str(root), "--no-report", "--method", "full-bp", "--method", "elastic-zo",
                 "--set", "fault=crash@full-bp", *TINY]) == 1
    # the run that is new: two runs started within one second sort by their ids' random tails
    (bad_run,) = set(store.run_ids()) - {ok_run}
    return {"store": store, "ok": ok_run, "bad": bad_run, "html": build(store, [ok_run]),
            "bad_html": build(store, [bad_run])}


def md_rows(md: str) -> dict:
    """The Results table of report.md as {method label: {column: cell}}."""
    section = md.split("## Results", 1)[1].split("##", 1)[0]
    lines = [l for l in section.splitlines() if l.startswith("|")]
    head = [c.strip() for c in lines[0].strip("|").split("|")]
    return {cells[0]: dict(zip(head, cells)) for cells in
            ([c.strip() for c in l.strip("|").split("|")] for l in lines[2:])}


def charted(report) -> list[str]:
    """The charts of the ok run's report: the energy chart only where a meter (RAPL, on an x86
    machine that lets a user read it) measured a job (tests/test_energy_report.py), the
    fine-tuning chart only for a run with a pretraining stage (tests/test_finetune.py), the
    context chart only for transformers (tests/test_report_transformers.py), the equal-memory
    chart only for an equal_memory run (tests/test_equal_memory.py), the history chart only with a
    shared store (tests/test_shared_store.py), the tuning chart only for a zobench tune run
    (tests/test_tune.py)."""
    metered = any((r.get("energy") or {}).get("joules_per_step") is not None
                  for r in report["store"].results(report["ok"]))
    return [name for name in CHARTS if (metered or name != "energy") and
            name not in ("finetune", "context", "equal_memory", "history", "tune", "zo_optimizers")]


def test_files_are_written_in_the_runs_report_folder(report):
    out = report["html"].parent
    assert out == report["store"].runs / report["ok"] / "report"
    for name in charted(report):
        data = (out / f"{name}.png").read_bytes()
        assert data.startswith(PNG) and len(data) > 10_000
        assert (out / f"{name}.svg").read_text().lstrip().startswith("<?xml")
    assert (out / "energy.png").exists() == ("energy" in charted(report)) and (out / "report.md").is_file()
    assert not (out / "context.png").exists()


def test_results_table_agrees_with_the_raw_results(report):
    rows = md_rows((report["html"].parent / "report.md").read_text())
    results = {r["job"]["method"]: r for r in report["store"].results(report["ok"])}
    assert set(rows) == {"Full BP", "Full ZO"} and "setup" not in rows["Full BP"]     # a transformer's column
    for label, method in (("Full BP", "full-bp"), ("Full ZO", "full-zo")):
        r = results[method]
        assert rows[label]["status"] == "ok"
        # with the share of the CPU other work took while it ran, never a bare number (issue 60)
        share = machine_load.lost_share(r)
        assert share is not None and rows[label]["ms/step"] == \
            f"{1000 * r['train_seconds'] / r['steps']:.2f} ({machine_load.flag(share)})"
        assert rows[label]["steps"] == str(r["steps"]) == "20"
        assert rows[label]["test accuracy %"] == f"{100 * r['epochs'][-1]['test_accuracy']:.1f}"
        assert rows[label]["peak RSS MiB"] == f"{r['memory']['peak_rss_bytes'] / 2**20:.1f}"


def test_phase_shares_add_up_to_100_percent(report):
    md = (report["html"].parent / "report.md").read_text()
    section = md.split("## Where training time goes", 1)[1].split("##", 1)[0]
    for line in [l for l in section.splitlines() if l.startswith("|")][2:]:
        cells = [c.strip() for c in line.strip("|").split("|")][1:]
        assert sum(float(c) for c in cells if c != "-") == pytest.approx(100, abs=0.5)


def test_html_is_self_contained(report):
    page = report["html"].read_text()
    assert not re.search(r'(src|href)="(?!data:)', page)
    images = re.findall(r'<img src="data:image/png;base64,([^"]+)"', page)
    assert len(images) == len(charted(report)) >= 6
    assert all(base64.b64decode(i).startswith(PNG) for i in images)
    assert "<table" in page and "Full ZO" in page


def test_failed_job_is_tabled_with_its_error_not_charted(report):
    md = (report["bad_html"].parent / "report.md").read_text()
    rows = md_rows(md)
    failed = next(r for r in report["store"].results(report["bad"]) if r["status"] != "ok")
    assert "SIGABRT" in failed["error"]
    assert rows["Full BP"]["status"] == "failed" and rows["Full BP"]["error"] == failed["error"]
    assert rows["Full BP"]["ms/step"] == "-"
    assert rows["ElasticZO k=1 (ZO-Feat-Cls2)"]["status"] == "ok"
    shares = md.split("## Where training time goes", 1)[1].split("##", 1)[0]
    assert "Full BP" not in shares


def test_report_command_over_two_runs(report, tmp_path):
    store = report["store"]
    from testkit.runners import zobench
    p = zobench("report", "--results", store.root, "--run", report["ok"], "--run", report["bad"], "--out", tmp_path)
    assert p.returncode == 0 and p.stdout.strip() == str(tmp_path / "report.html")
    md = (tmp_path / "report.md").read_text()
    assert report["ok"] in md and report["bad"] in md
    # Full BP appears twice in the table: ok in one run, failed in the other
    section = md.split("## Results", 1)[1].split("##", 1)[0]
    assert section.count("| Full BP |") == 2


def test_an_unknown_run_is_refused_and_leaves_no_folder_behind(report):
    store = report["store"]
    p = zobench("report", "--results", store.root, "--run", "no-such-run")
    assert p.returncode == 2 and "unknown run 'no-such-run'" in p.stderr and "Traceback" not in p.stderr
    assert not (store.runs / "no-such-run").exists()


def test_a_run_with_no_result_yet_is_refused_and_leaves_no_folder_behind(report):
    """A run interrupted before its first job ended: its plan, no results."""
    store = report["store"]
    run = store.runs / "20000101-000000-0000"
    run.mkdir()
    (run / "run.json").write_bytes((store.runs / report["ok"] / "run.json").read_bytes())
    p = zobench("report", "--results", store.root, "--run", run.name)
    assert p.returncode == 2 and "no result yet" in p.stderr and "--resume" in p.stderr and "Traceback" not in p.stderr
    assert not (run / "report").exists()


def test_int8_and_accuracy_tables_agree_with_the_raw_results(native, tmp_path):   # native: skipped without a C++ toolchain
    assert main(["run", "--results", str(tmp_path), "--no-report", "--runtime", "cpp", "--method", "full-zo",
                 "--method", "elastic-zo:2", "--set", "epochs=1", "--set", "train_samples=640",
                 "--set", "test_samples=128"]) == 0
    store = Store(tmp_path)
    md = (build(store, [store.latest()]).parent / "report.md").read_text()
    res = {(r["job"]["method"], r["job"]["bp_layers"], r["job"]["precision"], r["job"]["zo_loss"]): r
           for r in store.results(store.latest())}
    ms = {k: 1000 * r["train_seconds"] / r["steps"] for k, r in res.items()}
    section = md.split("## INT8 vs FP32", 1)[1].split("##", 1)[0]
    rows = {l.split("|")[1].strip(): [c.strip() for c in l.strip("|").split("|")]
            for l in section.splitlines() if l.startswith("| Full ZO") or l.startswith("| ElasticZO")}
    zo = rows["Full ZO"]
    assert zo[4] == f"{ms[('full-zo', 0, 'fp32', 'float')] / ms[('full-zo', 0, 'int8', 'float')]:.2f}"
    assert zo[5] == "allocated buffers"
    buffers = {p: res[("full-zo", 0, p, "float")]["memory"]["buffers_bytes"] for p in ("fp32", "int8")}
    assert zo[8] == f"{buffers['fp32'] / buffers['int8']:.2f}" and float(zo[9]) > 1.4
    # the binary's INT8 allocation is below Eqs. 13-15's, and the report says why
    assert float(zo[8]) > float(zo[9]) and "computes each layer into one accumulator, the largest layer's" in section
    acc = md.split("## Accuracy", 1)[1].split("##", 1)[0]
    assert "| FP32 | INT8 | INT8* |" in acc
    line = next(l for l in acc.splitlines() if l.startswith("| Full ZO"))
    assert f"{100 * res[('full-zo', 0, 'int8', 'integer')]['epochs'][-1]['test_accuracy']:.1f}" in line
    # the binary's thread pool's version is named as one, not read as a count beside the job's threads
    assert "thread pool: zobench team 1" in md and "threads zobench" not in md
    # a C++ job adds a sliver of memory to its few MiB: its whole bar still has its method's colour
    from reports import charts, report as rep
    df = rep._load(store, [store.latest()], [store.run_plan(store.latest())])
    ok, palette = rep._chart_groups(df), rep._method_palette(df)
    ax = next(a for a in charts.peak_memory(ok, palette).axes if a.get_title())
    g = ok[ok["runtime"] == "cpp"]
    assert len(ax.patches) == 2 * len(g)
    for bar, method in zip(ax.patches[:len(g)], g["mlabel"]):
        assert bar.get_facecolor()[:3] == pytest.approx(matplotlib.colors.to_rgb(palette[method]))
        assert bar.get_facecolor()[3] == pytest.approx(0.3)
    only = (build(store, [store.latest()], tmp_path / "only", methods=["full-zo"]).parent / "report.md").read_text()
    assert "Full ZO" in only and "ElasticZO" not in only
    p = zobench("report", "--results", tmp_path, "--target", "no-such-board")
    assert p.returncode == 2 and "matches --target/--method" in p.stderr and "Traceback" not in p.stderr


def test_a_report_of_two_models_never_puts_one_models_bars_beside_the_others(native, tmp_path):
    """LeNet-5 and PointNet in one report: each chart gives each model panels of its own."""
    from reports import charts, report as rep

    tiny = ["--results", str(tmp_path), "--no-report", "--method", "full-bp", "--method", "full-zo", *TINY]
    assert main(["run", *tiny]) == 0
    assert main(["run", "--suite", "quick-pointnet", *tiny, "--set", "points=32"]) == 0
    store = Store(tmp_path)
    runs = store.run_ids()
    build(store, runs)
    df = rep._load(store, runs, [store.run_plan(r) for r in runs])
    ok, palette = rep._chart_groups(df), rep._method_palette(df)
    workloads = ["lenet5/fashion-mnist", "pointnet/modelnet40-synthetic"]
    assert sorted(ok["workload"].unique()) == workloads

    fig = charts.memory(ok, palette, rep._models(df))
    rows = [[ax.get_title() for ax in fig.axes if ax.get_title().startswith(m)] for m in ("lenet5", "pointnet")]
    assert [len(r) for r in rows] == [1, 1]                  # one row of panels per model (fp32 only here)
    for (model, batch, optimizer), ax in zip(rep._models(df).values(), [ax for ax in fig.axes if ax.get_title()]):
        highest = max(memory_model.breakdown(model, m, batch, "fp32", k, optimizer).total_bytes for m, k in PAPER_CONFIGS)
        assert ax.get_ylim()[1] == pytest.approx(1.3 * highest / 2**20)     # each model on its own scale
    for make in (charts.time_breakdown, charts.peak_memory, charts.cross_device):
        titles = [ax.get_title() for ax in make(ok, palette).axes if ax.get_title()]
        assert all(sum(w in t for w in workloads) == 1 for t in titles), titles
        assert {w for w in workloads if any(w in t for t in titles)} == set(workloads)
    titles = [ax.get_title() for ax in charts.loss_curves(ok, palette).axes if ax.get_title()]
    assert sorted(titles) == sorted(f"{w}, fp32: {s} loss" for w in workloads for s in ("train", "test"))


def test_a_full_disk_leaves_no_part_of_a_report_names_the_file_and_the_run_says_a_command_that_works(tmp_path):
    """`zobench report` whose files may not pass 20 kB (RLIMIT_FSIZE, the kernel's own "File too
    large", as a full disk refuses a write): one line naming the file it could not write, that
    file not there and no temporary file left; every image there is whole. The command a run
    suggests for making its report again (running.report_again) then makes it."""
    import os
    import resource
    import shlex
    import subprocess
    import sys
    from pathlib import Path
    from testkit.compare_runs import made_up_result, made_up_run
    from testkit.runners import REPO
    from zobench.running import report_again

    store = Store(tmp_path / "res")
    run_id = made_up_run(store, [made_up_result(10.0 + i, repeat=i) for i in range(3)])
    out = tmp_path / "rep"

    def small_files():
        resource.setrlimit(resource.RLIMIT_FSIZE, (20_000, 20_000))

    p = subprocess.run([sys.executable, "-m", "zobench", "report", "--run", run_id, "--results", store.root,
                        "--out", out], cwd=REPO, capture_output=True, text=True, timeout=300, preexec_fn=small_files,
                       env={**os.environ, "PYTHONWARNINGS": "ignore::UserWarning"})   # matplotlib's on made-up data
    assert p.returncode == 2, p.stderr
    (line,) = p.stderr.strip().splitlines()
    found = re.fullmatch(rf"zobench: error: report: cannot write ({re.escape(str(out))}/\S+): File too large", line)
    assert found, line
    assert not Path(found[1]).exists() and [f.name for f in out.iterdir() if ".part-" in f.name] == []
    for f in out.glob("*.png"):
        assert f.read_bytes().endswith(b"IEND\xaeB`\x82"), f      # a PNG's last chunk: whole
    for f in out.glob("*.svg"):
        assert f.read_text().rstrip().endswith("</svg>"), f
    again = report_again(run_id, store)
    assert again.startswith("zobench report --run ")
    r = python("-m", *shlex.split(again), timeout=300)
    assert r.returncode == 0 and (store.runs / run_id / "report" / "report.html").is_file(), r.stderr
