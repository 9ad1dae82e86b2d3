"""INT8 training: the torch reference and the C++ binary (native and under qemu) bit for bit,
the integer numerics on their own, and INT8 ElasticZO actually learning."""
import re
import subprocess
from pathlib import Path

import numpy as np
import pytest
import torch

from harness.planning import cpu
from harness.stores import schema
from workloads import int8
from workloads.models import LENET5

from testkit.agreement import assert_buffers_follow_the_model
from testkit.binaries import check_program
from testkit.runners import QEMU_A53, REPO, TORCH_RUNNER, job_spec, run_runner

STEPS = 100
CONFIGS = [("full-bp", 0, "float"), ("full-zo", 0, "float"), ("full-zo", 0, "integer"),
           ("elastic-zo", 1, "float"), ("elastic-zo", 1, "integer"),
           ("elastic-zo", 2, "float"), ("elastic-zo", 2, "integer")]


def spec(method, k, zo_loss, data_dir, steps=STEPS, batch=32):
    return job_spec(method, k, seed=11, steps=steps, batch=batch, test_samples=100, data_dir=data_dir,
                    precision="int8", zo_loss=zo_loss)


@pytest.fixture(scope="module")
def reference(data_dir, tmp_path_factory):
    """The torch runner's results, computed once per configuration."""
    tmp = tmp_path_factory.mktemp("torch-int8")
    return {c: run_runner(spec(*c, data_dir), tmp / "_".join(map(str, c))) for c in CONFIGS}


def assert_identical(a: dict, b: dict) -> None:
    assert a["status"] == b["status"] == "ok", (a["error"], b["error"])
    assert a["model"]["weights_sha256"] == b["model"]["weights_sha256"]
    assert a["model"]["params_total"] == b["model"]["params_total"] == 107550
    for x, y in zip(a["trace"], b["trace"], strict=True):
        assert {k: x[k] for k in x if k.startswith(("grad", "sign"))} == {k: y[k] for k in y if k.startswith(("grad", "sign"))}
        assert x["loss"] == pytest.approx(y["loss"], rel=1e-12)
    assert a["epochs"][0]["test_accuracy"] == b["epochs"][0]["test_accuracy"]


@pytest.mark.parametrize("config", CONFIGS, ids=lambda c: "-".join(map(str, c)))
def test_binary_ends_with_the_torch_runners_exact_int8_weights(native, reference, data_dir, tmp_path, config):
    c = run_runner(spec(*config, data_dir), tmp_path, native)
    assert len(c["trace"]) == STEPS
    assert_identical(reference[config], c)
    assert_buffers_follow_the_model(c)


def test_aarch64_binary_under_qemu_ends_with_the_same_weights(aarch64, data_dir, tmp_path):
    """BP through every layer of LeNet-5 (each INT8 kernel's backward, the convolutions' too) on
    a Pi Zero 2's core. ZO with a BP head and the integer loss runs under qemu in
    tests/test_kernel_paths.py; the native runs above cover every configuration. 12 steps: qemu
    runs the binary about 30 times slower than the native build."""
    s = spec("full-bp", 0, "float", data_dir, steps=12)
    arm = run_runner(s, tmp_path / "arm", [*QEMU_A53, aarch64])
    assert arm["env"]["arch"] == "aarch64" and schema.problems(arm) == []
    assert_identical(run_runner(s, tmp_path / "torch"), arm)


@pytest.mark.parametrize("arch,name", [("x86_64", cpu.NATIVE), ("aarch64", "cortex-a53")])
def test_the_fc_forwards_packed_gemm_is_the_plain_sum_of_products(native, tmp_path, arch, name):
    """fc_forward's panels on shapes no model has (tests/cpp/fc_panels.cpp: odd inputs, short
    panels, uneven thread shares) in both panel layouts: a lane's bytes in order (this CPU's
    path) and neon-smull's interleaved ones (the A53 under qemu)."""
    run = check_program(REPO / "tests" / "cpp" / "fc_panels.cpp", arch, name, tmp_path / "fc_panels",
                        Path(native).parent / "generated")
    lines = subprocess.run(run, capture_output=True, text=True, check=True, timeout=120).stdout.splitlines()
    assert len(lines) == 8 and all(line.endswith(" same") for line in lines), lines


