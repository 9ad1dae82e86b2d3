"""INT8 training (ElasticZO-INT8, Sec. 4.2-4.4; NITI-style), the torch reference.

The integer algorithm is specified in docs/int8.md; this module is its reference
implementation and workloads/cpp/int8.hpp implements the same operations, so the
two end with identical int8 weights (tested bit for bit).

The engine walks the model description (models.py): conv2d, fc and pointwise layers,
each requantized with its ReLU if it has one, then its max2x2 or global-max pool.

Exactness: weights, activations and errors are integer-valued float32 tensors, and
every convolution and matrix product runs on them in the narrowest float type that is
exact for it (exact_dtype), chosen from its number of terms. Every product is at most
127^2 = 16129 and every partial sum is an integer, so a sum of n products is exact in
float32 while n * 16129 <= 2^24, n <= 1040 (LeNet-5's forward pass: at most 784
products; its error propagation; FC weight gradients for batches up to 1040), and in
float64 for n < 5.6e11 (the convolutions' weight gradients, B * H * W products per
weight; the pointwise layers', B * N). Requantization (round_shift) is exact on such
floats too. The same holds on a GPU as long as each product and sum is a plain float one:
the runner turns cuDNN (Winograd and FFT convolutions are not exact) and TF32 off for an
int8 job on cuda, and every tensor of the engine lives on the job's device. The integer parts that need bit operations (the loss, the softmax error, the
rounding of updates) run on int64.
"""
from __future__ import annotations

import hashlib
import math

import numpy as np
import torch
import torch.nn.functional as F

from . import zrng, zrng_torch
from .spec import SpecError

ACT_BITS = 7              # activations and errors are requantized to 7 bits + sign
INPUT_EXP = -7            # the input is pixel >> 1 with exponent -7: [0, 1)
LOG2E_Q15 = 47274         # log2(e) in Q15: logits to base 2 (NITI)
CE_OFFSET = 10            # softmax terms more than 10 bits below the max are dropped
ERR_BITS_IN = 11          # the softmax error is formed in Q11, then shifted right by 4
ZO_GRAD_BITS = 1          # the ZO update is rounded to 1 bit: -1, 0 or +1 per weight


def schedule(epoch: int, values: tuple) -> int | float:
    """The paper's schedules change at epochs 20 and 50 (Sec. 5.1.1)."""
    return values[0] if epoch < 20 else values[1] if epoch < 50 else values[2]


def grad_bits(epoch: int) -> int:
    return schedule(epoch, (5, 4, 3))


def sparsity_threshold(epoch: int) -> int:
    """P(z_i = 0) = threshold / 65536, for sparsity 0.33 -> 0.5 -> 0.9."""
    return schedule(epoch, (21627, 32768, 58982))


def ceil_log2(m: int) -> int:
    """NITI's bitwidth of a tensor with max |value| m: ceil(log2(m)), 0 for m <= 1."""
    return (m - 1).bit_length() if m > 1 else 0


EXACT_F32_TERMS = (1 << 24) // (127 * 127)    # 1040: float32 sums this many int8 products exactly


def exact_dtype(terms: int) -> torch.dtype:
    """The float type in which a sum of `terms` int8 x int8 products is exact."""
    return torch.float32 if terms <= EXACT_F32_TERMS else torch.float64


def round_shift(x: torch.Tensor, s: int) -> torch.Tensor:
    """x / 2^s rounded half up (s >= 1). On an integer-valued float tensor as ceil(u / 2) with
    u = floor(x / 2^(s-1)), i.e. u - floor(u / 2): power-of-two scalings and floors, so exact
    without the headroom that adding 2^(s-1) would need."""
    if x.is_floating_point():
        u = (x * 2.0 ** (1 - s)).floor_()
        return u.sub_((u * 0.5).floor_())
    return (x >> s) + ((x >> (s - 1)) & 1)


def psto_shift(x: torch.Tensor, s: int) -> torch.Tensor:
    """x / 2^s with NITI's pseudo-stochastic rounding: the discarded bits are split in a
    high half (the rounding probability) and a low half (the pseudo-random number).
    Applied to |x| and the sign put back, so that updates have no drift: rounding the
    two's-complement value biases every negative update away from zero."""
    a = x.abs()
    rem = a & ((1 << s) - 1)
    h = s >> 1
    prob, rand = rem >> h, rem & ((1 << h) - 1)
    if s & 1:
        rand = rand << 1
    return torch.sign(x) * ((a >> s) + (prob > rand).to(x.dtype))


