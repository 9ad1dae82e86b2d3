"""The C++ binary against the torch runner, natively and as the aarch64 build under qemu."""
import copy
import dataclasses
import json
import os
import struct
import subprocess

import numpy as np
import pytest

from harness.stores import schema
from harness.preparation.artifacts import raw_idx
from workloads.models import LENET5, POINTNET
from workloads import models, support, vocab
from workloads.spec import Hyper
from workloads.vocab import PAPER_CONFIGS

from testkit.agreement import assert_buffers_follow_the_model, assert_same_fp32_steps, assert_same_int8_run
from testkit.runners import QEMU_A53, job_spec, run_runner


def spec(method, k, data_dir, steps=60):
    return job_spec(method, k, seed=3, steps=steps, data_dir=data_dir)


@pytest.mark.parametrize("method,k", PAPER_CONFIGS)
def test_binary_matches_torch_step_for_step(native, data_dir, tmp_path, method, k):
    s = spec(method, k, data_dir)
    t = run_runner(s, tmp_path / "torch")
    c = run_runner(s, tmp_path / "cpp", native)
    assert t["status"] == c["status"] == "ok", c["error"]
    assert len(t["trace"]) == len(c["trace"]) == 60
    lt, lc = (np.array([x["loss"] for x in r["trace"]]) for r in (t, c))
    np.testing.assert_allclose(lc, lt, rtol=1e-4)
    assert lt[-1] < lt[0]
    if method != "full-bp":
        gt, gc = (np.array([x["grad"] for x in r["trace"]]) for r in (t, c))
        np.testing.assert_allclose(gc, gt, rtol=0, atol=5e-3 + 1e-2 * np.abs(gt).max())
        assert np.corrcoef(gt, gc)[0, 1] > 0.9999
    assert abs(t["epochs"][0]["test_accuracy"] - c["epochs"][0]["test_accuracy"]) <= 2 / 256
    assert_buffers_follow_the_model(c)


def test_binary_result_follows_the_schema(native, data_dir, tmp_path):
    r = run_runner(spec("elastic-zo", 2, data_dir, steps=20), tmp_path, native)
    assert schema.problems(r) == [] and r["schema"] == vocab.RESULT_SCHEMA
    assert r["model"]["params_total"] == 107_786 and r["model"]["params_bp"] == 11_014
    train = sum(p["seconds"] for name, p in r["phases"].items() if name != "eval")
    assert train == pytest.approx(r["train_seconds"], rel=0.02)
    assert r["phases"]["backward"]["calls"] == r["steps"] == 20
    assert r["memory"]["peak_rss_bytes"] >= r["memory"]["baseline_rss_bytes"] > 0
    assert r["warmup"] == {"steps": 0, "seconds": 0.0}      # no hyper.warmup_steps: none
    assert r["energy"] == NO_ENERGY
    loop = r["timed_loop_load"]     # as the Python runners measure it (test_runner.py)
    assert loop["wall_seconds"] == pytest.approx(r["train_seconds"], abs=1e-6)
    assert loop["cores"] == os.sysconf("SC_NPROCESSORS_ONLN") and loop["cpu_seconds_other"] >= 0
    bad = copy.deepcopy(r)
    bad["memory"]["buffer_parts"]["errors"] = -1
    bad["timed_loop_load"]["cpu_seconds_other"] = -1.0
    assert schema.problems(bad) == ["memory.buffer_parts.errors: -1 is not an integer >= 0",
                                    "timed_loop_load.cpu_seconds_other: -1.0 is not a finite number >= 0"]
    bad["timed_loop_load"] = {"cores": 0}
    assert schema.problems(bad)[-1] == "timed_loop_load needs cores (an integer >= 1)"


NO_ENERGY = {"source": None, "joules": None, "joules_per_step": None, "avg_power_w": None,
             "unavailable": "the C++ runner reads no power meter"}


def test_binary_reports_a_missing_dataset_in_its_result(native, tmp_path):
    s = spec("full-zo", 0, str(tmp_path / "nowhere"), steps=5)
    s["workload"]["dataset"] = "mnist"
    r = run_runner(s, tmp_path, native)
    assert r["status"] == "failed" and "train-images-idx3-ubyte not found" in r["error"]


