"""The ONNX Runtime runner on decoder-only transformers: its graph against the torch forward,
its steps against the torch engine's, its numpy head's gradient against autograd's, and what
it refuses. Token batches are made here (numpy, fixed seeds), not read from a data set."""
import subprocess
import sys

import numpy as np
import onnx
import onnxruntime as ort
import pytest
import torch

from harness.preparation.artifacts import onnx_graph
from harness.stores.store import Store
from workloads import methods
from harness.preparation import onnx_export
from workloads.clock import NullClock
from workloads.models import MODELS, Transformer
from workloads.ort_runner import OrtEngine
from workloads.spec import JobSpec, SpecError
from workloads.torch_runner import make_engine
from workloads.transformer_torch import TransformerNet

from testkit.runners import REPO, cli
from testkit.transformers import B, CLASSES, GPT2, LLAMA, STYLES, T

ZO_METHODS = [("full-zo", 0), ("elastic-zo", 1)]
HYPER = {"lr_zo": 1e-3, "lr_bp": 1e-2, "eps": 1e-3}


def model(style: str, classes: int = 0) -> Transformer:
    m = STYLES[style]
    return m.with_classes(classes) if classes else m


def batch(m, rng, t=T):
    """Token ids as a data set gives them: x int32 [B, T], y the next tokens (int32 [B, T]) or a
    label per sequence."""
    tokens = rng.integers(0, m.vocab, (B, t + 1)).astype(np.int32)
    return tokens[:, :-1], rng.integers(0, m.classes, B) if m.classes else tokens[:, 1:]


def specs(m, method, k, **hyper) -> tuple[JobSpec, JobSpec]:
    """The torch job and the ort job of one run, its graph made as the harness makes it."""
    d = {"job_id": "t", "method": method, "bp_layers": k, "precision": "fp32", "threads": 1, "seed": 3,
         "workload": {"model": m.name, "architecture": m.to_dict()}, "hyper": {**HYPER, **hyper}}
    return JobSpec.from_dict(d), JobSpec.from_dict({**d, "runtime": "ort", "onnx_model": str(onnx_graph(m, method, k))})


def weights(m, seed=1) -> np.ndarray:
    """The init moved off its ones and zeros, so every norm weight and bias shows in the output."""
    w = m.init_weights(seed)
    return w + np.random.default_rng(seed).standard_normal(w.size).astype(np.float32) * np.float32(0.1)


@pytest.mark.parametrize("head", [True, False], ids=["logits", "front"])
@pytest.mark.parametrize("classes", [0, CLASSES])
@pytest.mark.parametrize("style", STYLES)
def test_the_graph_computes_the_torch_forward_at_any_length(style, classes, head):
    """The whole network's logits, or the head's input (the last block's output; a classifier's
    last position), at two sequence lengths of one session; a language model's with a row per token."""
    m = model(style, classes)
    w = weights(m)
    units = m.units if head else m.units - 1
    session = ort.InferenceSession(onnx_export.graph(m, units).SerializeToString(),
                                   providers=["CPUExecutionProvider"])
    feeds = {name: w[o:o + int(np.prod(s))].reshape(s) for name, o, s in m.offsets()
             if name in {i.name for i in session.get_inputs()}}
    net = TransformerNet(m, [torch.from_numpy(w[o:o + int(np.prod(s))].reshape(s)).double() for _, o, s in m.offsets()])
    for t in (T, m.context):
        x, _ = batch(m, np.random.default_rng(t), t)
        with torch.no_grad():
            want = net.run(torch.from_numpy(x).long(), 0, units).numpy()
        if classes and not head:
            want = want[:, -1]
        want = want.reshape(-1, want.shape[-1])
        (got,) = session.run(None, {"x": x, **feeds})
        assert got.shape == want.shape and got.dtype == np.float32
        # measured: at most 5.1e-7 of the largest value from the float64 forward
        np.testing.assert_allclose(got, want, rtol=0, atol=3e-6 * np.abs(want).max())


@pytest.mark.parametrize("method,k", ZO_METHODS)
@pytest.mark.parametrize("classes", [0, CLASSES])
@pytest.mark.parametrize("style", STYLES)
def test_ort_matches_torch_step_for_step(style, classes, method, k):
    m = model(style, classes)
    # each task with each optimizer of the BP head, across the two styles
    torch_spec, ort_spec = specs(m, method, k, optimizer="adam" if style == "llama" else "sgd")
    init = m.init_weights(0)
    engines = make_engine(torch_spec, m, init), OrtEngine(ort_spec, m, init)
    rng = np.random.default_rng(0)
    steps = [[], []]
    for t in range(30):
        xy = batch(m, rng)
        for engine, out in zip(engines, steps):
            out.append(methods.step(engine, torch_spec, *engine.load_batch(*xy), t, 0, HYPER["lr_zo"],
                                    HYPER["lr_bp"], NullClock()))
    (lt, lo), (gt, go) = ([np.array([r[key] for r in s]) for s in steps] for key in ("loss", "grad"))
    # measured: losses within 3.1e-6 relative, projected gradients within 5.5e-4, weights within 9e-6
    np.testing.assert_allclose(lo, lt, rtol=1e-5)
    np.testing.assert_allclose(go, gt, rtol=0, atol=3e-3)
    assert np.corrcoef(gt, go)[0, 1] > 0.9999
    wt, wo = (e.weights() for e in engines)
    assert np.abs(wt - init).max() > 1e-2
    np.testing.assert_allclose(wo, wt, rtol=0, atol=3e-5)
    x, y = batch(m, rng)
    (loss_t, right_t), (loss_o, right_o) = (e.evaluate(*e.load_batch(x, y)) for e in engines)
    assert loss_o == pytest.approx(loss_t, rel=1e-5) and right_o == pytest.approx(right_t)
    assert engines[1].n_zo == engines[0].n_zo == m.split(method, k)


