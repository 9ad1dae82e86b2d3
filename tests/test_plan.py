"""Suites expand into the jobs of a run; the paper's setting is what the paper says."""
import re

import pytest

from harness.planning import inventory, plan, suites
from harness.stores import measurements
from harness.errors import UserError
from workloads.models import LENET5
from workloads.spec import JobSpec, SpecError

from testkit.runners import run_runner


@pytest.mark.parametrize("name,data", [("paper-fmnist", "fashion-mnist"), ("paper-mnist", "mnist")])
def test_paper_table1_suites_are_the_papers_table1_setting(name, data):
    s = suites.load(name)
    jobs, notes = plan.make(s, inventory.resolve(["local"], None), runtimes=["cpp"])
    assert notes == []
    configs = [(j.spec["method"], j.spec["bp_layers"], j.spec["precision"], j.spec["zo_loss"]) for j in jobs]
    methods = [("full-bp", 0), ("full-zo", 0), ("elastic-zo", 1), ("elastic-zo", 2)]
    assert configs == [(m, k, "fp32", "float") for m, k in methods] + \
        [(m, k, "int8", z) for z in ("float", "integer") for m, k in methods if m != "full-bp" or z == "float"]
    for j in jobs:
        h = JobSpec.from_dict(j.spec).hyper
        # Sec. 5.1.1's FP32 batch of 32; its INT8 batch was lost, and chosen on the validation split
        batch = 128 if j.spec["precision"] == "int8" else 32
        assert (h.epochs, h.batch_size, h.lr_decay, h.lr_decay_every, h.zo_grad_clip) == (100, batch, 0.8, 10, 5.0)
        assert h.train_samples == 0 and h.test_samples == 0          # the whole data set
        # Sec. 4: FP32 Full ZO and ElasticZO perturb by a standard Gaussian; INT8 by its uniform integers
        gaussian = j.spec["precision"] == "fp32" and j.spec["method"] != "full-bp"
        assert h.zo_distribution == ("gaussian" if gaussian else "irwin-hall"), j.job_id
        assert j.spec["workload"] == {"model": "lenet5", "dataset": data, "data_dir": "", "rotate": 0.0,
                                      "validation": 0, "subset": 0, "architecture": LENET5.to_dict()}


def test_filters_overrides_and_repeats():
    s = suites.load("quick")
    s.repeats = 3
    jobs, _ = plan.make(s, inventory.resolve(["local"], None), methods=["elastic-zo"], runtimes=["torch"],
                        precisions=["fp32"], overrides=plan.parse_set(["epochs=1", "lr_zo=2e-3"]), timeout_s=42)
    # round-robin over repeats: a busy minute slows one repeat of many keys, not one key
    assert [j.job_id for j in jobs] == [f"local.torch.elastic-zo-k{k}.fp32.r{r}" for r in range(3) for k in (1, 2)]
    assert {j.spec["hyper"]["epochs"] for j in jobs} == {1} and {j.timeout_s for j in jobs} == {42}
    assert {j.spec["hyper"]["lr_zo"] for j in jobs} == {2e-3}
    assert [j.spec["repeat"] for j in jobs] == [0, 0, 1, 1, 2, 2]


def test_data_set_and_zo_loss_filters_keep_ids_and_refuse_what_the_suite_lacks():
    s = suites.load("paper-finetune")     # MNIST is not here: only Fashion-MNIST's variants are planned
    local = inventory.resolve(["local-1t"], None)
    jobs, _ = plan.make(s, local, data=["fashion-mnist-rot30"], runtimes=["cpp"], precisions=["int8"],
                        zo_losses=["integer"], methods=["full-zo", "full-bp"])
    assert [j.job_id for j in jobs] == ["pretrain.local-1t.cpp.full-bp.int8.fashion-mnist",
                                        "local-1t.cpp.full-zo.int8-integer.fashion-mnist-rot30-sub1000.r0",
                                        "local-1t.cpp.full-bp.int8.fashion-mnist-rot30-sub1000.r0"]
    both, _ = plan.make(s, local, data=["fashion-mnist"], runtimes=["cpp"], precisions=["fp32"], methods=["full-zo"])
    assert [j.spec["workload"]["rotate"] for j in both[1:]] == [30.0, 45.0]    # a set's name: all its angles
    for kw, why in ((dict(data=["fashion-mnist-rot60"]), "--dataset 'fashion-mnist-rot60': the suite learns"),
                    (dict(zo_losses=["exact"]), "--zo-loss 'exact': expected one of float, integer")):
        with pytest.raises(UserError, match=why):
            plan.make(s, local, **kw)


