"""Diverged and unstable runs are flagged (harness/stores/convergence.py): the judgement on made-up
epochs, the record a real job stores, and the flag beside the accuracy in `zobench results` and
the report, for a new result and for one stored before there was a record."""
import json
import random

import pytest

from harness.stores import convergence, schema
from harness.stores.store import Store
from testkit.compare_runs import made_up_result, made_up_run
from testkit.runners import cli


def result(losses, accuracies=None, **extra) -> dict:
    """A result whose epochs have these train losses and test accuracies (test loss = train loss)."""
    accuracies = accuracies or [0.5] * len(losses)
    return {"status": "ok", **extra,
            "epochs": [{"epoch": i + 1, "seconds": 1.0, "train_loss": loss, "test_loss": loss, "test_accuracy": acc}
                       for i, (loss, acc) in enumerate(zip(losses, accuracies))]}


def flags(losses, accuracies=None, **extra) -> list[str]:
    return convergence.judge(result(losses, accuracies, **extra))["flags"]


def test_the_full_zo_run_whose_loss_exploded_is_diverged():
    """A real 100-epoch Full ZO run: 2.20, 2.70, 12.5, 36.4, 50.0 ... 238; best 48.0%, ended at 19.6%."""
    losses = [2.20, 2.70, 12.5, 36.4, 50.0] + [50.0 + 188.0 * i / 95 for i in range(1, 96)]
    accs = [0.30, 0.42, 0.48, 0.40, 0.35] + [0.30] * 94 + [0.196]
    got = convergence.judge(result(losses, accs))
    assert got == {"flags": ["diverged"], "first_train_loss": 2.20, "min_train_loss": 2.20, "final_train_loss": 238.0,
                   "best_test_accuracy": 0.48, "best_epoch": 3, "final_test_accuracy": 0.196}


def test_the_elastic_zo_run_that_collapsed_is_at_least_unstable():
    """A real ElasticZO run: loss 105.8 by epoch 6, best epoch 62.5%, ended at 31.1%."""
    accs = [0.45, 0.55, 0.625, 0.60, 0.50, 0.40, 0.35, 0.311]
    assert flags([1.6, 1.2, 1.0, 4.0, 40.0, 105.8, 60.0, 45.0], accs) == ["diverged"]
    # had its loss come back below the first epoch's, the fall from its best is still flagged
    assert flags([1.6, 1.2, 1.0, 4.0, 40.0, 105.8, 3.0, 1.5], accs) == ["unstable"]
    assert flags([1.6, 1.2, 1.0, 0.9, 0.9, 0.9, 0.9, 0.9], accs) == ["unstable"]      # accuracy alone
    assert flags([1.6, 1.2, 0.4, 0.5, 0.9, 0.9], [0.5, 0.6, 0.7, 0.7, 0.68, 0.68]) == ["unstable"]     # loss alone


def test_a_healthy_run_is_not_flagged():
    assert flags([2.0, 1.2, 0.8, 0.6, 0.55, 0.52], [0.55, 0.68, 0.74, 0.78, 0.80, 0.79]) == []
    # a fine-tuned model's small loss that moves by noise
    assert flags([0.02, 0.015, 0.03], [0.99, 0.99, 0.985]) == []
    # a healthy short run's swing of accuracy between epochs (a real 3-epoch Full BP: 70.4 -> 63.4)
    assert flags([1.993, 1.152, 0.870], [0.342, 0.704, 0.634]) == []


@pytest.mark.parametrize("seed", range(5))
def test_a_noisy_run_flat_at_chance_is_not_flagged(seed):
    rng = random.Random(seed)
    losses = [2.303 + rng.uniform(-0.05, 0.05) for _ in range(20)]
    accs = [0.10 + rng.uniform(-0.03, 0.05) for _ in range(20)]
    assert flags(losses, accs) == []
    assert flags([2.27, 2.30, 2.34], [0.1, 0.12, 0.09]) == []    # ended above the first, by noise


def test_a_loss_that_was_not_finite_is_diverged():
    assert flags([2.3, None, 1.0]) == ["diverged"]
    assert flags([2.3, 2.0, None]) == ["diverged"]
    r = result([2.3, 2.0, 1.8], nonfinite=["epochs[1].test_loss: inf"])
    r["epochs"][1]["test_loss"] = None
    assert convergence.judge(r)["flags"] == ["diverged"]
    assert flags([2.3, 2.0, 1.8], nonfinite=["epochs[2].train_loss: nan"]) == ["diverged"]
    # the starting weights' loss is not training's
    assert flags([2.3, 2.0, 1.8], nonfinite=["start_eval.test_loss: inf"]) == []
    got = convergence.judge(result([2.3, 2.0, None], [0.2, 0.3, 0.1]))
    assert got["final_train_loss"] is None and got["min_train_loss"] == 2.0 and got["best_epoch"] == 2


def test_a_one_epoch_run_is_flagged_only_for_a_loss_that_was_not_finite():
    assert flags([50.0], [0.1]) == []
    assert flags([None], [0.1]) == ["diverged"]


