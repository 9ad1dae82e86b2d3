"""The ONNX Runtime runner against the torch runner, and its graph and numpy head on their own."""
import json
import subprocess
import sys

import numpy as np
import onnx
import pytest

from harness.preparation.artifacts import onnx_graph
from harness.stores.store import Store
from harness.preparation import onnx_export
from workloads.models import LENET5
from workloads.spec import JobSpec

from testkit.agreement import assert_same_fp32_steps
from testkit.runners import ORT_RUNNER, REPO, job_spec, run_runner, zobench

ZO_METHODS = [("full-zo", 0), ("elastic-zo", 1), ("elastic-zo", 2)]


def spec(method, k, runtime, steps=60, **extra):
    s = job_spec(method, k, seed=5, steps=steps, runtime=runtime, **extra)
    if runtime == "ort" and "onnx_model" not in extra:
        s["onnx_model"] = str(onnx_graph(LENET5, method, k))
    return s


@pytest.mark.parametrize("method,k", ZO_METHODS)
def test_ort_matches_torch_step_for_step(tmp_path, method, k):
    t = run_runner(spec(method, k, "torch"), tmp_path / "torch")
    o = run_runner(spec(method, k, "ort"), tmp_path / "ort", ORT_RUNNER)
    assert t["status"] == o["status"] == "ok", o["error"]
    assert len(t["trace"]) == len(o["trace"]) == 60
    lt, lo = (np.array([x["loss"] for x in r["trace"]]) for r in (t, o))
    gt, go = (np.array([x["grad"] for x in r["trace"]]) for r in (t, o))
    np.testing.assert_allclose(lo, lt, rtol=1e-4)
    np.testing.assert_allclose(go, gt, rtol=0, atol=5e-3 + 1e-2 * np.abs(gt).max())
    assert np.corrcoef(gt, go)[0, 1] > 0.9999
    assert abs(t["epochs"][0]["test_accuracy"] - o["epochs"][0]["test_accuracy"]) <= 2 / 256
    assert set(o["phases"]) == set(t["phases"]) and o["model"]["params_zo"] == t["model"]["params_zo"]


@pytest.mark.parametrize("method,k,parts", [
    ("full-zo", 0, {"zo_queries": 3}),
    ("elastic-zo", 1, {"zo_estimator": "one-sided", "zo_queries": 2, "zo_update": "sign"}),
    ("full-zo", 0, {"zo_update": "momentum", "zo_sparsity": "layers", "zo_layers": 2}),
    ("elastic-zo", 1, {"zo_update": "adam", "zo_sparsity": "magnitude", "zo_mask_every": 1000}),   # the mask of step 0: docs/zo-optimizers.md
    ("full-zo", 0, {"zo_update": "conservative", "zo_queries": 2}),
    ("full-zo", 0, {"zo_sparsity": "random", "zo_mask_every": 4}),
    ("elastic-zo", 1, {"zo_distribution": "gaussian", "zo_update": "momentum"})],
    ids=["q3", "one-sided-q2-sign", "momentum-lezo", "adam-mask", "conservative-q2", "random-mask", "gaussian"])
def test_ort_matches_torch_step_for_step_with_the_zo_parts(tmp_path, method, k, parts):
    """Both runners run methods.zo_step: the estimators and update rules agree as MeZO's step does."""
    t = run_runner(spec(method, k, "torch", steps=30, hyper=parts), tmp_path / "torch")
    o = run_runner(spec(method, k, "ort", steps=30, hyper=parts), tmp_path / "ort", ORT_RUNNER)
    assert_same_fp32_steps(t, o, 30)
    assert [len(x.get("grads", [0])) for x in o["trace"]] == [parts.get("zo_queries", 1)] * 30
    assert max(abs(x["grad"]) for x in t["trace"]) > 1e-2     # the steps moved the weights


