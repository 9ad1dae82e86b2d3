"""zobench-z v3: known answers (docs/zrng.md) and the statistics SPSA relies on."""
import subprocess
from pathlib import Path

import numpy as np
import pytest
import torch

from workloads import gauss_table as gauss, int8, methods, zrng, zrng_torch
from workloads.clock import PhaseClock
from workloads.models import weights_sha256
from workloads.spec import JobSpec
from workloads.torch_runner import TorchEngine

from testkit.binaries import check_program, x86_names_here
from testkit.runners import REPO, job_spec


def test_known_answers_match_the_documented_spec():
    key = zrng.stream_key(0, zrng.STREAM_ZO, 0)
    assert key == 0x7AB40E090F363A7D
    assert [int(b) for b in zrng.bits(key, 0, 2)] == [0x4181B152FB77616F, 0x169C646D52269D62]
    assert zrng.block_key(key, 0) == 0x48049CE4 and zrng.block_key(key, 1) == 0xDE212E89
    assert [int(b) for b in zrng.bits32(key, 0, 2)] == [0xFB2C1FB1, 0xE4E4DA1C]
    assert [int(b) for b in zrng.bits32(key, 2**32, 2)] == [0xEFC226C6, 0xCA13F17A]
    assert zrng.normal(key, 0, 4).tolist() == [-0.04736112430691719, 1.2990479469299316,
                                               0.5006747245788574, -1.8267862796783447]
    init = zrng.stream_key(0, zrng.STREAM_INIT, 0)
    assert zrng.uniform(init, 0, 3).tolist() == [0.39645451307296753, 0.27075713872909546,
                                                 0.42573779821395874]
    assert zrng.permutation(0, 0, 10).tolist() == [9, 0, 8, 3, 5, 2, 7, 4, 6, 1]
    assert zrng.Z_SCALE.view(np.uint32) == 0x3BDDB446


def test_pieces_across_a_block_boundary_equal_the_whole():
    key = zrng.stream_key(4, zrng.STREAM_ZO, 2)
    whole = zrng.bits32(key, 2**32 - 3, 6)
    assert np.array_equal(whole[3:], zrng.bits32(key, 2**32, 3))
    assert np.array_equal(whole[:3], zrng.bits32(key, 2**32 - 3, 3))
    assert not np.array_equal(whole[3:], zrng.bits32(key, 0, 3))     # the next block has its own key


# the C++ ZO passes' SIMD code on every path it has: x86's levels this CPU runs (SSE2's generic
# vector code, AVX2's vpmaddubsw + vpmaddwd with and without FMA, AVX-512BW's, AVX-512 VNNI's
# vpdpbusd; pmulhuw for INT8's z on each) and the Arm builds under qemu (the A53's uaddlp, the dot
# product's udot; umull for INT8's)
LANE_PATHS = [("x86_64", n) for n in ("x86-64", "x86-64-v2", "x86-64-v3", "x86-64-v3-nofma", "x86-64-v4", "x86-64-v4-vnni")] \
    + [("aarch64", "cortex-a53"), ("aarch64", "armv8.2-a+dotprod")]


@pytest.fixture(scope="module")
def lanes_source(tmp_path_factory):
    """The check program's include folder: the Gaussian table's header, as the build writes it."""
    out = tmp_path_factory.mktemp("generated")
    (out / "gauss_table.hpp").write_text(gauss.header(gauss.words()))
    return out


@pytest.mark.parametrize("arch,name", LANE_PATHS, ids=[n for _, n in LANE_PATHS])
def test_the_binarys_simd_perturbations_add_the_references_z_bit_for_bit(lanes_source, tmp_path, arch, name):
    """Over ranges that start mid-vector, cross a 2^32 block of hashes and end in a tail shorter
    than a SIMD iteration: FP32's z itself equals numpy's, and alpha * z added to weights equals the
    scalar loop's; INT8's z equals the torch reference's, from an odd first element (a hash's high
    half alone) to an unpaired last one (a low half alone)."""
    if arch == "x86_64" and name.removesuffix("-nofma") not in x86_names_here():
        pytest.skip(f"this CPU cannot run {name} code")
    run = check_program(REPO / "tests" / "cpp" / "zo_lanes.cpp", arch, name, tmp_path / "lanes", lanes_source)
    key, start, n = zrng.stream_key(5, zrng.STREAM_ZO, 9), 2**32 - 203, 2 * 203 + 61
    start8, n8, scale, threshold = 2**33 - 2 * 203 + 1, 2 * 203 + 62, 16, 21627     # hash 2^32: element 2^33
    out = subprocess.run([*run, str(key), str(start), str(n), str(start8), str(n8), str(scale), str(threshold)],
                         capture_output=True, text=True, check=True, timeout=120).stdout.split()
    z = np.array([int(w, 16) for w in out[:n]], dtype=np.uint32)
    assert np.array_equal(z, zrng.normal(key, start, n).view(np.uint32))
    assert out[n] == "same"
    assert [int(v) for v in out[n + 1:]] == int8.zo_noise(key, start8, n8, scale, threshold).tolist()


