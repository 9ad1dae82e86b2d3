"""zobench-z v3: the counter-based generator every runtime shares.

Every random number a training run draws -- the ZO perturbation z, the initial
weights, the data order -- is a pure function of (seed, stream, counter, i).
Nothing is ever stored: a runtime regenerates z for step t and parameter index
i from the seed alone (the MeZO trick), and the torch, ONNX Runtime and C++
runners draw bit-identical numbers. The specification is docs/zrng.md; this
numpy code is its reference implementation.

Why not Box-Muller: log/cos differ in the last ulp between libm, numpy's SIMD
kernels and CUDA, and cost ~20 ns per element -- too slow for a fused perturb
loop on a Cortex-A53. z is the sum of four uniform bytes (Irwin-Hall, n=4)
scaled to unit variance: mean 0, variance 1, excess kurtosis -0.3, bounded by
+-3.46. SPSA needs only E[z z^T] = I, and the result is exact in integer
arithmetic plus one float32 multiply, so it is bit-identical everywhere.

Why v2: the perturbation draws one z per parameter three times a step, so its
hash is the ZO step's own cost. v1 drew z from splitmix64's 64-bit finalizer,
whose two 64 x 64-bit multiplies no SIMD unit before AVX-512 has (AVX2 and
NEON emulate each with three 32-bit ones): a fifth of an FP32 step on an AVX2
CPU. v2 draws each z from one 32-bit hash of a Weyl sequence, all 32-bit lane
operations (vpmulld, NEON's mul), 4x cheaper on AVX2. Keys, initial weights and
data order are v1's (cold paths, where 64 bits avoid ties); docs/zrng.md keeps
v1's z for results made before. v3 draws INT8's z two to a hash (workloads/int8.py
zo_noise): it needs 16 bits, and its loops run over one-byte weights.
"""
from __future__ import annotations

import numpy as np

from . import gauss_table as gauss

GOLDEN = np.uint64(0x9E3779B97F4A7C15)
_M1 = np.uint64(0xBF58476D1CE4E5B9)
_M2 = np.uint64(0x94D049BB133111EB)
_MASK = (1 << 64) - 1

# Streams keep the uses of one seed independent of each other.
STREAM_ZO = 1      # counter = global optimizer step, i = flat parameter index
STREAM_INIT = 2    # counter = 0, i = flat parameter index
STREAM_DATA = 3    # counter = epoch (0-based), i = training sample index
STREAM_SPLIT = 4   # counter = 0, i = training sample index: the validation split (holdout)
STREAM_ZO_QUERY = 5   # counter = step * MAX_QUERIES + query (the 2nd and later of a q-query step), i = flat parameter index
MAX_QUERIES = 1024    # hyper.zo_queries' bound: the counters of two steps never meet
STREAM_ZO_UNITS = 6   # counter = global optimizer step, i = ZO unit: LeZO's layers of the step (choose)
STREAM_ZO_MASK = 7    # counter = step // zo_mask_every, i = flat parameter index: the random mask (methods.Sparsity)

# 1 / sqrt(Var(sum of four U{0..255})) = sqrt(3 / (256^2 - 1))
Z_SCALE = np.float32(np.sqrt(3.0 / (256.0 ** 2 - 1.0)))
Z_OFFSET = 2 * 255    # the mean of the four-byte sum
WEYL = 0x9E3779B9     # 2^32 / golden ratio, odd: i * WEYL visits every 32-bit word
LB1, LB2 = 0x7FEB352D, 0x846CA68B   # lowbias32's multipliers (Wellons' hash prospector)
# the xorshift-multiply rounds of each hash: (shift, multiplier or None for the last)
MIX64_ROUNDS = ((30, _M1), (27, _M2), (31, None))
LOWBIAS32_ROUNDS = ((16, LB1), (15, LB2), (16, None))
CHUNK = 1 << 14       # elements generated at a time: the scratch stays in L2 (1.8x faster than 1 << 16)
VERSION = "zobench-z v3"


def mix64_int(x: int) -> int:
    """splitmix64's finalizer on a Python int (scalar key derivation)."""
    x &= _MASK
    x = ((x ^ (x >> 30)) * 0xBF58476D1CE4E5B9) & _MASK
    x = ((x ^ (x >> 27)) * 0x94D049BB133111EB) & _MASK
    return x ^ (x >> 31)


def stream_key(seed: int, stream: int, counter: int) -> int:
    """key = mix64(mix64(mix64(seed) ^ stream) ^ counter)."""
    return mix64_int(mix64_int(mix64_int(seed) ^ stream) ^ counter)


def zo_keys(seed: int, step: int, queries: int = 1) -> list[int]:
    """The keys of optimizer step's directions, one per query: the first is the key a one-query
    step has always had (STREAM_ZO, counter = step), so q = 1 is today's MeZO step bit for bit."""
    return [stream_key(seed, STREAM_ZO, step)] + [stream_key(seed, STREAM_ZO_QUERY, step * MAX_QUERIES + i)
                                                  for i in range(1, queries)]


