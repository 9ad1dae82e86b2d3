"""zobench-z (docs/zrng.md) in torch integer ops, drawn where the weights live.

The torch runner perturbs its parameters with z generated on their device: on a GPU no
host-to-device copy per chunk and no n_zo-sized z buffer, only one chunk at a time, the
MeZO way. torch has no unsigned 32-bit arithmetic, so the words are int32: + and * wrap as
uint32's do, so only the right shift needs care (torch's is arithmetic; masking the
sign-filled bits makes it logical). The numbers are bit for bit those of workloads/zrng.py, the reference (tested on
CPU torch, the code path a GPU runs).
"""
from __future__ import annotations

import torch

from . import zrng

# elements per chunk: on a CPU, the fewest torch calls that still stay in L2 (1 << 16: 2x
# faster than numpy's 1 << 14 here); a GPU wants chunks large enough to fill it
CHUNKS = {"cpu": 1 << 16, "cuda": 1 << 22}


def _int32(c: int) -> int:
    """A uint32 value as the int32 with the same bits."""
    return c - (1 << 32) if c >= 1 << 31 else c


WEYL = _int32(zrng.WEYL)
ROUNDS = tuple((shift, None if m is None else _int32(m)) for shift, m in zrng.LOWBIAS32_ROUNDS)


def key32(key: int, block: int = 0) -> int:
    """The block key of indices block * 2^32 onwards as int32 bits: what a device key holds."""
    return _int32(zrng.block_key(key, block))


def device_key(n: int, device) -> torch.Tensor:
    """The device key of a step over n indices: one int32 block key per 2^32 of them (a model
    past 4.29e9 parameters, Llama-2-7B's 6.7e9, has two), filled each step by set_key, so a
    CUDA graph's perturbation reads the step's keys where it captured them."""
    return torch.zeros(max(1, -(-n // (1 << 32))), dtype=torch.int32, device=device)


def set_key(dkey: torch.Tensor, key: int) -> torch.Tensor:
    """dkey (device_key's) filled with key's block keys, one fill a block: no host-device copy."""
    if dkey.numel() == 1:
        return dkey.fill_(key32(key))
    for block, k in enumerate(dkey.reshape(-1)):
        k.fill_(key32(key, block))
    return dkey


def block_of(key, block: int):
    """The block key of `block`: from the 64-bit key, or from a device key (set_key's), which
    must hold it."""
    if not isinstance(key, torch.Tensor):
        return key32(key, block)
    keys = key.reshape(-1)
    if block >= len(keys):
        raise ValueError(f"index {block << 32} onwards needs block key {block}: the device key holds {len(keys)} "
                         "(zrng_torch.device_key)")
    return keys[block]


def bits32(key, start: int, count: int, device) -> torch.Tensor:
    """lowbias32(k + lo32(i) * WEYL) for i in [start, start + count), as int32 bits, k the
    block key of i (zrng.bits32). key: the 64-bit key, an int; or a device key (set_key's,
    or key32's value as an int32 scalar), holding the block keys of the indices drawn."""
    out = torch.empty(count, dtype=torch.int32, device=device)
    done = 0
    for block, lo, n in zrng.blocks(start, count):
        x = out[done:done + n]
        # lo32(i) as int32 bits: counted from -2^31, the top bit flipped back
        torch.arange(lo - (1 << 31), lo + n - (1 << 31), dtype=torch.int32, device=device, out=x)
        x.bitwise_xor_(-(1 << 31)).mul_(WEYL)
        x.add_(block_of(key, block))
        for shift, mult in ROUNDS:      # x ^= x >> shift (logical: the sign-filled bits masked)
            x.bitwise_xor_(x.bitwise_right_shift(shift).bitwise_and_((1 << (32 - shift)) - 1))
            if mult is not None:
                x.mul_(mult)
        done += n
    return out


def normal(key, start: int, count: int, device, gaussian: bool = False) -> torch.Tensor:
    """z[i] for i in [start, start + count): float32, the four bytes' sum scaled (a float32
    product, as numpy's), or with gaussian the Gaussian table's entry (zrng.gauss_table)."""
    b = bits32(key, start, count, device)
    if gaussian:
        return gauss_table(device)[b.bitwise_right_shift(zrng.GAUSS_SHIFT).bitwise_and_(0xFFFF).long()]
    s = b.bitwise_and(0xFF)
    for shift in (8, 16, 24):
        s.add_(b.bitwise_right_shift(shift).bitwise_and_(0xFF))
    return s.sub_(zrng.Z_OFFSET).to(torch.float32).mul_(zrng.Z_SCALE)


def gauss_table(device) -> torch.Tensor:
    """zrng.gauss_table on the device, made once per device."""
    device = torch.device(device)
    if device not in _GAUSS:
        _GAUSS[device] = torch.from_numpy(zrng.gauss_table().copy()).to(device)
    return _GAUSS[device]


_GAUSS: dict = {}


def perturb_(w: torch.Tensor, key, alpha, start: int = 0, gaussian: bool = False) -> None:
    """w += alpha * z[start : start + w.numel()] in place, a chunk of z at a time: the GPU's
    perturbation where Triton is not installed (workloads/zrng_triton.py fuses it)."""
    for off, z in normal_chunks(key, start, w.numel(), w.device, gaussian):
        w[off:off + len(z)].add_(as_added(z, w.dtype).mul_(alpha))


def as_added(z: torch.Tensor, dtype) -> torch.Tensor:
    """z as a perturbation of weights of `dtype` adds it: a half precision's z rounded once to it
    and then exact in float32 (w + alpha z is formed in float32 and rounded once, on every
    device); other weights' z in their type."""
    return z.to(dtype).float() if dtype in (torch.bfloat16, torch.float16) else z.to(dtype)


def normal_chunks(key: int, start: int, count: int, device, gaussian: bool = False):
    """(offset, z) pieces of at most one chunk, offset relative to start."""
    chunk = CHUNKS.get(torch.device(device).type, zrng.CHUNK)
    for off in range(0, count, chunk):
        yield off, normal(key, start + off, min(chunk, count - off), device, gaussian)
