"""benchmarks/fig7.py: its phase groups are Alg. 1's and tile a step, and docs/cpus.md's Fig. 7
table is its committed record shown; so is the Cortex-A53 estimate's table (benchmarks/a53_estimate.py)."""
import json

import pytest

from benchmarks import a53_estimate, fig7
from benchmarks import record as records
from benchmarks.runtimes import bench_spec, paper_batches
from workloads.vocab import TRAIN_PHASES

from testkit.runners import REPO, python, run_runner

RECORD = REPO / "docs" / "fig7.json"
A53_RECORD = REPO / "docs" / "a53.json"


def test_the_groups_take_every_training_phase_once_and_a_real_steps_shares_sum_to_all_of_it(native, data_dir,
                                                                                           tmp_path):
    grouped = [p for phases in fig7.GROUPS.values() for p in phases]
    assert sorted(grouped) == sorted(TRAIN_PHASES)
    r = run_runner(bench_spec("elastic-zo", 1, 32, 6, data_dir, threads=1, precision="int8"), tmp_path, [native])
    s = fig7.shares(r)
    assert sum(s.values()) == pytest.approx(100)
    zo = r["phases"]["zo_perturb"]["seconds"] + r["phases"]["zo_update"]["seconds"]
    assert s["ZO perturb + update"] == pytest.approx(100 * zo / sum(r["phases"][p]["seconds"] for p in TRAIN_PHASES))
    assert s["backward"] > 0 and s["forward"] > s["backward"]     # ElasticZO's head trains by BP


def test_the_docs_table_is_the_committed_record_shown():
    """Every ZO configuration in each precision at the batch paper-mnist trains it at, and INT8 at
    FP32's batch too."""
    record = fig7.read(RECORD)
    configs = {"Full ZO", "ElasticZO ZO-Feat-Cls2", "ElasticZO ZO-Feat-Cls1"}
    runs = {(c, p, b) for c in configs for p, bs in paper_batches().items() for b in bs}
    assert paper_batches() == {"fp32": [32], "int8": [32, 128]}
    for rows in (record["here"], record["a53"]):
        assert sorted((r["config"], r["precision"], r["batch"]) for r in rows) == sorted(runs)
    assert fig7.table(record) in (REPO / "docs" / "cpus.md").read_text()
    shown = python(REPO / "benchmarks" / "fig7.py", "--show", str(RECORD))
    assert shown.returncode == 0 and shown.stdout.strip() == fig7.table(record)


def test_a_version_1_record_shows_as_its_rows_at_batch_32():
    """Before INT8 was timed at its own batch, a record was keyed by configuration and precision."""
    old = {"version": 1, "here": {"Full ZO": {p: {"shares": dict.fromkeys(fig7.GROUPS, 25.0), "ms_step": ms}
                                              for p, ms in (("fp32", 1.0), ("int8", 0.5))}},
           "a53": {"Full ZO": {p: {"zo_share": 3.0, "mcycles_step": c} for p, c in (("fp32", 40.0), ("int8", 30.0))}}}
    up = fig7.upgrade(old)
    assert up["version"] == 2 and {r["batch"] for r in up["here"] + up["a53"]} == {32}
    lines = fig7.table(old).splitlines()
    assert "| int8 | here | 32 | Full ZO | 25.0 | 25.0 | 25.0 | 25.0 | 2.00 |" in lines
    assert "| int8 | A53 model | 32 | Full ZO |  |  | 3.0 |  | 1.33 |" in lines
    a53 = a53_estimate.upgrade({"version": 1, "batch": 32, "ghz": 1, "rows": [{"method": "full-zo"}]})
    assert a53["version"] == 2 and a53["rows"] == [{"method": "full-zo", "batch": 32}]


