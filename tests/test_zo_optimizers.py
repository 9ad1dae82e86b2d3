"""The ZO part's estimators and update rules (docs/zo-optimizers.md), checked numerically: each
against a direct implementation of its formula on LeNet-5 in float64, the estimators' statistics
on a model whose gradient is known, and what the plan and each runtime run."""
import numpy as np
import pytest
import torch

from harness.planning import inventory, plan, suites
from workloads import methods, vocab, zrng
from workloads.spec import JobSpec, SpecError

from test_methods import batch, clock, make, reference_grad, reference_loss  # noqa: F401 (batch: a fixture)
from testkit.runners import job_spec, run_runner


class Quadratic:
    """An Engine over L(θ) = ½ Σ a_i θ_i² + b·θ, in float64: its gradient a θ + b is known, and
    z is zobench-z's, drawn as every runtime draws it."""

    def __init__(self, a: np.ndarray, b: np.ndarray, theta: np.ndarray):
        self.a, self.b, self.theta = a, b, theta.copy()
        self.n_zo, self.n_bp = len(theta), 0

    def perturb(self, key, alpha):
        self.theta += alpha * zrng.normal(key, 0, self.n_zo).astype(np.float64)

    def forward(self, x, keep):
        return 0.5 * self.a @ (self.theta * self.theta) + self.b @ self.theta

    def loss(self, out, y):
        return out

    def gradient(self) -> np.ndarray:
        return self.a * self.theta + self.b


def quadratic(n=512, curved=True, seed=0) -> Quadratic:
    rng = np.random.default_rng(seed)
    return Quadratic(rng.uniform(0.5, 2.0, n) if curved else np.zeros(n), rng.standard_normal(n),
                     rng.standard_normal(n))


def test_one_query_keys_are_mezos_and_the_others_are_new():
    keys = zrng.zo_keys(3, 17, 4)
    assert keys[0] == zrng.stream_key(3, zrng.STREAM_ZO, 17) and zrng.zo_keys(3, 17) == keys[:1]
    later = {k for t in range(50) for k in zrng.zo_keys(3, t, 4)}
    assert len(later) == 200      # no step's direction is another's, nor another query's


@pytest.mark.parametrize("method,k", [("full-zo", 0), ("elastic-zo", 1)])
def test_the_sign_update_moves_the_front_by_lr_sign_g_z(batch, method, k):  # noqa: F811
    spec, eng = make(method, k)
    x, y = eng.load_batch(*batch)
    theta, n = eng.weights(), eng.n_zo
    key, eps, lr_zo, lr_bp = zrng.stream_key(0, zrng.STREAM_ZO, 0), 1e-3, 1e-2, 0.1
    r = methods.zo_step(eng, x, y, key, eps, 5.0, lr_zo, lr_bp, clock(), update="sign")
    z = zrng.normal(key, 0, n).astype(np.float64)
    g = np.clip((r["loss_plus"] - r["loss_minus"]) / (2 * eps), -5.0, 5.0)
    assert r["grad"] == g and abs(g) > 1e-3
    np.testing.assert_allclose(eng.weights()[:n], theta[:n] - lr_zo * np.sign(g) * z, rtol=0, atol=1e-12)
    if k:       # the BP head learns as with SGD's ZO update: from the two perturbed passes
        plus, minus = theta.copy(), theta.copy()
        plus[:n] += eps * z
        minus[:n] -= eps * z
        head = 0.5 * (reference_grad(plus, *batch) + reference_grad(minus, *batch))[n:]
        np.testing.assert_allclose(eng.weights()[n:], theta[n:] - lr_bp * head, rtol=0, atol=1e-12)


@pytest.mark.parametrize("estimator", vocab.ZO_ESTIMATORS)
def test_q_queries_estimate_from_one_theta_and_average_their_updates(batch, estimator):  # noqa: F811
    spec, eng = make("full-zo")
    x, y = eng.load_batch(*batch)
    theta, n = eng.weights(), eng.n_zo
    keys, eps, lr_zo = zrng.zo_keys(0, 4, 3), 1e-7, 1e-2
    r = methods.zo_step(eng, x, y, keys, eps, 1e9, lr_zo, 0.0, clock(), estimator=estimator)
    zs = [zrng.normal(k, 0, n).astype(np.float64) for k in keys]
    true = reference_grad(theta, *batch)[:n]
    # each query's projected gradient is the directional derivative at the same θ
    assert r["grads"] == pytest.approx([true @ z for z in zs], rel=1e-4 if estimator == "one-sided" else 1e-5)
    assert r["grad"] == pytest.approx(np.mean(r["grads"]), rel=1e-12)
    want = theta[:n] - lr_zo / 3 * sum(g * z for g, z in zip(r["grads"], zs))
    np.testing.assert_allclose(eng.weights()[:n], want, rtol=0, atol=1e-12)
    at_theta = reference_loss(torch.from_numpy(theta), torch.from_numpy(batch[0]).double(), torch.from_numpy(batch[1])).item()
    if estimator == "one-sided":        # L(θ) once, then one forward a query: q + 1 forwards
        assert r["loss"] == pytest.approx(at_theta, rel=1e-12) and "loss_minus" not in r
    else:
        assert r["loss"] == pytest.approx(at_theta, rel=1e-6)


