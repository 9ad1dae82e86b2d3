"""What "two runtimes agree" means, asserted on two runners' results of one spec: FP32 step for
step within float tolerance, INT8 bit for bit. Shared by every test that compares runtimes."""
from __future__ import annotations

import numpy as np
import pytest


def assert_same_fp32_steps(t: dict, o: dict, steps: int) -> None:
    """The same losses and projected gradients every step, and the same test accuracy within a
    sample: what two float implementations of one method on one model can promise."""
    assert t["status"] == o["status"] == "ok", (t["error"], o["error"])
    assert t["model"]["params_total"] == o["model"]["params_total"]
    assert len(t["trace"]) == len(o["trace"]) == steps
    lt, lo = (np.array([x["loss"] for x in r["trace"]]) for r in (t, o))
    np.testing.assert_allclose(lo, lt, rtol=1e-4)
    if "grad" in t["trace"][0]:
        gt, go = (np.array([x["grad"] for x in r["trace"]]) for r in (t, o))
        np.testing.assert_allclose(go, gt, rtol=0, atol=5e-3 + 1e-2 * np.abs(gt).max())
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
