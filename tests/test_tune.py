"""Per-method hyperparameters in a suite, the validation split zobench tune scores on, and the
search itself: scopes resolve most specific last and reach every runtime's update, the split
is disjoint from training, stable, the same in every runtime and checked by each, and the
search finds a known optimum and prunes what falls behind."""
import math
import tomllib

import numpy as np
import pytest

from harness.preparation import artifacts
from harness.planning import inventory, plan, suites
from harness.search import tune
from harness.errors import UserError
from harness.boards.transport import Stop
from workloads import datasets, zrng
from workloads.models import LENET5
from workloads.spec import Hyper

from testkit.runners import ORT_RUNNER, TORCH_RUNNER, cli, job_spec, run_runner, small_mnist

SCOPED = """
description = "scoped"
targets = ["local"]
runtimes = ["torch", "cpp"]
precisions = ["fp32", "int8"]
zo_losses = ["float", "integer"]
methods = ["full-zo", "elastic-zo:1", "elastic-zo:2", "full-bp"]
[workload]
model = "lenet5"
dataset = "fashion-mnist"
[hyper]
epochs = 1
train_samples = 320
test_samples = 64
lr_zo = 1e-3
[hyper.int8]
zo_scale = 4
[hyper.int8-integer]
zo_scale = 6
[hyper."full-zo".fp32]
lr_zo = 1e-4
[hyper.elastic-zo]
lr_bp = 0.01
[hyper."elastic-zo:1".int8]
zo_scale = 2
"""