@pytest.mark.parametrize("classes", [0, CLASSES])
@pytest.mark.parametrize("style", STYLES)
def test_the_numpy_head_gradient_of_two_perturbed_passes_equals_autograds(style, classes):
    """BP through the mean loss of the two kept passes, with the ZO part moved between them and
    before backward as in a step: gpt2's tied LM head reads the token embedding each pass was
    perturbed to. A classifier's unused LM head gets no gradient."""
    m = model(style, classes)
    _, ort_spec = specs(m, "elastic-zo", 1)
    init = m.init_weights(4)
    ort_engine, torch_engine = OrtEngine(ort_spec, m, init), make_engine(ort_spec, m, init)
    x, y = batch(m, np.random.default_rng(1))
    for engine in (ort_engine, torch_engine):
        xb, yb = engine.load_batch(x, y)
        for alpha in (0.5, -1.0):
            engine.perturb(7, alpha)
            engine.loss(engine.forward(xb, keep=True), yb)
        engine.perturb(7, 0.75)
        engine.backward()
    want = torch.cat([torch.zeros(p.numel()) if p.grad is None else p.grad.flatten()
                      for p in torch_engine.bp_params]).numpy()
    assert ort_engine.grad.shape == want.shape and np.abs(want).max() > 1e-3
    # measured: within 1.1e-6 of the largest component
    np.testing.assert_allclose(ort_engine.grad, want, rtol=1e-4, atol=1e-5 * np.abs(want).max())


def dims(value_info) -> list:
    return [d.dim_param or d.dim_value for d in value_info.type.tensor_type.shape.dim]


def test_the_graph_is_deterministic_named_by_its_hash_and_takes_the_zo_part(tmp_path):
    path = onnx_export.export(GPT2, GPT2.units - 1, tmp_path)
    again = onnx_export.export(GPT2, GPT2.units - 1, tmp_path / "again")
    assert again.name == path.name and again.read_bytes() == path.read_bytes()
    assert onnx_export.file_name(GPT2, GPT2.units)[0] != path.name
    # and in another process, llama's float64 rotary constants included
    code = ("from workloads import models; from harness.preparation import onnx_export; "
            f"print(onnx_export.file_name(models.from_dict({LLAMA.to_dict()!r}), {LLAMA.units})[0])")
    p = subprocess.run([sys.executable, "-c", code], cwd=REPO, capture_output=True, text=True, timeout=120)
    assert p.stdout.strip() == onnx_export.file_name(LLAMA, LLAMA.units)[0], p.stderr
    proto = onnx.load(path)
    assert not proto.graph.initializer
    inputs = {i.name: (i.type.tensor_type.elem_type, dims(i)) for i in proto.graph.input}
    assert inputs["x"] == (onnx.TensorProto.INT32, ["batch", "tokens"])
    assert inputs["wte"][1] == [64, 32] and "ln_f.weight" not in inputs     # the head is numpy's
    assert dims(proto.graph.output[0]) == ["batch_tokens", 32]      # a row per token, as the residual stream
    # a llama classifier's LM head is read by no node, yet bound: the runner binds the ZO part whole
    assert "lm_head.weight" in {i.name for i in onnx_export.graph(LLAMA.with_classes(CLASSES), LLAMA.units).graph.input}


@pytest.mark.parametrize("style", STYLES)
def test_bp_through_blocks_is_refused_naming_bp_layers(style):
    m = model(style)
    with pytest.raises(SpecError, match=r"^bp_layers: the ort runtime trains a transformer's head unit alone"):
        onnx_graph(m, "elastic-zo", 2)
    _, ort_spec = specs(m, "elastic-zo", 1)
    ort_spec.bp_layers = 2
    with pytest.raises(SpecError, match=r"^bp_layers: .* not 2 units"):
        OrtEngine(ort_spec, m, m.init_weights(0))


def test_the_quick_transformer_suite_runs_through_the_harness_and_the_runtimes_agree(capsys, tmp_path):
    """Plan, data, bundle, both runners, results: ort's MeZO is torch's, step for step, and the
    combination ort cannot run is left out with its reason, not failed."""
    r = cli(capsys, "run", "--suite", "quick-transformer", "--results", tmp_path, "--no-report",
            "--set", "epochs=1", "--set", "train_samples=80", "--set", "test_samples=16")
    assert r.returncode == 0, r.stderr
    assert "elastic-zo:2 fp32 on ort" in r.stderr and "bp_layers = 1" in r.stderr
    store = Store(tmp_path)
    res = {(x["job"]["runtime"], x["job"]["method"], x["job"]["bp_layers"]): x for x in store.results(store.latest())}
    assert len(res) == 6 and all(x["status"] == "ok" for x in res.values())
    for method, k in (("full-zo", 0), ("elastic-zo", 1)):
        t, o = res["torch", method, k]["epochs"][0], res["ort", method, k]["epochs"][0]
        assert t["train_loss"] == pytest.approx(o["train_loss"], rel=1e-5)
        assert t["test_accuracy"] == pytest.approx(o["test_accuracy"], abs=1e-3)
    assert res["torch", "full-bp", 0]["model"]["params_total"] == MODELS["gpt2-1m"].params_total
    bp, zo = (res["torch", m, 0]["epochs"][0]["train_loss"] for m in ("full-bp", "full-zo"))
    assert bp < zo - 0.1        # ten BP steps with Adam already learn; MeZO barely moves from ln 4096
