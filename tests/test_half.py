"""Half precision (bf16, fp16) on the torch engine's transformers: z rounded once, a half step
against an FP32 one to the half type's own rounding, the loss falling, fp16's loss scale, what is
refused and why, the device-memory cap's error path, and the gpt2 ladder's jobs in bf16 end to end."""
import json

import numpy as np
import pytest
import torch

from workloads import methods, runner, support, zrng
from workloads.clock import NullClock
from workloads.models import LENET5
from workloads.spec import JobSpec, SpecError
from workloads.torch_runner import HALF, TorchEngine

from harness.execution.job import device_limit
from testkit.runners import zobench
from testkit.transformers import STYLES
from test_transformer import batch, spec_dict

EPS, LR_ZO, LR_BP = 1e-3, 1e-3, 0.1


def engine(m, method="full-zo", k=0, precision="bf16", **hyper):
    spec = JobSpec.from_dict(spec_dict(m, method, k, precision, **{"lr_zo": LR_ZO, "lr_bp": LR_BP, **hyper}))
    return spec, TorchEngine(spec, m, m.init_weights(0))


def ulp(x, precision: str) -> np.ndarray:
    """The spacing of the half type's values at |x| (bf16: 8 significant bits, fp16: 11)."""
    bits = {"bf16": 8, "fp16": 11}[precision]
    _, e = np.frexp(np.maximum(np.abs(x), 2.0 ** -14))
    return np.ldexp(1.0, e - bits)


@pytest.mark.parametrize("precision", ["bf16", "fp16"])
def test_z_is_rounded_once_and_each_perturbation_rounded_once(precision):
    """theta + alpha z(key) is formed in FP32 from z rounded to the half type, then rounded once:
    what the GPU's fused kernel computes (zrng_triton), so every device moves the weights alike."""
    m = STYLES["gpt2"]
    _, e = engine(m, precision=precision)
    before = e.flat.clone()
    e.perturb(7, -2 * EPS)
    z = torch.from_numpy(zrng.normal(7, 0, e.n_zo)).to(HALF[precision]).float()
    want = (before.float() + -2 * EPS * z).to(HALF[precision])
    assert e.flat.dtype == HALF[precision]
    assert torch.equal(e.flat, want)
    # and not the sum of the unrounded z: the two differ somewhere
    assert not torch.equal(want, (before.float() + -2 * EPS * torch.from_numpy(zrng.normal(7, 0, e.n_zo))).to(HALF[precision]))


@pytest.mark.parametrize("style", STYLES)
@pytest.mark.parametrize("method,k", [("full-zo", 0), ("elastic-zo", 1), ("full-bp", 0)])
def test_a_bf16_step_agrees_with_an_fp32_step_to_bf16s_rounding(style, method, k):
    """From the same weights and batch: each loss of the step within bf16's relative precision
    (2^-8) of FP32's (the loss itself is FP32, the network bf16), and every weight within two of
    bf16's ulps at its size (the init's rounding, and the perturbation's rounding at
    |theta| + 2 eps |z|), plus what the projected gradient's difference moves it by."""
    m = STYLES[style]
    out = {}
    for precision in ("fp32", "bf16"):
        spec, e = engine(m, method, k, precision)
        x, y = e.load_batch(*batch(m))
        out[precision] = methods.step(e, spec, x, y, 3, 0, LR_ZO, LR_BP, NullClock()), e.weights(), e
    (r32, w32, e32), (r16, w16, e16) = out["fp32"], out["bf16"]
    for key in r32:
        if key.startswith("loss"):
            assert r16[key] == pytest.approx(r32[key], rel=2 ** -8), key
    n = e32.n_zo
    z = np.abs(zrng.normal(zrng.zo_keys(0, 3, 1)[0], 0, n))
    moved = LR_ZO * abs(r16.get("grad", 0) - r32.get("grad", 0)) * z
    assert np.all(np.abs(w16 - w32)[:n] <= 2 * ulp(np.abs(w32[:n]) + 2 * EPS * z, "bf16") + moved)
    # the BP part: beyond two ulps (the init's and the update's rounding), bf16's activations
    # and gradients err the step by a few percent, in norm
    beyond = np.maximum(np.abs(w16 - w32)[n:] - 2 * ulp(w32[n:], "bf16"), 0)
    assert np.linalg.norm(beyond) <= 2 ** -3 * np.linalg.norm((w32 - m.init_weights(0))[n:])
    assert e16.flat.dtype == torch.bfloat16 and e16.flat.nbytes == 2 * m.params_total