def elf_facts(path) -> tuple[int, bool]:
    """(e_machine, has a program interpreter) of an ELF64 file."""
    data = open(path, "rb").read()
    e_machine = struct.unpack_from("<H", data, 18)[0]
    phoff, phentsize, phnum = struct.unpack_from("<Q", data, 32)[0], *struct.unpack_from("<HH", data, 54)
    interp = any(struct.unpack_from("<I", data, phoff + i * phentsize)[0] == 3 for i in range(phnum))
    return e_machine, interp


def test_aarch64_build_is_static_and_agrees_under_qemu_cortex_a53(native, aarch64, data_dir, tmp_path):
    assert elf_facts(aarch64) == (183, False)         # EM_AARCH64, statically linked
    s = spec("elastic-zo", 1, data_dir, steps=15)
    arm = run_runner(s, tmp_path / "arm", [*QEMU_A53, aarch64])
    x86 = run_runner(s, tmp_path / "x86", native)
    assert arm["status"] == "ok" and schema.problems(arm) == []
    assert arm["env"]["arch"] == "aarch64"
    la, lx = (np.array([x["loss"] for x in r["trace"]]) for r in (arm, x86))
    np.testing.assert_allclose(la, lx, rtol=1e-5)


def test_runtimes_of_a_run_start_from_the_same_weights_file(tmp_path):
    """The harness writes the initial weights once; with a zero learning rate Full BP leaves
    them untouched, so both runtimes must end with the file's exact bytes."""
    import hashlib
    from zobench.cli import main
    from harness.stores.store import Store

    assert main(["run", "--results", str(tmp_path), "--no-report", "--method", "full-bp", "--precision", "fp32",
                 "--set", "epochs=1", "--set", "train_samples=64", "--set", "test_samples=32", "--set", "lr_bp=0"]) == 0
    store = Store(tmp_path)
    results = {r["job"]["runtime"]: r for r in store.results(store.latest())}
    assert set(results) == {"torch", "cpp"}
    init = {r["job"]["init_weights"] for r in results.values()}
    assert len(init) == 1
    digest = hashlib.sha256(open(init.pop(), "rb").read()).hexdigest()
    assert results["torch"]["model"]["weights_sha256"] == results["cpp"]["model"]["weights_sha256"] == digest
    assert results["cpp"]["env"]["binary_sha256"] and results["torch"]["env"]["binary_sha256"] is None


# ---- PointNet, which the binary knows only from its description ----

INT8_CONFIGS = [("full-bp", 0, "float"), ("full-zo", 0, "integer"), ("elastic-zo", 1, "float"),
                ("elastic-zo", 2, "integer")]


@pytest.fixture(scope="module")
def points_dir():
    return str(raw_idx("modelnet40-synthetic", "").dir)


def small_spec(model, method, k, data_dir, precision="fp32", zo_loss="float"):
    """A few steps on 32 points of a few synthetic clouds, at the learning rates of its suite
    (quick-pointnet.toml)."""
    return job_spec(method, k, seed=5, steps=6, batch=4, test_samples=16, data_dir=data_dir, model=model,
                    dataset="modelnet40-synthetic", hyper={"points": 32, "lr_bp": 0.01, "lr_zo": 1e-4},
                    precision=precision, zo_loss=zo_loss)


@pytest.mark.parametrize("method,k", PAPER_CONFIGS)
def test_pointnet_matches_torch_step_for_step(native, points_dir, tmp_path, method, k):
    s = small_spec(POINTNET, method, k, points_dir)
    c = run_runner(s, tmp_path / "cpp", native)
    assert_same_fp32_steps(run_runner(s, tmp_path / "torch"), c, 6)
    assert c["model"]["params_total"] == POINTNET.params_total
    assert_buffers_follow_the_model(c)


@pytest.mark.parametrize("config", INT8_CONFIGS, ids=lambda c: "-".join(map(str, c)))
def test_pointnet_is_bit_exact_in_int8(native, points_dir, tmp_path, config):
    s = small_spec(POINTNET, *config[:2], points_dir, "int8", config[2])
    c = run_runner(s, tmp_path / "cpp", native)
    assert_same_int8_run(run_runner(s, tmp_path / "torch"), c)
    assert_buffers_follow_the_model(c)