def test_z_is_counter_based_any_slice_equals_the_whole():
    key = zrng.stream_key(7, zrng.STREAM_ZO, 123)
    whole = zrng.normal(key, 0, 200_000)
    pieces = np.concatenate([z for _, z in zrng.normal_chunks(key, 0, 200_000)])
    assert np.array_equal(whole, pieces)
    assert np.array_equal(zrng.normal(key, 150_000, 10), whole[150_000:150_010])


def test_z_has_zero_mean_unit_variance_and_near_gaussian_shape():
    z = zrng.normal(zrng.stream_key(1, zrng.STREAM_ZO, 0), 0, 1_000_000).astype(np.float64)
    assert abs(z.mean()) < 0.005
    assert abs(z.var() - 1.0) < 0.005
    kurt = ((z - z.mean()) ** 4).mean() / z.var() ** 2 - 3.0
    assert abs(kurt - (-0.3)) < 0.02      # Irwin-Hall n=4; a Gaussian has 0, a uniform -1.2
    assert np.abs(z).max() <= 3.4642
    for lag in (1, 2, 3, 4, 8):          # neighbours (a Weyl sequence's) are uncorrelated, also in z^2
        assert abs(np.corrcoef(z[:-lag], z[lag:])[0, 1]) < 0.004
        assert abs(np.corrcoef(z[:-lag] ** 2, z[lag:] ** 2)[0, 1]) < 0.004


def test_the_byte_sum_follows_irwin_hall_exactly():
    """z's 1,021 values are as frequent as the sum of four independent uniform bytes makes them
    (a chi-square test; a hash whose bytes were correlated fails it)."""
    z = zrng.normal(zrng.stream_key(2, zrng.STREAM_ZO, 5), 0, 1_000_000)
    s = np.rint(z.astype(np.float64) / float(zrng.Z_SCALE)).astype(np.int64) + zrng.Z_OFFSET
    p = np.ones(256)
    for _ in range(3):
        p = np.convolve(p, np.ones(256))
    expected = p / p.sum() * len(s)
    counts = np.bincount(s, minlength=len(p))
    m = expected > 5
    chi2 = (((counts[m] - expected[m]) ** 2) / expected[m]).sum()
    dof = m.sum() - 1
    assert chi2 < dof + 5 * np.sqrt(2 * dof)     # 5 sigma: never a flake

def test_steps_and_streams_draw_independent_numbers():
    a = zrng.normal(zrng.stream_key(0, zrng.STREAM_ZO, 0), 0, 100_000)
    b = zrng.normal(zrng.stream_key(0, zrng.STREAM_ZO, 1), 0, 100_000)
    c = zrng.normal(zrng.stream_key(1, zrng.STREAM_ZO, 0), 0, 100_000)
    d = zrng.normal(zrng.stream_key(0, zrng.STREAM_INIT, 0), 0, 100_000)
    for other in (b, c, d):
        assert abs(np.corrcoef(a, other)[0, 1]) < 0.02


def test_uniform_in_unit_interval_and_permutation_is_a_permutation():
    u = zrng.uniform(zrng.stream_key(3, zrng.STREAM_INIT, 0), 0, 100_000)
    assert u.min() >= 0.0 and u.max() < 1.0 and abs(u.mean() - 0.5) < 0.01
    p = zrng.permutation(3, 2, 60_000)
    assert np.array_equal(np.sort(p), np.arange(60_000))
    assert not np.array_equal(p, zrng.permutation(3, 3, 60_000))