@pytest.mark.parametrize("precision", ["bf16", "fp16"])
@pytest.mark.parametrize("method,k,hyper", [
    ("full-bp", 0, {"lr_bp": 0.5}), ("full-bp", 0, {"optimizer": "adam", "lr_bp": 1e-2}),
    ("full-bp", 0, {"lr_bp": 0.5, "checkpointing": True}), ("full-zo", 0, {"lr_zo": 1e-2}),
    ("elastic-zo", 1, {"lr_zo": 1e-2, "lr_bp": 0.5})])
@pytest.mark.parametrize("style", STYLES)
def test_a_few_half_steps_on_one_batch_lower_its_loss(style, method, k, hyper, precision):
    m = STYLES[style]
    if precision == "fp16" and style == "llama" and method != "full-zo":
        with pytest.raises(SpecError, match="RMSNorm backward overflows fp16"):
            engine(m, method, k, precision, **hyper)
        return
    spec, e = engine(m, method, k, precision, **hyper)
    x, y = e.load_batch(*batch(m))
    before = e.loss(e.forward(x, keep=False), y)
    for t in range(12):
        methods.step(e, spec, x, y, t, 0, spec.hyper.lr_zo, spec.hyper.lr_bp, NullClock())
    assert e.loss(e.forward(x, keep=False), y) < before - 1e-3
    assert (e.scaler is not None) == (precision == "fp16" and method != "full-zo")


def test_fp16s_loss_scale_skips_an_overflowing_step_and_unscales_a_good_one():
    """A scale that overflows fp16's gradients: the step changes no weight, the scale halves and
    the step is counted skipped. At the default scale the step is SGD on the unscaled gradient:
    beyond two ulps, the update errs FP32's by under 2^-5 of its size in norm (fp16 has 11 bits)."""
    m = STYLES["gpt2"]
    spec, e = engine(m, "full-bp", precision="fp16")
    x, y = e.load_batch(*batch(m))
    before = e.flat.clone()
    e.scaler.scale.fill_(2.0 ** 100)
    methods.step(e, spec, x, y, 0, 0, LR_ZO, LR_BP, NullClock())
    assert torch.equal(e.flat, before)
    assert e.scaler.scale.item() == 2.0 ** 99 and e.scaler.skipped.item() == 1
    e.scaler.scale.fill_(2.0 ** 16)
    methods.step(e, spec, x, y, 1, 0, LR_ZO, LR_BP, NullClock())
    assert e.scaler.skipped.item() == 1
    spec32, e32 = engine(m, "full-bp", precision="fp32")
    methods.step(e32, spec32, x, y, 1, 0, LR_ZO, LR_BP, NullClock())
    start = before.float().numpy()
    d16, d32 = e.weights() - start, e32.weights() - start
    assert np.abs(d16).max() > 0
    beyond = np.maximum(np.abs(d16 - d32) - 2 * ulp(start + d32, "fp16"), 0)
    assert np.linalg.norm(beyond) <= 2 ** -5 * np.linalg.norm(d32)


def test_half_precision_is_refused_where_it_does_not_run():
    layer = {"job_id": "t", "method": "full-zo", "precision": "bf16", "workload": {"model": "lenet5"}}
    with pytest.raises(SpecError, match="precision bf16: half precision trains the transformers"):
        JobSpec.from_dict(layer)
    m = STYLES["gpt2"]
    with pytest.raises(SpecError, match="MeZO's step alone.*not one-sided"):
        JobSpec.from_dict(spec_dict(m, "full-zo", 0, "fp16", zo_estimator="one-sided"))
    for runtime in ("cpp", "ort"):
        assert support.unsupported(runtime, "full-zo", "bf16", "fortunes", "cpu", m) == \
            f"the {runtime} runtime has no bf16 training"
    assert support.unsupported("torch", "full-zo", "bf16", "fashion-mnist", "cpu", LENET5).startswith(
        "half precision trains the transformers")
    assert support.unsupported("torch", "full-bp", "fp16", "fortunes", "cuda", m) is None