def test_results_without_epochs_accuracies_or_a_record():
    assert convergence.judge({"status": "ok", "epochs": []}) is None
    assert convergence.judge({"status": "ok"}) is None
    # a result with no test accuracy (an epoch without eval): judged on its losses
    no_acc = {"status": "ok", "epochs": [{"epoch": 1, "train_loss": 2.0}, {"epoch": 2, "train_loss": 9.0}]}
    assert convergence.judge(no_acc) == {"flags": ["diverged"], "first_train_loss": 2.0, "min_train_loss": 2.0,
                                         "final_train_loss": 9.0, "best_test_accuracy": None, "best_epoch": None,
                                         "final_test_accuracy": None}
    # of(): the stored record, else judged now (an older result); nothing for a job that did not end ok
    old = result([2.0, 9.0])
    assert convergence.of(old)["flags"] == ["diverged"] and convergence.flag(old) == "diverged"
    stored = {**old, "convergence": {**convergence.judge(old), "flags": []}}
    assert convergence.of(stored)["flags"] == [] and convergence.flag(stored) is None
    assert convergence.of({**old, "status": "failed"}) is None
    assert convergence.annotate("0.196", "diverged", "0.480") == "0.196 diverged (best 0.480)"
    assert convergence.annotate("0.5", None, "-") == convergence.annotate("0.5", float("nan"), "-") == "0.5"


def test_the_schema_takes_a_record_and_refuses_a_malformed_one():
    r = made_up_result(10.0)
    assert schema.problems(r) == [] and schema.problems({**r, "convergence": None}) == []
    assert schema.problems({**r, "convergence": convergence.judge(r)}) == []
    record = convergence.judge(result([2.0, 9.0]))
    for bad, needle in (({**record, "flags": ["exploded"]}, "convergence needs flags"), ("diverged", "convergence needs"),
                        ({**record, "best_test_accuracy": 48.0}, "convergence.best_test_accuracy"),
                        ({**record, "final_train_loss": "big"}, "convergence.final_train_loss"),
                        ({**record, "best_epoch": -1}, "convergence.best_epoch")):
        assert any(needle in p for p in schema.problems({**r, "convergence": bad})), bad


def test_an_older_result_that_diverged_is_flagged_in_the_results_table(capsys, tmp_path):
    """A result stored before zobench judged convergence has no record: the readers judge it."""
    old = {k: v for k, v in made_up_result(10.0).items() if k != "convergence"}
    old["epochs"] = [{**old["epochs"][0], "epoch": i + 1, "train_loss": loss, "test_accuracy": acc}
                     for i, (loss, acc) in enumerate(((2.2, 0.3), (36.4, 0.48), (238.0, 0.196)))]
    store = Store(tmp_path)
    run_id = made_up_run(store, [old])
    p = cli(capsys, "results", "--results", tmp_path, "--run", run_id)
    assert p.returncode == 0 and "0.196 diverged (best 0.480)" in p.stdout
    (row,) = json.loads(cli(capsys, "results", "--results", tmp_path, "--format", "json").stdout)
    assert row["flags"] == "diverged" and row["best_test_accuracy"] == 0.48 and row["test_accuracy"] == 0.196


def test_a_real_full_zo_job_at_a_huge_learning_rate_is_recorded_and_shown_diverged(capsys, tmp_path):
    """Full ZO at lr_zo=0.05 on LeNet-5: the train loss is ~4.5e3 after the first epoch and ~4e5
    after the third (finite: the job stays ok); same seed, same numbers on every run."""
    root = tmp_path / "res"
    p = cli(capsys, "run", "--results", root, "--no-report", "--runtime", "torch", "--precision", "fp32",
            "--method", "full-zo", "--set", "lr_zo=0.05", "--set", "epochs=3", "--set", "train_samples=640",
            "--set", "test_samples=200")
    assert p.returncode == 0, p.stderr
    store = Store(root)
    (r,) = store.results(store.latest())
    assert r["status"] == "ok" and not r.get("nonfinite")
    losses = [e["train_loss"] for e in r["epochs"]]
    assert losses[-1] > 10 * losses[0] > 100, losses
    assert r["convergence"]["flags"] == ["diverged"]
    assert r["convergence"] == convergence.judge(r) and schema.problems(r) == []
    best = r["convergence"]["best_test_accuracy"]

    p = cli(capsys, "results", "--results", root)
    line = next(l for l in p.stdout.splitlines() if "full-zo" in l)
    assert f"{r['epochs'][-1]['test_accuracy']:.3f} diverged (best {best:.3f})" in line
    (row,) = json.loads(cli(capsys, "results", "--results", root, "--format", "json").stdout)
    assert row["flags"] == "diverged" and row["best_test_accuracy"] == best
    assert "flags" in cli(capsys, "results", "--results", root, "--format", "csv").stdout.splitlines()[0]

    assert cli(capsys, "report", "--results", root, "--out", tmp_path / "report").returncode == 0
    md = (tmp_path / "report" / "report.md").read_text()
    cell = f"{100 * r['epochs'][-1]['test_accuracy']:.1f} diverged (best {100 * best:.1f})"
    for section in ("Results", "Accuracy"):
        table = md.split(f"## {section}", 1)[1].split("##", 1)[0]
        assert cell in next(l for l in table.splitlines() if l.startswith("| Full ZO")), section
