"""Model architectures as data: every runtime executes this description.

A model is its input shape, its class count and a list of trainable layers. Each
layer says what it computes (`kind`), its weight's shape, and what follows it:
`relu`, then `pool`. Nothing about a network is written anywhere else: the torch
runner, the ONNX export, the ORT runner's head, the INT8 reference, the analytic
memory model and the C++ binary (which gets `Model.to_dict()` in its spec) all
walk this list, so a new network is a new entry in MODELS.

Layer kinds (input -> output per sample; weights in PyTorch order):
- "conv2d": [C, H, W] -> [OC, H + 2p - KH + 1, W + 2p - KW + 1], weight [OC, C, KH, KW],
  stride 1, zero padding p on every side.
- "fc": any input, flattened to I values -> [O], weight [O, I].
- "pointwise": the shared per-point FC of PointNet, [N, C] -> [N, O], weight [O, C]: one FC
  applied to each of N points (a 1x1 convolution over the points).
Pools (after the ReLU; max commutes with it):
- "max2x2": 2x2 max pooling, stride 2, of a conv2d output (rows and columns floored).
- "global-max": the max over the points of a pointwise output, [N, O] -> [O].

The flat parameter vector is the concatenation, in layer order, of each layer's weight
then bias, each in row-major order of its PyTorch shape. The ZO index i of zobench-z,
the initial-weights file and weights_sha256 (sha256 of the little-endian float32 bytes
of the vector) are all defined on this layout. Trainable layers are ordered front to
back, so ElasticZO's ZO part is a prefix of the vector and its BP part (the last
bp_layers FC layers) a suffix.
"""
from __future__ import annotations

import hashlib
import math
import re
from dataclasses import asdict, dataclass, field

import numpy as np

from . import zrng

KINDS = ("conv2d", "fc", "pointwise")
POOLS = ("", "max2x2", "global-max")
# How a model's float weights start, U(-b, b) per layer, b from the layer's fan-in: "pytorch" is
# PyTorch's default (b = 1/sqrt(fan_in) for weights and biases); "he" is He uniform for the
# weights (b = sqrt(6/fan_in)) and PyTorch's for the biases. PyTorch's default shrinks the
# variance of a ReLU layer's output 6-fold, which batch norm undoes in the usual PointNet;
# without it, eight such layers leave plain SGD a signal too small to train (docs/models.md).
INITS = ("pytorch", "he")
NAME = r"[a-z0-9][a-z0-9_.-]{0,63}"     # model and layer names become file and tensor names


class ModelError(ValueError):
    """A model description that does not describe a network; the message names the field."""


@dataclass(frozen=True)
class Layer:
    name: str
    kind: str            # one of KINDS
    weight_shape: tuple  # PyTorch order
    padding: int = 0     # conv2d only
    relu: bool = False   # a ReLU follows the layer
    pool: str = ""       # then this pooling (POOLS)

    @property
    def fan_in(self) -> int:
        return math.prod(self.weight_shape[1:])

    @property
    def outputs(self) -> int:
        return self.weight_shape[0]

    @property
    def size(self) -> int:
        return math.prod(self.weight_shape) + self.outputs


@dataclass(frozen=True)
class Shapes:
    """One layer's per-sample shapes: its input, its output (before and after the ReLU),
    and what its pooling leaves (= out when it has none): the next layer's input."""
    input: tuple
    out: tuple
    pooled: tuple