def test_aarch64_build_runs_pointnet_under_qemu_cortex_a53(aarch64, points_dir, tmp_path):
    """FP32 step for step with torch and INT8 bit for bit with the reference, on the aarch64
    kernels (NEON) instead of the x86 ones."""
    s = small_spec(POINTNET, "elastic-zo", 1, points_dir)
    arm = run_runner(s, tmp_path / "arm", [*QEMU_A53, aarch64])
    assert arm["env"]["arch"] == "aarch64" and schema.problems(arm) == []
    assert_same_fp32_steps(run_runner(s, tmp_path / "torch"), arm, 6)
    s = small_spec(POINTNET, "elastic-zo", 2, points_dir, "int8", "integer")
    warm = with_warmup(s, 2)       # the warm-up restores the weights on the aarch64 build too
    assert_same_int8_run(run_runner(s, tmp_path / "torch8"), run_runner(warm, tmp_path / "arm8", [*QEMU_A53, aarch64]))


@pytest.mark.parametrize("change,error", [
    (lambda w: w.pop("architecture"), "workload.architecture: missing"),
    (lambda w: w["architecture"]["layers"][0].update(kind="conv3d"),
     "workload.architecture: layer conv1: kind 'conv3d' is not one this binary runs (conv2d, fc, pointwise)"),
    (lambda w: w["architecture"].update(init="xavier"),
     "workload.architecture: init 'xavier' is not one this binary draws (pytorch, he)"),
])
def test_binary_refuses_a_spec_without_a_model_it_can_run(native, data_dir, tmp_path, change, error):
    s = spec("full-zo", 0, data_dir, steps=5)
    change(s["workload"])
    r = run_runner(s, tmp_path, native)
    assert r["status"] == "failed" and r["error"].startswith(error), r["error"]
    assert r["steps"] == 0 and r["model"] is None


def _wide_padding(d):
    d["layers"][0]["padding"] = 5
    d["layers"][2]["weight_shape"] = [120, 16 * 8 * 8]     # conv1 padded by 5 gives 16 x 8 x 8 to fc1


def _four_coordinates(d):
    d["input_shape"] = [1024, 4]
    d["layers"][0]["weight_shape"] = [64, 4]


def _many_classes(d):
    d["classes"] = 1025
    d["layers"][-1]["weight_shape"] = [1025, 84]


@pytest.mark.parametrize("base,change,binary_says", [
    (LENET5, _wide_padding, "layer conv1: this binary runs a conv2d padding of 0 to kernel - 1"),
    (POINTNET, _four_coordinates, "a point cloud's points have 3 coordinates"),
    (LENET5, _many_classes, "classes: expected 2..1024"),
])
def test_the_plans_rules_for_the_binary_are_the_binarys(native, data_dir, tmp_path, base, change, binary_says):
    """support.cpp_refuses is the plan's copy of the binary's parse_arch: a description models.py
    accepts and the plan leaves out of a cpp plan, the binary refuses too."""
    d = base.to_dict()
    change(d)
    assert support.cpp_refuses(models.from_dict(d)) is not None
    s = spec("full-zo", 0, data_dir, steps=5)
    s["workload"].update(model=d["name"], architecture=d)
    r = run_runner(s, tmp_path, native)
    assert r["status"] == "failed" and r["error"] == f"workload.architecture: {binary_says}", r["error"]


# ---- untimed warm-up steps (hyper.warmup_steps): outside every number, the weights restored ----

def with_warmup(s: dict, n: int) -> dict:
    s = copy.deepcopy(s)
    s["hyper"]["warmup_steps"] = n
    return s


def expected_calls(method: str, steps: int) -> dict:
    """Each phase's laps in one epoch of `steps` steps: two perturbed passes a ZO step, one a BP step."""
    zo, bp = method != "full-bp", method != "full-zo"
    passes = 2 if zo else 1
    return {"data": steps, "zo_perturb": 2 * steps * zo, "forward": passes * steps, "loss": passes * steps,
            "backward": steps * bp, "zo_update": steps * zo, "bp_update": steps * bp, "eval": 1}


WARMUP_CONFIGS = [(LENET5, "fp32", "full-zo", 0, "float"), (LENET5, "fp32", "elastic-zo", 1, "float"),
                  (LENET5, "fp32", "full-bp", 0, "float"), (LENET5, "int8", "full-bp", 0, "float"),
                  (LENET5, "int8", "elastic-zo", 2, "integer"), (POINTNET, "int8", "elastic-zo", 1, "float"),
                  (POINTNET, "fp32", "elastic-zo", 2, "float")]


@pytest.mark.parametrize("model,precision,method,k,zo_loss", WARMUP_CONFIGS,
                         ids=lambda c: getattr(c, "name", str(c)))
