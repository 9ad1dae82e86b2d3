"""The training methods, checked numerically against an independent autograd reference.

The reference is a plain functional LeNet-5 written here, not the runner's engine:
it reads the same flat parameter vector (models.py layout) and differentiates
the loss with torch.autograd in float64.
"""
import numpy as np
import pytest
import torch
import torch.nn.functional as F

from workloads import datasets, methods, zrng
from workloads.clock import PhaseClock
from workloads.models import LENET5
from workloads.spec import JobSpec
from workloads.torch_runner import TorchEngine


def reference_loss(flat: torch.Tensor, x: torch.Tensor, y: torch.Tensor) -> torch.Tensor:
    p = {name: flat[o:o + int(np.prod(s))].view(s) for name, o, s in LENET5.offsets()}
    h = F.max_pool2d(F.relu(F.conv2d(x, p["conv1.weight"], p["conv1.bias"], padding=2)), 2)
    h = F.max_pool2d(F.relu(F.conv2d(h, p["conv2.weight"], p["conv2.bias"], padding=2)), 2)
    h = F.relu(F.linear(h.flatten(1), p["fc1.weight"], p["fc1.bias"]))
    h = F.relu(F.linear(h, p["fc2.weight"], p["fc2.bias"]))
    return F.cross_entropy(F.linear(h, p["fc3.weight"], p["fc3.bias"]), y)


def reference_grad(theta: np.ndarray, x, y) -> np.ndarray:
    flat = torch.tensor(theta, dtype=torch.float64, requires_grad=True)
    reference_loss(flat, torch.from_numpy(x).double(), torch.from_numpy(y)).backward()
    return flat.grad.numpy()


def make(method, bp_layers=0, dtype=np.float64, seed=0, hyper=None):
    spec = JobSpec.from_dict({"job_id": "t", "method": method, "bp_layers": bp_layers, "threads": 1,
                              "seed": seed, "hyper": hyper or {}})
    return spec, TorchEngine(spec, LENET5, LENET5.init_weights(seed).astype(dtype))


@pytest.fixture(scope="module")
def batch():
    return datasets.load("fashion-mnist", "train", 64).batch(np.arange(32))


def clock():
    c = PhaseClock()
    c.start()
    return c


@pytest.mark.parametrize("method,k", [("full-zo", 0), ("elastic-zo", 1), ("elastic-zo", 2)])
def test_zo_estimate_equals_the_directional_derivative(batch, method, k):
    spec, eng = make(method, k)
    x, y = eng.load_batch(*batch)
    theta = eng.weights()
    key = zrng.stream_key(0, zrng.STREAM_ZO, 5)
    # eps*|z| ~ 3e-5 in parameter space: small enough that no ReLU or max-pool kink is
    # crossed, large enough that float64 roundoff stays below 1e-6 relative
    r = methods.zo_step(eng, x, y, key, eps=1e-7, clip=1e9, lr_zo=0.0, lr_bp=0.0, clock=clock())
    z = zrng.normal(key, 0, eng.n_zo).astype(np.float64)
    directional = reference_grad(theta, *batch)[:eng.n_zo] @ z
    assert abs(directional) > 1e-3          # a non-trivial direction
    assert r["grad"] == pytest.approx(directional, rel=1e-5)


@pytest.mark.parametrize("method,k", [("full-zo", 0), ("elastic-zo", 2)])
def test_seed_trick_restores_parameters_to_float_rounding(method, k):
    _, eng = make(method, k, dtype=np.float32)
    theta0 = eng.weights()
    key, eps = zrng.stream_key(0, zrng.STREAM_ZO, 0), 1e-3
    z = zrng.normal(key, 0, eng.n_zo)
    eng.perturb(key, eps)
    moved = eng.weights()
    # the perturbation really is eps*z on the ZO prefix and nothing else
    np.testing.assert_allclose(moved[:eng.n_zo] - theta0[:eng.n_zo], eps * z, atol=2e-7)
    assert np.array_equal(moved[eng.n_zo:], theta0[eng.n_zo:])
    eng.perturb(key, -2 * eps)
    eng.perturb(key, eps)
    theta1 = eng.weights()
    # three in-place float32 roundings, each at most half an ulp of the largest intermediate
    ulp = np.spacing(np.abs(theta0[:eng.n_zo]) + 2 * eps * np.abs(z))
    assert np.all(np.abs(theta1[:eng.n_zo] - theta0[:eng.n_zo]) <= 2 * ulp)
    assert np.array_equal(theta1[eng.n_zo:], theta0[eng.n_zo:])


@pytest.mark.parametrize("k", [1, 2])
def test_elastic_zo_updates_front_by_zo_rule_and_head_by_bp_rule(batch, k):
    spec, eng = make("elastic-zo", k)
    x, y = eng.load_batch(*batch)
    theta = eng.weights()
    n = eng.n_zo
    key, eps, lr_zo, lr_bp = zrng.stream_key(0, zrng.STREAM_ZO, 0), 1e-3, 1e-2, 0.1
    r = methods.zo_step(eng, x, y, key, eps=eps, clip=5.0, lr_zo=lr_zo, lr_bp=lr_bp, clock=clock())
    after = eng.weights()
    z = zrng.normal(key, 0, n).astype(np.float64)
    plus, minus = theta.copy(), theta.copy()
    plus[:n] += eps * z
    minus[:n] -= eps * z
    xt, yt = torch.from_numpy(batch[0]).double(), torch.from_numpy(batch[1])
    assert r["loss_plus"] == pytest.approx(reference_loss(torch.from_numpy(plus), xt, yt).item(), rel=1e-12)
    assert r["loss_minus"] == pytest.approx(reference_loss(torch.from_numpy(minus), xt, yt).item(), rel=1e-12)
    g = np.clip((r["loss_plus"] - r["loss_minus"]) / (2 * eps), -5.0, 5.0)
    assert r["grad"] == g
    # front: theta - lr_zo * g * z (the seed trick's restore merged into the update)
    np.testing.assert_allclose(after[:n], theta[:n] - lr_zo * g * z, rtol=0, atol=1e-12)
    # head: theta - lr_bp * mean of the BP gradients at the two perturbed feature inputs
    head_grad = 0.5 * (reference_grad(plus, *batch) + reference_grad(minus, *batch))[n:]
    assert np.abs(head_grad).max() > 1e-3
    np.testing.assert_allclose(after[n:], theta[n:] - lr_bp * head_grad, rtol=0, atol=1e-12)
    assert eng.n_bp == {1: 850, 2: 11014}[k]


def test_full_bp_is_plain_sgd_on_every_parameter(batch):
    spec, eng = make("full-bp")
    x, y = eng.load_batch(*batch)
    theta = eng.weights()
    methods.bp_step(eng, x, y, update=0.05, clock=clock())
    np.testing.assert_allclose(eng.weights(), theta - 0.05 * reference_grad(theta, *batch), rtol=0, atol=1e-12)


def test_projected_gradient_is_clipped(batch):
    _, eng = make("full-zo", dtype=np.float32)
    x, y = eng.load_batch(*batch)
    r = methods.zo_step(eng, x, y, zrng.stream_key(0, 1, 0), eps=1e-3, clip=1e-4, lr_zo=0.0, lr_bp=0.0,
                        clock=clock())
    raw = (r["loss_plus"] - r["loss_minus"]) / 2e-3
    assert abs(raw) > 1e-4 and abs(r["grad"]) == pytest.approx(1e-4)
    assert np.sign(r["grad"]) == np.sign(raw)