@dataclass(frozen=True)
class Model:
    name: str
    input_shape: tuple   # (C, H, W) for images, (N, C) for point clouds
    classes: int
    layers: tuple
    init: str = "pytorch"   # INITS
    shapes: tuple = field(init=False, repr=False, compare=False)

    def __post_init__(self):
        object.__setattr__(self, "shapes", tuple(_propagate(self)))

    @property
    def params_total(self) -> int:
        return sum(l.size for l in self.layers)

    @property
    def points(self) -> bool:
        """The input is a point cloud [N, C] (its first layer is pointwise)."""
        return self.layers[0].kind == "pointwise"

    def offsets(self) -> list[tuple[str, int, tuple]]:
        """(tensor name, offset, shape) for every weight and bias, in layout order."""
        out, off = [], 0
        for l in self.layers:
            for suffix, shape in (("weight", l.weight_shape), ("bias", (l.outputs,))):
                out.append((f"{l.name}.{suffix}", off, shape))
                off += math.prod(shape)
        return out

    def head_layers(self) -> int:
        """How many layers at the end are FC: the most ElasticZO can train by BP."""
        n = 0
        for l in reversed(self.layers):
            if l.kind != "fc":
                break
            n += 1
        return n

    def first_bp_layer(self, method: str, bp_layers: int) -> int:
        """Index of the first layer trained by BP; the layers before it are trained by ZO.
        0 for full-bp, len(layers) for full-zo (no BP layer), len(layers) - bp_layers for
        ElasticZO, whose BP head is the last bp_layers FC layers (validated here)."""
        n = len(self.layers)
        if method == "full-bp":
            return 0
        if method == "full-zo":
            return n
        if not 1 <= bp_layers <= self.head_layers():
            raise ValueError(f"bp_layers must be between 1 and {self.head_layers()} for {self.name}")
        return n - bp_layers

    def split(self, method: str, bp_layers: int) -> int:
        """Number of leading parameters trained by ZO (0 for full-bp)."""
        return sum(l.size for l in self.layers[:self.first_bp_layer(method, bp_layers)])

    def init_weights(self, seed: int) -> np.ndarray:
        """The model's init (INITS), U(-b, b) drawn from zobench-z."""
        u = zrng.uniform(zrng.stream_key(seed, zrng.STREAM_INIT, 0), 0, self.params_total)
        bound = np.empty(self.params_total, dtype=np.float32)
        off = 0
        for l in self.layers:
            weights = l.size - l.outputs
            bound[off:off + l.size] = np.float32(1.0 / math.sqrt(l.fan_in))
            if self.init == "he":
                bound[off:off + weights] = np.float32(math.sqrt(6.0 / l.fan_in))
            off += l.size
        return (u * np.float32(2.0) - np.float32(1.0)) * bound

    def forward_flops(self) -> int:
        """Floating-point operations of one sample's forward pass, 2 per multiply-add (ReLUs,
        pools and biases are not counted): what GFLOP/s figures divide by."""
        return sum(2 * math.prod(s.out) * l.fan_in for l, s in zip(self.layers, self.shapes))

    def with_points(self, n: int) -> "Model":
        """The same network on clouds of n points (the weights do not depend on n)."""
        if not self.points:
            raise ModelError(f"{self.name}: only a point-cloud model takes a number of points")
        return Model(self.name, (n, *self.input_shape[1:]), self.classes, self.layers, self.init)

    def to_dict(self) -> dict:
        """The description as JSON-able data: what a spec carries to every runner."""
        return {"name": self.name, "input_shape": list(self.input_shape), "classes": self.classes,
                "layers": [{**asdict(l), "weight_shape": list(l.weight_shape)} for l in self.layers],
                "init": self.init}

    @classmethod
    def from_dict(cls, d) -> "Model":
        """A description from data (a spec's architecture); ModelError names what is wrong."""
        if not isinstance(d, dict):
            raise ModelError(f"expected a table with name, input_shape, classes and layers, got {d!r}")
        unknown = set(d) - {"name", "input_shape", "classes", "layers", "init"}
        if unknown:
            raise ModelError(f"unknown keys {sorted(unknown)}; expected name, input_shape, classes, layers, init")
        name = _take(d, "name", str)
        shape = tuple(_ints(d, "input_shape"))
        classes = _take(d, "classes", int)
        raw = _take(d, "layers", list)
        layers = []
        for i, l in enumerate(raw):
            where = f"layers[{i}]"
            if not isinstance(l, dict):
                raise ModelError(f"{where}: expected a table, got {l!r}")
            unknown = set(l) - {"name", "kind", "weight_shape", "padding", "relu", "pool"}
            if unknown:
                raise ModelError(f"{where}: unknown keys {sorted(unknown)}")
            layers.append(Layer(_take(l, "name", str, where), _take(l, "kind", str, where),
                                tuple(_ints(l, "weight_shape", where)), _take(l, "padding", int, where, 0),
                                _take(l, "relu", bool, where, False), _take(l, "pool", str, where, "")))
        return cls(name, shape, classes, tuple(layers), _take(d, "init", str, "", "pytorch"))


def _take(d: dict, key: str, t: type, where: str = "", default=None):
    where = f"{where}." if where else ""
    if key not in d:
        if default is None:
            raise ModelError(f"{where}{key}: missing")
        return default
    v = d[key]
    if not isinstance(v, t) or (t is int and isinstance(v, bool)):
        raise ModelError(f"{where}{key}: expected {t.__name__}, got {v!r}")
    return v


def _ints(d: dict, key: str, where: str = "") -> list[int]:
    v = _take(d, key, list, where)
    if not v or not all(isinstance(x, int) and not isinstance(x, bool) and 0 < x <= 1 << 20 for x in v):
        raise ModelError(f"{where + '.' if where else ''}{key}: expected a list of positive integers, got {v!r}")
    return v