def test_warmup_leaves_the_training_bit_identical(native, data_dir, points_dir, tmp_path, model, precision, method, k,
                                                  zo_loss):
    """Three warm-up steps on epoch 0's first batch, then the saved weights restored: the same
    trace and final weights to the bit as without them, and none of it in the phases or steps."""
    if model is LENET5:
        s = job_spec(method, k, seed=3, steps=5, test_samples=32, data_dir=data_dir, precision=precision,
                     zo_loss=zo_loss)
    else:
        s = small_spec(model, method, k, points_dir, precision, zo_loss)
    steps = s["hyper"]["trace_steps"]
    cold = run_runner(with_warmup(s, 0), tmp_path / "cold", native, check=True)
    warm = run_runner(with_warmup(s, 3), tmp_path / "warm", native, check=True)
    assert schema.problems(warm) == []
    assert warm["model"]["weights_sha256"] == cold["model"]["weights_sha256"]
    assert warm["trace"] == cold["trace"] and len(warm["trace"]) == steps    # losses, gradients, signs: exactly
    for key in ("train_loss", "test_loss", "test_accuracy"):
        assert warm["epochs"][0][key] == cold["epochs"][0][key]
    assert cold["warmup"] == {"steps": 0, "seconds": 0.0}
    assert warm["warmup"]["steps"] == 3 and warm["warmup"]["seconds"] > 0 and set(warm["warmup"]) == {"steps", "seconds"}
    assert warm["steps"] == cold["steps"] == steps
    for r in (cold, warm):
        assert {name: p["calls"] for name, p in r["phases"].items()} == expected_calls(method, steps)
        assert {name: p["calls"] for name, p in r["epochs"][0]["phases"].items()} == expected_calls(method, steps)
        assert r["energy"] == NO_ENERGY


@pytest.mark.parametrize("value", [-1, -5])
def test_binary_refuses_a_negative_warmup(native, data_dir, tmp_path, value):
    r = run_runner(with_warmup(spec("full-zo", 0, data_dir, steps=5), value), tmp_path, native)
    assert r["status"] == "failed" and r["error"] == "hyper.warmup_steps: expected >= 0", r["error"]
    assert r["steps"] == 0 and r["model"] is None and r["warmup"] is None
    assert r["energy"] == NO_ENERGY


def shape(r: dict) -> dict:
    """A result's fields: its own, and those of its memory and energy records."""
    return {"": set(r), "memory": set(r["memory"]), "energy": set(r["energy"])}


def test_the_binary_and_the_python_runners_write_the_same_fields(native, data_dir, tmp_path):
    """workloads/result.py's skeleton is the one shape of a result: the binary writes each of its
    fields, as the Python runner does, for a job that fails before training (no such data set
    here) and for one that trains (then both add its trace, which the spec asks for)."""
    from workloads.result import skeleton
    s = spec("full-zo", 0, str(tmp_path / "nowhere"), steps=5)
    s["workload"]["dataset"] = "mnist"
    want = shape(skeleton(None, {}))
    nowhere = {"HOME": str(tmp_path)}         # nor MNIST that the host fetched into its cache
    assert shape(run_runner(s, tmp_path / "cpp", native)) == shape(run_runner(s, tmp_path / "torch", env=nowhere)) == want
    s = spec("full-zo", 0, data_dir, steps=5)
    cpp, torch = run_runner(s, tmp_path / "cpp-ok", native), run_runner(s, tmp_path / "torch-ok")
    assert cpp["status"] == torch["status"] == "ok"
    assert shape(cpp) == shape(torch) == {**want, "": want[""] | {"trace"}}


def test_the_binary_takes_every_hyperparameter_with_pythons_default(native):
    """Hyper (workloads/spec.py) and ZOBENCH_HYPER (workloads/cpp/common.hpp) are two lists of one
    fact: a field added on one side only, or a default changed on one side, fails here."""
    taken = json.loads(subprocess.run([native, "--hyper"], capture_output=True, text=True, check=True).stdout)
    fields = {f.name: f.default for f in dataclasses.fields(Hyper)}
    assert set(taken) == set(fields) - set(Hyper.CPP_LEAVES)
    assert set(Hyper.CPP_LEAVES) <= set(fields)
    differ = {name: (value, fields[name]) for name, value in taken.items() if value != fields[name]}
    assert set(differ) == set(Hyper.RESOLVED_BY_HOST), differ
