"""zobench-z's perturbation as one Triton kernel: theta += alpha * z, each z drawn where it is
added (docs/zrng.md), so a GPU step's three passes over the ZO prefix are three kernels with
no z buffer, instead of the ~17 elementwise kernels of workloads/zrng_torch.py each. Triton has
unsigned 64-bit integers, so mix64 is written as the spec states it; the key and alpha are
read from device scalars, so a CUDA graph replays the kernel with each step's. Imported only
where Triton is installed (the torch runner falls back to zrng_torch); benchmarks/gpu.py checks
its z against workloads/zrng.py bit for bit on the GPU.
"""
from __future__ import annotations

import torch
import triton
import triton.language as tl

from . import zrng

BLOCK = 1024


@triton.jit
def _perturb(w_ptr, n, start, key_ptr, alpha_ptr, golden, m1, m2, offset, scale, BLOCK: tl.constexpr):
    i = tl.program_id(0).to(tl.int64) * BLOCK + tl.arange(0, BLOCK).to(tl.int64)
    mask = i < n
    key = tl.load(key_ptr).to(tl.uint64, bitcast=True)
    x = (i + start + 1).to(tl.uint64, bitcast=True) * golden + key
    x = (x ^ (x >> 30)) * m1
    x = (x ^ (x >> 27)) * m2
    x = x ^ (x >> 31)
    s = (x & 0xFFFF) + ((x >> 16) & 0xFFFF) + ((x >> 32) & 0xFFFF) + (x >> 48)
    z = (s.to(tl.int32) - offset).to(tl.float32) * scale
    alpha = tl.load(alpha_ptr).to(tl.float32)
    w = tl.load(w_ptr + i, mask=mask)
    tl.store(w_ptr + i, w + alpha * z, mask=mask)


def perturb_(w: torch.Tensor, key: torch.Tensor, alpha: torch.Tensor, start: int = 0) -> None:
    """w += alpha * z[start : start + w.numel()] in place; w a contiguous float32 tensor, key an
    int64 and alpha a float device scalar."""
    n = w.numel()
    _perturb[(triton.cdiv(n, BLOCK),)](w, n, start, key, alpha, int(zrng.GOLDEN), int(zrng._M1), int(zrng._M2),
                                       zrng.Z_OFFSET, float(zrng.Z_SCALE), BLOCK=BLOCK)
