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

from typing import Protocol

from . import models, zrng


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
            estimator: str = "two-point", update: str = "sgd") -> dict:
    """One FP32 ZO step (docs/zo-optimizers.md). key: the direction's key, or one key per query
    (zrng.zo_keys); each query's projected gradient is estimated from the same θ, and the step
    moves θ by -lr_zo/q times the sum of each query's update direction (g, or sign(g)) times its
    z. With one query the restore and the update are one pass, as MeZO's is (Sec. 4)."""
    keys = key if isinstance(key, (list, tuple)) else [key]
    q, head = len(keys), engine.n_bp > 0
    one_sided = estimator == "one-sided"
    if one_sided:       # L(θ), once for all queries; kept: the head learns from it as from the others
        out = engine.forward(x, keep=head)
        clock.lap("forward")
        loss_zero = engine.loss(out, y)
        clock.lap("loss")
    plus, minus, grads = [], [], []
    for k in keys:
        engine.perturb(k, eps)
        clock.lap("zo_perturb")
        out = engine.forward(x, keep=head)
        clock.lap("forward")
        plus.append(engine.loss(out, y))
        clock.lap("loss")
        if one_sided:
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
        if q == 1:
            engine.perturb(k, back - lr_zo * _direction(grads[0], update))
            clock.lap("zo_update")
        else:
            engine.perturb(k, back)
            clock.lap("zo_perturb")
    if q > 1:
        for k, g in zip(keys, grads):
            engine.perturb(k, -lr_zo * _direction(g, update) / q)
        clock.lap("zo_update")
    if head:
        engine.backward()
        clock.lap("backward")
        engine.bp_update(lr_bp)
        clock.lap("bp_update")
    out = {"loss": loss_zero if one_sided else _mean([0.5 * (p + m) for p, m in zip(plus, minus)]),
           "loss_plus": _mean(plus), **({} if one_sided else {"loss_minus": _mean(minus)}), "grad": _mean(grads)}
    return {**out, "grads": grads} if q > 1 else out


def _mean(values: list):
    """The queries' mean; one query's value itself (a GPU step adds no kernel for it)."""
    return values[0] if len(values) == 1 else sum(values) / len(values)


def _direction(g, update: str):
    """What a query's projected gradient moves θ by, per unit rate: g itself (SGD), or its sign
    (ZO-SGD-Sign), as a float or, on a GPU, a device scalar."""
    if update == "sign":
        return g.sign() if hasattr(g, "sign") else float(_sign(g))
    return g


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
    return (v > 0) - (v < 0)


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
    return zo_step(engine, x, y, key, h.eps, h.zo_grad_clip, lr_zo, lr_bp, clock, h.zo_estimator, h.zo_update)
