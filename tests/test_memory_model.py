"""The analytic memory model against the ElasticZO paper's figures (DESIGN.md), within 3%."""
import json

import pytest

from harness.memory_model import breakdown, layer_outputs
from workloads.models import LENET5

from testkit.runners import zobench

MIB, KIB = 2 ** 20, 2 ** 10


def total(method, batch, precision="fp32", k=0, optimizer="sgd"):
    return breakdown(LENET5, method, batch, precision, k, optimizer).total_bytes


def test_activations_come_from_the_layer_shapes():
    assert layer_outputs(LENET5) == [[4704, 4704, 1176], [3136, 3136, 784], [120, 120], [84, 84], [10]]


@pytest.mark.parametrize("batch,full_zo,full_bp,cls2_kib,cls1_kib", [(32, 2.6, 5.2, 4.6, 65.3),
                                                                      (256, 18.0, 36.1, 13.3, 221.0)])
def test_fp32_reproduces_the_papers_figures(batch, full_zo, full_bp, cls2_kib, cls1_kib):
    zo = total("full-zo", batch)
    assert zo / MIB == pytest.approx(full_zo, rel=0.03)
    assert total("full-bp", batch) / MIB == pytest.approx(full_bp, rel=0.03)
    assert (total("elastic-zo", batch, k=1) - zo) / KIB == pytest.approx(cls2_kib, rel=0.03)
    assert (total("elastic-zo", batch, k=2) - zo) / KIB == pytest.approx(cls1_kib, rel=0.03)


@pytest.mark.parametrize("method,k", [("full-zo", 0), ("elastic-zo", 1), ("elastic-zo", 2)])
def test_int8_zo_methods_need_146_to_160x_less_memory(method, k):
    ratios = [total(method, b, "fp32", k) / total(method, b, "int8", k) for b in (32, 256)]
    assert ratios[0] == pytest.approx(1.60, rel=0.03) and ratios[1] == pytest.approx(1.46, rel=0.03)


def test_int8_elastic_overheads_match_sec_5_2():
    """'0.052/1.4% and 0.26/4.1% more than Full ZO' (k=1 / k=2, at B=256 and B=32)."""
    for batch, cls2, cls1 in ((256, 0.052, 1.4), (32, 0.26, 4.1)):
        zo = total("full-zo", batch, "int8")
        assert 100 * (total("elastic-zo", batch, "int8", 1) - zo) / zo == pytest.approx(cls2, rel=0.03)
        assert 100 * (total("elastic-zo", batch, "int8", 2) - zo) / zo == pytest.approx(cls1, rel=0.03)


def test_adam_adds_two_moments_per_bp_parameter():
    params = breakdown(LENET5, "full-bp", 32).parts["parameters"]
    assert total("full-bp", 32, optimizer="adam") - total("full-bp", 32) == 2 * params
    assert total("full-zo", 32, optimizer="adam") == total("full-zo", 32)


def test_cli_prints_the_breakdown_as_json_and_refuses_bad_input():
    p = zobench("memory", "--model", "lenet5", "--batch", "32", "--precision", "int8", "--method", "elastic-zo",
                "--bp-layers", "2", "--json")
    assert p.returncode == 0, p.stderr
    (row,) = json.loads(p.stdout)
    assert set(row) == {"method", "bp_layers", "precision", "batch", "optimizer", "total_bytes", "parts"}
    assert set(row["parts"]) >= {"parameters", "activations", "gradients", "errors", "scratch"}
    assert row["total_bytes"] == sum(row["parts"].values()) == total("elastic-zo", 32, "int8", 2)
    bad = zobench("memory", "--batch", "32", "--method", "elastic-zo", "--bp-layers", "4")
    assert bad.returncode == 2 and "Traceback" not in bad.stderr and "between 1 and 3" in bad.stderr