def requant(acc: torch.Tensor, exp: int, relu: bool = False) -> tuple[torch.Tensor, int]:
    """int32 accumulator -> 7-bit values and the exponent, by the bitwidth of the tensor's max;
    relu: and the ReLU after it (the same clamp from 0)."""
    lo, hi = torch.aminmax(acc)
    s = ceil_log2(int(max(hi, -lo))) - ACT_BITS
    if s > 0:
        acc, exp = round_shift(acc, s), exp + s
    return acc.clamp(0 if relu else -127, 127), exp


def grad_round(acc: torch.Tensor, bits: int) -> torch.Tensor:
    """NITI's gradient rounding: the accumulated gradient to `bits` bits; the bitwidth is
    the learning rate."""
    b = ceil_log2(int(acc.abs().max()))
    s = b - bits
    if b == 0:
        return torch.zeros_like(acc)
    return acc if s < 1 else psto_shift(acc, s)


def base2_logits(q: torch.Tensor, exp: int) -> torch.Tensor:
    """floor(q * 2^exp * log2(e)): the logits as integer powers of two."""
    t = q * LOG2E_Q15
    return t >> (15 - exp) if exp <= 15 else t << (exp - 15)


def ce_error(q: torch.Tensor, exp: int, y: torch.Tensor) -> torch.Tensor:
    """NITI's integer cross-entropy gradient dL/dlogits, as int8 values: softmax from
    powers of two, in Q11, minus the one-hot, shifted to 7 bits."""
    s = base2_logits(q.long(), exp)
    d = (s - s.max(dim=1, keepdim=True).values + CE_OFFSET).clamp(min=0)
    p = (torch.ones_like(d) << d) - 1
    p = (p << ERR_BITS_IN) // p.sum(dim=1, keepdim=True)
    rows = torch.arange(len(y), device=y.device)
    p[rows, y] -= p.sum(dim=1)
    return round_shift(p, 4).clamp(-127, 127)


# 2^(f/64) in Q30 for f = 0..63: the fractional powers of two of the integer loss
POW2_Q30 = tuple(round(2 ** (f / 64) * 2 ** 30) for f in range(64))
LOSS_FRAC_BITS = 6
_POW2_Q30 = {}     # device -> POW2_Q30 as a tensor there, made once (a copy to a GPU per loss is not free)


def integer_loss(q: torch.Tensor, exp: int, y: torch.Tensor) -> int:
    """Eq. 12's integer loss summed over the batch, in units of 2^-6 bits: per sample
    log2(sum_j 2^(s_j - m)) + m - s_label, with the base-2 logits s and the log2 in fixed
    point with 6 fractional bits (powers from POW2_Q30, log2 by repeated squaring)
    instead of the paper's floor(log2): see docs/int8.md for why."""
    sh = 15 - exp - LOSS_FRAC_BITS
    t = q.long() * LOG2E_Q15
    s = t >> sh if sh >= 0 else t << -sh
    m = s.max(dim=1, keepdim=True).values
    d = s - m
    ip = -(d >> LOSS_FRAC_BITS)
    pow2 = _POW2_Q30.get(q.device)
    if pow2 is None:
        pow2 = _POW2_Q30[q.device] = torch.tensor(POW2_Q30, device=q.device)
    terms = torch.where(ip <= 30, pow2[d & 63] >> ip.clamp(max=30), 0)   # below 2^-30 of the max: dropped
    acc = terms.sum(dim=1).tolist()
    return (sum(map(log2_fixed, acc)) - len(acc) * (30 << LOSS_FRAC_BITS) +
            int(m.sum()) - int(s.gather(1, y.view(-1, 1)).sum()))


def log2_fixed(v: int) -> int:
    """log2(v) for an integer v > 0, in units of 2^-6, rounded down: the integer part from
    the bit length, each fractional bit by squaring the mantissa (Q30)."""
    msb = v.bit_length() - 1
    m = v << (30 - msb) if msb <= 30 else v >> (msb - 30)
    out = msb
    for _ in range(LOSS_FRAC_BITS):
        m = (m * m) >> 30
        bit = m >> 31
        m >>= bit
        out = (out << 1) | bit
    return out


def float_loss(q: torch.Tensor, exp: int, y: torch.Tensor) -> float:
    """The mean cross-entropy of the dequantized logits, in float64 (the paper's INT8)."""
    return float(F.cross_entropy(q.double() * 2.0 ** exp, y))


