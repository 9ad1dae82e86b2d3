"""benchmarks/fig7.py: its phase groups are Alg. 1's and tile a step, and docs/cpus.md's Fig. 7
table is its committed record shown; so is the Cortex-A53 estimate's table (benchmarks/a53_estimate.py)."""
import json

import pytest

from benchmarks import a53_estimate, fig7
from benchmarks.runtimes import bench_spec
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
    record = fig7.read(RECORD)
    assert set(record["here"]) == set(record["a53"]) == {"Full ZO", "ElasticZO ZO-Feat-Cls2", "ElasticZO ZO-Feat-Cls1"}
    assert fig7.table(record) in (REPO / "docs" / "cpus.md").read_text()
    shown = python(REPO / "benchmarks" / "fig7.py", "--show", str(RECORD))
    assert shown.returncode == 0 and shown.stdout.strip() == fig7.table(record)


def test_the_a53_table_is_its_committed_record_shown_and_agrees_with_fig7s():
    """Every paper configuration in both precisions; the ZO configurations' shares and cycles are
    the ones the Fig. 7 record's A53 rows give (the same model over the same binary's code)."""
    record = a53_estimate.read(A53_RECORD)
    rows = {(r["method"], r["precision"]): r for r in record["rows"]}
    assert set(rows) == {(m, p) for m in ("full-bp", "full-zo", "elastic-zo:1", "elastic-zo:2") for p in ("fp32", "int8")}
    assert a53_estimate.table(record) in (REPO / "docs" / "cpus.md").read_text()
    shown = python(REPO / "benchmarks" / "a53_estimate.py", "--show", str(A53_RECORD))
    assert shown.returncode == 0 and shown.stdout.strip() == a53_estimate.table(record)
    names = {"full-zo": "Full ZO", "elastic-zo:1": "ElasticZO ZO-Feat-Cls2", "elastic-zo:2": "ElasticZO ZO-Feat-Cls1"}
    fig = fig7.read(RECORD)["a53"]
    for method, name in names.items():
        for p in ("fp32", "int8"):
            r = rows[method, p]
            assert fig[name][p]["zo_share"] == pytest.approx(100 * r["zo_cycles"] / r["cycles"], abs=0.05)
            assert fig[name][p]["mcycles_step"] == pytest.approx(r["cycles"] / 1e6, rel=1e-3)
    assert rows["full-bp", "fp32"]["zo_cycles"] == 0 < rows["full-zo", "fp32"]["zo_cycles"]


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
    assert json.loads(RECORD.read_text())["version"] == json.loads(A53_RECORD.read_text())["version"] == 1