# ---- the torch generator (zrng_torch): the same bits, drawn where the weights are ----

@pytest.mark.parametrize("start,count", [
    (0, 1), (1, 1), (5, 3), (zrng_torch.CHUNKS["cpu"] - 3, 7),      # across a chunk boundary
    (12_345, 3 * zrng_torch.CHUNKS["cpu"] + 11),                     # whole chunks and a partial last one
    (2**31 - 2, 4), (2**32 - 3, 7),                                  # int32's sign, a block boundary
    (2**40 + 1, 1000), (2**62, 2),                                   # indices past 32 bits
])
def test_torch_generator_equals_the_numpy_reference_bit_for_bit(start, count):
    for seed, stream, counter in ((0, zrng.STREAM_ZO, 0), (2**64 - 1, zrng.STREAM_ZO, 10**9), (7, zrng.STREAM_INIT, 0)):
        key = zrng.stream_key(seed, stream, counter)
        assert np.array_equal(zrng_torch.bits32(key, start, count, "cpu").numpy().view(np.uint32),
                              zrng.bits32(key, start, count))
        z = np.concatenate([z.numpy() for _, z in zrng_torch.normal_chunks(key, start, count, "cpu")])
        assert np.array_equal(z.view(np.uint32), zrng.normal(key, start, count).view(np.uint32))


@pytest.mark.parametrize("method,k", [("full-zo", 0), ("elastic-zo", 1)])
def test_training_with_z_drawn_by_torch_is_step_for_step_the_numpy_run(method, k):
    """The torch runner's two generators (numpy on the host, torch on the weights' device, the
    GPU's path) leave bit-identical weights after every step of a real ZO training loop."""
    spec = JobSpec.from_dict(job_spec(method, k, seed=3, steps=5, threads=1))
    model = spec.model()
    engines = [TorchEngine(spec, model, model.init_weights(spec.seed), z_on_device=d) for d in (False, True)]
    x = np.random.default_rng(0).normal(size=(8, *model.input_shape)).astype(np.float32)
    y = np.arange(8) % model.classes
    seen = {weights_sha256(engines[0].weights())}
    for t in range(5):
        for e in engines:
            clock = PhaseClock()
            clock.start()
            methods.step(e, spec, *e.load_batch(x, y), t, 0, 1e-2, 0.05, clock)
        a, b = (weights_sha256(e.weights()) for e in engines)
        assert a == b and a not in seen, t           # the same step, and a step that moved the weights
        seen.add(a)


def keyed(key: int, n: int, device: str) -> torch.Tensor:
    """The device key of a step over n indices, set to key's block keys, as the engine holds it."""
    return zrng_torch.set_key(zrng_torch.device_key(n, device), key)


@pytest.mark.parametrize("start,count", [(0, 1), (3, zrng_torch.CHUNKS["cpu"] + 5), (2**32 - 3, 7), (2**33 + 1, 2)])
def test_the_gpu_perturbation_adds_zobench_z_from_device_scalars(start, count):
    """The perturbation a GPU runs (zrng_torch.perturb_, the key and alpha read from device
    scalars as in a CUDA graph), run on CPU torch: w + 1.0 * z is z's bits exactly, past 2^32
    too (Llama-2-7B's 6.7e9 weights), where each 2^32 indices read their own block key."""
    key = zrng.stream_key(5, zrng.STREAM_ZO, 9)
    w = torch.zeros(count)
    dkey = keyed(key, start + count, "cpu")
    zrng_torch.perturb_(w, dkey, torch.tensor(1.0, dtype=torch.float64), start)
    assert np.array_equal(w.numpy().view(np.uint32), zrng.normal(key, start, count).view(np.uint32))


def test_a_device_key_holds_a_block_key_per_2_32_indices():
    """A model's device key has a block key for each 2^32 of its weights, set each step with no
    copy from the host; a range past what it holds is refused, not drawn with a wrong key."""
    assert [len(zrng_torch.device_key(n, "cpu")) for n in (1, 2**32, 2**32 + 1, 13_015_864_320)] == [1, 1, 2, 4]
    key = zrng.stream_key(1, zrng.STREAM_ZO, 2)
    dkey = keyed(key, 2**32 + 1, "cpu")
    assert [k & 0xFFFFFFFF for k in dkey.tolist()] == [zrng.block_key(key, 0), zrng.block_key(key, 1)]
    with pytest.raises(ValueError, match="needs block key 1: the device key holds 1"):
        zrng_torch.perturb_(torch.zeros(2), keyed(key, 5, "cpu"), 1.0, 2**32 - 1)


