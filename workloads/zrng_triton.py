"""zobench-z's perturbation as one Triton kernel: theta += alpha * z, each z drawn where it is
added (docs/zrng.md), so a GPU step's three passes over the ZO prefix are three kernels with
no z buffer, instead of the ~15 elementwise kernels of workloads/zrng_torch.py each. Triton has
unsigned 32-bit integers, so lowbias32 is written as the spec states it; the (block) key and
alpha are read from device scalars, so a CUDA graph replays the kernel with each step's. Imported only
where Triton is installed (the torch runner falls back to zrng_torch); benchmarks/gpu.py checks
its z against workloads/zrng.py bit for bit on the GPU.
"""
from __future__ import annotations

import torch
import triton
import triton.language as tl

from . import zrng, zrng_torch

BLOCK = 1024


@triton.jit
def _perturb(w_ptr, n, start, key_ptr, alpha_ptr, weyl, lb1, lb2, offset, scale, gauss_ptr, BLOCK: tl.constexpr,
             GAUSS: tl.constexpr):
    i = tl.program_id(0).to(tl.int64) * BLOCK + tl.arange(0, BLOCK).to(tl.int64)
    mask = i < n
    # an int argument over 2^31 arrives as int64: every operand is made uint32 first
    weyl, lb1, lb2 = weyl.to(tl.uint32), lb1.to(tl.uint32), lb2.to(tl.uint32)
    key = tl.load(key_ptr).to(tl.uint32, bitcast=True)
    x = (i + start).to(tl.uint32) * weyl + key
    x = (x ^ (x >> 16)) * lb1
    x = (x ^ (x >> 15)) * lb2
    x = x ^ (x >> 16)
    if GAUSS:       # the Gaussian table's entry at the top 16 bits (zrng.gauss_table)
        z = tl.load(gauss_ptr + (x >> 16).to(tl.int32))
    else:
        s = (x & 0xFF) + ((x >> 8) & 0xFF) + ((x >> 16) & 0xFF) + (x >> 24)
        z = (s.to(tl.int32) - offset).to(tl.float32) * scale
    # half weights: z rounded once to their type (zrng_torch.as_added), w + alpha z formed in
    # float32 and rounded once on the store
    z = z.to(w_ptr.dtype.element_ty).to(tl.float32)
    alpha = tl.load(alpha_ptr).to(tl.float32)
    w = tl.load(w_ptr + i, mask=mask).to(tl.float32)
    tl.store(w_ptr + i, (w + alpha * z).to(w_ptr.dtype.element_ty), mask=mask)


def perturb_(w: torch.Tensor, key: torch.Tensor, alpha: torch.Tensor, start: int = 0, gaussian: bool = False) -> None:
    """w += alpha * z[start : start + w.numel()] in place; w a contiguous float32, bf16 or fp16 tensor, key the
    device key (zrng_torch.set_key: the int32 block keys) and alpha a float device scalar. One launch per 2^32
    block the range touches (one, but for a model past 4.29e9 parameters), each reading its block's key."""
    table = zrng_torch.gauss_table(w.device) if gaussian else w
    done = 0
    for block, lo, n in zrng.blocks(start, w.numel()):
        _perturb[(triton.cdiv(n, BLOCK),)](w[done:done + n], n, lo, zrng_torch.block_of(key, block), alpha, zrng.WEYL,
                                           zrng.LB1, zrng.LB2, zrng.Z_OFFSET, float(zrng.Z_SCALE), table,
                                           BLOCK=BLOCK, GAUSS=gaussian)
        done += n
