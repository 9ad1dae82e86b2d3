"""The quick suite's four methods on real Fashion-MNIST (a 2000-sample subset, 3 epochs)."""
import csv
import io
import json

import pytest

from harness.stores import schema

from testkit.runners import zobench

KEYS = ["full-bp", "full-zo", "elastic-zo-k1", "elastic-zo-k2"]


def test_all_four_methods_run_ok_and_follow_the_schema(quick_run):
    assert quick_run["rc"] == 0
    assert sorted(quick_run["results"]) == sorted(KEYS)
    for r in quick_run["results"].values():
        assert r["status"] == "ok" and schema.problems(r) == []
        assert r["steps"] == 3 * (2000 // 32)
        assert r["model"]["params_total"] == 107_786


@pytest.mark.parametrize("key", KEYS)
def test_every_methods_loss_goes_down(quick_run, key):
    epochs = quick_run["results"][key]["epochs"]
    assert len(epochs) == 3
    assert epochs[-1]["train_loss"] < epochs[0]["train_loss"]
    assert epochs[-1]["test_loss"] < epochs[0]["test_loss"]


def test_full_bp_ends_lower_than_full_zo_and_elastic_zo_in_between(quick_run):
    final = {k: r["epochs"][-1] for k, r in quick_run["results"].items()}
    assert final["full-bp"]["train_loss"] < final["full-zo"]["train_loss"]
    assert final["full-bp"]["test_accuracy"] > final["full-zo"]["test_accuracy"]
    # training the head by BP helps ZO (ElasticZO's claim), on this small budget too
    assert final["elastic-zo-k2"]["train_loss"] < final["full-zo"]["train_loss"]


@pytest.mark.parametrize("key", KEYS)
def test_phases_sum_to_train_seconds_and_match_the_algorithm(quick_run, key):
    r = quick_run["results"][key]
    phases, steps = r["phases"], r["steps"]
    assert sum(p["seconds"] for n, p in phases.items() if n != "eval") == pytest.approx(r["train_seconds"], rel=0.02)
    for e in r["epochs"]:
        assert sum(p["seconds"] for n, p in e["phases"].items() if n != "eval") == pytest.approx(e["seconds"], rel=0.02)
    calls = {n: p["calls"] for n, p in phases.items()}
    zo, head = key != "full-bp", key != "full-zo"
    assert calls["data"] == steps
    assert calls["forward"] == calls["loss"] == (2 if zo else 1) * steps
    assert calls["zo_perturb"] == (2 * steps if zo else 0) and calls["zo_update"] == (steps if zo else 0)
    assert calls["backward"] == calls["bp_update"] == (steps if head else 0)
    assert calls["eval"] == 3


def test_memory_and_split_are_recorded(quick_run):
    bp_params = {"full-bp": 107_786, "full-zo": 0, "elastic-zo-k1": 850, "elastic-zo-k2": 11_014}
    for key, r in quick_run["results"].items():
        assert r["model"]["params_bp"] == bp_params[key]
        assert r["model"]["params_zo"] == 107_786 - bp_params[key]
        assert r["memory"]["peak_rss_bytes"] >= r["memory"]["baseline_rss_bytes"] > 10 * 2**20


def test_results_command_formats(quick_run):
    root, run_id = quick_run["store"].root, quick_run["run_id"]
    p = zobench("results", "--results", root, "--format", "csv")
    assert p.returncode == 0
    rows = list(csv.DictReader(io.StringIO(p.stdout)))
    assert sorted(r["job_id"].split(".")[2] for r in rows) == sorted(KEYS)
    by_key = {r["job_id"].split(".")[2]: r for r in rows}
    bp = quick_run["results"]["full-bp"]
    assert float(by_key["full-bp"]["step_seconds"]) == pytest.approx(bp["train_seconds"] / bp["steps"])
    data = json.loads(zobench("results", "--results", root, "--run", run_id, "--format", "json").stdout)
    assert {d["status"] for d in data} == {"ok"}
    table = zobench("results", "--results", root).stdout
    assert run_id in table and "elastic-zo-k2" in table
