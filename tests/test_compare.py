"""`zobench compare` and `zobench export` on real runs of the C++ binary.

This machine is shared and its speed drifts by tens of percent over minutes, so each side
is five single-repeat runs taken in turn with the other side's: the drift hits both
sides alike, and the fastest repeats of each side (the default estimate) see the difference
that is really there."""
import json
import subprocess
import sys
from statistics import median

import pytest

from harness.compare import compare as compare_measurements
from harness.measurements import Measurement

from conftest import interleaved_runs, zobench


@pytest.fixture(scope="module")
def runs(tmp_path_factory):
    """Five runs (of five repeats) each of: the code as it is, twice, and with a 20% slowdown injected."""
    root, ids = interleaved_runs(tmp_path_factory.mktemp("compare"), 5)
    return {"root": root, **{side: ",".join(v) for side, v in ids.items()}}


def compare(runs, base, cur, *extra):
    return zobench("compare", "--results", runs["root"], base, cur, *extra)


def test_a_real_20_percent_slowdown_is_a_regression_and_exits_1(runs):
    p = compare(runs, runs["base"], runs["slow"], "--format", "json")
    assert p.returncode == 1, p.stdout + p.stderr
    (v,) = json.loads(p.stdout)["verdicts"]
    assert v["status"] == "regressed" and v["metrics"]["step_time"]["significant"]
    assert not v["metrics"]["peak_memory"]["significant"]


def test_two_runs_of_the_same_code_are_unchanged_and_exit_0(runs):
    """At 10%: a same-code false alarm needs the fastest repeats of one side to stay 10% off the
    other's, through 25 interleaved samples."""
    p = compare(runs, runs["base"], runs["same"], "--threshold", "10")
    assert p.returncode == 0, p.stdout
    assert "1 unchanged" in p.stdout


def test_fail_on_change_also_fails_on_an_improvement(runs):
    p = compare(runs, runs["slow"], runs["base"], "--fail-on-change", "--format", "markdown")
    assert p.returncode == 1 and "🟢 improved" in p.stdout and p.stdout.startswith("### zobench compare")
    assert compare(runs, runs["slow"], runs["base"]).returncode == 0


def test_an_exported_baseline_compares_like_the_run_and_a_changed_fingerprint_is_not_compared(runs, tmp_path):
    first = runs["base"].split(",")[0]
    exported = tmp_path / "baseline.json"
    assert zobench("export", "--results", runs["root"], "--run", first, "--format", "pytest-benchmark",
                   "--out", exported).returncode == 0
    p = compare(runs, str(exported), first, "--format", "json")
    assert p.returncode == 0 and json.loads(p.stdout)["verdicts"][0]["status"] == "unchanged"
    doc = json.loads(exported.read_text())
    doc["benchmarks"][0]["extra_info"]["zobench"]["fingerprint"]["governor"] = "powersave"
    exported.write_text(json.dumps(doc))
    p = compare(runs, str(exported), first)
    assert p.returncode == 0 and "not comparable" in p.stdout and "governor" in p.stdout and "powersave" in p.stdout


def test_pytest_benchmark_reads_the_export(runs, tmp_path):
    out = tmp_path / "0001_zobench.json"
    assert zobench("export", "--results", runs["root"], "--run", runs["base"].split(",")[0],
                   "--format", "pytest-benchmark", "--out", out).returncode == 0
    doc = json.loads(out.read_text())
    (b,) = doc["benchmarks"]
    assert b["stats"]["rounds"] == len(b["stats"]["data"]) and b["stats"]["min"] <= b["stats"]["median"]
    p = subprocess.run([sys.executable, "-m", "pytest_benchmark", "compare", str(out),
                        "--columns", "min,median,rounds"], capture_output=True, text=True, timeout=60, cwd=tmp_path)
    assert p.returncode == 0 and "full-zo" in p.stdout, p.stdout + p.stderr


def test_csv_export_has_one_row_per_job_key(runs):
    p = zobench("export", "--results", runs["root"], "--run", runs["base"].split(",")[0], "--format", "csv")
    lines = p.stdout.strip().splitlines()
    assert p.returncode == 0 and len(lines) == 2 and lines[0].startswith("workload,method,precision")
    assert ",full-zo,fp32,cpp,solo,5," in lines[1]


def measurement(step_ms):
    return Measurement("k", {}, step_s=[t / 1e3 for t in step_ms], peak_rss=[1 << 20] * len(step_ms))


def test_the_minimum_ignores_one_sided_noise_that_moves_the_median():
    """Made-up samples, no clock: the same code, its second side measured while a neighbour was
    busy. The gate's estimates are the sides' minimums, equal here, so it sees no change; by
    the medians it would call a "regression" the Mann-Whitney test backs."""
    quiet = [1.50, 1.49, 1.51, 1.49, 1.52, 1.50, 1.80, 1.50]
    busy = [1.49, 1.81, 1.79, 1.85, 1.50, 1.83, 1.80, 1.82]
    base, cur = {"k": measurement(quiet)}, {"k": measurement(busy)}
    (v,) = compare_measurements(base, cur, 0.05, "min")
    est = v.metrics["step_time"]
    assert v.status == "unchanged" and (est.baseline, est.current) == pytest.approx((min(quiet), min(busy)))
    (v,) = compare_measurements(base, cur, 0.05, "median")
    est = v.metrics["step_time"]
    assert v.status == "regressed" and (est.baseline, est.current) == pytest.approx((median(quiet), median(busy)))
    (v,) = compare_measurements(base, {"k": measurement([1.2 * t for t in quiet])}, 0.05, "min")
    est = v.metrics["step_time"]
    assert v.status == "regressed" and est.current == pytest.approx(1.2 * est.baseline)


def test_compare_names_a_bad_baseline(runs, tmp_path):
    (tmp_path / "x.json").write_text("{}")
    p = compare(runs, str(tmp_path / "x.json"), runs["base"])
    assert p.returncode == 2 and "not a zobench pytest-benchmark export" in p.stderr and "Traceback" not in p.stderr
    p = compare(runs, "no-such-run", runs["base"])
    assert p.returncode == 2 and "neither a run id" in p.stderr
