"""Adam on the BP part (hyper.optimizer = "adam"): the textbook update in every runtime, step for
step alike, its state saved and restored by the warm-up, counted in the binary's buffers, and
refused for INT8."""
import numpy as np
import pytest
import torch

from harness.planning import inventory, plan, suites
from harness.preparation.artifacts import onnx_graph
from harness.errors import UserError
from testkit.agreement import assert_buffers_follow_the_model, assert_same_fp32_steps
from testkit.runners import ORT_RUNNER, TORCH_RUNNER, job_spec, run_runner
from workloads import methods
from workloads.clock import NullClock
from workloads.models import LENET5
from workloads.spec import ADAM_INT8 as WHY_NOT_INT8, JobSpec, SpecError
from workloads.torch_runner import TorchEngine

# eps 1e-6, not the default 1e-8, for runtimes to agree over tens of steps: with 1e-8 a gradient
# at float32's rounding level (a fc2 weight's 5.6e-10 in float64 is 3.6e-10 in float32, full-bp
# step 0) moves its weight by lr g / (|g| + eps), 1.8e-5 apart; a ReLU flips on that at step 17,
# and torch's float32 run leaves its own float64 run there (1e-3 of the loss), as the binary does
ADAM = {"optimizer": "adam", "lr_bp": 1e-3, "adam_eps": 1e-6}
BP_METHODS = [("full-bp", 0), ("elastic-zo", 1)]


def adam_spec(method, k, data_dir=None, steps=30, **fields):
    return job_spec(method, k, seed=3, steps=steps, test_samples=128, data_dir=data_dir,
                    hyper={**ADAM, **fields.pop("hyper", {})}, **fields)


def weights(folder):
    return np.fromfile(folder / "weights.bin", dtype="<f4")


def assert_same_adam_weights(a, b, lr: float) -> None:
    """Adam moves a weight about lr a step whatever its gradient's size, so a head weight whose
    gradient is zero in one runtime and tiny in the other (a ReLU at 0 flips on a float
    difference of the perturbed features) ends up to a few lr apart (measured: 2.1e-3, 0.07% of
    elastic-zo:2's weights); all others agree to float rounding (99.9% within 3.3e-6)."""
    d = np.abs(a - b)
    assert np.quantile(d, 0.99) < 1e-5 and d.max() < 3 * lr, (np.quantile(d, 0.99), d.max())


@pytest.mark.parametrize("dtype,tol", [(np.float64, 1e-13), (np.float32, 1e-6)])
@pytest.mark.parametrize("method,k", [("full-bp", 0), ("elastic-zo", 2)])
def test_the_engines_adam_is_torch_optim_adams(method, k, dtype, tol):
    """On the gradients the engine's own steps compute, torch.optim.Adam given the same start
    ends where the engine's BP part does, step after step (the ZO front of elastic-zo is
    perturbed and updated between them, as in training)."""
    s = JobSpec.from_dict(job_spec(method, k, seed=1, steps=6, batch=16, hyper={**ADAM, "lr_bp": 1e-2}))
    engine = TorchEngine(s, LENET5, LENET5.init_weights(1).astype(dtype))
    ref = [torch.nn.Parameter(p.detach().clone()) for p in engine.bp_params]
    h = s.hyper
    opt = torch.optim.Adam(ref, lr=h.lr_bp, betas=(h.adam_beta1, h.adam_beta2), eps=h.adam_eps)
    own_update = engine.bp_update

    def bp_update(lr):
        for r, p in zip(ref, engine.bp_params):
            r.grad = p.grad.clone()
        opt.step()
        own_update(lr)

    engine.bp_update = bp_update
    rng = np.random.default_rng(0)
    for t in range(6):
        x, y = engine.load_batch(rng.standard_normal((16, 1, 28, 28)).astype(dtype), rng.integers(0, 10, 16))
        methods.step(engine, s, x, y, t, 0, h.lr_zo, h.lr_bp, NullClock())
        got = engine.flat[engine.n_zo:].numpy()
        want = torch.cat([r.detach().flatten() for r in ref]).numpy()
        np.testing.assert_allclose(got, want, rtol=0, atol=tol)
    assert engine.adam_t.item() == 6
    moved = got - LENET5.init_weights(1)[engine.n_zo:]
    assert np.abs(moved).max() > 5e-2     # 6 steps of about lr each: the updates are real


