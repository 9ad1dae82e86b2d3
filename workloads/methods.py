"""One optimizer step of each training method, written once for every runtime.

A runtime supplies an Engine (torch tensors, ONNX Runtime sessions, ...) with a
handful of primitives; the algorithms of the ElasticZO paper live only here, so
the torch and ONNX Runtime runners cannot drift apart.

Full ZO and ElasticZO follow Alg. 1 with the MeZO seed trick: z for step t is
zobench-z with key (seed, STREAM_ZO, t) over the ZO prefix of the flat parameter
vector, regenerated on every use and never stored. The parameters are perturbed
in place by +eps z, then -2 eps z; restoring (+eps z) and the SGD update
(-lr g z) are merged into one pass, theta += (eps - lr g) z (Sec. 4).
The projected gradient g = (l+ - l-) / (2 eps) is clipped to +-zo_grad_clip.

ElasticZO's BP head (the last bp_layers FC layers, never perturbed) gets its
gradient from the two perturbed forward passes (Sec. 4: "keeps layer
activations of the last layers obtained during the computation of l+ and
l-"): the head's activations of both passes are kept and the head is
back-propagated through the mean loss (l+ + l-)/2, i.e. the head gradient is
the mean of the BP gradients at the two perturbed feature inputs. No third
forward pass is run.
"""
from __future__ import annotations

import hashlib
import math
from typing import Protocol

import numpy as np

from . import models, vocab, zrng


class Engine(Protocol):
    n_zo: int          # leading parameters trained by ZO
    n_bp: int          # trailing parameters trained by BP

    def load_batch(self, x, y): ...
    def perturb(self, key: int, alpha: float) -> None: ...    # theta[:n_zo] += alpha * z(key)
    def forward(self, x, keep: bool): ...                      # keep what BP needs
    def loss(self, out, y) -> float: ...
    def backward(self) -> None: ...                            # BP through the mean kept loss
    def bp_update(self, lr: float) -> None: ...
    def evaluate(self, x, y) -> tuple[float, int]: ...         # (sum of losses, correct)
    def weights(self): ...                                     # flat float32 numpy copy
    def save(self): ...                                        # the trainable state, for warm-up ...
    def restore(self, saved) -> None: ...                      # ... to put back exactly

    # The ZO parts (docs/zo-optimizers.md) read these; an engine holds them from zo_state.
    sparsity: "Sparsity | None"     # None: every ZO parameter, every step
    ranges: list | None             # the step's ZO parameter ranges (LeZO's units), None: all
    mask: object                    # 0/1 per ZO parameter (Sparse MeZO), None: all
    zo_moments: list                # momentum's m, or Adam's m and v, over the ZO part
    zo_t: object                    # Adam's ZO update count
    decayed: list                   # the ZO part's weight ranges weight decay reaches ([]: no decay)

    def set_sparsity(self, ranges=None, mask=None) -> None: ...   # what perturb touches from now on
    def zo_direction(self, keys, coefs): ...    # Σ cᵢ z(keyᵢ) over the ZO part, touched as perturb does
    def zo_params(self): ...                    # theta[:n_zo], an array to update in place
    def jvp(self, x, y, key): ...               # (L(θ), ∇L·z(key)) by forward-mode AD: torch only

    def weights_bytes(self) -> bytes:
        return models.weights_bytes(self.weights())

    def weights_sha256(self) -> str:
        return hashlib.sha256(self.weights_bytes()).hexdigest()


class Int8Engine(Protocol):
    """An integer network (workloads/int8.py, docs/int8.md): weights are perturbed and
    updated by integer multiples of the sparse perturbation z, and the BP head's update is
    the gradient rounded to a bitwidth that changes with the epoch."""
    n_zo: int
    n_bp: int

    def load_batch(self, x, y): ...
    def perturb(self, key: int, k: int, epoch: int) -> None: ...     # theta = clip(theta + k z)
    def forward(self, x, keep: bool): ...
    def loss(self, out, y) -> float: ...                               # float64 CE of the logits
    def integer_loss(self, out, y) -> int: ...                         # Eq. 12's integer loss
    def zo_update(self, key: int, g: int, epoch: int) -> None: ...     # restore and update
    def backward(self) -> None: ...
    def bp_update(self, epoch: int) -> None: ...
    def evaluate(self, x, y) -> tuple[float, int]: ...
    def weights_bytes(self) -> bytes: ...                              # int8.weights_bytes' layout
    def weights_sha256(self) -> str: ...
    def save(self): ...
    def restore(self, saved) -> None: ...