def test_combinations_a_runtime_cannot_run_are_left_out_with_the_reason():
    s = suites.load("quick")
    jobs, notes = plan.make(s, inventory.resolve(["local"], None))
    assert len(jobs) == 25
    assert not any(j.spec["runtime"] == "ort" and j.spec["precision"] == "int8" for j in jobs)
    assert "full-zo int8 on ort: the ort runtime has no int8 training" in notes
    assert "full-bp fp32 on ort: the ort runtime cannot train full-bp: ONNX Runtime runs forward passes " \
           "only, by design (use torch or cpp for full-bp)" in notes
    with pytest.raises(UserError, match="ort runtime cannot train full-bp: ONNX Runtime runs forward passes only"):
        plan.make(s, inventory.resolve(["local"], None), runtimes=["ort"], methods=["full-bp"])
    with pytest.raises(UserError, match="the plan has no job: .*the ort runtime has no int8 training"):
        plan.make(s, inventory.resolve(["local"], None), runtimes=["ort"], precisions=["int8"])


def test_quick_suite_runs_every_method_on_torch_and_cpp_and_the_zo_methods_on_ort_here():
    jobs, _ = plan.make(suites.load("quick"), inventory.resolve(["local"], None), precisions=["fp32"])
    assert sorted((j.spec["runtime"], j.spec["method"], j.spec["bp_layers"]) for j in jobs) == sorted(
        (r, m, k) for r in ("torch", "cpp", "ort") for m, k in
        (("full-bp", 0), ("full-zo", 0), ("elastic-zo", 1), ("elastic-zo", 2)) if (r, m) != ("ort", "full-bp"))


def test_quick_suite_has_the_int8_jobs_on_torch_and_cpp_with_both_zo_losses():
    jobs, _ = plan.make(suites.load("quick"), inventory.resolve(["local"], None), precisions=["int8"])
    keys = sorted((j.spec["runtime"], j.spec["method"], j.spec["bp_layers"], j.spec["zo_loss"]) for j in jobs)
    zo = [("full-zo", 0), ("elastic-zo", 1), ("elastic-zo", 2)]
    assert keys == sorted([(r, "full-bp", 0, "float") for r in ("torch", "cpp")] +
                          [(r, m, k, zl) for r in ("torch", "cpp") for m, k in zo for zl in ("float", "integer")])
    assert len({j.job_id for j in jobs}) == len(jobs)
    # full-bp computes no ZO loss: its job id, like its compare key, names none
    assert sorted(j.job_id for j in jobs if j.spec["method"] == "full-bp") == [
        "local.cpp.full-bp.int8.r0", "local.torch.full-bp.int8.r0"]
    assert all(j.job_id.split(".")[3] == measurements.job_key(j.spec)[1]["precision"] for j in jobs)


def test_a_suite_of_integer_zo_loss_only_keeps_both_full_bp_jobs():
    """full-bp computes no ZO loss: it runs once per precision whatever zo_losses holds."""
    s = suites.load("quick")
    s.zo_losses = ["integer"]
    jobs, notes = plan.make(s, inventory.resolve(["local"], None), runtimes=["torch"])
    assert notes == []
    assert sorted((j.spec["method"], j.spec["bp_layers"], j.spec["precision"], j.spec["zo_loss"]) for j in jobs) == sorted(
        [("full-bp", 0, "fp32", "float"), ("full-bp", 0, "int8", "integer")] +
        [(m, k, p, "float" if p == "fp32" else "integer")
         for m, k in (("full-zo", 0), ("elastic-zo", 1), ("elastic-zo", 2)) for p in ("fp32", "int8")])


