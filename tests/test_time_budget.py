"""hyper.max_train_seconds: every runtime stops at the first step boundary past the budget,
records the epoch it was in with the steps it made, and starts no other."""
import pytest

from harness.preparation.artifacts import onnx_graph
from workloads.models import LENET5

from testkit.runners import ORT_RUNNER, TORCH_RUNNER, job_spec, run_runner

PER_EPOCH, EPOCHS, BUDGET = 20, 50, 0.3     # 1,000 steps planned: seconds of training, not 0.3


@pytest.mark.parametrize("runtime", ["torch", "ort", "cpp"])
def test_training_stops_once_its_seconds_are_spent(runtime, tmp_path, data_dir, request):
    method = "full-zo" if runtime == "ort" else "full-bp"
    spec = job_spec(method, 0, seed=1, steps=PER_EPOCH, batch=16, test_samples=64, data_dir=data_dir,
                    runtime=runtime, hyper={"epochs": EPOCHS, "max_train_seconds": BUDGET,
                                            "trace_steps": PER_EPOCH * EPOCHS})
    if runtime == "ort":
        spec["onnx_model"] = str(onnx_graph(LENET5, method, 0))
    command = {"torch": TORCH_RUNNER, "ort": ORT_RUNNER}.get(runtime) or request.getfixturevalue("native")
    r = run_runner(spec, tmp_path, command)
    assert r["status"] == "ok", r["error"]
    assert 0 < r["steps"] < PER_EPOCH * EPOCHS                        # it stopped early ...
    assert r["train_seconds"] >= BUDGET                               # ... once the budget was spent
    assert len(r["trace"]) == r["steps"]
    last = r["epochs"][-1]                                            # the epoch it was in, recorded
    in_last = r["steps"] - (len(r["epochs"]) - 1) * PER_EPOCH
    assert 0 < in_last <= PER_EPOCH and last["epoch"] == len(r["epochs"])
    losses = [t["loss"] for t in r["trace"][-in_last:]]
    assert last["train_loss"] == pytest.approx(sum(losses) / in_last, rel=1e-6)
    for i, e in enumerate(r["epochs"][:-1]):                          # every epoch before it is whole
        whole = [t["loss"] for t in r["trace"][i * PER_EPOCH:(i + 1) * PER_EPOCH]]
        assert e["train_loss"] == pytest.approx(sum(whole) / PER_EPOCH, rel=1e-6)
    assert last["test_accuracy"] is not None
