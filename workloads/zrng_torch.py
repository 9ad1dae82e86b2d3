"""zobench-z (docs/zrng.md) in torch integer ops, drawn where the weights live.

The torch runner perturbs its parameters with z generated on their device: on a GPU no
host-to-device copy per chunk and no n_zo-sized z buffer, only one chunk at a time, the
MeZO way. torch has no uint64, so the 64-bit words are int64: + and * wrap modulo 2^64 on
both, so only the right shift needs care (torch's is arithmetic; masking the sign-filled
bits makes it logical). The numbers are bit for bit those of workloads/zrng.py, the
reference (tested on CPU torch, the code path a GPU runs).
"""
from __future__ import annotations

import torch

from . import zrng

# elements per chunk: on a CPU, the fewest torch calls that still stay in L2 (1 << 16: 2x
# faster than numpy's 1 << 14 here); a GPU wants chunks large enough to fill it
CHUNKS = {"cpu": 1 << 16, "cuda": 1 << 22}


def int64(c: int) -> int:
    """A 64-bit constant as the int64 with the same bits."""
    return c - (1 << 64) if c >= 1 << 63 else c


GOLDEN, M1, M2 = (int64(int(c)) for c in (zrng.GOLDEN, zrng._M1, zrng._M2))


def _xorshift(x: torch.Tensor, s: int) -> torch.Tensor:
    """x ^ (x >> s) with a logical shift, in place."""
    return x.bitwise_xor_(x.bitwise_right_shift(s).bitwise_and_((1 << (64 - s)) - 1))


def bits(key, start: int, count: int, device) -> torch.Tensor:
    """mix64(key + (i + 1) * GOLDEN) for i in [start, start + count), as int64 bits. key: an int,
    or an int64 scalar tensor on the device (a CUDA graph replays with the step's key in it)."""
    x = torch.arange(start + 1, start + count + 1, dtype=torch.int64, device=device)
    x.mul_(GOLDEN).add_(key if isinstance(key, torch.Tensor) else int64(key))
    _xorshift(x, 30).mul_(M1)
    _xorshift(x, 27).mul_(M2)
    return _xorshift(x, 31)


def normal(key, start: int, count: int, device) -> torch.Tensor:
    """z[i] for i in [start, start + count): float32, the four 16-bit lanes' sum scaled (a float32
    product, as numpy's)."""
    b = bits(key, start, count, device)
    s = b.bitwise_and(0xFFFF)
    for shift in (16, 32, 48):
        s.add_(b.bitwise_right_shift(shift).bitwise_and_(0xFFFF))
    return s.sub_(zrng.Z_OFFSET).to(torch.float32).mul_(zrng.Z_SCALE)


def perturb_(w: torch.Tensor, key, alpha, start: int = 0) -> None:
    """w += alpha * z[start : start + w.numel()] in place, a chunk of z at a time: the GPU's
    perturbation where Triton is not installed (workloads/zrng_triton.py fuses it)."""
    for off, z in normal_chunks(key, start, w.numel(), w.device):
        w[off:off + len(z)].add_(z.mul_(alpha))


def normal_chunks(key: int, start: int, count: int, device):
    """(offset, z) pieces of at most one chunk, offset relative to start."""
    chunk = CHUNKS.get(torch.device(device).type, zrng.CHUNK)
    for off in range(0, count, chunk):
        yield off, normal(key, start + off, min(chunk, count - off), device)