def bp_step(engine, x, y, update, clock) -> dict:
    """One BP step; `update` is what the engine's bp_update takes: the learning rate (FP32)
    or the epoch, which sets the INT8 gradient bitwidth."""
    out = engine.forward(x, keep=True)
    clock.lap("forward")
    loss = engine.loss(out, y)
    clock.lap("loss")
    engine.backward()
    clock.lap("backward")
    engine.bp_update(update)
    clock.lap("bp_update")
    return {"loss": loss}


def zo_step(engine: Engine, x, y, key, eps: float, clip: float, lr_zo: float, lr_bp: float, clock,
            hyper=None) -> dict:
    """One FP32 ZO step (docs/zo-optimizers.md). key: the direction's key, or one key per query
    (zrng.zo_keys); each query's projected gradient is estimated from the same θ, and the step's
    direction is d = (1/q) Σ dir(gᵢ) zᵢ (dir: g, or sign(g)), which the update rule applies.
    With one query SGD's and sign's restore and update are one pass, as MeZO's is (Sec. 4).
    hyper: the job's Hyper, whose ZO parts (estimator, update rule and its constants) the step
    runs; None: MeZO's step. Weight decay (hyper.weight_decay) splits MeZO's merged pass: the
    restore, the decay and the update are a pass each."""
    from .spec import Hyper
    hyper = hyper or Hyper()
    estimator, update = hyper.zo_estimator, hyper.zo_update
    keys = key if isinstance(key, (list, tuple)) else [key]
    q, head = len(keys), engine.n_bp > 0
    merged = q == 1 and update in ("sgd", "sign") and estimator != "forward-grad" and not hyper.weight_decay
    plus, minus, grads, loss_zero = [], [], [], None
    if estimator == "forward-grad":     # exact ∇L·z by forward-mode AD: no perturbation
        for k in keys:
            loss, g = engine.jvp(x, y, k)
            clock.lap("forward")
            loss_zero = loss if loss_zero is None else loss_zero
            grads.append(_clip(g, clip))
        if head:        # the head learns from one kept pass at θ
            engine.loss(engine.forward(x, keep=True), y)
            clock.lap("forward")
    elif estimator == "one-sided":      # L(θ), once for all queries; kept: the head learns from it as from the others
        out = engine.forward(x, keep=head)
        clock.lap("forward")
        loss_zero = engine.loss(out, y)
        clock.lap("loss")
    for k in keys if estimator != "forward-grad" else ():
        engine.perturb(k, eps)
        clock.lap("zo_perturb")
        out = engine.forward(x, keep=head)
        clock.lap("forward")
        plus.append(engine.loss(out, y))
        clock.lap("loss")
        if estimator == "one-sided":
            grads.append(_clip((plus[-1] - loss_zero) / eps, clip))
            back = -eps
        else:
            engine.perturb(k, -2.0 * eps)
            clock.lap("zo_perturb")
            out = engine.forward(x, keep=head)
            clock.lap("forward")
            minus.append(engine.loss(out, y))
            clock.lap("loss")
            grads.append(_clip((plus[-1] - minus[-1]) / (2.0 * eps), clip))
            back = eps
        if merged:
            engine.perturb(k, back - lr_zo * _direction(grads[0], update))
            clock.lap("zo_update")
        else:
            engine.perturb(k, back)
            clock.lap("zo_perturb")
    coefs = [_direction(g, update) / q if q > 1 else _direction(g, update) for g in grads]
    extra = {}
    if update == "conservative":
        if loss_zero is None:       # two-point: L(θ) is the step's fifth forward
            loss_zero = engine.loss(engine.forward(x, keep=False), y)
            clock.lap("forward")
        extra["loss_kept"] = _conservative(engine, x, y, keys, coefs, lr_zo, loss_zero, clock)
    elif update in ("momentum", "adam"):
        _stateful(engine, keys, coefs, lr_zo, update, hyper)
        clock.lap("zo_update")
    elif not merged:
        if hyper.weight_decay:      # coupled, MeZO's: θ −= lr (d + wd θ)
            decay(engine, 1 - lr_zo * hyper.weight_decay)
        for k, c in zip(keys, coefs):
            engine.perturb(k, -lr_zo * c)
        clock.lap("zo_update")
    if head:
        engine.backward()
        clock.lap("backward")
        engine.bp_update(lr_bp)
        clock.lap("bp_update")
    if loss_zero is not None:       # one-sided, forward-grad, conservative: L(θ) was measured
        out = {"loss": loss_zero}
    else:
        out = {"loss": _mean([0.5 * (p + m) for p, m in zip(plus, minus)])}
    if plus:
        out["loss_plus"] = _mean(plus)
    if minus:
        out["loss_minus"] = _mean(minus)
    out = {**out, "grad": _mean(grads), **extra}
    return {**out, "grads": grads} if q > 1 else out


