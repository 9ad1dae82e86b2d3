"""benchmarks/fig7.py: its phase groups are Alg. 1's and tile a step, and docs/cpus.md's Fig. 7
table is its committed record shown."""
import json

import pytest

from benchmarks import fig7
from benchmarks.runtimes import bench_spec
from workloads.vocab import TRAIN_PHASES

from testkit.runners import REPO, python, run_runner

RECORD = REPO / "docs" / "fig7.json"


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


@pytest.mark.parametrize("text,said", [("{", "not a fig7.py record (JSONDecodeError"),
                                       ('{"here": {}}', "not a fig7.py record (KeyError: 'a53')")])
def test_a_damaged_record_is_one_line_naming_it_and_exit_2(tmp_path, text, said):
    bad = tmp_path / "fig7.json"
    bad.write_text(text)
    r = python(REPO / "benchmarks" / "fig7.py", "--show", str(bad))
    assert r.returncode == 2 and r.stdout == ""
    assert r.stderr.startswith(f"fig7.py: {bad}: {said}") and len(r.stderr.strip().splitlines()) == 1
    assert json.loads(RECORD.read_text())["version"] == 1