def _propagate(m: Model) -> list[Shapes]:
    """Every layer's shapes from the input's, checking that each layer fits what it gets."""
    def bad(what: str, where: str = "") -> ModelError:
        return ModelError(f"model {m.name}{': ' + where if where else ''}: {what}")

    if not re.fullmatch(NAME, m.name):
        raise bad(f"name {m.name!r}: expected lower-case letters, digits, '.', '_' and '-'")
    if not m.layers:
        raise bad("no layers")
    if not isinstance(m.classes, int) or m.classes < 2:
        raise bad(f"classes: expected an integer >= 2, got {m.classes!r}")
    if m.init not in INITS:
        raise bad(f"init {m.init!r}: expected one of {', '.join(map(repr, INITS))}")
    shape, out, names = tuple(m.input_shape), [], set()
    for i, l in enumerate(m.layers):
        where = f"layer {i} ({l.name})"
        if not re.fullmatch(NAME, l.name) or l.name in names:
            raise bad(f"name {l.name!r}: expected a unique lower-case name", where)
        names.add(l.name)
        if l.kind not in KINDS:
            raise bad(f"kind {l.kind!r}: expected one of {', '.join(KINDS)}", where)
        if l.pool not in POOLS:
            raise bad(f"pool {l.pool!r}: expected one of {', '.join(repr(p) for p in POOLS)}", where)
        w = tuple(l.weight_shape)
        if l.kind == "conv2d":
            if len(shape) != 3 or len(w) != 4 or w[1] != shape[0]:
                raise bad(f"a conv2d weight [OC, C, KH, KW] with C = {shape[0] if len(shape) == 3 else '?'} "
                          f"needs an input [C, H, W]; got weight {list(w)} on input {list(shape)}", where)
            h, x = shape[1] + 2 * l.padding - w[2] + 1, shape[2] + 2 * l.padding - w[3] + 1
            if h < 1 or x < 1 or l.padding < 0:
                raise bad(f"kernel {w[2]}x{w[3]} with padding {l.padding} does not fit {list(shape)}", where)
            o = (w[0], h, x)
        elif l.kind == "pointwise":
            if len(shape) != 2 or len(w) != 2 or w[1] != shape[1]:
                raise bad(f"a pointwise weight [O, C] needs an input [N, C] with the same C; got weight "
                          f"{list(w)} on input {list(shape)}", where)
            o = (shape[0], w[0])
        else:
            if len(w) != 2 or w[1] != math.prod(shape):
                raise bad(f"an fc weight [O, I] needs I = {math.prod(shape)} inputs (the flattened "
                          f"{list(shape)}); got {list(w)}", where)
            o = (w[0],)
        if l.padding and l.kind != "conv2d":
            raise bad("only a conv2d layer takes padding", where)
        if l.pool == "max2x2":
            if l.kind != "conv2d" or o[1] < 2 or o[2] < 2:
                raise bad("max2x2 pools the [OC, H, W] output of a conv2d layer with H, W >= 2", where)
            pooled = (o[0], o[1] // 2, o[2] // 2)
        elif l.pool == "global-max":
            if l.kind != "pointwise":
                raise bad("global-max pools the [N, O] output of a pointwise layer", where)
            pooled = (o[1],)
        else:
            pooled = o
        out.append(Shapes(shape, o, pooled))
        shape = pooled
    last = m.layers[-1]
    if last.kind != "fc" or last.relu or shape != (m.classes,):
        raise bad(f"the last layer must be an fc layer without ReLU giving the {m.classes} class logits")
    return out


def weights_bytes(flat: np.ndarray) -> bytes:
    """The weights as a file holds them (init_weights, save_weights) and weights_sha256 hashes them."""
    return np.ascontiguousarray(flat, dtype="<f4").tobytes()


def weights_sha256(flat: np.ndarray) -> str:
    return hashlib.sha256(weights_bytes(flat)).hexdigest()


def _conv(name, oc, c, k, padding):
    return Layer(name, "conv2d", (oc, c, k, k), padding=padding, relu=True, pool="max2x2")


# The paper's LeNet-5: 107,786 parameters; the last FC layer is 0.8% of them,
# the last two 10.2% (ElasticZO Sec. 5.1.1).
LENET5 = Model(
    name="lenet5",
    input_shape=(1, 28, 28),
    classes=10,
    layers=(
        _conv("conv1", 6, 1, 5, 2),
        _conv("conv2", 16, 6, 5, 2),
        Layer("fc1", "fc", (120, 784), relu=True),
        Layer("fc2", "fc", (84, 120), relu=True),
        Layer("fc3", "fc", (10, 84)),
    ),
)

# The paper's PointNet (Sec. 5.1, Fig. 1 bottom): shared per-point FC layers 3-64-64-64-128-1024,
# a global max pool over the 1,024 points, and the classifier 1024-512-256-40; no T-Nets, batch
# norm or dropout, and so He init (INITS). docs/models.md compares its size and ZO shares with
# the paper's text.
POINTNET = Model(
    name="pointnet",
    input_shape=(1024, 3),
    classes=40,
    layers=(
        Layer("mlp1", "pointwise", (64, 3), relu=True),
        Layer("mlp2", "pointwise", (64, 64), relu=True),
        Layer("mlp3", "pointwise", (64, 64), relu=True),
        Layer("mlp4", "pointwise", (128, 64), relu=True),
        Layer("mlp5", "pointwise", (1024, 128), relu=True, pool="global-max"),
        Layer("fc1", "fc", (512, 1024), relu=True),
        Layer("fc2", "fc", (256, 512), relu=True),
        Layer("fc3", "fc", (40, 256)),
    ),
    init="he",
)

MODELS = {m.name: m for m in (LENET5, POINTNET)}