def forwards_per_step(method: str, hyper) -> int:
    """The forward passes one step of zo_step (bp_step: 1) runs, a Jacobian-vector product counted
    as one: what ZO-Bench reports as queries a step (docs/zo-optimizers.md)."""
    if method == "full-bp":
        return 1
    q, estimator = hyper.zo_queries, hyper.zo_estimator
    n = {"two-point": 2 * q, "one-sided": q + 1, "forward-grad": q + (method == "elastic-zo")}[estimator]
    return n + (2 + (estimator == "two-point") if hyper.zo_update == "conservative" else 0)


def _mean(values: list):
    """The queries' mean; one query's value itself (a GPU step adds no kernel for it)."""
    return values[0] if len(values) == 1 else sum(values) / len(values)


def _direction(g, update: str):
    """What a query's projected gradient moves θ by, per unit rate: its sign (ZO-SGD-Sign), or g
    itself (every other rule), as a float or, on a GPU, a device scalar."""
    if update == "sign":
        return g.sign() if hasattr(g, "sign") else float(_sign(g))
    return g


def _conservative(engine, x, y, keys, coefs, lr, loss_zero, clock):
    """ZO-SGD-Cons: of θ, θ - lr d and θ + lr d keep the one with the lowest loss on the batch
    (ties to θ, then to θ - lr d), so no step ends above where it started. Two forwards, and the
    choice applied as one more scaled pass (none when θ + lr d is kept). Returns the kept loss."""
    def move(scale):
        for k, c in zip(keys, coefs):
            engine.perturb(k, scale * lr * c)
        clock.lap("zo_update")

    losses = []
    for scale in (-1.0, 2.0):       # θ - lr d, then θ + lr d
        move(scale)
        losses.append(engine.loss(engine.forward(x, keep=False), y))
        clock.lap("forward")
    lower, upper = losses
    if hasattr(loss_zero, "where"):     # device scalars: chosen on the device, no host sync
        import torch
        best = torch.minimum(lower, upper)
        back = torch.where(loss_zero <= best, -1.0, torch.where(lower <= upper, -2.0, 0.0))
        move(back.to(loss_zero.dtype))
        return torch.minimum(loss_zero, best)
    back = -1.0 if loss_zero <= min(lower, upper) else -2.0 if lower <= upper else 0.0
    if back:
        move(back)
    return min(loss_zero, lower, upper)


def _stateful(engine, keys, coefs, lr, update: str, hyper) -> None:
    """The update rules with state over the ZO part, on the engine's arrays (numpy or torch, in
    place): the step's direction d = Σ cᵢ zᵢ is formed once (an n_zo scratch buffer), then
    momentum (ZO-SGD-MMT, torch.optim's SGD momentum on d: m = β m + d, θ -= lr m) or Adam
    (ZO-Adam: adam_update on d, with its own update count). The C++ binary runs the same
    operations in the same order (fp32_net.hpp). Weight decay: coupled into d for momentum, as
    torch.optim's SGD adds it (d += wd θ), and decoupled for Adam, as AdamW (θ *= 1 − lr wd first)."""
    d = engine.zo_direction(keys, coefs)
    p = engine.zo_params()
    wd = hyper.weight_decay
    if update == "momentum":
        for lo, hi in decayed(engine) if wd else ():
            _add_scaled(d[lo:hi], p[lo:hi], wd)
        m, = engine.zo_moments
        m *= hyper.zo_momentum
        m += d
        p -= lr * m
        return
    if wd:
        decay(engine, 1 - lr * wd)
    engine.zo_t += 1
    adam_update(p, d, *engine.zo_moments, lr, engine.zo_t, hyper, engine.sqrt)


def decayed(engine) -> list[tuple[int, int]]:
    """The ranges weight decay reaches this step: the ZO part's weights (models.decayed), within
    the step's ranges where LeZO draws units. A mask (Sparse MeZO's, ZO-Bench's random one)
    limits z, not the decay."""
    if engine.ranges is None:
        return engine.decayed
    return [(max(a, c), min(b, e)) for a, b in engine.decayed for c, e in engine.ranges if max(a, c) < min(b, e)]