@pytest.fixture
def tiny_mnist(tmp_path, monkeypatch):
    """A small MNIST (600 train, 50 test) of random pixels and labels in $ZOBENCH_DATA, each
    training image stamped with its index, and a cache of its own (artifacts.root follows HOME)."""
    def stamp(prefix, images):
        images[:, 0, :2] = np.stack([np.arange(len(images)) // 256, np.arange(len(images)) % 256], axis=1)

    return small_mnist(tmp_path, monkeypatch, 600, 50, 3, stamp)


def _jobs(tmp_path, text=SCOPED, **kw):
    path = tmp_path / "scoped.toml"
    path.write_text(text)
    jobs, _ = plan.make(suites.load(str(path)), inventory.resolve(["local"], None), **kw)
    return {j.job_id: j.spec["hyper"] for j in jobs}


def test_scoped_hyperparameters_resolve_most_specific_last_and_name_the_key(tmp_path):
    h = _jobs(tmp_path)
    assert h["local.cpp.full-zo.fp32.r0"]["lr_zo"] == 1e-4                 # the method's precision table
    assert h["local.cpp.elastic-zo-k1.fp32.r0"]["lr_zo"] == 1e-3            # [hyper]
    assert h["local.cpp.elastic-zo-k2.fp32.r0"]["lr_bp"] == 0.01            # the method's name, every K
    assert h["local.cpp.full-bp.fp32.r0"]["lr_bp"] == Hyper.lr_bp          # the default
    assert h["local.cpp.full-zo.int8-float.r0"]["zo_scale"] == 4            # the precision's table
    assert h["local.cpp.full-zo.int8-integer.r0"]["zo_scale"] == 6          # INT8*'s, over int8's
    assert h["local.cpp.elastic-zo-k1.int8-integer.r0"]["zo_scale"] == 2    # the method's over the precision's
    assert h["local.cpp.elastic-zo-k2.int8-float.r0"]["zo_scale"] == 4
    # --set over every table
    assert _jobs(tmp_path, overrides={"lr_zo": 5e-4})["local.torch.full-zo.fp32.r0"]["lr_zo"] == 5e-4
    # the job key carries what each job used, so two learning rates are never pooled
    from harness.stores.measurements import job_key
    keys = {job_key({"method": "full-zo", "hyper": h[j]})[0] for j in ("local.cpp.full-zo.fp32.r0",
                                                                       "local.cpp.elastic-zo-k1.fp32.r0")}
    assert any("lr_zo=0.0001" in k for k in keys) and len(keys) == 2


def test_a_data_sets_table_goes_over_the_suites_for_its_jobs_alone_and_tune_prints_it(tiny_mnist, tmp_path):
    """The paper tunes "for each model and dataset": one suite of two data sets holds each one's
    rates, and a tune run on one of them prints the table its value goes in."""
    text = SCOPED.replace('dataset = "fashion-mnist"', '').replace(
        'methods = [', 'datasets = ["fashion-mnist", "mnist"]\nmethods = [').replace("test_samples = 64", "test_samples = 50")
    text += '[hyper.mnist]\nlr_bp = 0.02\n[hyper.mnist."full-zo".fp32]\nlr_zo = 2e-4\n[hyper.mnist.int8-integer]\nzo_scale = 9\n'
    h = _jobs(tmp_path, text)
    assert h["local.cpp.full-zo.fp32.mnist.r0"]["lr_zo"] == 2e-4            # the data set's, over the method's
    assert h["local.cpp.full-zo.fp32.fashion-mnist.r0"]["lr_zo"] == 1e-4     # the other data set's: as before
    assert h["local.cpp.elastic-zo-k2.fp32.mnist.r0"]["lr_bp"] == 0.02       # over the method's name's
    assert h["local.cpp.elastic-zo-k2.fp32.fashion-mnist.r0"]["lr_bp"] == 0.01
    assert h["local.cpp.elastic-zo-k1.int8-integer.mnist.r0"]["zo_scale"] == 9    # over the method's precision's
    assert h["local.cpp.elastic-zo-k1.int8-integer.fashion-mnist.r0"]["zo_scale"] == 2
    record = {"method": "elastic-zo:1", "precision": "int8", "zo_loss": "float", "epochs": 2, "validation": 40,
              "dataset": "mnist", "trials": [], "data_scope": "mnist",
              "best": {"number": 0, "values": {"zo_scale": 5}, "score": 0.5}}
    lines = tune.toml_lines("20261128-000000-abcd", record)
    assert lines[1] == '[hyper.mnist."elastic-zo:1".int8-float]'
    h = _jobs(tmp_path, text + "\n".join(lines) + "\n")      # read back: mnist's INT8 job alone takes it
    assert h["local.cpp.elastic-zo-k1.int8-float.mnist.r0"]["zo_scale"] == 5
    assert h["local.cpp.elastic-zo-k1.int8-float.fashion-mnist.r0"]["zo_scale"] == 2


@pytest.mark.parametrize("table, expected", [
    ('[hyper."full-z"]\nlr_zo = 1', 'hyper.full-z: expected a hyperparameter, a precision'),
    ('[hyper."full-zo".int4]\nlr_zo = 1', 'hyper.full-zo.int4: expected a precision of the suite'),
    ('[hyper."elastic-zo:1"]\nlr_zoo = 1', 'hyper."elastic-zo:1".lr_zoo: unknown key'),
    ('[hyper."full-zo".fp32]\nlr_zo = "x"', 'hyper.full-zo.fp32.lr_zo: expected a number'),
    ('[hyper.mnist."full-zo"]\nlr_zo = 1', 'hyper.mnist: expected a hyperparameter, a precision (fp32), a method of '
                                          'the suite (full-zo, elastic-zo:1, elastic-zo:2, full-bp, elastic-zo) or one of its data '
                                          'sets (fashion-mnist)'),
    ('[hyper.fashion-mnist."full-z"]\nlr_zo = 1', 'hyper.fashion-mnist.full-z: expected a hyperparameter'),
])
def test_a_misspelt_scope_is_refused_with_its_file_and_key(tmp_path, capsys, table, expected):
    path = tmp_path / "bad.toml"
    path.write_text(SCOPED.split("[hyper.int8]")[0].replace('["fp32", "int8"]', '["fp32"]') + table + "\n")
    r = cli(capsys, "run", "--suite", path, "--results", tmp_path / "results")
    assert r.returncode == 2 and f"{path}: {expected}" in r.stderr and "Traceback" not in r.stderr


def test_a_scoped_learning_rate_drives_the_update_of_every_runtime(tmp_path, native):
    """One ZO step per runtime from the same init: the weights move by lr * g * z with the lr of
    the method's table ([hyper."full-zo".fp32] = 0.05 over [hyper] 1e-3), g the step's traced
    projected gradient and z zobench-z's normal draw for step 0."""
    (tmp_path / "s.toml").write_text(SCOPED.replace('lr_zo = 1e-4', 'lr_zo = 0.05'))
    ((job,), _) = plan.make(suites.load(str(tmp_path / "s.toml")), inventory.resolve(["local"], None),
                            methods=["full-zo"], runtimes=["torch"], precisions=["fp32"])
    hyper = {**job.spec["hyper"], "train_samples": 32, "trace_steps": 1, "warmup_steps": 0}
    assert hyper["lr_zo"] == 0.05
    init = artifacts.init_weights_file(LENET5, 0)
    theta0 = np.fromfile(init, dtype="<f4").astype(np.float64)
    z = zrng.normal(zrng.stream_key(0, zrng.STREAM_ZO, 0), 0, LENET5.params_total).astype(np.float64)
    for runtime, command in (("torch", TORCH_RUNNER), ("ort", ORT_RUNNER), ("cpp", native)):
        spec = job_spec("full-zo", 0, seed=0, steps=1, data_dir=str(artifacts.raw_idx("fashion-mnist", "").dir),
                        hyper=hyper, runtime=runtime, init_weights=str(init), save_weights=True, threads=1)
        if runtime == "ort":
            spec["onnx_model"] = str(artifacts.onnx_graph(LENET5, "full-zo", 0))
        r = run_runner(spec, tmp_path / runtime, command, check=True)
        theta1 = np.fromfile(tmp_path / runtime / "weights.bin", dtype="<f4").astype(np.float64)
        g = r["trace"][0]["grad"]
        moved = z != 0      # zobench-z's normal is a sum of four bytes: exactly 0 now and then
        lr = np.median((theta0 - theta1)[moved] / (g * z[moved]))
        assert lr == pytest.approx(0.05, rel=1e-3), runtime


def test_the_validation_split_is_disjoint_stable_and_nested(tiny_mnist):
    held = artifacts.validation_idx("mnist", "", 0.0, 100)
    assert held.dir.name.startswith("mnist-val100-")
    raw = {s: datasets.read_idx(tiny_mnist / f"train-{s}") for s in ("images-idx3-ubyte", "labels-idx1-ubyte")}
    split = {p: {s: datasets.read_idx(held.files[f"mnist/{p}-{s}"]) for s in raw} for p in ("train", "t10k")}
    out = zrng.holdout(600, 100)
    keep = np.setdiff1d(np.arange(600), out)
    for s, arr in raw.items():      # the held-out samples are the test split, the rest (in order) training
        assert np.array_equal(split["t10k"][s], arr[out]) and np.array_equal(split["train"][s], arr[keep])
    index = lambda images: set((images[:, 0, 0].astype(int) * 256 + images[:, 0, 1]).tolist())  # noqa: E731
    assert index(split["train"]["images-idx3-ubyte"]).isdisjoint(index(split["t10k"]["images-idx3-ubyte"]))
    assert len(index(split["train"]["images-idx3-ubyte"]) | index(split["t10k"]["images-idx3-ubyte"])) == 600
    assert (held.dir / "mnist" / datasets.VALIDATION_FILE).read_text() == "100\n"
    again = artifacts.validation_idx("mnist", "", 0.0, 100)     # stable: the same folder and bytes
    assert again == held and all(p.read_bytes() == held.files[r].read_bytes() for r, p in again.files.items())
    assert set(zrng.holdout(600, 40).tolist()) < set(out.tolist())     # a smaller split is part of a larger
    assert len(set(out.tolist())) == 100 and list(out) == sorted(out)
    with pytest.raises(datasets.DatasetError, match="expected fewer than its 600 training samples"):
        artifacts.validation_idx("mnist", "", 0.0, 600)


def test_every_runtime_scores_on_the_same_held_out_samples_and_refuses_another_folder(tmp_path, native):
    """The start of training evaluated on the split's test files: the same loss in every
    runtime, another than on the test set; a runner pointed at the unsplit folder refuses it."""
    split = artifacts.validation_idx("fashion-mnist", "", 0.0, 5000)
    losses = {}
    for runtime, command in (("torch", TORCH_RUNNER), ("ort", ORT_RUNNER), ("cpp", native)):
        spec = job_spec("full-zo", 0, seed=0, steps=1, data_dir=str(split.dir), test_samples=500, runtime=runtime,
                        eval_start=True, init_weights=str(artifacts.init_weights_file(LENET5, 0)), threads=1)
        spec["workload"]["validation"] = 5000
        if runtime == "ort":
            spec["onnx_model"] = str(artifacts.onnx_graph(LENET5, "full-zo", 0))
        losses[runtime] = run_runner(spec, tmp_path / runtime, command, check=True)["start_eval"]["test_loss"]
        spec["workload"]["data_dir"] = str(artifacts.raw_idx("fashion-mnist", "").dir)    # the whole sets
        r = run_runner(spec, tmp_path / f"{runtime}-unsplit", command)
        assert r["status"] == "failed" and "no validation file" in r["error"] and "validation is 5000" in r["error"]
    assert losses["ort"] == pytest.approx(losses["torch"], rel=1e-5)
    assert losses["cpp"] == pytest.approx(losses["torch"], rel=1e-5)
    test_set = run_runner(job_spec("full-zo", 0, seed=0, steps=1, test_samples=500, eval_start=True),
                          tmp_path / "test-set", TORCH_RUNNER, check=True)["start_eval"]["test_loss"]
    assert test_set != pytest.approx(losses["torch"], rel=1e-4)


def test_a_text_set_is_not_split_and_the_split_must_leave_training_samples(tmp_path):
    with pytest.raises(datasets.DatasetError, match="only image and point sets are split"):
        datasets.check_splittable("fortunes", 10)
    text = SCOPED.replace('dataset = "fashion-mnist"', 'dataset = "fashion-mnist"\nvalidation = 60000')
    with pytest.raises(UserError, match="workload.validation: expected fewer than the 60000 training samples"):
        _jobs(tmp_path, text)


def test_params_parse_with_their_scale_and_bounds():
    assert tune.Param.parse("lr_zo=1e-5:1e-2") == tune.Param("lr_zo", 1e-5, 1e-2, True)
    p = tune.Param.parse("zo_scale=1:32")
    assert p.integer and not p.log and p.grid(4) == [1, 11, 22, 32]
    assert tune.Param("lr_zo", 1e-5, 1e-1).grid(5) == [1e-5, 1e-4, 1e-3, 1e-2, 1e-1]
    for bad, why in (("lr_zo=1e-2:1e-5", "LOW < HIGH"), ("epochs=1:10", "numeric hyperparameter"),
                     ("zo_scale=1:300", "<= 127"), ("lr_zo=0:1", "both > 0 on a log scale"), ("lr_zo", "NAME=LOW")):
        with pytest.raises(UserError, match=why):
            tune.Param.parse(bad)
    assert [p.name for p in tune.default_params(suites.MethodChoice("elastic-zo", 1), "fp32")] == ["lr_zo", "lr_bp"]
    assert [p.name for p in tune.default_params(suites.MethodChoice("full-zo"), "int8")] == ["zo_scale"]
    assert tune.default_params(suites.MethodChoice("full-bp"), "int8") == []
    # a trial sees INT8's schedule changes at epochs 20 and 50, and never trains longer than the suite
    paper, quick = suites.load("paper-fmnist"), suites.load("quick")
    assert (tune.default_epochs(paper, "fp32"), tune.default_epochs(paper, "int8")) == (10, 50)
    assert (tune.default_epochs(quick, "fp32"), tune.default_epochs(quick, "int8")) == (3, 3)


def _curve(lr: float, epochs: int) -> list[float]:
    """A made-up training: accuracy rises each epoch towards a ceiling that peaks at lr = 1e-3."""
    top = 0.9 - 0.2 * (math.log10(lr) + 3) ** 2
    return [top * (1 - 0.5 ** (e + 1)) for e in range(epochs)]


@pytest.mark.parametrize("sampler", ["grid", "tpe"])
def test_the_search_finds_a_known_optimum_and_prunes_what_falls_behind(sampler):
    opts = tune.Options(suites.MethodChoice("full-zo"), params=[tune.Param("lr_zo", 1e-5, 1e-1)], trials=12,
                        epochs=6, sampler=sampler, grid_points=9, pruner="median", seed=1)
    seen = {}

    def train(entry, report):
        curve = _curve(entry["values"]["lr_zo"], opts.epochs)
        for epoch, acc in enumerate(curve, 1):
            if report(epoch, acc, 1 - acc):
                break
        seen[entry["number"]] = curve
        return "ok", [], None

    records = tune.search(opts, train)
    best = tune.best_of(records)
    assert len(records) == (9 if sampler == "grid" else 12)
    if sampler == "grid":       # the grid holds the optimum: found exactly
        assert best["values"]["lr_zo"] == pytest.approx(1e-3)
    else:                       # TPE homes in on it
        assert abs(math.log10(best["values"]["lr_zo"]) + 3) < 0.5
    pruned = [t for t in records if t["state"] == "pruned"]
    assert pruned, "a trial far from the optimum falls behind the median and is stopped"
    for t in pruned:    # stopped before its last epoch, below the median of the whole trials before it there
        e = t["pruned_at"]
        assert 2 <= e <= tune.LAST_PRUNED * opts.epochs and len(t["validation_accuracy"]) == e
        earlier = [seen[u["number"]][e - 1] for u in records[:t["number"]] if u["state"] == "complete"]
        assert t["validation_accuracy"][-1] < np.median(earlier)
    assert best["state"] == "complete" and best["score"] == max(t["score"] for t in records if t["score"] is not None)


def test_a_trial_that_did_not_converge_ranks_after_every_one_that_did():
    opts = tune.Options(suites.MethodChoice("full-zo"), params=[tune.Param("lr_zo", 1e-5, 1e-1)], trials=3,
                        epochs=1, sampler="grid", grid_points=3, pruner="none")

    def train(entry, report):     # the largest rate scores best, but its loss diverged
        report(1, 0.5 + entry["values"]["lr_zo"], 1.0)
        return "ok", ["diverged"] if entry["values"]["lr_zo"] > 0.01 else [], None

    best = tune.best_of(tune.search(opts, train))
    assert best["values"]["lr_zo"] == pytest.approx(1e-3) and best["flags"] == []


def test_a_trial_can_be_scored_by_the_mean_of_its_last_epochs():
    """A rate whose accuracy swings to a lucky last epoch wins on the last epoch alone and loses
    on the mean of the last three, which a steadier rate leads."""
    curves = {1e-4: [0.70, 0.71, 0.72, 0.72], 1e-3: [0.60, 0.65, 0.62, 0.74]}
    chosen = {}
    for n in (1, 3):
        opts = tune.Options(suites.MethodChoice("full-zo"), params=[tune.Param("lr_zo", 1e-4, 1e-3)], trials=2,
                            epochs=4, sampler="grid", grid_points=2, pruner="none", score_epochs=n)

        def train(entry, report):
            for epoch, acc in enumerate(curves[round(entry["values"]["lr_zo"], 6)], 1):
                report(epoch, acc, 1.0)
            return "ok", [], None

        best = tune.best_of(tune.search(opts, train))
        chosen[n] = best["values"]["lr_zo"], best["score"]
    assert chosen[1] == (pytest.approx(1e-3), pytest.approx(0.74))
    assert chosen[3] == (pytest.approx(1e-4), pytest.approx((0.71 + 0.72 + 0.72) / 3))
    assert tune.objective(opts) == "the mean validation accuracy of the last 3 epochs"


@pytest.mark.parametrize("args,epochs", [(["--epochs", "2", "--score-epochs", "5"], 2),
                                         (["--score-epochs", "11"], 10),                      # FP32's default 10
                                         (["--set", "epochs=30", "--epochs", "3", "--score-epochs", "4"], 3)])
def test_a_score_over_more_epochs_than_a_trial_trains_is_refused_in_one_line(tmp_path, capsys, args, epochs):
    """--score-epochs above the epochs a trial trains (--epochs, its default, whatever --set
    says): one line naming both, exit 2, no run made."""
    r = cli(capsys, "tune", "--method", "full-zo", "--results", tmp_path, *args)
    assert r.returncode == 2, r.stderr
    (line,) = r.stderr.strip().splitlines()
    assert line.startswith("zobench: error: tune --score-epochs ") and f"a trial trains {epochs} epochs" in line
    assert not (tmp_path / "runs").exists()


def test_a_stop_ends_the_search_and_a_failed_trial_is_no_score():
    opts = tune.Options(suites.MethodChoice("full-zo"), params=[tune.Param("lr_zo", 1e-5, 1e-1)], trials=5,
                        epochs=2, pruner="none")
    stop = Stop()

    def train(entry, report):
        if entry["number"] == 0:
            return "failed", [], "runner exited with code 1"
        report(1, 0.5, 1.0)
        report(2, 0.6, 0.9)
        stop.request("interrupted by SIGINT")
        return "ok", [], None

    records = tune.search(opts, train, stop)
    assert [t["state"] for t in records] == ["failed", "complete"]
    assert records[0]["error"] == "runner exited with code 1" and tune.best_of(records)["score"] == 0.6


def test_tune_runs_trials_as_jobs_and_prints_lines_a_suite_reads(tmp_path, capsys, native):
    results = tmp_path / "results"
    r = cli(capsys, "tune", "--suite", "quick", "--method", "full-zo", "--trials", "2", "--epochs", "2",
            "--validation", "500", "--set", "train_samples=320", "--set", "test_samples=200",
            "--results", results, "--target", "local-1t")
    assert r.returncode == 0, r.stderr
    lines = r.stdout.strip().splitlines()
    assert lines[0].startswith("# zobench tune run ") and lines[1] == "[hyper.full-zo.fp32]"
    chosen = tomllib.loads("\n".join(lines[1:]))["hyper"]["full-zo"]["fp32"]["lr_zo"]
    from harness.stores.store import Store
    store = Store(results)
    run_id = lines[0].split()[4].rstrip(":")
    study = store.run_plan(run_id)["tune"]
    assert [t["state"] for t in study["trials"]] == ["complete", "complete"]
    assert study["best"]["values"]["lr_zo"] == pytest.approx(chosen, rel=1e-2)
    assert study["validation"] == 500 and study["dataset"] == "fashion-mnist"
    jobs = {j["job_id"]: j for j in store.run_plan(run_id)["jobs"]}
    for t in study["trials"]:       # each trial a job on the split, scored on its held-out samples
        spec = jobs[t["job_id"]]["spec"]
        assert spec["workload"]["validation"] == 500 and spec["hyper"]["lr_zo"] == t["values"]["lr_zo"]
        result = next(x for x in store.results(run_id) if x["job"]["job_id"] == t["job_id"])
        assert [e["test_accuracy"] for e in result["epochs"]] == t["validation_accuracy"]
    # the chosen lines read back by a suite without that table: its job trains with the tuned rate
    untuned = SCOPED.replace('[hyper."full-zo".fp32]\nlr_zo = 1e-4\n', "")
    assert _jobs(tmp_path, untuned)["local.cpp.full-zo.fp32.r0"]["lr_zo"] == 1e-3
    assert _jobs(tmp_path, untuned + "\n".join(lines) + "\n")["local.cpp.full-zo.fp32.r0"]["lr_zo"] == chosen
    # a tune run is not resumed, and the search wrote its report, which charts it
    report = results / "runs" / run_id / "report"
    assert f"report: {(report / 'report.html').resolve()}" in r.stderr.splitlines()
    r = cli(capsys, "run", "--resume", run_id, "--results", results)
    assert r.returncode == 2 and "zobench tune search" in r.stderr
    md = (report / "report.md").read_text()
    assert "## Tuning" in md and f"lr_zo={chosen:.3g}" in md and (results / "runs" / run_id / "report" / "tune.png").is_file()


def test_a_subsets_validation_split_trains_on_the_subset_and_holds_out_other_training_images(tiny_mnist, tmp_path):
    """zobench tune on a fine-tuning suite: its trials train on exactly the subset the job trains
    on and are scored on as many other training images, turned alike."""
    sub, held = artifacts.subset_idx("mnist", "", 0.0, 40), artifacts.validation_idx("mnist", "", 0.0, 100, 40)
    assert held.dir.name.startswith("mnist-sub40-val100-")
    for s in ("images-idx3-ubyte", "labels-idx1-ubyte"):     # the subset's own training files, byte for byte
        assert held.files[f"mnist/train-{s}"].read_bytes() == sub.files[f"mnist/train-{s}"].read_bytes()
    index = lambda images: (images[:, 0, 0].astype(int) * 256 + images[:, 0, 1]).tolist()  # noqa: E731
    inside = index(datasets.read_idx(held.files["mnist/train-images-idx3-ubyte"]))
    out = index(datasets.read_idx(held.files["mnist/t10k-images-idx3-ubyte"]))
    assert inside == zrng.holdout(600, 40, artifacts.SUBSET_SEEDS["train"]).tolist()
    assert len(out) == 100 and out == sorted(out) and set(out).isdisjoint(inside)
    assert out == zrng.holdout(600, 100, exclude=np.array(inside)).tolist()
    assert set(zrng.holdout(600, 50, exclude=np.array(inside)).tolist()) < set(out)     # nested, as every draw
    assert [(held.dir / "mnist" / f).read_text() for f in (datasets.SUBSET_FILE, datasets.VALIDATION_FILE)] == \
        ["40\n", "100\n"]
    turned = artifacts.validation_idx("mnist", "", 30.0, 100, 40)     # the same images, turned
    assert turned.dir.name.startswith("mnist-rot30-sub40-val100-")
    assert np.array_equal(datasets.read_idx(turned.files["mnist/t10k-images-idx3-ubyte"]),
                          artifacts.rotate_images(datasets.read_idx(held.files["mnist/t10k-images-idx3-ubyte"]), 30.0))
    with pytest.raises(datasets.DatasetError, match="expected at most the 560 training samples outside its subset of 40"):
        artifacts.validation_idx("mnist", "", 0.0, 561, 40)
    text = SCOPED.replace('dataset = "fashion-mnist"', 'dataset = "fashion-mnist"\nsubset = 1000\nvalidation = 59001')
    with pytest.raises(UserError, match="expected at most the 59000 training samples of fashion-mnist outside its "
                                        "subset of 1000, got 59001"):
        _jobs(tmp_path, text)


FINETUNE = """
description = "fine-tuning, tuned"
targets = ["local"]
runtimes = ["cpp"]
precisions = ["fp32"]
methods = ["full-zo", "full-bp"]
datasets = ["mnist"]
rotations = [30, 45]
[workload]
model = "lenet5"
subset = 40
[hyper]
epochs = 2
batch_size = 8
[pretrain]
target = "local-1t"
runtime = "cpp"
method = "full-bp"
[pretrain.fp32]
epochs = 1
lr_bp = 0.01
"""


def test_tune_fine_tunes_every_trial_from_one_pretraining_reused_only_at_a_clean_commit(
        tiny_mnist, tmp_path, capsys, monkeypatch, native):
    from harness.stores.store import Store
    suite, results = tmp_path / "finetune.toml", tmp_path / "results"
    suite.write_text(FINETUNE)
    store = Store(results)

    def tune_run(method: str, param: str, commit: str):
        monkeypatch.setattr(plan, "harness_commit", lambda: commit)     # the code the jobs name
        r = cli(capsys, "tune", "--no-report", "--suite", suite, "--method", method, "--dataset", "mnist-rot45", "--trials", "2",
                "--sampler", "grid", "--grid-points", "2", "--param", param, "--target", "local-1t",
                "--results", results)
        assert r.returncode == 0, r.stderr
        run_id = r.stdout.split()[4].rstrip(":")
        study, jobs = store.run_plan(run_id)["tune"], store.run_plan(run_id)["jobs"]
        got = {x["job"]["job_id"]: x for x in store.results(run_id)}
        return run_id, study, jobs, got

    first, study, jobs, got = tune_run("full-zo", "lr_zo=1e-4:1e-3", "abc123")
    assert study["dataset"] == "mnist-rot45" and study["validation"] == 40     # as many as the job tests on
    pre = jobs[0]["spec"]       # the suite's own pretraining job: the whole unrotated set
    assert pre["save_weights"] and pre["workload"]["rotate"] == 0
    assert pre["workload"]["subset"] == 0 and pre["workload"]["validation"] == 0
    sha = got[jobs[0]["job_id"]]["model"]["weights_sha256"]
    starts = set()
    for t in study["trials"]:
        assert t["state"] == "complete"
        r = got[t["job_id"]]
        spec = r["job"]
        assert spec["pretrained_from"] == jobs[0]["job_id"] and spec["init_sha256"] == sha
        assert (spec["workload"]["rotate"], spec["workload"]["subset"], spec["workload"]["validation"]) == (45, 40, 40)
        starts.add(r["start_eval"]["test_loss"])
    assert len(starts) == 1      # every trial starts from the same network on the same held-out images
    second, study2, _, got2 = tune_run("full-bp", "lr_bp=1e-3:1e-2", "abc123")
    assert study2["pretrain"]["reused_from"] == first and "reused_from" not in study["pretrain"]
    assert {got2[t["job_id"]]["start_eval"]["test_loss"] for t in study2["trials"]} == starts
    assert {got2[t["job_id"]]["job"]["init_sha256"] for t in study2["trials"]} == {sha}
    _, study3, _, _ = tune_run("full-bp", "lr_bp=1e-3:1e-2", "abc123-dirty")      # not what a commit names
    assert "reused_from" not in study3["pretrain"] and study3["pretrain"]["status"] == "ok"


def test_a_search_whose_pretraining_cannot_end_runs_no_trial_and_says_why(tiny_mnist, tmp_path):
    from harness.stores.store import Store
    suite = tmp_path / "finetune.toml"
    suite.write_text(FINETUNE)
    stop = Stop()
    stop.request("interrupted by SIGINT")
    (target,) = inventory.resolve(["local-1t"], None)
    opts = tune.Options(suites.MethodChoice.parse("full-zo"), params=[tune.Param("lr_zo", 1e-4, 1e-3)], epochs=2)
    outcome = tune.run(Store(tmp_path / "results"), suites.load(str(suite)), target, opts, stop)
    assert outcome.record["trials"] == [] and outcome.record["best"] is None
    assert outcome.interrupted.startswith("its pretraining job pretrain.local-1t.cpp.full-bp.fp32.mnist ended interrupted")