def choose(key: int, n: int, k: int) -> list[int]:
    """k of range(n), ascending: the k with the smallest 64-bit draws (ties to the lower index),
    as zrng.hpp choose draws them."""
    return sorted(int(i) for i in np.argsort(bits(key, 0, n), kind="stable")[:k])


def bits(key: int, start: int, count: int) -> np.ndarray:
    """64 random bits for indices start..start+count-1: mix64(key + (i+1)*GOLDEN).

    Written with in-place ufuncs and one scratch array: the temporaries of the
    plain expression cost more than the arithmetic."""
    x = np.arange(start + 1, start + count + 1, dtype=np.uint64)
    np.multiply(x, GOLDEN, out=x)
    np.add(x, np.uint64(key), out=x)
    return _rounds(x, MIX64_ROUNDS)


def _rounds(x: np.ndarray, rounds) -> np.ndarray:
    """x ^= x >> shift, then x *= multiplier, per round, in place (one scratch array)."""
    t = np.empty_like(x)
    for shift, mult in rounds:
        np.right_shift(x, x.dtype.type(shift), out=t)
        np.bitwise_xor(x, t, out=x)
        if mult is not None:
            np.multiply(x, x.dtype.type(mult), out=x)
    return x


def block_key(key: int, block: int) -> int:
    """The 32-bit key of indices block * 2^32 ... block * 2^32 + 2^32 - 1: lo32(mix64(key ^ block))."""
    return mix64_int(key ^ block) & 0xFFFFFFFF


def blocks(start: int, count: int):
    """(block, first low index, count) pieces of [start, start + count) within one 2^32 block each."""
    while count > 0:
        block, lo = divmod(start, 1 << 32)
        n = min(count, (1 << 32) - lo)
        yield block, lo, n
        start, count = start + n, count - n


def bits32(key: int, start: int, count: int) -> np.ndarray:
    """32 random bits for indices start..start+count-1: lowbias32(k + lo32(i) * WEYL), k the
    index's block key (uint32, wrapping)."""
    out = np.empty(count, dtype=np.uint32)
    done = 0
    for block, lo, n in blocks(start, count):
        x = out[done:done + n]
        x[:] = np.arange(lo, lo + n, dtype=np.uint32)
        np.multiply(x, np.uint32(WEYL), out=x)
        np.add(x, np.uint32(block_key(key, block)), out=x)
        _rounds(x, LOWBIAS32_ROUNDS)
        done += n
    return out


def gauss_table() -> np.ndarray:
    """Gaussian z's 65,536 float32 entries, from workloads/gauss_table.py, their one home (which
    the C++ build runs for the binary's copy), made once."""
    global _GAUSS
    if _GAUSS is None:
        _GAUSS = np.array(gauss.words(), dtype=np.uint32).view(np.float32)
        _GAUSS.flags.writeable = False
    return _GAUSS


_GAUSS = None
GAUSS_SHIFT = gauss.SHIFT      # Gaussian z = gauss_table()[bits32 >> GAUSS_SHIFT]


def normal(key: int, start: int, count: int, gaussian: bool = False) -> np.ndarray:
    """z[i] for i in [start, start+count): float32, unit variance: the four bytes of bits32 summed
    (Irwin-Hall), or with gaussian the Gaussian table's entry at bits32's top 16 bits."""
    if gaussian:
        return gauss_table()[bits32(key, start, count) >> np.uint32(GAUSS_SHIFT)]
    b = bits32(key, start, count).view(np.uint8).reshape(-1, 4)    # the four bytes, in any order
    s = np.add(b[:, 0], b[:, 1], dtype=np.int32)
    s += b[:, 2]
    s += b[:, 3]
    s -= Z_OFFSET
    return s.astype(np.float32) * Z_SCALE


def uniform(key: int, start: int, count: int) -> np.ndarray:
    """u[i] in [0, 1) as float32, from the top 24 bits (exact)."""
    return (bits(key, start, count) >> np.uint64(40)).astype(np.float32) * np.float32(2.0 ** -24)


def normal_chunks(key: int, start: int, count: int, gaussian: bool = False):
    """Yield (offset, z) pieces of at most CHUNK elements, offset relative to start."""
    for off in range(0, count, CHUNK):
        yield off, normal(key, start + off, min(CHUNK, count - off), gaussian)


def permutation(seed: int, epoch: int, n: int) -> np.ndarray:
    """Epoch order of n samples: indices sorted by their 64-bit draw (stable)."""
    return np.argsort(bits(stream_key(seed, STREAM_DATA, epoch), 0, n), kind="stable")


def holdout(n: int, held: int, seed: int = 0, exclude: np.ndarray | None = None) -> np.ndarray:
    """The `held` of n training samples a validation split holds out, in ascending order: the
    first `held` of the samples sorted by their 64-bit draw on STREAM_SPLIT, passing over those
    in `exclude` (a subset's, which its trials train on). A larger split holds every sample of a
    smaller one."""
    order = np.argsort(bits(stream_key(seed, STREAM_SPLIT, 0), 0, n), kind="stable")
    if exclude is not None:
        order = order[~np.isin(order, exclude)]
    return np.sort(order[:held])