def decay(engine, factor) -> None:
    """θ *= factor over what decayed() reaches, in place; factor = 1 − lr wd, a float or, in a
    CUDA graph, a device scalar."""
    p = engine.zo_params()
    for lo, hi in decayed(engine):
        view = p[lo:hi]
        view *= factor


def _add_scaled(y, x, a: float) -> None:
    """y += a x in place, with no temporary the size of x in torch (the memory model counts none)."""
    if hasattr(y, "add_"):
        y.add_(x, alpha=a)
    else:
        y += np.float32(a) * x


class Sparsity:
    """Which ZO parameters a step perturbs and updates (hyper.zo_sparsity): every one; LeZO's
    zo_layers of the ZO part's units, drawn from the step's key on zrng.STREAM_ZO_UNITS so every
    runtime draws the same; or Sparse MeZO's mask, in each ZO tensor its zo_mask_fraction of
    smallest |weights| (ties to the lower index), recomputed every zo_mask_every steps from the
    weights then. Host work between steps (sparsify): a step reads the engine's ranges or mask."""

    def __init__(self, model, method: str, bp_layers: int, hyper):
        self.h = hyper
        self.n_zo = n_zo = model.split(method, bp_layers)
        sizes = model.unit_sizes()[:model.first_bp_layer(method, bp_layers)]
        starts = [sum(sizes[:i]) for i in range(len(sizes))]
        self.units = [(lo, lo + n) for lo, n in zip(starts, sizes)]
        self.tensors = [(o, o + math.prod(shape)) for _, o, shape in model.offsets() if o < n_zo]

    def ranges(self, seed: int, t: int) -> list[tuple[int, int]]:
        """Step t's units as parameter ranges, adjacent ones merged."""
        out = []
        for i in zrng.choose(zrng.stream_key(seed, zrng.STREAM_ZO_UNITS, t), len(self.units), self.h.zo_layers):
            lo, hi = self.units[i]
            if out and out[-1][1] == lo:
                out[-1] = (out[-1][0], hi)
            else:
                out.append((lo, hi))
        return out

    def random_mask(self, seed: int, t: int) -> np.ndarray:
        """ZO-Bench's random mask of step t (drawn anew every zo_mask_every steps): 1 where a ZO
        parameter is perturbed. A parameter is zeroed where its 53-bit draw on STREAM_ZO_MASK,
        as a fraction of 2^53, falls below zeroed_share: compared as doubles (the draw is exact
        in one), the C++ binary's comparison too."""
        u = (zrng.bits(zrng.stream_key(seed, zrng.STREAM_ZO_MASK, t // self.h.zo_mask_every), 0, self.n_zo)
             >> np.uint64(11)).astype(np.float64)
        return (u >= zeroed_share(self.h) * 2.0 ** 53).astype(np.uint8)

    def mask(self, weights: np.ndarray) -> np.ndarray:
        """1 where a ZO weight is perturbed, else 0: a byte each, as every runtime holds it."""
        mask = np.zeros(self.n_zo, dtype=np.uint8)
        for lo, hi in self.tensors:
            k = math.ceil(self.h.zo_mask_fraction * (hi - lo))
            mask[lo + np.argsort(np.abs(weights[lo:hi]), kind="stable")[:k]] = 1
        return mask


def zeroed_share(h) -> float:
    """The share of ZO parameters a random mask zeroes: 1 − zo_mask_fraction exactly, or as
    ZO-Bench draws it, a standard normal below its sparsity s = 1 − fraction (its
    fast_random_mask_like: `normal_() < s`), which zeroes Φ(s) of them rather than s (0.75 for
    s = 0.75 becomes 0.77; s = 0.25, 0.60). Φ by libm's erfc, which CPython and the binary share."""
    s = 1.0 - h.zo_mask_fraction
    return s if h.zo_mask_draw == "exact" else 0.5 * math.erfc(-s / math.sqrt(2.0))


def zo_state(engine, spec, model, zeros, count) -> None:
    """Give an engine what the ZO parts read (Engine): its Sparsity, the update rule's moments
    over the ZO part, the step's direction d where a rule keeps them, and Adam's count (zeros(n):
    n zeros of the engine's kind; count: its zero count)."""
    h = spec.hyper
    zo = spec.method != "full-bp"
    engine.sparsity = Sparsity(model, spec.method, spec.bp_layers, h) if zo and h.zo_sparsity != "all" else None
    engine.ranges = engine.mask = None
    engine.zo_moments = [zeros(engine.n_zo) for _ in range(vocab.ZO_UPDATE_STATE.get(h.zo_update, 0) if zo else 0)]
    engine.d = zeros(engine.n_zo if engine.zo_moments else 0)
    engine.zo_t = count
    engine.decayed = models.decayed(model, engine.n_zo) if zo and h.weight_decay else []


def sparsify(engine, spec, t: int) -> None:
    """Before step t, outside any CUDA graph: set what the step perturbs (Sparsity)."""
    s = engine.sparsity
    if s is None:
        return
    if spec.hyper.zo_sparsity == "layers":
        engine.set_sparsity(ranges=s.ranges(spec.seed, t))
    elif t % spec.hyper.zo_mask_every == 0 or engine.mask is None:
        engine.set_sparsity(mask=s.random_mask(spec.seed, t) if spec.hyper.zo_sparsity == "random"
                            else s.mask(engine.weights()[:engine.n_zo]))


def adam_update(p, g, m, v, lr, t, hyper, sqrt) -> None:
    """Adam (Kingma & Ba, Alg. 1) on BP-trained parameters p with gradient g, in place; m and v
    its moments, t the BP updates made so far, this one included (1-based, global over epochs).
    Written once for numpy and torch arrays (sqrt: np.sqrt or torch.sqrt), with each scalar
    rounded to the arrays' float32 and the operations in the order of the C++ binary's
    (fp32_net.hpp bp_update), so the runtimes agree step for step. t may be a device scalar
    (a CUDA graph updates it on the device): the bias corrections are then device scalars too."""
    b1, b2 = hyper.adam_beta1, hyper.adam_beta2
    c1, c2 = 1 - b1 ** t, 1 - b2 ** t
    m *= b1
    m += (1 - b1) * g
    v *= b2
    v += (1 - b2) * (g * g)
    p -= lr * (m / c1) / (sqrt(v / c2) + hyper.adam_eps)


def _clip(v, c: float):
    """v clipped to [-c, c]: a float, or a device scalar that a GPU step keeps on the device
    (comparing it on the host would synchronize, and cannot be captured in a CUDA graph)."""
    return v.clamp(-c, c) if hasattr(v, "clamp") else min(max(v, -c), c)


def _sign(v: float) -> int:
    return int(v > 0) - int(v < 0)


def int8_zo_step(engine: Int8Engine, x, y, key: int, zo_loss: str, epoch: int, clock) -> dict:
    """Alg. 2: the ZO gradient is the sign of the loss difference (ternary), from the float
    losses (the paper's INT8) or from Eq. 12's integer losses (INT8*); both signs are
    reported so their agreement can be measured."""
    head = engine.n_bp > 0
    losses = []
    for k in (1, -2):
        engine.perturb(key, k, epoch)
        clock.lap("zo_perturb")
        out = engine.forward(x, keep=head)
        clock.lap("forward")
        losses.append((engine.loss(out, y), engine.integer_loss(out, y)))
        clock.lap("loss")
    (lp, ip), (lm, im) = losses
    sign_float, sign_integer = _sign(lp - lm), _sign(ip - im)
    grad = sign_integer if zo_loss == "integer" else sign_float
    engine.zo_update(key, grad, epoch)
    clock.lap("zo_update")
    if head:
        engine.backward()
        clock.lap("backward")
        engine.bp_update(epoch)
        clock.lap("bp_update")
    return {"loss": 0.5 * (lp + lm), "loss_plus": lp, "loss_minus": lm, "grad": grad,
            "sign_float": sign_float, "sign_integer": sign_integer}


def step(engine, spec, x, y, t: int, epoch: int, lr_zo, lr_bp, clock, key=None) -> dict:
    """Optimizer step t (0-based, global across epochs) of the spec's method and precision.
    key: z's key, or an FP32 step's keys (one per query), when the caller holds them elsewhere (a
    CUDA graph reads them from the device, as it does the rates), else the step's own."""
    if key is None:
        key = zrng.zo_keys(spec.seed, t, spec.hyper.zo_queries) if spec.precision == "fp32" else \
            zrng.stream_key(spec.seed, zrng.STREAM_ZO, t)
    if spec.precision == "int8":
        if spec.method == "full-bp":
            return bp_step(engine, x, y, epoch, clock)
        return int8_zo_step(engine, x, y, key, spec.zo_loss, epoch, clock)
    if spec.method == "full-bp":
        return bp_step(engine, x, y, lr_bp, clock)
    h = spec.hyper
    sparsify(engine, spec, t)
    return zo_step(engine, x, y, key, h.eps, h.zo_grad_clip, lr_zo, lr_bp, clock, h)
