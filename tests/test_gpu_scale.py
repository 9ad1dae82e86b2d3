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
PARTS = ["memory", "fit", "lenet", "hf", "contexts"]
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
    assert lenet["job_ms"] > 0 and lenet["limit_ms"] > 0 and lenet["ratio"] == pytest.approx(
        lenet["job_ms"] / lenet["limit_ms"])
    (hf,) = data["parts"]["hf"]
    assert hf["status"] == "ok" and hf["ours_ms"] > 0 and hf["hf_ms"] > 0
    assert 0 < hf["ours_peak_bytes"] and 0 < hf["hf_peak_bytes"]
    md = (out / "gpu_scale.md").read_text()
    assert "this CPU, a dry run" in md and "| gpt2-1m | bf16 |" in md and "Largest model within a budget" in md
    assert (out / "fig3.png").read_bytes()[:8] == b"\x89PNG\r\n\x1a\n"


def test_a_run_out_of_time_leaves_the_parts_it_did_not_start_named(tmp_path):
    data = dry_run(tmp_path, "--budget", "0")
    assert data["left_out"] == PARTS and all(not v for v in data["parts"].values())
    assert "Left out when the run's time ran out: memory, fit, lenet, hf, contexts" in (
        tmp_path / "gpu_scale.md").read_text()