@pytest.mark.parametrize("method,k", BP_METHODS + [("elastic-zo", 2)])
def test_the_binary_and_torch_agree_step_for_step_with_adam(native, data_dir, tmp_path, method, k):
    s = adam_spec(method, k, data_dir, save_weights=True)
    t = run_runner(s, tmp_path / "torch")
    c = run_runner(s, tmp_path / "cpp", native)
    assert_same_fp32_steps(t, c, 30)
    wt, wc = weights(tmp_path / "torch"), weights(tmp_path / "cpp")
    assert_same_adam_weights(wc, wt, ADAM["lr_bp"])
    assert np.abs(wt - LENET5.init_weights(3)).max() > 1e-2


def test_the_ort_head_and_torch_agree_step_for_step_with_adam(tmp_path):
    s = adam_spec("elastic-zo", 2, runtime="ort", onnx_model=str(onnx_graph(LENET5, "elastic-zo", 2)),
                  save_weights=True)
    t = run_runner(s, tmp_path / "torch")
    o = run_runner(s, tmp_path / "ort", ORT_RUNNER)
    assert_same_fp32_steps(t, o, 30)
    assert_same_adam_weights(weights(tmp_path / "ort"), weights(tmp_path / "torch"), ADAM["lr_bp"])


def test_loss_goes_down_with_adam(native, data_dir, tmp_path):
    r = run_runner(adam_spec("full-bp", 0, data_dir, steps=40), tmp_path, native, check=True)
    loss = np.array([x["loss"] for x in r["trace"]])
    assert loss[-5:].mean() < 0.5 * loss[:5].mean()      # measured: 2.30 -> 0.84


@pytest.mark.parametrize("runner,method,k", [("torch", "full-bp", 0), ("torch", "elastic-zo", 1),
                                             ("ort", "elastic-zo", 1), ("cpp", "full-bp", 0),
                                             ("cpp", "elastic-zo", 2)])
def test_warm_up_puts_adams_state_back(native, data_dir, tmp_path, runner, method, k):
    """Three warm-up steps move the moments and the update count; the run after them is bit for
    bit the one without (the bias correction of step 1 is step 1's)."""
    extra = {"runtime": "ort", "onnx_model": str(onnx_graph(LENET5, method, k))} if runner == "ort" else {}
    command = {"torch": TORCH_RUNNER, "ort": ORT_RUNNER, "cpp": native}[runner]
    runs = [run_runner(adam_spec(method, k, data_dir, steps=6, hyper={"warmup_steps": n}, **extra),
                       tmp_path / str(n), command, check=True) for n in (0, 3)]
    cold, warm = runs
    assert warm["warmup"]["steps"] == 3
    assert warm["trace"] == cold["trace"]
    assert warm["model"]["weights_sha256"] == cold["model"]["weights_sha256"] != cold["model"]["init_sha256"]


@pytest.mark.parametrize("method,k", BP_METHODS + [("full-zo", 0)])
def test_the_binary_holds_two_values_per_bp_parameter_for_adam(native, data_dir, tmp_path, method, k):
    """Eq. 5's optimizer part, exactly: full-zo has no BP part and so no Adam state."""
    sgd, adam = (run_runner(job_spec(method, k, seed=3, steps=2, test_samples=32, data_dir=data_dir,
                                     hyper={"optimizer": o}), tmp_path / o, native, check=True)
                 for o in ("sgd", "adam"))
    extra = adam["memory"]["buffers_bytes"] - sgd["memory"]["buffers_bytes"]
    assert extra == 2 * 4 * adam["model"]["params_bp"]
    assert_buffers_follow_the_model(adam)
    if method == "full-zo":
        assert extra == 0 and adam["trace"] == sgd["trace"]


