"""The torch engine on decoder-only transformers (models.Transformer): every method, checked
against an independent autograd reference, per-block activation checkpointing, ElasticZO's
partition into units, the weights' layout, and the runner's way in.

The reference is written here with other torch ops than transformer_torch's -- F.embedding,
F.scaled_dot_product_attention, F.rms_norm, rotary embedding as a complex product, the final
norm over every position -- and differentiates the loss of the flat parameter vector in float64.
"""
import math

import numpy as np
import pytest
import torch
import torch.nn.functional as F

from workloads import methods, models, zrng
from workloads.clock import NullClock
from workloads.models import Transformer
from workloads.runner import initial_weights
from workloads.spec import JobSpec, SpecError
from workloads.torch_runner import TorchEngine, make_engine
from workloads.transformer_torch import TransformerNet

from testkit.transformers import B, CLASSES, STYLES, T



def model(style: str, classes: int = 0) -> Transformer:
    m = STYLES[style]
    return m.with_classes(classes) if classes else m


def spec_dict(m, method="full-bp", k=0, precision="fp32", **hyper) -> dict:
    return {"job_id": "t", "method": method, "bp_layers": k, "precision": precision, "threads": 1,
            "workload": {"model": m.name, "architecture": m.to_dict()}, "hyper": hyper}


def make(m, method="full-bp", k=0, dtype=np.float64, **hyper):
    spec = JobSpec.from_dict(spec_dict(m, method, k, **hyper))
    return spec, TorchEngine(spec, m, m.init_weights(0).astype(dtype))


def batch(m, seed=0):
    """Token ids as a data set gives them: x int32 [B, T], y the next tokens (int32 [B, T]) or a
    label (int64 [B])."""
    rng = np.random.default_rng(seed)
    tokens = rng.integers(0, m.vocab, (B, T + 1)).astype(np.int32)
    y = rng.integers(0, m.classes, B).astype(np.int64) if m.classes else tokens[:, 1:]
    return tokens[:, :-1], y