def test_every_combination_is_a_job_or_a_note_with_the_reason(tmp_path):
    """On a CUDA target with a data set the C++ binary cannot read: nothing leaves the plan
    without a note naming the method, precision and runtime."""
    inv = tmp_path / "inventory.toml"
    inv.write_text('[targets.gpu]\nprofile = "local"\ndevice = "cuda"\n')
    s = suites.load("quick")
    s.workload = {"dataset": "digits"}
    jobs, notes = plan.make(s, inventory.resolve(["gpu"], inv), overrides={"train_samples": 1000, "test_samples": 300})
    # torch trains both precisions on a GPU; int8 once per ZO loss, full-bp once
    assert sorted((j.spec["runtime"], j.spec["method"], j.spec["precision"]) for j in jobs) == sorted(
        [("torch", m, "fp32") for m in ("full-bp", "full-zo", "elastic-zo", "elastic-zo")] +
        [("torch", "full-bp", "int8")] + [("torch", m, "int8") for m in ("full-zo", "elastic-zo", "elastic-zo")] * 2)
    assert "full-zo fp32 on cpp: the cpp runtime reads mnist, fashion-mnist, modelnet40 and " \
           "modelnet40-synthetic, not digits" in notes
    assert "full-zo fp32 on ort: the ort runtime trains fp32 on cpu, not cuda" in notes
    for runtime in s.runtimes:
        for precision in s.precisions:
            for m in s.methods:
                if not any((j.spec["runtime"], j.spec["method"], j.spec["bp_layers"], j.spec["precision"]) ==
                           (runtime, m.method, m.bp_layers, precision) for j in jobs):
                    assert any(n.startswith(f"{m} {precision} on {runtime}: ") for n in notes), (m, precision, runtime)


def test_job_ids_and_target_names_that_would_be_paths_are_refused_by_the_spec():
    """A job id names its folder on the board: a plan's ids pass the spec, a path never does."""
    jobs, _ = plan.make(suites.load("quick"), inventory.resolve(["local"], None))
    assert [JobSpec.from_dict(j.spec).job_id for j in jobs] == [j.job_id for j in jobs]
    for key, bad in (("job_id", "../../x"), ("job_id", ".."), ("target", "a/b"), ("target", "..")):
        with pytest.raises(SpecError, match=f"^{key}: expected a .*, got '{re.escape(bad)}'$"):
            JobSpec.from_dict({"job_id": "j", "method": "full-zo", key: bad})


@pytest.mark.slow
def test_full_bp_one_epoch_on_all_of_fashion_mnist_reaches_80_percent(tmp_path):
    r = run_runner({"job_id": "paper", "method": "full-bp", "hyper": {"epochs": 1}}, tmp_path)
    assert r["status"] == "ok" and r["steps"] == 60_000 // 32
    assert r["epochs"][0]["test_accuracy"] > 0.80


def test_the_plan_leaves_out_a_model_the_cpp_binary_cannot_run_with_the_reason():
    """A description models.py accepts but the binary refuses (a conv2d padded wider than
    kernel - 1): the cpp jobs become notes naming the layer, the other runtimes keep theirs."""
    wide = LENET5.to_dict()
    wide["name"] = "lenet5-wide-pad"
    wide["layers"][2]["weight_shape"] = [120, 16 * 8 * 8]      # conv1 padded by 5 gives 16 x 8 x 8 to fc1
    wide["layers"][0]["padding"] = 5
    s = suites.load("quick")
    s.workload = {**s.workload, "model": "lenet5-wide-pad", "architecture": wide}
    jobs, notes = plan.make(s, inventory.resolve(["local"], None), precisions=["fp32"])
    assert {j.spec["runtime"] for j in jobs} == {"torch", "ort"}
    assert "full-zo fp32 on cpp: the cpp runtime cannot run lenet5-wide-pad: layer conv1: it runs a conv2d " \
           "padding of at most kernel - 1, not 5" in notes
    with pytest.raises(UserError, match="the plan has no job: .*cpp runtime cannot run lenet5-wide-pad: layer conv1"):
        plan.make(s, inventory.resolve(["local"], None), runtimes=["cpp"])