@pytest.mark.parametrize("scale", [3, 40, 127])
def test_every_perturbation_range_updates_exactly_as_the_reference(native, data_dir, tmp_path, scale):
    """The binary's ZO update rounds g z to one bit in fewer operations than psto_shift and a
    clamp (int8.hpp psto_sign): at odd and even shifts (scale 3: s = 1, 40: 5, 127: 6) its weights
    must stay the reference's. At 127 the perturbation by -2 z and the update's z + 1 are over
    127, and the binary adds them in two halves (int8_net.hpp apply_changes)."""
    s = job_spec("full-zo", 0, seed=5, steps=30, test_samples=100, data_dir=data_dir, precision="int8",
                 zo_loss="float", hyper={"zo_scale": scale})
    torch_run = run_runner(s, tmp_path / "torch")
    assert_identical(torch_run, run_runner(s, tmp_path / "cpp", native))
    assert torch_run["model"]["weights_sha256"] != run_runner(
        job_spec("full-zo", 0, seed=5, steps=30, test_samples=100, data_dir=data_dir, precision="int8",
                 zo_loss="float", hyper={"zo_scale": scale - 1}), tmp_path / "other")["model"]["weights_sha256"]


def test_an_odd_batch_size_is_exact_too(native, data_dir, tmp_path):
    s = spec("elastic-zo", 2, "integer", data_dir, steps=30, batch=30)
    assert_identical(run_runner(s, tmp_path / "torch"), run_runner(s, tmp_path / "cpp", native))


def test_integer_sign_agrees_with_the_float_sign_on_real_batches(native, data_dir, tmp_path):
    """Eq. 12's integer-only comparison against the float loss difference, on the same
    perturbed logits of 400 Fashion-MNIST steps (the paper reports about 95%)."""
    agree = []
    for method, k in (("full-zo", 0), ("elastic-zo", 1), ("elastic-zo", 2)):
        r = run_runner(spec(method, k, "float", data_dir, steps=400), tmp_path / method, native)
        agree += [t["sign_integer"] == t["sign_float"] for t in r["trace"]]
    assert np.mean(agree) >= 0.90


def test_int8_elastic_zo_learns_about_as_well_as_fp32(native, data_dir, tmp_path):
    """Three epochs on 4000 samples: INT8 ElasticZO's loss goes down and its accuracy is
    within a few points of FP32 ElasticZO's from the same seed and data order."""
    out = {}
    for precision in ("fp32", "int8"):
        s = spec("elastic-zo", 2, "float", data_dir, steps=125)
        s["precision"], s["hyper"]["epochs"], s["hyper"]["test_samples"] = precision, 3, 1000
        out[precision] = run_runner(s, tmp_path / precision, native)
    losses = [e["train_loss"] for e in out["int8"]["epochs"]]
    assert losses[-1] < losses[0] - 0.2
    acc = {p: r["epochs"][-1]["test_accuracy"] for p, r in out.items()}
    assert acc["int8"] > 0.5 and acc["int8"] >= acc["fp32"] - 0.08, acc


# ---- the integer numerics on their own ----

def test_psto_shift_is_symmetric_and_unbiased_over_the_discarded_bits():
    x = torch.arange(-4096, 4097)
    r = int8.psto_shift(x, 6)
    assert torch.equal(r, -int8.psto_shift(-x, 6))
    assert abs(float(r.double().mean())) < 1e-9                     # no drift
    assert (r.double() - x.double() / 64).abs().max() < 1.0          # never off by a whole step
    assert abs(float((r.double() - x.double() / 64).mean())) < 0.05


def test_round_shift_rounds_half_up_like_division():
    x = torch.tensor([-7, -6, -5, -2, -1, 0, 1, 2, 5, 6, 7])
    assert int8.round_shift(x, 2).tolist() == [int(np.floor(v / 4 + 0.5)) for v in x.tolist()]


def test_requant_keeps_seven_bits_and_tracks_the_exponent():
    acc = torch.tensor([[1000, -20000, 5]])
    q, e = int8.requant(acc, -3)
    assert q.abs().max() <= 127 and e == -3 + 8          # 20000 needs 15 bits: shift by 8
    assert torch.allclose(q.double() * 2.0 ** e, acc.double() * 2.0 ** -3, atol=2.0 ** (e - 1))


def test_ce_error_points_along_the_softmax_gradient():
    g = torch.Generator().manual_seed(0)
    q = torch.randint(-127, 128, (64, 10), generator=g)
    y = torch.randint(0, 10, (64,), generator=g)
    err = int8.ce_error(q, -4, y).double()
    true = torch.softmax(q.double() * 2.0 ** -4, dim=1) - torch.nn.functional.one_hot(y, 10)
    cos = torch.nn.functional.cosine_similarity(err.flatten(), true.flatten(), dim=0)
    assert cos > 0.95 and err.abs().max() <= 127