def zo_noise(key: int, start: int, count: int, scale: int, threshold: int, device="cpu") -> torch.Tensor:
    """The sparse uniform perturbation z[i], int64, drawn on `device`, two to a hash: z[i] from
    the 16-bit half i & 1 (the low for even i) of zobench-z's bits32(key, i >> 1) (docs/zrng.md,
    "INT8 z"): an INT8 z needs 16 bits, and a hash is most of the cost of a ZO pass."""
    first = start >> 1
    b = zrng_torch.bits32(key, first, ((start + count + 1) >> 1) - first, device)
    # the int32 words as their 16-bit halves, low half first (every target zobench runs is little-endian)
    u = b.view(torch.int16)[start - 2 * first:start - 2 * first + count].long().bitwise_and_(0xFFFF)
    return z_of_half(u, scale, threshold)


def z_of_half(u: torch.Tensor, scale: int, threshold: int) -> torch.Tensor:
    """z from its 16 bits u (int64, consumed): with p = u (2 scale + 1), 0 where p's low 16 bits
    are below threshold (probability exactly threshold/65536: u -> p mod 2^16 is a bijection),
    else p's high 16 bits - scale, uniform on [-scale, scale]."""
    p = u.mul_(2 * scale + 1)
    z = p.bitwise_right_shift(16).sub_(scale)
    return z.masked_fill_(p.bitwise_and_(0xFFFF) < threshold, 0)


def zo_update_shift(scale: int) -> int:
    """The ZO update rounds g*z to ZO_GRAD_BITS bits; its bitwidth is taken from the range
    [-scale, scale] (z is never stored, so its sample max is never known)."""
    return ceil_log2(scale) - ZO_GRAD_BITS


def init_weights(model, seed: int) -> tuple[np.ndarray, list[int]]:
    """NITI's uniform initialization as integers: q uniform on [-127, 127] from zobench-z, and
    per layer the exponent of Xavier's bound a: 127 * 2^e ~ a, e = ceil(log2 a) - 7."""
    sizes = [math.prod(l.weight_shape) for l in model.layers]
    u = zrng.bits(zrng.stream_key(seed, zrng.STREAM_INIT, 1), 0, sum(sizes))
    q = (((u & np.uint64(0xFFFFFFFF)) * np.uint64(255)) >> np.uint64(32)).astype(np.int64) - 127
    exps = []
    for l in model.layers:
        fan_out = l.weight_shape[0] * math.prod(l.weight_shape[2:])
        exps.append(math.ceil(math.log2(math.sqrt(6.0 / (l.fan_in + fan_out)))) - ACT_BITS)
    return q.astype(np.int8), exps


def weights_bytes(q: np.ndarray, exps: list[int]) -> bytes:
    """The int8 weights in layout order, then each layer's exponent as int32 LE: what a weights
    file holds (init_weights, save_weights) and weights_sha256 hashes."""
    return np.ascontiguousarray(q, dtype=np.int8).tobytes() + np.asarray(exps, dtype="<i4").tobytes()


def weights_sha256(q: np.ndarray, exps: list[int]) -> str:
    return hashlib.sha256(weights_bytes(q, exps)).hexdigest()


def read_weights(path: str, model) -> tuple[np.ndarray, list[int]]:
    """A weights file (weights_bytes' layout) for model: a trained network to fine-tune."""
    n, layers = sum(math.prod(l.weight_shape) for l in model.layers), len(model.layers)
    raw = np.fromfile(path, dtype=np.uint8)
    if raw.size != n + 4 * layers:
        raise SpecError(f"init_weights: {path} must hold {n + 4 * layers} bytes (int8 weights, then an "
                        f"int32 exponent per layer) for {model.name}, holds {raw.size}")
    q = raw[:n].view(np.int8)
    if (q == -128).any():
        raise SpecError(f"init_weights: {path} holds -128 (int8 weights are in [-127, 127])")
    return q.copy(), [int(e) for e in raw[n:].view("<i4")]


WINDOW = ((0, 0), (0, 1), (1, 0), (1, 1))     # a 2x2 pooling window in scan order