def test_q_query_variance_falls_as_one_over_q():
    """On a linear loss the projected gradient is exact (G·z), so what is left is the variance of
    the direction: the estimate of G along u = G/|G| has variance 2|G|²/q for Gaussian z
    (zobench-z's fourth moment is near 3). Measured over 600 steps a q."""
    n, steps, lr = 256, 600, 1e-3
    var = {}
    for q in (1, 4):
        along = []
        for t in range(steps):
            eng = quadratic(n, curved=False)
            before = eng.theta.copy()
            methods.zo_step(eng, None, None, zrng.zo_keys(9, t, q), 1e-3, 1e9, lr, 0.0, clock())
            along.append((before - eng.theta) / lr @ eng.b / np.linalg.norm(eng.b))
        along = np.array(along)
        # unbiased: the mean of the estimates is the true slope within 4 standard errors
        assert abs(along.mean() - np.linalg.norm(eng.b)) < 4 * along.std() / np.sqrt(steps)
        var[q] = along.var()
    assert var[1] == pytest.approx(2 * np.linalg.norm(eng.b) ** 2, rel=0.25)
    assert 2.8 < var[1] / var[4] < 5.5


def test_the_one_sided_estimate_is_biased_by_order_eps_and_the_two_point_one_is_not():
    """On a quadratic, (L(θ+εz) - L(θ))/ε = ∇L·z + (ε/2) zᵀAz exactly; the two-point estimate is
    ∇L·z exactly. So halving ε halves the one-sided error, and the two-point error is roundoff."""
    key = zrng.stream_key(1, zrng.STREAM_ZO, 0)
    errors = {}
    for estimator in vocab.ZO_ESTIMATORS:
        for eps in (1e-2, 5e-3):
            eng = quadratic()
            slope = eng.gradient() @ zrng.normal(key, 0, eng.n_zo).astype(np.float64)
            r = methods.zo_step(eng, None, None, key, eps, 1e9, 0.0, 0.0, clock(), estimator=estimator)
            errors[estimator, eps] = r["grad"] - slope
    z = zrng.normal(key, 0, 512).astype(np.float64)
    curvature = quadratic().a @ (z * z)
    assert errors["one-sided", 1e-2] == pytest.approx(1e-2 / 2 * curvature, rel=1e-6)
    assert errors["one-sided", 1e-2] / errors["one-sided", 5e-3] == pytest.approx(2, rel=1e-5)
    assert abs(errors["two-point", 1e-2]) < 1e-9 * abs(errors["one-sided", 1e-2])


def test_the_parts_are_checked_and_int8_keeps_its_own_step():
    spec = JobSpec.from_dict({"job_id": "t", "method": "full-zo", "hyper": {"zo_update": "sign", "zo_queries": 4}})
    assert spec.hyper.zo_parts() == "q=4 sign" and JobSpec.from_dict({"job_id": "t", "method": "full-zo"}).hyper.zo_parts() == ""
    with pytest.raises(SpecError, match="hyper.zo_queries: expected"):
        JobSpec.from_dict({"job_id": "t", "method": "full-zo", "hyper": {"zo_queries": 0}})
    with pytest.raises(SpecError, match="hyper.zo_estimator: expected one of 'two-point', 'one-sided'"):
        JobSpec.from_dict({"job_id": "t", "method": "full-zo", "hyper": {"zo_estimator": "forward-grad"}})
    with pytest.raises(SpecError, match="INT8 trains its ZO part by Alg. 2.*, not one-sided"):
        JobSpec.from_dict({"job_id": "t", "method": "full-zo", "precision": "int8", "hyper": {"zo_estimator": "one-sided"}})


def test_the_plan_leaves_out_what_a_runtime_does_not_run_and_keys_keep_optimizers_apart(tmp_path):
    p = tmp_path / "parts.toml"
    p.write_text('methods = ["full-zo", "full-bp"]\nruntimes = ["torch", "ort", "cpp"]\nprecisions = ["fp32", "int8"]\n'
                 'datasets = ["fashion-mnist"]\n[hyper]\nzo_update = "sign"\nzo_queries = 2\n')
    jobs, notes = plan.make(suites.load(str(p)), inventory.resolve(["local"], None))
    zo = {(j.spec["runtime"], j.spec["precision"]) for j in jobs if j.spec["method"] == "full-zo"}
    assert zo == {("torch", "fp32"), ("ort", "fp32")}
    assert any("full-zo fp32 on cpp: the cpp runtime runs MeZO's ZO step only" in n and "not q=2 sign" in n for n in notes)
    assert any("full-zo int8" in n and "INT8 trains its ZO part by Alg. 2" in n for n in notes)
    assert {j.spec["runtime"] for j in jobs if j.spec["method"] == "full-bp"} == {"torch", "cpp"}   # no ZO part
    from harness.stores.measurements import job_key
    key, _ = job_key(next(j.spec for j in jobs if j.spec["method"] == "full-zo" and j.spec["runtime"] == "torch"))
    assert "zo_queries=2 zo_update=sign" in key


def test_the_binary_refuses_the_parts_it_does_not_run(native, data_dir, tmp_path):
    s = job_spec("full-zo", 0, seed=0, steps=2, data_dir=data_dir, hyper={"zo_update": "sign"})
    r = run_runner(s, tmp_path, native)
    assert r["status"] == "failed" and "runs MeZO's ZO step only" in r["error"]