def test_the_triton_perturbation_draws_zobench_z_on_the_gpu():
    """Where Triton and a GPU are (not in CI: benchmarks/gpu.py checks it too), the fused kernel
    adds the same z, over an awkward length and offset."""
    if not torch.cuda.is_available():
        pytest.skip("no CUDA")
    from workloads import zrng_triton
    key = zrng.stream_key(2**64 - 1, zrng.STREAM_ZO, 7)
    for n, start in ((1_000_003, 2**31 + 5), (1_000_003, 2**32 - 500_001)):     # the second crosses into block 1
        w = torch.zeros(n, device="cuda")
        dkey = keyed(key, start + n, "cuda")
        zrng_triton.perturb_(w, dkey, torch.tensor(1.0, device="cuda"), start)
        assert np.array_equal(w.cpu().numpy().view(np.uint32), zrng.normal(key, start, n).view(np.uint32))


def test_gaussian_z_is_the_tables_entry_at_the_top_16_bits(native):
    """Known answers (docs/zrng.md, "Gaussian z"); the table is the one its pinned hash names, and
    the header the C++ build wrote (with the build machine's python3) holds the same entries."""
    key = zrng.stream_key(0, zrng.STREAM_ZO, 0)
    bits = zrng.bits32(key, 0, 4)
    table = zrng.gauss_table()
    assert np.array_equal(zrng.normal(key, 0, 4, gaussian=True), table[bits >> 16])
    assert zrng.normal(key, 0, 2, gaussian=True).view(np.uint32).tolist() == [int(table[0xFB2C].view(np.uint32)),
                                                                              int(table[0xE4E4].view(np.uint32))]
    assert len(table) == 65536 and np.array_equal(table, -table[::-1])        # symmetric
    assert gauss.digest(tuple(table.view(np.uint32).tolist())) == gauss.SHA256
    header = (Path(native).parent / "generated" / "gauss_table.hpp").read_text()
    assert header == gauss.header(gauss.words())


def test_gaussian_z_has_a_normals_moments():
    """Over 10^6 draws: mean 0, variance 1, kurtosis 3 (Irwin-Hall's is 2.7) and skewness 0, each
    within 3 standard errors; the table's own are 0, 1 (to float32), 2.9992 and 0 exactly."""
    table = zrng.gauss_table().astype(np.float64)
    assert table.mean() == 0 and abs((table ** 2).mean() - 1) < 1e-7 and abs((table ** 4).mean() - 2.99925) < 1e-4
    n = 1_000_000
    z = zrng.normal(zrng.stream_key(1, zrng.STREAM_ZO, 0), 0, n, gaussian=True).astype(np.float64)
    assert abs(z.mean()) < 3 / np.sqrt(n)
    assert abs(z.var() - 1) < 3 * np.sqrt(2 / n)
    assert abs(((z - z.mean()) ** 3).mean() / z.var() ** 1.5) < 3 * np.sqrt(6 / n)
    assert abs(((z - z.mean()) ** 4).mean() / z.var() ** 2 - 3) < 3 * np.sqrt(24 / n)
    assert np.abs(z).max() > 3.4642        # past Irwin-Hall's bound: a normal's tails


@pytest.mark.parametrize("start,count", [(0, 1), (3, zrng_torch.CHUNKS["cpu"] + 5), (2**32 - 3, 7)])
def test_gaussian_z_from_torch_and_the_gpu_path_equals_numpys_bit_for_bit(start, count):
    key = zrng.stream_key(9, zrng.STREAM_ZO, 4)
    want = zrng.normal(key, start, count, gaussian=True).view(np.uint32)
    z = np.concatenate([z.numpy() for _, z in zrng_torch.normal_chunks(key, start, count, "cpu", gaussian=True)])
    assert np.array_equal(z.view(np.uint32), want)
    w = torch.zeros(count)
    zrng_torch.perturb_(w, keyed(key, start + count, "cpu"), torch.tensor(1.0), start, gaussian=True)
    assert np.array_equal(w.numpy().view(np.uint32), want)