def _even(x: torch.Tensor) -> torch.Tensor:
    """x without its last row and column where its sides are odd: what a floored 2x2 pool reads."""
    return x[:, :, :x.shape[2] // 2 * 2, :x.shape[3] // 2 * 2]


def max_pool2(x: torch.Tensor) -> torch.Tensor:
    """2x2 max pooling (sides floored) as the maximum of the four strided views of a window's
    corners: F.max_pool2d's values, ten times faster on CPU."""
    x = _even(x)
    return torch.maximum(torch.maximum(x[:, :, 0::2, 0::2], x[:, :, 0::2, 1::2]),
                         torch.maximum(x[:, :, 1::2, 0::2], x[:, :, 1::2, 1::2]))


def max_unpool2(err: torch.Tensor, x: torch.Tensor) -> torch.Tensor:
    """The pooled error routed back to the first maximum of each window of x in scan order,
    as F.max_unpool2d does with F.max_pool2d's indices (docs/int8.md), in strided views; an
    odd last row or column, which no window reads, gets none."""
    m, out = max_pool2(x), torch.zeros_like(x)
    x, inner = _even(x), _even(out)     # inner is a view: writing it writes out
    free = torch.ones_like(m, dtype=torch.bool)
    for di, dj in WINDOW:
        hit = (x[:, :, di::2, dj::2] == m) & free
        inner[:, :, di::2, dj::2] = torch.where(hit, err, 0)
        free &= ~hit
    return out


def global_max(x: torch.Tensor) -> torch.Tensor:
    """The max over the points of [B, N, O]."""
    return x.amax(dim=1)


def global_unmax(err: torch.Tensor, x: torch.Tensor) -> torch.Tensor:
    """The error of the global max [B, O] routed back to the first point holding the maximum
    of x [B, N, O] (argmax returns the first)."""
    return torch.zeros_like(x).scatter_(1, x.argmax(dim=1, keepdim=True), err.unsqueeze(1))


POOL = {"": lambda x: x, "max2x2": max_pool2, "global-max": global_max}
UNPOOL = {"": lambda err, x: err, "max2x2": max_unpool2, "global-max": global_unmax}


class Int8Engine:
    """The integer network on torch tensors (int8 values held in float32; products in the
    float type exact for them, as the module docstring shows). Implements methods.Int8Engine."""
    inputs = torch.float32      # what a batch's int8 values are computed in (device_data gathers them so)

    def __init__(self, spec, model, init: tuple[np.ndarray, list[int]] | None = None):
        self.model = model
        self.device = torch.device(spec.device)
        q, self.exps = init if init is not None else init_weights(model, spec.seed)
        self.q = torch.from_numpy(q.astype(np.float32)).to(self.device)
        self.sizes = [math.prod(l.weight_shape) for l in model.layers]
        self.offsets = [sum(self.sizes[:i]) for i in range(len(self.sizes))]
        self.first_bp = model.first_bp_layer(spec.method, spec.bp_layers)
        self.n_zo = sum(self.sizes[:self.first_bp])
        self.n_bp = sum(self.sizes) - self.n_zo
        self.scale = spec.hyper.zo_scale
        self.z_values = torch.arange(-self.scale, self.scale + 1, device=self.device)   # what z can be
        self.grad = {i: torch.zeros(self.sizes[i], dtype=torch.float64, device=self.device)     # exact integer sums
                     for i in range(self.first_bp, len(model.layers))}
        self.kept = []
        self.z, self.z_key = None, None   # this step's z, drawn once for its three uses
        if self.device.type == "cuda":
            self.sync = torch.cuda.synchronize

    def w(self, i: int) -> torch.Tensor:
        o = self.offsets[i]
        return self.q[o:o + self.sizes[i]].view(self.model.layers[i].weight_shape)

    def load_batch(self, x, y):
        return (torch.from_numpy(np.asarray(x, dtype=np.float32)).to(self.device),
                torch.from_numpy(np.asarray(y, dtype=np.int64)).to(self.device))

    def forward(self, x, keep: bool):
        """Logits (values, exponent) and, if keep, every layer's input and pre-pool output.
        Each layer requantizes its whole output (the ReLU is the clamp from 0), then pools:
        the pool is taken after the exponent is chosen, as the C++ binary does."""
        a, e, saved = x, INPUT_EXP, []
        for i, layer in enumerate(self.model.layers):
            w, dt = self.w(i), exact_dtype(layer.fan_in)
            if layer.kind == "conv2d":
                acc = F.conv2d(a.to(dt), w.to(dt), padding=layer.padding)
            else:   # fc on the flattened input; pointwise on the last axis of [B, N, C]
                if layer.kind == "fc":
                    a = a.flatten(1)
                acc = a.to(dt) @ w.T.to(dt)
            out, e = requant(acc, e + self.exps[i], relu=layer.relu)
            out = out.float()
            saved.append((a, out))
            a = POOL[layer.pool](out)
        return a, e, saved if keep else None

    def loss(self, out, y) -> float:
        q, e, saved = out
        if saved is not None:
            self.kept.append((q, e, saved, y))
        return float_loss(q, e, y)

    def integer_loss(self, out, y) -> int:
        return integer_loss(out[0], out[1], y)

    def backward(self) -> None:
        """Accumulate the BP layers' integer gradients over the kept passes (NITI's backward)."""
        for q, e, saved, y in self.kept:
            err = ce_error(q, e, y).float()
            for i in range(len(self.model.layers) - 1, self.first_bp - 1, -1):
                layer, (a, _) = self.model.layers[i], saved[i]
                w = self.w(i)
                if layer.kind == "conv2d":
                    dt = exact_dtype(err[:, 0].numel())
                    self.grad[i] += torch.nn.grad.conv2d_weight(a.to(dt), w.shape, err.to(dt),
                                                                padding=layer.padding).flatten()
                    if i == self.first_bp:
                        break
                    dt = exact_dtype(w[:, 0].numel())
                    err = F.conv_transpose2d(err.to(dt), w.to(dt), padding=layer.padding)
                else:   # fc: err [B, O], a [B, I]; pointwise: err [B, N, O], a [B, N, C], summed over B * N
                    o = layer.outputs
                    dt = exact_dtype(err.numel() // o)
                    self.grad[i] += (err.reshape(-1, o).T.to(dt) @ a.reshape(-1, a.shape[-1]).to(dt)).flatten()
                    if i == self.first_bp:
                        break
                    dt = exact_dtype(o)
                    err = err.to(dt) @ w.to(dt)
                err = requant(err, 0)[0].float()
                below, prev_out = self.model.layers[i - 1], saved[i - 1][1]
                err = UNPOOL[below.pool](err.view(len(err), *self.model.shapes[i - 1].pooled), prev_out)
                if below.relu:   # the ReLU passes the error where its output is > 0
                    err = torch.where(prev_out > 0, err, 0)
        self.kept.clear()

    def bp_update(self, epoch: int) -> None:
        bits = grad_bits(epoch)
        for i, acc in self.grad.items():
            o = self.offsets[i]
            self.q[o:o + self.sizes[i]].sub_(grad_round(acc.long(), bits)).clamp_(-127, 127)
            acc.zero_()

    def _z(self, key: int, epoch: int) -> torch.Tensor:
        """z of step `key` at `epoch`'s sparsity, int64. A step uses it three times (+z, -2z,
        then the restore and update), so it is drawn once and kept until the next step's key,
        as the ONNX Runtime runner does: drawing it costs about as much as applying it."""
        if self.z_key != (key, epoch):
            self.z = None      # free the last step's z before drawing this one's
            self.z = zo_noise(key, 0, self.n_zo, self.scale, sparsity_threshold(epoch), self.device)
            self.z_key = (key, epoch)
        return self.z

    def perturb(self, key: int, k: int, epoch: int) -> None:
        self.q[:self.n_zo].add_(self._z(key, epoch), alpha=k).clamp_(-127, 127)

    def zo_update(self, key: int, g: int, epoch: int) -> None:
        """Restore (+z) and update (-round(g z)) in one pass. A weight's change depends only
        on its z, one of 2 scale + 1 values, so it is computed for each value and looked up."""
        v = self.z_values
        s = zo_update_shift(self.scale)
        delta = psto_shift(g * v, s) if s >= 1 else g * v
        change = (v - delta.clamp(-1, 1)).float()
        self.q[:self.n_zo].add_(change.index_select(0, self._z(key, epoch) + self.scale)).clamp_(-127, 127)

    def evaluate(self, x, y) -> tuple[float, int]:
        q, e, _ = self.forward(x, keep=False)
        return float_loss(q, e, y) * len(y), int((q.argmax(dim=1) == y).sum())

    def weights(self) -> np.ndarray:
        return self.q.cpu().numpy().astype(np.int8)

    def save(self):
        return self.q.clone()

    def restore(self, saved) -> None:
        self.q.copy_(saved)

    def weights_bytes(self) -> bytes:
        return weights_bytes(self.weights(), self.exps)

    def weights_sha256(self) -> str:
        return weights_sha256(self.weights(), self.exps)