def test_int8s_speed_up_is_per_sample_so_per_epoch_as_fig7s():
    """A step of 128 samples that takes twice a step of 32 is twice as fast an epoch."""
    rows = [{"config": "Full ZO", "precision": "fp32", "batch": 32, "ms_step": 1.0},
            {"config": "Full ZO", "precision": "int8", "batch": 128, "ms_step": 2.0}]
    assert records.speedup(rows[1], rows, "ms_step", "config") == "2.00"
    assert records.speedup(rows[0], rows, "ms_step", "config") == ""
    rec = {"version": 2, "ghz": 1, "rows": [
        {"method": "full-zo", "precision": p, "batch": b, "insns": 1e6, "cycles": c, "zo_insns": 0, "zo_cycles": 0,
         "params_zo": 1} for p, b, c in (("fp32", 32, 4e7), ("int8", 128, 8e7))]}
    assert a53_estimate.table(rec).splitlines()[-1].endswith("| 2.00 |")


def test_the_a53_table_is_its_committed_record_shown_and_agrees_with_fig7s():
    """Every paper configuration in both precisions, INT8 at both batches; the ZO configurations'
    shares and cycles are the ones the Fig. 7 record's A53 rows give (the same model over the same
    binary's code)."""
    record = a53_estimate.read(A53_RECORD)
    rows = {(r["method"], r["precision"], r["batch"]): r for r in record["rows"]}
    assert set(rows) == {(m, p, b) for m in ("full-bp", "full-zo", "elastic-zo:1", "elastic-zo:2")
                         for p, bs in paper_batches().items() for b in bs}
    assert a53_estimate.table(record) in (REPO / "docs" / "cpus.md").read_text()
    shown = python(REPO / "benchmarks" / "a53_estimate.py", "--show", str(A53_RECORD))
    assert shown.returncode == 0 and shown.stdout.strip() == a53_estimate.table(record)
    names = {"full-zo": "Full ZO", "elastic-zo:1": "ElasticZO ZO-Feat-Cls2", "elastic-zo:2": "ElasticZO ZO-Feat-Cls1"}
    fig = {(r["config"], r["precision"], r["batch"]): r for r in fig7.read(RECORD)["a53"]}
    for (method, p, b), r in rows.items():
        if method in names:
            assert fig[names[method], p, b]["zo_share"] == pytest.approx(100 * r["zo_cycles"] / r["cycles"], abs=0.05)
            assert fig[names[method], p, b]["mcycles_step"] == pytest.approx(r["cycles"] / 1e6, rel=1e-3)
    assert rows["full-bp", "fp32", 32]["zo_cycles"] == 0 < rows["full-zo", "fp32", 32]["zo_cycles"]
    # the ZO loops cost a step the same at any batch, so their share falls as the forward grows
    for method in names:
        small, large = rows[method, "int8", 32], rows[method, "int8", 128]
        assert large["zo_cycles"] == pytest.approx(small["zo_cycles"], rel=1e-3)
        assert large["cycles"] > 3 * small["cycles"]


@pytest.mark.parametrize("script,text,said", [
    ("fig7.py", "{", "not a record of fig7.py (JSONDecodeError"),
    ("fig7.py", '{"here": {}}', "not a record of fig7.py (KeyError: 'a53')"),
    ("a53_estimate.py", "[", "not a record of a53_estimate.py (JSONDecodeError"),
    ("a53_estimate.py", '{"ghz": 1, "rows": [{"method": "full-zo"}]}', "not a record of a53_estimate.py (KeyError: 'precision')")])
def test_a_damaged_record_is_one_line_naming_it_and_exit_2(tmp_path, script, text, said):
    bad = tmp_path / "record.json"
    bad.write_text(text)
    r = python(REPO / "benchmarks" / script, "--show", str(bad))
    assert r.returncode == 2 and r.stdout == ""
    assert r.stderr.startswith(f"{script}: {bad}: {said}") and len(r.stderr.strip().splitlines()) == 1
    assert json.loads(RECORD.read_text())["version"] == json.loads(A53_RECORD.read_text())["version"] == 2
