"""Model architectures as data: the parameter layout every runtime agrees on.

The flat parameter vector is the concatenation, in this order, of each layer's
weight then bias, each in row-major order of its PyTorch shape (conv weight
[out, in, kh, kw], FC weight [out, in]). The ZO index i of zobench-z, the
initial-weights file and model.weights_sha256 (sha256 of the little-endian
float32 bytes of the vector) are all defined on this layout. Trainable layers
are ordered front to back, so ElasticZO's ZO part is a prefix of the vector and
its BP part (the last bp_layers FC layers) a suffix.
"""
from __future__ import annotations

import hashlib
import math
from dataclasses import dataclass

import numpy as np

from . import zrng


@dataclass(frozen=True)
class Layer:
    name: str
    kind: str            # "conv" or "fc"
    weight_shape: tuple  # PyTorch order
    padding: int = 0

    @property
    def fan_in(self) -> int:
        return math.prod(self.weight_shape[1:])

    @property
    def size(self) -> int:
        return math.prod(self.weight_shape) + self.weight_shape[0]


@dataclass(frozen=True)
class Model:
    name: str
    input_shape: tuple   # (C, H, W)
    classes: int
    layers: tuple

    @property
    def params_total(self) -> int:
        return sum(l.size for l in self.layers)

    def offsets(self) -> list[tuple[str, int, tuple]]:
        """(tensor name, offset, shape) for every weight and bias, in layout order."""
        out, off = [], 0
        for l in self.layers:
            for suffix, shape in (("weight", l.weight_shape), ("bias", (l.weight_shape[0],))):
                out.append((f"{l.name}.{suffix}", off, shape))
                off += math.prod(shape)
        return out

    def first_bp_layer(self, method: str, bp_layers: int) -> int:
        """Index of the first layer trained by BP; the layers before it are trained by ZO.
        0 for full-bp, len(layers) for full-zo (no BP layer), len(layers) - bp_layers for
        ElasticZO, whose BP head is the last bp_layers FC layers (validated here)."""
        n = len(self.layers)
        if method == "full-bp":
            return 0
        if method == "full-zo":
            return n
        fc = [l for l in self.layers if l.kind == "fc"]
        if not 1 <= bp_layers <= len(fc):
            raise ValueError(f"bp_layers must be between 1 and {len(fc)} for {self.name}")
        return n - bp_layers

    def split(self, method: str, bp_layers: int) -> int:
        """Number of leading parameters trained by ZO (0 for full-bp)."""
        return sum(l.size for l in self.layers[:self.first_bp_layer(method, bp_layers)])

    def init_weights(self, seed: int) -> np.ndarray:
        """PyTorch's default init, U(-1/sqrt(fan_in), 1/sqrt(fan_in)), drawn from zobench-z."""
        u = zrng.uniform(zrng.stream_key(seed, zrng.STREAM_INIT, 0), 0, self.params_total)
        bound = np.empty(self.params_total, dtype=np.float32)
        off = 0
        for l in self.layers:
            bound[off:off + l.size] = np.float32(1.0 / math.sqrt(l.fan_in))
            off += l.size
        return (u * np.float32(2.0) - np.float32(1.0)) * bound


def weights_sha256(flat: np.ndarray) -> str:
    return hashlib.sha256(np.ascontiguousarray(flat, dtype="<f4").tobytes()).hexdigest()


# The paper's LeNet-5: 107,786 parameters; the last FC layer is 0.8% of them,
# the last two 10.2% (ElasticZO Sec. 5.1.1). ReLU after every layer but the last,
# 2x2 max pooling after each convolution.
LENET5 = Model(
    name="lenet5",
    input_shape=(1, 28, 28),
    classes=10,
    layers=(
        Layer("conv1", "conv", (6, 1, 5, 5), padding=2),
        Layer("conv2", "conv", (16, 6, 5, 5), padding=2),
        Layer("fc1", "fc", (120, 784)),
        Layer("fc2", "fc", (84, 120)),
        Layer("fc3", "fc", (10, 84)),
    ),
)

MODELS = {m.name: m for m in (LENET5,)}
