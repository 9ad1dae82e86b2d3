"""eval_start: a job's starting weights on the test set, before training and outside every
timed number, in every runtime: a fine-tuning job's accuracy without fine-tuning."""
import pytest

from harness.stores import schema
from harness.preparation.artifacts import onnx_graph
from testkit.runners import ORT_RUNNER, TORCH_RUNNER, job_spec, run_runner
from workloads.models import LENET5

RUNS = [("torch", "fp32"), ("cpp", "fp32"), ("cpp", "int8"), ("torch", "int8"), ("ort", "fp32")]


def spec(data_dir, runtime, precision, **fields):
    """One epoch of 320 samples, after two warm-up steps: the evaluation reads the weights they restore."""
    extra = {"runtime": "ort", "onnx_model": str(onnx_graph(LENET5, "elastic-zo", 1))} if runtime == "ort" else {}
    return job_spec("elastic-zo", 1, seed=3, steps=10, test_samples=200, data_dir=data_dir, precision=precision,
                    hyper={"warmup_steps": 2}, **extra, **fields)


@pytest.mark.parametrize("runtime,precision", RUNS)
def test_the_start_of_a_run_from_saved_weights_scores_what_they_scored(native, data_dir, tmp_path, runtime,
                                                                       precision):
    command = {"torch": TORCH_RUNNER, "ort": ORT_RUNNER, "cpp": native}[runtime]
    first = run_runner(spec(data_dir, runtime, precision, save_weights=True), tmp_path / "first", command, check=True)
    assert first["start_eval"] is None      # eval_start false: null
    second = run_runner(spec(data_dir, runtime, precision, init_weights=str(tmp_path / "first" / "weights.bin"),
                             eval_start=True), tmp_path / "second", command, check=True)
    assert second["warmup"]["steps"] == 2 and schema.problems(second) == []
    last = first["epochs"][-1]
    assert second["start_eval"] == {"test_loss": last["test_loss"], "test_accuracy": last["test_accuracy"]}
    assert second["model"]["init_sha256"] == first["model"]["weights_sha256"] != first["model"]["init_sha256"]
    # untimed: no phase, epoch or step of its own
    assert second["phases"]["eval"]["calls"] == len(second["epochs"]) == 1
    assert second["steps"] == first["steps"] == 10


@pytest.mark.parametrize("start_eval,problem", [
    ({"test_loss": 2.3, "test_accuracy": 1.5}, "start_eval.test_accuracy: 1.5 is not a number in [0, 1]"),
    ({"test_loss": -1.0, "test_accuracy": 0.5}, "start_eval.test_loss: -1.0 is not a finite number >= 0"),
    ({"test_accuracy": 0.5}, "start_eval must be null or hold exactly test_loss and test_accuracy"),
    ("0.5", "start_eval must be null or hold exactly test_loss and test_accuracy"),
])
def test_the_schema_checks_start_eval(native, data_dir, tmp_path, start_eval, problem):
    r = run_runner(spec(data_dir, "cpp", "fp32", eval_start=True), tmp_path, native, check=True)
    assert schema.problems(r) == []
    assert schema.problems({**r, "start_eval": start_eval}) == [problem]
    assert schema.problems({**r, "start_eval": {"test_loss": None, "test_accuracy": 0.1}}) == []   # diverged
    assert schema.problems({k: v for k, v in r.items() if k != "start_eval"}) == []   # an older result