def reference_loss(m, flat: torch.Tensor, x: torch.Tensor, y: torch.Tensor) -> torch.Tensor:
    p = {name: flat[o:o + math.prod(s)].view(s) for name, o, s in m.offsets()}
    D, H, hd, gpt2 = m.width, m.heads, m.head_dim, m.style == "gpt2"
    n, t = x.shape

    def norm(v, name):
        if gpt2:
            return F.layer_norm(v, (D,), p[f"{name}.weight"], p[f"{name}.bias"], 1e-5)
        return F.rms_norm(v, (D,), p[f"{name}.weight"], 1e-5)

    def linear(v, name):
        return F.linear(v, p[f"{name}.weight"], p.get(f"{name}.bias"))

    angles = torch.outer(torch.arange(t, dtype=flat.dtype), 10000.0 ** -(torch.arange(0, hd, 2, dtype=flat.dtype) / hd))
    turn = torch.polar(torch.ones_like(angles), angles)

    def rope(v):    # the pairs (v[j], v[j + hd/2]) as complex numbers, turned by the position's angles
        c = torch.view_as_complex(v.unflatten(-1, (2, hd // 2)).transpose(-1, -2).contiguous())
        return torch.view_as_real(c * turn).transpose(-1, -2).flatten(-2)

    h = F.embedding(x, p["wte"]) + (p["wpe"][:t] if gpt2 else 0)
    for i in range(m.depth):
        b = f"h{i}"
        qkv = linear(norm(h, f"{b}.ln1"), f"{b}.attn.qkv")
        q, k, v = (u.view(n, t, H, hd).transpose(1, 2) for u in qkv.split(D, -1))
        if not gpt2:
            q, k = rope(q), rope(k)
        a = F.scaled_dot_product_attention(q, k, v, is_causal=True).transpose(1, 2).reshape(n, t, D)
        h = h + linear(a, f"{b}.attn.proj")
        u = norm(h, f"{b}.ln2")
        h = h + (linear(F.gelu(linear(u, f"{b}.mlp.fc"), approximate="tanh"), f"{b}.mlp.proj") if gpt2 else
                 linear(F.silu(linear(u, f"{b}.mlp.gate")) * linear(u, f"{b}.mlp.up"), f"{b}.mlp.down"))
    h = norm(h, "ln_f")
    if m.classes:
        return F.cross_entropy(linear(h[:, -1], "cls"), y)
    logits = h @ (p["wte"] if m.tied else p["lm_head.weight"]).T
    return F.cross_entropy(logits.reshape(-1, m.vocab), y.reshape(-1))


def reference_grad(m, theta: np.ndarray, x, y) -> np.ndarray:
    flat = torch.tensor(theta, dtype=torch.float64, requires_grad=True)
    reference_loss(m, flat, torch.from_numpy(x).long(), torch.from_numpy(y).long()).backward()
    return flat.grad.numpy()


def unit_of_each_parameter(m) -> np.ndarray:
    return np.concatenate([np.full(t.size, t.unit) for t in m.tensors()])


@pytest.mark.parametrize("method,k", [("full-zo", 0), ("elastic-zo", 2)])
@pytest.mark.parametrize("classes", [0, CLASSES])
@pytest.mark.parametrize("style", STYLES)
def test_zo_estimate_equals_the_directional_derivative(style, classes, method, k):
    m = model(style, classes)
    _, eng = make(m, method, k)
    xb, yb = batch(m)
    theta = eng.weights()
    key = zrng.stream_key(0, zrng.STREAM_ZO, 5)
    # the network is smooth: eps 1e-6 keeps the central difference's error (measured: 1.3e-7
    # relative at worst) below both its float64 roundoff at 1e-7 and its curvature at 1e-5
    r = methods.zo_step(eng, *eng.load_batch(xb, yb), key, eps=1e-6, clip=1e9, lr_zo=0.0, lr_bp=0.0,
                        clock=NullClock())
    z = zrng.normal(key, 0, eng.n_zo).astype(np.float64)
    directional = reference_grad(m, theta, xb, yb)[:eng.n_zo] @ z
    assert abs(directional) > 1e-3
    assert r["grad"] == pytest.approx(directional, rel=1e-6)
    assert r["loss_plus"] != r["loss_minus"]


@pytest.mark.parametrize("style,k", [("gpt2", 1), ("llama", 2)])
def test_elastic_zo_trains_the_last_k_units_by_bp_and_the_rest_by_zo(style, k):
    """The ZO prefix moves by -lr_zo g z alone; the last k units by the mean of the BP gradients at
    the two perturbed points. gpt2's tied LM head reads the ZO-trained token embedding: its BP
    gradient needs the embedding each pass was perturbed to, not the updated one."""
    m = model(style)
    _, eng = make(m, "elastic-zo", k)
    units = unit_of_each_parameter(m)
    n = eng.n_zo
    assert n == m.split("elastic-zo", k) == int((units < m.units - k).sum())
    assert sum(p.numel() for p in eng.bp_params) == eng.n_bp == m.params_total - n
    xb, yb = batch(m)
    theta = eng.weights()
    key, eps, lr_zo, lr_bp = zrng.stream_key(0, zrng.STREAM_ZO, 0), 1e-3, 1e-2, 0.5
    r = methods.zo_step(eng, *eng.load_batch(xb, yb), key, eps=eps, clip=5.0, lr_zo=lr_zo, lr_bp=lr_bp,
                        clock=NullClock())
    after = eng.weights()
    z = zrng.normal(key, 0, n).astype(np.float64)
    plus, minus = theta.copy(), theta.copy()
    plus[:n] += eps * z
    minus[:n] -= eps * z
    x, y = torch.from_numpy(xb).long(), torch.from_numpy(yb).long()
    assert r["loss_plus"] == pytest.approx(reference_loss(m, torch.from_numpy(plus), x, y).item(), rel=1e-12)
    assert r["loss_minus"] == pytest.approx(reference_loss(m, torch.from_numpy(minus), x, y).item(), rel=1e-12)
    np.testing.assert_allclose(after[:n], theta[:n] - lr_zo * r["grad"] * z, rtol=0, atol=1e-12)
    head_grad = 0.5 * (reference_grad(m, plus, xb, yb) + reference_grad(m, minus, xb, yb))[n:]
    np.testing.assert_allclose(after[n:], theta[n:] - lr_bp * head_grad, rtol=0, atol=1e-12)
    for u in range(m.units - k, m.units):     # every BP unit really trained
        assert np.abs(after - theta)[units == u].max() > 1e-4


def saved_bytes(eng, x, y) -> int:
    """The bytes autograd keeps for backward after one kept forward pass and its loss: every
    saved tensor's storage once, the parameters (the engine's flat buffer) not counted."""
    flat, storages = eng.flat.untyped_storage().data_ptr(), {}

    def pack(t):
        s = t.untyped_storage()
        if s.data_ptr() != flat:
            storages[s.data_ptr()] = s.nbytes()
        return t

    with torch.autograd.graph.saved_tensors_hooks(pack, lambda t: t):
        eng.loss(eng.forward(x, keep=True), y)
    eng.kept.clear()
    return sum(storages.values())


@pytest.mark.parametrize("method,k", [("full-bp", 0), ("elastic-zo", 2)])
@pytest.mark.parametrize("style", STYLES)
def test_checkpointing_gives_the_same_step_and_keeps_less(style, method, k):
    m = model(style)
    xb, yb = batch(m)
    runs = {}
    for ckpt in (False, True):
        spec, eng = make(m, method, k, checkpointing=ckpt, lr_bp=0.5, lr_zo=1e-2)
        assert isinstance(eng.net, TransformerNet) and eng.net.checkpointing is ckpt
        x, y = eng.load_batch(xb, yb)
        kept = saved_bytes(eng, x, y)
        r = methods.step(eng, spec, x, y, 0, 0, spec.hyper.lr_zo, spec.hyper.lr_bp, NullClock())
        runs[ckpt] = kept, r["loss"], eng.weights()
    (plain, loss, w), (ckpt, loss_c, w_c) = runs[False], runs[True]
    assert loss_c == pytest.approx(loss, rel=1e-14)
    np.testing.assert_allclose(w_c, w, rtol=0, atol=1e-13)
    assert np.abs(w - m.init_weights(0)).max() > 1e-3
    # what checkpointing spares is at least each BP block's attention probabilities [B, H, T, T]
    bp_blocks = m.depth if method == "full-bp" else k - 1
    assert plain - ckpt >= bp_blocks * B * m.heads * T * T * 8 > 0


@pytest.mark.parametrize("method,k,hyper", [
    ("full-bp", 0, {"lr_bp": 0.5}), ("full-bp", 0, {"optimizer": "adam", "lr_bp": 1e-2}),
    ("full-bp", 0, {"lr_bp": 0.5, "checkpointing": True}), ("full-zo", 0, {"lr_zo": 1e-2}),
    ("elastic-zo", 1, {"lr_zo": 1e-2, "lr_bp": 0.5}), ("elastic-zo", 3, {"lr_zo": 1e-2, "lr_bp": 0.5})])
@pytest.mark.parametrize("style", STYLES)
def test_a_few_steps_on_one_batch_lower_its_loss(style, method, k, hyper):
    m = model(style)
    spec, eng = make(m, method, k, dtype=np.float32, **hyper)
    x, y = eng.load_batch(*batch(m))
    before = eng.loss(eng.forward(x, keep=False), y)
    for t in range(12):
        methods.step(eng, spec, x, y, t, 0, spec.hyper.lr_zo, spec.hyper.lr_bp, NullClock())
    assert eng.loss(eng.forward(x, keep=False), y) < before - 1e-3


def test_a_classifier_trains_without_its_unused_lm_head():
    """llama's untied LM head is no part of a classifier's loss: it gets no gradient, and keeps
    its weights under SGD and Adam alike."""
    m = model("llama", CLASSES)
    lm_head = next((o, math.prod(s)) for name, o, s in m.offsets() if name == "lm_head.weight")
    for hyper in ({"lr_bp": 0.5}, {"optimizer": "adam", "lr_bp": 1e-2}):
        spec, eng = make(m, **hyper)
        x, y = eng.load_batch(*batch(m))
        before = eng.weights()
        for t in range(3):
            methods.step(eng, spec, x, y, t, 0, spec.hyper.lr_zo, spec.hyper.lr_bp, NullClock())
        moved = eng.weights() != before
        o, size = lm_head
        assert not moved[o:o + size].any() and moved[:o].any() and moved[o + size:].any()


@pytest.mark.parametrize("classes,chunk", [(0, -1), (0, 5), (CLASSES, 0)])
def test_evaluate_gives_per_sequence_mean_loss_and_token_accuracy(classes, chunk):
    m = model("gpt2", classes)
    _, eng = make(m, loss_chunk=chunk)
    x, y = eng.load_batch(*batch(m))
    out = eng.forward(x, keep=False)
    # chunked, the forward ends at the final norm: the logits are made here as the loss makes them
    logits = F.linear(out, eng.net.lm_weight()) if eng.net.chunked else out
    y[0] = logits[0].argmax(-1)         # the first sample all right, then (LM) the second's first half
    if not classes:
        y[1, :T // 2] = logits[1, :T // 2].argmax(-1)
    loss_sum, right = eng.evaluate(x, y)
    assert loss_sum / B == pytest.approx(eng.loss(out, y), rel=1e-12)   # equal lengths: the mean loss
    hits = (logits.argmax(-1) == y).double().view(B, -1)
    assert right == pytest.approx(hits.mean(1).sum().item(), rel=1e-12)
    assert right >= (1 if classes else 1.5)


@pytest.mark.parametrize("style", STYLES)
def test_the_engine_starts_from_init_weights_in_the_models_layout(style):
    m = model(style, CLASSES)
    init = m.init_weights(7)
    spec = JobSpec.from_dict({**spec_dict(m), "seed": 7})
    eng = TorchEngine(spec, m, init)
    assert np.array_equal(eng.weights(), init)
    assert eng.weights_sha256() == models.weights_sha256(init)
    for name, o, s in m.offsets():      # each tensor the forward reads is its slice of the layout
        assert np.array_equal(eng.net.p[name].detach().numpy(), init[o:o + math.prod(s)].reshape(s)), name


def test_the_runner_builds_a_transformer_engine_and_refuses_what_it_cannot_run():
    m = model("gpt2")
    spec = JobSpec.from_dict(spec_dict(m, "elastic-zo", 2, checkpointing=True, optimizer="adam"))
    eng = make_engine(spec, spec.model(), initial_weights(spec, spec.model()))
    assert isinstance(eng, TorchEngine) and isinstance(eng.net, TransformerNet)
    assert eng.n_zo == m.split("elastic-zo", 2) and eng.weights_sha256() == models.weights_sha256(m.init_weights(0))
    with pytest.raises(SpecError, match="precision int8: transformers train in fp32, bf16 or fp16"):
        JobSpec.from_dict(spec_dict(m, precision="int8"))
    with pytest.raises(SpecError, match="hyper.checkpointing: full-zo"):
        JobSpec.from_dict(spec_dict(m, "full-zo", checkpointing=True))


@pytest.mark.parametrize("method,k,hyper", [
    ("full-zo", 0, {}), ("elastic-zo", 1, {}), ("elastic-zo", 2, {}), ("full-bp", 0, {}),
    ("full-bp", 0, {"optimizer": "adam", "lr_bp": 1e-2}), ("full-bp", 0, {"checkpointing": True})])
@pytest.mark.parametrize("style", STYLES)
def test_the_loss_in_chunks_trains_as_the_whole_logits_do(style, method, k, hyper):
    """Three steps with the logits whole (loss_chunk -1, the loss before chunking) and with the
    LM head a chunk at a time (the default rule's chunks, and 5 tokens: a short last chunk), in
    float64: the same losses, the same weights after, the same evaluation. gpt2's tied head
    under ElasticZO k=1 reads the ZO-trained embedding through the chunked loss's backward."""
    m = model(style)
    xb, yb = batch(m)
    runs = {}
    for chunk in (-1, 0, 5):
        spec, eng = make(m, method, k, loss_chunk=chunk, **{"lr_bp": 0.5, "lr_zo": 1e-2, **hyper})
        assert eng.net.chunked is (chunk >= 0)
        x, y = eng.load_batch(xb, yb)
        losses = [methods.step(eng, spec, x, y, t, 0, spec.hyper.lr_zo, spec.hyper.lr_bp, NullClock())["loss"]
                  for t in range(3)]
        runs[chunk] = losses, eng.weights(), eng.evaluate(x, y)
    losses, w, evaluated = runs[-1]
    assert np.abs(w - m.init_weights(0)).max() > 1e-3
    for chunk in (0, 5):
        assert runs[chunk][0] == pytest.approx(losses, rel=1e-12)
        np.testing.assert_allclose(runs[chunk][1], w, rtol=0, atol=1e-12)
        assert runs[chunk][2] == pytest.approx(evaluated, rel=1e-12)
    assert m.loss_chunk(B * T) < B * T      # the default rule really chunks this batch


def test_the_loss_in_chunks_agrees_in_float32():
    """One MeZO step of an FP32 engine: its two losses as the whole logits give them, to FP32's
    rounding; the projected gradient, their difference over 2 eps, to that rounding over eps."""
    m = model("gpt2")
    xb, yb = batch(m)
    got = {}
    for chunk in (-1, 5):
        spec, eng = make(m, "full-zo", dtype=np.float32, loss_chunk=chunk)
        got[chunk] = methods.step(eng, spec, *eng.load_batch(xb, yb), 0, 0, 1e-3, 0.0, NullClock())
    for key in ("loss_plus", "loss_minus"):
        assert got[5][key] == pytest.approx(got[-1][key], rel=1e-6)
    assert got[5]["grad"] == pytest.approx(got[-1]["grad"], abs=4 * 1e-6 * got[-1]["loss"] / (2 * 1e-3))


def test_the_default_chunk_makes_a_chunks_logits_about_the_hidden_states():
    """Liger's rule: rows / ceil(V / D), rounded up to a power of two, never more than the rows;
    a setting is taken as it is, -1 and a classifier's head are not chunked (0)."""
    small = models.MODELS["gpt2-small"]
    assert small.loss_chunk(8 * 512) == 64              # 4,096 / ceil(50,257 / 768) = 63 -> 64
    assert small.loss_chunk(8 * 512, 100) == 100 and small.loss_chunk(50, 100) == 50
    assert small.loss_chunk(8 * 512, -1) == 0 and small.with_classes(3).loss_chunk(4096) == 0
    assert models.MODELS["gpt2-1m"].loss_chunk(8 * 64) == 16     # 512 / 32
    assert STYLES["gpt2"].loss_chunk(1) == 1


def test_loss_chunk_is_a_transformers_setting_and_old_records_made_the_logits_whole():
    """A layer model refuses it, a value below -1 is refused; a transformer job's record written
    before the setting existed reads as -1 (it made the logits whole), a layer model's as the
    default, so neither's key nor predicted memory changes."""
    from harness.stores.schema import full_job
    m = model("gpt2")
    with pytest.raises(SpecError, match="loss_chunk"):
        JobSpec.from_dict(spec_dict(m, loss_chunk=-2))
    lenet = models.LENET5
    with pytest.raises(SpecError, match="hyper.loss_chunk: only a transformer takes it"):
        JobSpec.from_dict({"job_id": "t", "method": "full-bp", "workload": {"model": "lenet5"},
                           "hyper": {"loss_chunk": 4}})
    old = spec_dict(m)
    assert full_job(old)["hyper"]["loss_chunk"] == -1
    assert full_job({**old, "hyper": {"loss_chunk": 0}})["hyper"]["loss_chunk"] == 0
    assert full_job({"job_id": "t", "method": "full-bp", "workload": {"model": lenet.name}})["hyper"]["loss_chunk"] == 0


def test_the_fused_pass_computes_what_the_explicit_one_does():
    """A pass without autograd (MeZO's, ElasticZO's front, evaluation) runs the fused attention
    and its activations in place (TransformerNet.fused): the same logits as the explicit ops a BP
    pass runs, to float64 rounding, on both styles."""
    for style in STYLES:
        m = model(style)
        _, e = make(m)
        x, _ = e.load_batch(*batch(m))
        with torch.no_grad():
            fused = e.net.run(x, 0, m.units)
            e.net.fused = False
            explicit = e.net.run(x, 0, m.units)
        assert torch.allclose(fused, explicit, rtol=0, atol=1e-12) and fused.abs().max() > 0.1


def test_a_gpus_transposed_lm_head_gives_the_rows_logits():
    """_chunk_logits on a GPU in half precision makes w h_cᵀ (aligned rows for cuBLAS, GPT-2's
    50,257 odd) and copies it to FP32 [c, V]: the same logits as h_c wᵀ's (products of bf16
    values summed in FP32 either way) and the FP32 tensor the loss reads, contiguous."""
    from workloads.transformer_torch import _logits

    rng = torch.Generator().manual_seed(0)
    h = torch.randn(8, 32, generator=rng).bfloat16()
    w = torch.randn(101, 32, generator=rng).bfloat16()
    rows, transposed = _logits(h, w, False), _logits(h, w, True)
    assert transposed.dtype == torch.float32 and transposed.shape == (8, 101) and transposed.is_contiguous()
    assert torch.allclose(transposed, rows, rtol=1e-2, atol=1e-2)
    assert torch.allclose(transposed, h.float() @ w.float().t(), rtol=1e-2, atol=5e-2)