@pytest.mark.parametrize("k", [1, 2, 3])
def test_numpy_head_gradient_of_two_kept_passes_equals_autograds(k):
    """BP through the mean loss of two kept passes, as ElasticZO's head does (methods.py)."""
    import torch

    from workloads.ort_runner import OrtEngine
    from workloads.torch_runner import TorchEngine

    s = JobSpec.from_dict(spec("elastic-zo", k, "ort"))
    init = LENET5.init_weights(7)
    ort_engine, torch_engine = OrtEngine(s, LENET5, init), TorchEngine(s, LENET5, init)
    rng = np.random.default_rng(0)
    batches = [(rng.standard_normal((16, 1, 28, 28)).astype(np.float32), rng.integers(0, 10, 16)) for _ in range(2)]
    for engine in (ort_engine, torch_engine):
        for x, y in batches:
            x, y = engine.load_batch(x, y)
            engine.loss(engine.forward(x, keep=True), y)
        engine.backward()
    want = torch.cat([p.grad.flatten() for p in torch_engine.bp_params]).numpy()
    assert ort_engine.grad.shape == want.shape and np.abs(want).max() > 1e-3
    np.testing.assert_allclose(ort_engine.grad, want, rtol=1e-4, atol=1e-6 * np.abs(want).max())


def test_graph_takes_the_weights_as_inputs_with_a_dynamic_batch_and_is_named_by_its_hash(tmp_path):
    path = onnx_export.export(LENET5, 4, tmp_path)
    proto = onnx.load(path)
    assert not proto.graph.initializer
    inputs = {i.name: [d.dim_param or d.dim_value for d in i.type.tensor_type.shape.dim] for i in proto.graph.input}
    assert inputs["x"] == ["batch", 1, 28, 28]
    assert inputs["fc2.weight"] == [84, 120] and "fc3.weight" not in inputs   # the head is not in the graph
    assert onnx_export.export(LENET5, 4, tmp_path / "again").name == path.name     # deterministic bytes
    assert onnx_export.file_name(LENET5, 3)[0] != path.name


def test_a_graph_for_another_partition_is_refused_with_the_reason(tmp_path):
    wrong = str(onnx_graph(LENET5, "elastic-zo", 2))
    r = run_runner(spec("full-zo", 0, "ort", onnx_model=wrong), tmp_path, ORT_RUNNER)
    assert r["status"] == "failed" and r["error"].startswith(f"onnx_model: {wrong} is not lenet5's front of 5 layers")


def test_runner_imports_neither_torch_nor_the_harness_nor_onnx(tmp_path):
    (tmp_path / "spec.json").write_text(json.dumps(spec("elastic-zo", 1, "ort", steps=5)))
    code = ("import json, sys\n"
            "from workloads import ort_runner\n"
            f"rc = ort_runner.main(ort_runner.OrtEngine, ('numpy', 'onnxruntime'), "
            f"['--spec', {str(tmp_path / 'spec.json')!r}, '--out', {str(tmp_path / 'r.json')!r}])\n"
            "print(json.dumps([rc, sorted({m.split('.')[0] for m in sys.modules} & {'torch', 'harness', 'onnx'})]))")
    p = subprocess.run([sys.executable, "-c", code], cwd=REPO, capture_output=True, text=True, timeout=300)
    rc, imported = json.loads(p.stdout.strip().splitlines()[-1])
    assert rc == 0 and imported == []
    assert json.loads((tmp_path / "r.json").read_text())["env"]["versions"]["onnxruntime"]


def test_zobench_run_exports_the_graph_and_trains_on_ort(tmp_path):
    p = zobench("run", "--results", tmp_path, "--no-report", "--runtime", "ort", "--method", "elastic-zo:2",
                "--set", "epochs=1", "--set", "train_samples=640", "--set", "test_samples=128")
    assert p.returncode == 0, p.stderr
    store = Store(tmp_path)
    (result,) = store.results(store.latest())
    assert result["status"] == "ok" and result["steps"] == 20
    assert result["job"]["onnx_model"].endswith(onnx_export.file_name(LENET5, 3)[0])
