"""zobench-z v1: the counter-based generator every runtime shares.

Every random number a training run draws -- the ZO perturbation z, the initial
weights, the data order -- is a pure function of (seed, stream, counter, i).
Nothing is ever stored: a runtime regenerates z for step t and parameter index
i from the seed alone (the MeZO trick), and the torch, ONNX Runtime and C++
runners draw bit-identical numbers. The specification is docs/zrng.md; this
numpy code is its reference implementation.

Why not Box-Muller: log/cos differ in the last ulp between libm, numpy's SIMD
kernels and CUDA, and cost ~20 ns per element -- too slow for a fused perturb
loop on a Cortex-A53. z here is the sum of four 16-bit uniforms (Irwin-Hall,
n=4) scaled to unit variance: mean 0, variance 1, excess kurtosis -0.3, bounded
by +-3.46. SPSA needs only E[z z^T] = I, and the result is exact in integer
arithmetic plus one float32 multiply, so it is bit-identical everywhere.
"""
from __future__ import annotations

import numpy as np

GOLDEN = np.uint64(0x9E3779B97F4A7C15)
_M1 = np.uint64(0xBF58476D1CE4E5B9)
_M2 = np.uint64(0x94D049BB133111EB)
_MASK = (1 << 64) - 1

# Streams keep the uses of one seed independent of each other.
STREAM_ZO = 1      # counter = global optimizer step, i = flat parameter index
STREAM_INIT = 2    # counter = 0, i = flat parameter index
STREAM_DATA = 3    # counter = epoch (0-based), i = training sample index

# 1 / sqrt(Var(sum of four U{0..65535})) = sqrt(3 / (65536^2 - 1))
Z_SCALE = np.float32(np.sqrt(3.0 / (65536.0 ** 2 - 1.0)))
Z_OFFSET = 2 * 65535  # the mean of the four-lane sum
CHUNK = 1 << 14       # elements generated at a time: the scratch stays in L2 (1.8x faster than 1 << 16)


def mix64_int(x: int) -> int:
    """splitmix64's finalizer on a Python int (scalar key derivation)."""
    x &= _MASK
    x = ((x ^ (x >> 30)) * 0xBF58476D1CE4E5B9) & _MASK
    x = ((x ^ (x >> 27)) * 0x94D049BB133111EB) & _MASK
    return x ^ (x >> 31)


def stream_key(seed: int, stream: int, counter: int) -> int:
    """key = mix64(mix64(mix64(seed) ^ stream) ^ counter)."""
    return mix64_int(mix64_int(mix64_int(seed) ^ stream) ^ counter)


def bits(key: int, start: int, count: int) -> np.ndarray:
    """64 random bits for indices start..start+count-1: mix64(key + (i+1)*GOLDEN).

    Written with in-place ufuncs and one scratch array: the temporaries of the
    plain expression cost more than the arithmetic."""
    x = np.arange(start + 1, start + count + 1, dtype=np.uint64)
    t = np.empty_like(x)
    np.multiply(x, GOLDEN, out=x)
    np.add(x, np.uint64(key), out=x)
    for shift, mult in ((30, _M1), (27, _M2), (31, None)):
        np.right_shift(x, np.uint64(shift), out=t)
        np.bitwise_xor(x, t, out=x)
        if mult is not None:
            np.multiply(x, mult, out=x)
    return x


def normal(key: int, start: int, count: int) -> np.ndarray:
    """z[i] for i in [start, start+count): float32, unit variance."""
    b = bits(key, start, count)
    lanes = b.view(np.uint16).reshape(-1, 4)   # the four 16-bit lanes, in any order
    s = np.add(lanes[:, 0], lanes[:, 1], dtype=np.int32)
    s += lanes[:, 2]
    s += lanes[:, 3]
    s -= Z_OFFSET
    return s.astype(np.float32) * Z_SCALE


def uniform(key: int, start: int, count: int) -> np.ndarray:
    """u[i] in [0, 1) as float32, from the top 24 bits (exact)."""
    return (bits(key, start, count) >> np.uint64(40)).astype(np.float32) * np.float32(2.0 ** -24)


def normal_chunks(key: int, start: int, count: int):
    """Yield (offset, z) pieces of at most CHUNK elements, offset relative to start."""
    for off in range(0, count, CHUNK):
        yield off, normal(key, start + off, min(CHUNK, count - off))


def permutation(seed: int, epoch: int, n: int) -> np.ndarray:
    """Epoch order of n samples: indices sorted by their 64-bit draw (stable)."""
    return np.argsort(bits(stream_key(seed, STREAM_DATA, epoch), 0, n), kind="stable")
