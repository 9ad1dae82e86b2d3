"""benchmarks/gpu_scale.py's dry run: the GPU run's whole plan on this CPU with tiny shapes. CI has
no GPU; this is what shows the script a lent GPU's few minutes go to will run through, write its
JSON, tables and Fig. 3, and keep what finished when its time runs out."""
import json
from pathlib import Path

import pytest

from harness.search.memory_model import breakdown
from workloads.models import MODELS

from testkit.runners import python

SCRIPT = Path(__file__).resolve().parent.parent / "benchmarks" / "gpu_scale.py"
PARTS = ["memory", "lenet", "hf", "profile", "residuals", "fit", "contexts"]
METHODS = {"full-bp": ("full-bp", 0, "sgd", False), "full-bp adam": ("full-bp", 0, "adam", False),
           "full-bp +ckpt": ("full-bp", 0, "sgd", True), "full-zo": ("full-zo", 0, "sgd", False),
           "elastic-zo:1": ("elastic-zo", 1, "sgd", False)}


def dry_run(out: Path, *args) -> dict:
    p = python(SCRIPT, "--dry-run", "--out", str(out), *args, cwd=Path.cwd(), timeout=600)
    assert p.returncode == 0, p.stderr
    return json.loads((out / "gpu_scale.json").read_text())


@pytest.fixture(scope="module")
def ran(tmp_path_factory):
    out = tmp_path_factory.mktemp("gpu_scale")
    return out, dry_run(out)


def test_every_part_runs_and_the_memory_model_holds_on_the_cpus_tensors(ran):
    """Each configuration's prediction is the memory model's, and on this CPU the live tensors'
    peak (the stand-in for max_memory_allocated) is within 1% of it, bf16 and FP32."""
    out, data = ran
    assert data["dry_run"] and data["left_out"] == [] and list(data["parts"]) == PARTS
    rows = data["parts"]["memory"] + data["parts"]["contexts"]
    assert {r["precision"] for r in rows} == {"bf16", "fp32"} and len({r["context"] for r in rows}) == 2
    for r in rows:
        method, k, opt, ckpt = METHODS[r["method"]]
        b = breakdown(MODELS[r["model"]], method, r["batch"], r["precision"], k, opt, r["context"], ckpt)
        assert r["predicted_bytes"] == b.peak_bytes
        assert r["status"] == "ok" and abs(r["error"]) < 0.01, r


def test_fit_walks_the_ladder_to_the_largest_model_within_the_budget(ran):
    """The answer's measured peak is within the budget and the next model up, where one was
    probed, was not; under the dry run's budget MeZO fits a larger model than Full BP."""
    _, data = ran
    ladder = sorted(data["plan"]["fit_ladder"], key=lambda n: MODELS[n].params_total)
    by = {}
    for row in data["parts"]["fit"]:
        budget, probes = row["budget_bytes"], {p["model"]: p for p in row["probes"]}
        best = probes[row["largest"]]
        assert best["status"] == "ok" and best["peak_bytes"] <= budget
        up = ladder.index(row["largest"]) + 1
        if up < len(ladder) and ladder[up] in probes:
            assert probes[ladder[up]]["status"] == "oom"
        by[row["method"]] = row["params"]
    assert by["full-zo"] > by["full-bp"]


def test_the_speed_parts_time_both_sides_and_the_outputs_are_drawn_from_the_json(ran):
    out, data = ran
    lenet = data["parts"]["lenet"]
    assert [(r["batch"], r["data"]["where"]) for r in lenet] == [(32, "host"), (32, "device")]
    for r in lenet:     # loop.train's clock: the phases tile the job's steps
        assert r["job_ms"] > 0 and r["limit_ms"] > 0 and r["ratio"] == pytest.approx(r["job_ms"] / r["limit_ms"])
        assert sum(r["phases_ms"].values()) == pytest.approx(r["job_ms"], rel=0.05) and r["phases_ms"]["forward"] > 0
    (hf,) = data["parts"]["hf"]
    assert hf["status"] == "ok" and hf["ours_ms"] > 0 and hf["hf_ms"] > 0 and hf["unfused_ms"] > 0
    assert 0 < hf["ours_peak_bytes"] and 0 < hf["hf_peak_bytes"]
    assert hf["ours_peak_bytes"] < hf["unfused_peak_bytes"]     # a ZO pass's attention holds no scores
    sides = {r["side"]: r for r in data["parts"]["profile"] if "kernels" in r}
    assert list(sides) == ["ours", "ours unfused", "hf"]
    assert all(r["kernels"] and r["us_per_step"] >= r["kernels"][0]["us"] > 0 for r in sides.values())
    (res,) = data["parts"]["residuals"]
    assert res["status"] == "ok" and res["at_peak"] is None and res["predicted_bytes"] > 0
    md = (out / "gpu_scale.md").read_text()
    assert "this CPU, a dry run" in md and "| gpt2-1m | bf16 |" in md and "Largest model within a budget" in md
    assert (out / "fig3.png").read_bytes()[:8] == b"\x89PNG\r\n\x1a\n"


def test_a_run_out_of_time_leaves_the_parts_it_did_not_start_named(tmp_path):
    data = dry_run(tmp_path, "--budget", "0")
    assert data["left_out"] == PARTS and all(not v for v in data["parts"].values())
    assert "Left out when the run's time ran out: memory, lenet, hf, profile, residuals, fit, contexts" in (
        tmp_path / "gpu_scale.md").read_text()


def test_the_docs_h200_tables_are_drawn_from_their_committed_record():
    """docs/transformers.md's tables between the gpu_scale markers are tables() of the H200 run's
    JSON committed beside it, number for number (a changed table needs a new record)."""
    import importlib.util
    import sys

    spec = importlib.util.spec_from_file_location("gpu_scale", SCRIPT)
    gpu_scale = sys.modules["gpu_scale"] = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(gpu_scale)
    record = json.loads((gpu_scale.DOC.parent / "transformers" / "gpu_scale-h200-2026-12-04.json").read_text())
    block = gpu_scale.DOC.read_text().partition(gpu_scale.BEGIN)[2].partition(gpu_scale.END)[0]
    assert block.startswith("\n" + gpu_scale.tables(record)) and "-15.1%" in block and "| 3.21x |" in block