def test_integer_loss_approximates_the_float_loss_in_bits():
    g = torch.Generator().manual_seed(1)
    q = torch.randint(-127, 128, (32, 10), generator=g)
    y = torch.randint(0, 10, (32,), generator=g)
    for e in (-6, -4, -2):
        nats = int8.float_loss(q, e, y) * 32
        bits = int8.integer_loss(q, e, y) / 2 ** int8.LOSS_FRAC_BITS
        assert bits * np.log(2) == pytest.approx(nats, rel=0.05)


def test_the_binary_uses_the_same_power_of_two_table():
    text = (REPO / "workloads" / "cpp" / "int8.hpp").read_text()
    table = re.search(r"POW2_Q30\[64\] = \{([^}]*)\}", text).group(1)
    assert [int(v) for v in table.replace("\n", " ").split(",")] == list(int8.POW2_Q30)


def test_int8_init_and_layout():
    q, exps = int8.init_weights(LENET5, 0)
    assert q.dtype == np.int8 and q.size == 107550 and q.min() >= -127 and q.max() <= 127
    assert abs(float(q.mean())) < 1.0 and exps == [-9, -10, -10, -9, -8]
    # the exponent puts 127 * 2^e next to Xavier's bound, as NITI does
    assert 127 * 2.0 ** exps[2] == pytest.approx(np.sqrt(6 / (784 + 120)), rel=0.6)


@pytest.mark.parametrize("runtime", ["torch", "cpp"])
def test_a_missing_init_weights_file_fails_the_job_by_name(native, tmp_path, data_dir, runtime):
    missing = tmp_path / "w.bin"
    r = run_runner({**spec("full-zo", 0, "float", data_dir, steps=2), "init_weights": str(missing)},
                   tmp_path / "run", native if runtime == "cpp" else TORCH_RUNNER)
    assert r["status"] == "failed" and r["error"].startswith(f"init_weights: {missing}")
    assert r["job"]["precision"] == "int8"


def test_strided_max_pool_and_its_backward_are_torchs_including_ties():
    """int8.max_pool2 / max_unpool2 stand in for F.max_pool2d and F.max_unpool2d (ten times
    faster); on integer maps ties are common, and the error must go to the first maximum of
    each window in scan order, as torch routes it."""
    g = torch.Generator().manual_seed(0)
    x = torch.randint(-3, 4, (4, 3, 8, 8), generator=g).float()   # seven values: most windows tie
    err = torch.randint(-127, 128, (4, 3, 4, 4), generator=g).float()
    pooled, idx = torch.nn.functional.max_pool2d(x, 2, return_indices=True)
    assert torch.equal(int8.max_pool2(x), pooled)
    assert torch.equal(int8.max_unpool2(err, x), torch.nn.functional.max_unpool2d(err, idx, 2, output_size=x.shape[-2:]))


def test_odd_maps_and_the_global_max_route_the_error_like_torch():
    """A 2x2 pool of an odd map drops its last row and column, as F.max_pool2d does; the
    global max over the points sends the error to the first point holding the maximum."""
    g = torch.Generator().manual_seed(1)
    x = torch.randint(-3, 4, (2, 3, 7, 9), generator=g).float()
    err = torch.randint(-127, 128, (2, 3, 3, 4), generator=g).float()
    pooled, idx = torch.nn.functional.max_pool2d(x, 2, return_indices=True)
    assert torch.equal(int8.max_pool2(x), pooled)
    assert torch.equal(int8.max_unpool2(err, x), torch.nn.functional.max_unpool2d(err, idx, 2, output_size=(7, 9)))
    pts = torch.randint(0, 3, (2, 5, 4), generator=g).float()       # [B, N, O], mostly ties
    gerr = torch.randint(-127, 128, (2, 4), generator=g).float()
    want = torch.zeros_like(pts)
    for b in range(2):
        for o in range(4):
            first = next(n for n in range(5) if pts[b, n, o] == pts[b, :, o].max())
            want[b, first, o] = gerr[b, o]
    assert torch.equal(int8.global_max(pts), pts.amax(dim=1))
    assert torch.equal(int8.global_unmax(gerr, pts), want)