def test_a_gpu_jobs_limit_becomes_its_device_memory_cap_and_its_oom_names_it():
    """The harness hands a GPU job's mem_limit to its runner as the device cap (a host limit on
    the address space would stop CUDA), and a CPU job's to the launcher. CI has no GPU: the
    runner's end of a device OOM is shown with the exception torch raises there."""
    spec, host = device_limit({"device": "cuda:0"}, "2G")
    assert spec["device_mem_limit"] == 2 << 30 and host == ""
    assert device_limit({"device": "cpu"}, "2G") == ({"device": "cpu"}, "2G")
    job = JobSpec.from_dict({**spec_dict(STYLES["gpt2"], precision="bf16"), "device_mem_limit": 2 << 30})
    out = runner.device_failure(torch.OutOfMemoryError("CUDA out of memory. Tried to allocate 2.00 GiB\nmore"), job)
    assert out == {"status": "oom", "error": "the GPU ran out of memory under its 2.00 GiB device-memory cap "
                                             "(mem_limit): CUDA out of memory. Tried to allocate 2.00 GiB"}
    assert runner.device_failure(ValueError("x"), job) == {"error": "ValueError: x"}


def test_the_gpt2_ladders_jobs_train_in_bf16(tmp_path):
    """quick-half's bf16 jobs on the ladder's smallest model and Debian's fortunes: Full BP (Adam),
    MeZO and ElasticZO end ok in bf16, keyed so, and BP's loss falls. Short sequences and few of
    them: a CPU without bf16 arithmetic multiplies bf16 matrices 6-25x slower than FP32 (an AMD
    EPYC's torch), and BP's loss falls by 0.8 in these 12 steps."""
    p = zobench("run", "--suite", "quick-half", "--precision", "bf16", "--results", str(tmp_path), "--no-report",
                "--set", "train_samples=48", "--set", "test_samples=8", "--set", "context=16")
    assert p.returncode == 0, p.stderr
    results = {r["job"]["method"] + str(r["job"]["bp_layers"]): r
               for r in map(json.load, map(open, tmp_path.glob("runs/*/local.*.json")))}
    assert set(results) == {"full-bp0", "full-zo0", "elastic-zo1"}
    for r in results.values():
        assert r["status"] == "ok" and r["job"]["precision"] == "bf16" and ".bf16." in r["job"]["job_id"]
        assert all(np.isfinite(e["train_loss"]) for e in r["epochs"])
    bp = results["full-bp0"]["epochs"]
    assert bp[-1]["train_loss"] < bp[0]["train_loss"] - 0.1


def test_a_gpu_jobs_cap_is_in_the_spec_its_runner_is_sent(tmp_path):
    """The cap reached the runner only as far as the harness's own copy: spec.json went to the
    board before device_limit. A cuda target here has no GPU, so its job fails, after its spec was
    sent."""
    from testkit.runners import zobench
    inv = tmp_path / "inventory.toml"
    inv.write_text('[targets.gpu]\nprofile = "local"\ndevice = "cuda"\nmem_limit = "512M"\n')
    p = zobench("run", "--inventory", inv, "--target", "gpu", "--runtime", "torch", "--method", "full-zo",
                "--precision", "fp32", "--set", "epochs=1", "--set", "train_samples=64", "--set", "test_samples=32",
                "--results", tmp_path / "r", "--no-report")
    (sent,) = (tmp_path / "r").glob("runs/*/work/attempts/*/*/spec.json")
    assert json.loads(sent.read_text())["device_mem_limit"] == 512 << 20, p.stdout + p.stderr
