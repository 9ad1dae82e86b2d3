"""The ElasticZO paper's analytic memory model (Eqs. 2-5 FP32, 13-15 INT8), from layer shapes.

Every tensor size comes from the model description in workloads/models.py, never from typed-in
numbers, so the model covers any architecture written there. As in the paper, every buffer is
assumed allocated for the whole run (no lifetime-based reuse).

Activations are the outputs of every operation: each layer's own (conv2d, pointwise: one row
per point, fc), its ReLU's and its pool's where the description has them (LeNet-5: 18,058 values
per sample; PointNet on 1,024 points: 2,753,352). The parts are as follows.

FP32 (4 bytes each):
- parameters: all weights and biases.
- activations: the activations, batch-sized.
- gradients: one per BP-trained parameter.
- errors: one per activation produced inside the BP part.
- optimizer: 2 per BP-trained parameter with Adam (Eq. 5). SGD, and the in-place ZO update,
  need none.

INT8 (NITI: int8 tensors plus the int32 buffers they are requantized from; no biases):
- parameters, activations, gradients and errors: as above, at 1 byte each.
- scratch (int32): each layer's output accumulator, batch-sized. For every
  BP-trained weight, its gradient accumulator. For every BP layer but the lowest, the
  accumulator of the error passed to its input.

This reproduces the paper's figures (DESIGN.md, checked in tests/test_memory_model.py). With
B=32 and B=256: Full ZO 2.6 / 18.0 MiB, Full BP 5.2 / 36.1 MiB, and ElasticZO adds
4.6 / 13.3 KiB (k=1) and 65.3 / 221.0 KiB (k=2). The INT8 ZO methods need 1.45-1.60x less
memory than FP32 (paper: 1.46-1.60), and INT8 ElasticZO adds 0.26 / 0.052% (k=1) and
4.1 / 1.4% (k=2) over INT8 Full ZO, as the paper's Sec. 5.2 states.
"""
from __future__ import annotations

import math
from dataclasses import asdict, dataclass

from workloads import vocab
from workloads.models import Model

PARTS = ("parameters", "activations", "gradients", "errors", "optimizer", "scratch")


@dataclass
class Breakdown:
    method: str
    bp_layers: int
    precision: str
    batch: int
    optimizer: str
    parts: dict

    @property
    def total_bytes(self) -> int:
        return sum(self.parts.values())

    def to_dict(self) -> dict:
        return {**asdict(self), "total_bytes": self.total_bytes}


def layer_outputs(model: Model) -> list[list[int]]:
    """Per layer, the sizes (per sample) of the activations it produces, in order: its output
    (conv2d [OC, H, W]; pointwise [N, O]; fc [O]), its ReLU's if it has one, its pool's if it
    has one (max2x2 [OC, H/2, W/2]; global-max [O])."""
    out = []
    for layer, shapes in zip(model.layers, model.shapes):
        o = math.prod(shapes.out)
        out.append([o] + [o] * layer.relu + [math.prod(shapes.pooled)] * bool(layer.pool))
    return out


def breakdown(model: Model, method: str, batch: int, precision: str = "fp32", bp_layers: int = 0,
              optimizer: str = "sgd") -> Breakdown:
    first = model.first_bp_layer(method, bp_layers)
    outs = layer_outputs(model)
    weights = [math.prod(l.weight_shape) for l in model.layers]
    biases = [l.weight_shape[0] for l in model.layers]
    acts = batch * sum(sum(o) for o in outs)
    bp_acts = batch * sum(sum(o) for o in outs[first:])
    if precision == "fp32":
        params = [w + b for w, b in zip(weights, biases)]
        bp_params = sum(params[first:])
        parts = {"parameters": 4 * sum(params), "activations": 4 * acts, "gradients": 4 * bp_params,
                 "errors": 4 * bp_acts, "optimizer": 4 * 2 * bp_params if optimizer == "adam" else 0,
                 "scratch": 0}
    elif precision == "int8":
        bp_weights = sum(weights[first:])
        layer_acc = batch * sum(o[0] for o in outs)               # each layer's int32 output accumulator
        error_acc = batch * sum(math.prod(s.input) for s in model.shapes[first + 1:])
        parts = {"parameters": sum(weights), "activations": acts, "gradients": bp_weights, "errors": bp_acts,
                 "optimizer": 0, "scratch": 4 * (layer_acc + bp_weights + error_acc)}
    else:
        raise ValueError(f"precision must be fp32 or int8, not {precision!r}")
    return Breakdown(method, bp_layers, precision, batch, optimizer, parts)


def configurations(model: Model, method: str | None, bp_layers: int | None) -> list[tuple[str, int]]:
    """The (method, bp_layers) pairs to print: the one asked for, or the paper's four."""
    if method:
        return [(method, bp_layers or (1 if method == "elastic-zo" else 0))]
    return list(vocab.PAPER_CONFIGS)


def human(n: float) -> str:
    for unit, size in (("MiB", 2 ** 20), ("KiB", 2 ** 10)):
        if n >= size:
            return f"{n / size:.1f} {unit}"
    return f"{n:.0f} B"


def table(rows: list[Breakdown]) -> str:
    head = f"{'method':34} {'prec':5} {'batch':>5} " + " ".join(f"{p:>12}" for p in PARTS) + f" {'total':>12}"
    lines = [head]
    for r in rows:
        lines.append(f"{vocab.method_label(r.method, r.bp_layers):34} {r.precision:5} {r.batch:5d} " +
                     " ".join(f"{human(r.parts[p]):>12}" for p in PARTS) + f" {human(r.total_bytes):>12}")
    return "\n".join(lines)

