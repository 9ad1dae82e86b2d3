"""zobench-z v1: known answers (docs/zrng.md) and the statistics SPSA relies on."""
import numpy as np

from workloads import zrng


def test_known_answers_match_the_documented_spec():
    key = zrng.stream_key(0, zrng.STREAM_ZO, 0)
    assert key == 0x7AB40E090F363A7D
    assert [int(b) for b in zrng.bits(key, 0, 2)] == [0x4181B152FB77616F, 0x169C646D52269D62]
    assert zrng.normal(key, 0, 4).tolist() == [0.539442241191864, -1.010988473892212,
                                               0.8318262696266174, 1.2450964450836182]
    init = zrng.stream_key(0, zrng.STREAM_INIT, 0)
    assert zrng.uniform(init, 0, 3).tolist() == [0.39645451307296753, 0.27075713872909546,
                                                 0.42573779821395874]
    assert zrng.permutation(0, 0, 10).tolist() == [9, 0, 8, 3, 5, 2, 7, 4, 6, 1]
    assert zrng.Z_SCALE.view(np.uint32) == 0x37DDB3D7


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