def test_full_zo_with_adam_trains_as_with_sgd_and_keeps_no_state(tmp_path):
    spec = lambda o: job_spec("full-zo", 0, seed=3, steps=4, test_samples=32, hyper={"optimizer": o})  # noqa: E731
    engine = TorchEngine(JobSpec.from_dict(spec("adam")), LENET5, LENET5.init_weights(3))
    assert engine.state == [engine.flat]
    sgd, adam = (run_runner(spec(o), tmp_path / o, check=True) for o in ("sgd", "adam"))
    assert adam["trace"] == sgd["trace"] and adam["model"]["weights_sha256"] == sgd["model"]["weights_sha256"]


ADAM_INT8 = "hyper.optimizer: adam trains FP32 only; INT8 trains its BP part with NITI's integer update"


@pytest.mark.parametrize("runner", ["torch", "cpp"])
def test_int8_with_adam_is_refused_with_the_reason(native, data_dir, tmp_path, runner):
    s = adam_spec("full-bp", 0, data_dir, steps=2, precision="int8")
    with pytest.raises(SpecError, match=f"^{ADAM_INT8}"):
        JobSpec.from_dict(s)
    r = run_runner(s, tmp_path, native if runner == "cpp" else TORCH_RUNNER)
    assert r["status"] == "failed" and r["error"].startswith(ADAM_INT8), r["error"]
    assert r["steps"] == 0


def test_the_plan_leaves_int8_out_of_adam_runs_and_keeps_ort():
    jobs, notes = plan.make(suites.load("quick"), inventory.resolve(["local"], None), overrides={"optimizer": "adam"})
    assert jobs and {j.spec["precision"] for j in jobs} == {"fp32"}
    assert {j.spec["hyper"]["optimizer"] for j in jobs} == {"adam"}
    assert {(j.spec["runtime"], j.spec["method"]) for j in jobs if j.spec["runtime"] == "ort"} == \
        {("ort", "full-zo"), ("ort", "elastic-zo")}
    assert any(n.startswith("full-bp int8 on cpp: ") and n.endswith(WHY_NOT_INT8) for n in notes), notes
    with pytest.raises(UserError, match="adam trains FP32 only"):
        plan.make(suites.load("quick"), inventory.resolve(["local"], None), precisions=["int8"],
                  overrides={"optimizer": "adam"})


@pytest.mark.parametrize("key,value,message", [
    ("optimizer", "rmsprop", "hyper.optimizer: expected one of 'sgd', 'adam', got 'rmsprop'"),
    ("adam_beta1", 1.0, "hyper.adam_beta1: expected a value >= 0 and < 1, got 1.0"),
    ("adam_beta2", -0.1, "hyper.adam_beta2: expected a value >= 0 and < 1, got -0.1"),
    ("adam_eps", 0.0, "hyper.adam_eps: expected a value > 0, got 0.0"),
])
def test_adams_settings_are_checked_by_name(key, value, message):
    with pytest.raises(SpecError) as e:
        JobSpec.from_dict({"job_id": "j", "method": "full-bp", "hyper": {key: value}})
    assert str(e.value) == message


def test_the_reports_analytic_memory_counts_adams_moments():
    """A report of adam FP32 jobs draws Eq. 5's optimizer part (INT8 jobs train without it)."""
    import pandas as pd

    from reports import charts, report

    df = pd.DataFrame({"model": ["lenet5"] * 3, "network": [LENET5] * 3, "batch": [32] * 3,
                       "precision": ["fp32", "fp32", "int8"], "optimizer": ["adam", "adam", "sgd"]})
    models = report._models(df)
    assert models == {"lenet5": (LENET5, 32, "adam")}
    fig = charts.memory(pd.DataFrame(columns=["precision", "runtime", "buffers_mib", "model", "mlabel"]), {}, models)
    assert [ax.get_title() for ax in fig.axes if ax.get_title()] == ["lenet5, FP32, batch 32: Eqs. 2-5"]
