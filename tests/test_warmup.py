"""Warm-up is untimed and changes nothing: every Python runtime trains, step for step, from the
weights it would have started from without it (the C++ binary's are in test_cpp.py)."""
import pytest

from harness.preparation.artifacts import onnx_graph
from testkit.runners import ORT_RUNNER, TORCH_RUNNER, job_spec, run_runner
from workloads import vocab
from workloads.models import LENET5
from workloads.spec import JobSpec

CASES = [  # runner, method, k, precision
    (TORCH_RUNNER, "full-zo", 0, "fp32"), (TORCH_RUNNER, "elastic-zo", 1, "fp32"),
    (TORCH_RUNNER, "full-bp", 0, "int8"), (TORCH_RUNNER, "elastic-zo", 2, "int8"),
    (ORT_RUNNER, "elastic-zo", 1, "fp32")]


@pytest.mark.parametrize("runner,method,k,precision", CASES, ids=lambda c: c if isinstance(c, str) else None)
def test_warm_up_leaves_the_run_step_for_step_as_without(tmp_path, runner, method, k, precision):
    spec = job_spec(method, k, seed=4, steps=6, test_samples=64, precision=precision,
                    **({"zo_loss": "integer"} if precision == "int8" else {}))
    if runner == ORT_RUNNER:
        spec["runtime"], spec["onnx_model"] = "ort", str(onnx_graph(LENET5, method, k))
    runs = {}
    for n in (0, 3):
        s = {**spec, "hyper": {**spec["hyper"], "warmup_steps": n}}
        runs[n] = run_runner(s, tmp_path / str(n), runner, check=True)
    cold, warm = runs[0], runs[3]
    assert warm["warmup"]["steps"] == 3 and warm["warmup"]["seconds"] > 0 and cold["warmup"]["steps"] == 0
    assert warm["model"]["weights_sha256"] == cold["model"]["weights_sha256"]
    assert warm["trace"] == cold["trace"]
    assert warm["epochs"][0]["test_accuracy"] == cold["epochs"][0]["test_accuracy"]
    # the warm-up's steps are not the training's: the phases count the 6 timed steps only
    passes = 1 if method == "full-bp" else 2
    assert warm["steps"] == 6 and warm["phases"]["forward"]["calls"] == 6 * passes
    assert warm["phases"] == {p: {**v, "seconds": warm["phases"][p]["seconds"]} for p, v in cold["phases"].items()}


def test_the_default_warm_up_comes_from_the_device():
    for device, steps in vocab.WARMUP_STEPS.items():
        assert JobSpec.from_dict({"job_id": "j", "method": "full-zo", "device": device}).hyper.warmup_steps == steps
    assert vocab.WARMUP_STEPS["cuda"] > vocab.WARMUP_STEPS["cpu"]
    given = JobSpec.from_dict({"job_id": "j", "method": "full-zo", "device": "cuda", "hyper": {"warmup_steps": 0}})
    assert given.hyper.warmup_steps == 0
