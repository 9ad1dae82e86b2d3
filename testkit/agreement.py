"""What "two runtimes agree" means, asserted on two runners' results of one spec: FP32 step for
step within float tolerance, INT8 bit for bit; and what the binary's buffers agree with in the
memory model. Shared by every test that compares runtimes."""
from __future__ import annotations

import math

import numpy as np
import pytest

from harness.search import memory_model
from workloads.spec import JobSpec


def assert_same_fp32_steps(t: dict, o: dict, steps: int) -> None:
    """The same record a step, the same losses (the kept one of a conservative step too) and
    projected gradients (each query's of a q-query step too) every step, and the same test
    accuracy within a sample: what two float implementations of one method on one model can
    promise."""
    assert t["status"] == o["status"] == "ok", (t["error"], o["error"])
    assert t["model"]["params_total"] == o["model"]["params_total"]
    assert len(t["trace"]) == len(o["trace"]) == steps
    assert [sorted(x) for x in o["trace"]] == [sorted(x) for x in t["trace"]]
    for key in ("loss", "loss_kept"):
        if key in t["trace"][0]:
            a, b = (np.array([x[key] for x in r["trace"]]) for r in (t, o))
            np.testing.assert_allclose(b, a, rtol=1e-4)
    for key in ("grad", "grads"):
        if key in t["trace"][0]:
            a, b = (np.array([x[key] for x in r["trace"]]) for r in (t, o))
            np.testing.assert_allclose(b, a, rtol=0, atol=5e-3 + 1e-2 * np.abs(a).max())
    n = t["job"]["hyper"]["test_samples"]
    assert abs(t["epochs"][0]["test_accuracy"] - o["epochs"][0]["test_accuracy"]) <= 1 / n


def assert_same_int8_run(t: dict, o: dict) -> None:
    """INT8 bit for bit: the final weights, each step's ZO signs and loss, the test accuracy."""
    assert t["status"] == o["status"] == "ok", (t["error"], o["error"])
    assert t["model"]["weights_sha256"] == o["model"]["weights_sha256"]
    assert t["model"]["params_total"] == o["model"]["params_total"]
    signs = lambda x: {k: v for k, v in x.items() if k.startswith(("grad", "sign"))}  # noqa: E731
    for x, y in zip(t["trace"], o["trace"], strict=True):
        assert signs(x) == signs(y)
        assert x["loss"] == pytest.approx(y["loss"], rel=1e-12)
    assert t["epochs"][0]["test_accuracy"] == o["epochs"][0]["test_accuracy"]


def assert_buffers_follow_the_model(r: dict) -> None:
    """The binary's table of buffers (memory.buffers, summed per part in memory.buffer_parts)
    against harness/search/memory_model.py term by term: the same part names, the parameters,
    and in FP32 the gradients and optimizer state exactly; the errors less what the binary never
    stores: a ReLU's output error (the ReLU's backward runs in place), a global max's layer
    output error (its backward routes the pooled error by argmax), and in INT8 a 2x2 pool's
    output error (routed straight into the accumulators). The rest is the binary's own layout:
    padded inputs, fused activations, one shared accumulator, and "working" for the kernels. The ZO
    parts' state and buffers (optimizer, zo) are the model's exactly too."""
    m, job = r["memory"], JobSpec.from_dict(r["job"])
    parts = m["buffer_parts"]
    assert set(parts) <= set(memory_model.PARTS + memory_model.TRANSFORMER_PARTS)
    assert sum(parts.values()) == sum(m["buffers"].values()) == m["buffers_bytes"]
    model, h = job.model(), job.hyper
    want = memory_model.breakdown(model, job.method, h.batch_size, job.precision, job.bp_layers, h.optimizer,
                                  zo=h).parts
    same = ("parameters", "gradients", "optimizer", "zo") if job.precision == "fp32" else ("parameters",)
    assert {p: parts.get(p, 0) for p in same} == {p: want[p] for p in same}
    never = 0
    for layer, shapes in list(zip(model.layers, model.shapes))[model.first_bp_layer(job.method, job.bp_layers):]:
        out = math.prod(shapes.out)
        never += out * layer.relu + out * (layer.pool == "global-max")
        never += math.prod(shapes.pooled) * (layer.pool == "max2x2" and job.precision == "int8")
    size = 4 if job.precision == "fp32" else 1
    assert parts["errors"] == want["errors"] - size * h.batch_size * never