INT8_THRESHOLDS = (21627, 32768, 58982)     # int8.sparsity_threshold's: sparsity 0.33, 0.5, 0.9


def test_int8_z_takes_two_to_a_hash_its_halves_low_first():
    key = zrng.stream_key(0, zrng.STREAM_ZO, 0)
    assert int8.zo_noise(key, 0, 8, 8, 21627).tolist() == [0, 8, 6, 0, 0, 5, 0, -7]    # docs/zrng.md
    b = zrng.bits32(key, 0, 500).astype(np.int64)
    halves = torch.from_numpy(np.stack([b & 0xFFFF, b >> 16], axis=1).reshape(-1))
    for scale, threshold in ((8, 21627), (40, 58982)):
        assert torch.equal(int8.zo_noise(key, 0, 1000, scale, threshold),
                           int8.z_of_half(halves.clone(), scale, threshold))


@pytest.mark.parametrize("start,count", [(1, 6), (4, 3), (7, 1), (2**33 - 3, 6)])
def test_int8_z_any_slice_equals_the_whole(start, count):
    """Odd first and last indices take one half of their hash; 2^33 onwards is the next block of
    hashes, with its own key."""
    key = zrng.stream_key(3, zrng.STREAM_ZO, 17)
    whole = int8.zo_noise(key, start - 1, count + 2, 16, 32768)
    assert torch.equal(int8.zo_noise(key, start, count, 16, 32768), whole[1:-1])
    if start > 2**32:
        assert not torch.equal(whole[3:], int8.zo_noise(key, 0, 5, 16, 32768))


@pytest.mark.parametrize("scale", [1, 8, 16, 31, 32, 64, 127])
def test_int8_z_is_zero_exactly_at_the_sparsity_and_uniform_on_its_range(scale):
    """Over all 65,536 halves: exactly `threshold` give 0; the others' values differ in count by
    at most one; and the mask is all but independent of the value: P(0 | value) within one part
    in a value's run of halves, (2 scale + 1) / 65536, of the sparsity."""
    for threshold in INT8_THRESHOLDS:
        u = torch.arange(1 << 16, dtype=torch.int64)
        z = int8.z_of_half(u.clone(), scale, threshold)
        value = (u * (2 * scale + 1)) >> 16          # what z is where it is not masked, + scale
        masked = ((u * (2 * scale + 1)) & 0xFFFF) < threshold
        assert int(masked.sum()) == threshold
        assert torch.equal(z, torch.where(masked, 0, value - scale))
        counts = torch.bincount(value[~masked], minlength=2 * scale + 1)
        assert len(counts) == 2 * scale + 1 and int(counts.max() - counts.min()) <= 1
        per_value = torch.bincount(value[masked], minlength=2 * scale + 1) / torch.bincount(value)
        assert float((per_value - threshold / 65536).abs().max()) < (2 * scale + 1) / 65536


def test_int8_z_drawn_is_sparse_symmetric_and_uncorrelated():
    """A million draws at scale 16, sparsity 0.5: P(0) and the mean within 4 standard errors, the
    values' frequencies uniform (chi-squared), neighbours uncorrelated, the two halves of a hash
    included."""
    n = 1_000_000
    z = int8.zo_noise(zrng.stream_key(2, zrng.STREAM_ZO, 9), 0, n, 16, 32768).double()
    p0 = float((z == 0).double().mean())
    expected0 = 0.5 + 0.5 / 33
    assert abs(p0 - expected0) < 4 * np.sqrt(expected0 * (1 - expected0) / n)
    assert abs(float(z.mean())) < 4 * float(z.std()) / np.sqrt(n)
    counts = torch.bincount((z[z != 0] + 16).long(), minlength=33).double()
    counts = torch.cat([counts[:16], counts[17:]])
    chi2 = float(((counts - counts.mean()) ** 2 / counts.mean()).sum())
    assert chi2 < 70        # 31 degrees of freedom: p = 1e-4
    for lag in (1, 2, 3):
        assert abs(float(torch.corrcoef(torch.stack([z[:-lag], z[lag:]]))[0, 1])) < 0.005
        assert abs(float(torch.corrcoef(torch.stack([z[:-lag].abs(), z[lag:].abs()]))[0, 1])) < 0.005
