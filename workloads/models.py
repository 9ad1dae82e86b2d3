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

import dataclasses
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
    """A network of trainable layers (conv2d, fc, pointwise): LeNet-5, PointNet."""
    name: str
    input_shape: tuple   # (C, H, W) for images, (N, C) for point clouds
    classes: int
    layers: tuple
    init: str = "pytorch"   # INITS
    shapes: tuple = field(init=False, repr=False, compare=False)
    kind = "layers"          # not a field: Transformer's is "transformer"

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

    def unit_sizes(self) -> list[int]:
        """Parameters per unit, in layout order: a layer model's units are its layers."""
        return [l.size for l in self.layers]

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


def decayed(model, n: int) -> list[tuple[int, int]]:
    """The flat ranges that weight decay reaches in the first n parameters: the weight tensors (a
    layer's weights, an embedding, a linear map), never a bias or a norm's gain, as MeZO's step and
    AdamW's usual groups leave those alone. A tensor has two or more dimensions exactly when it
    is a weight, in every model here; the C++ binary takes its layers' weights the same way."""
    return [(o, o + math.prod(shape)) for _, o, shape in model.offsets() if len(shape) >= 2 and o < n]


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



# --- Decoder-only transformers (Katti et al.'s question: the largest model a method can fine-tune) ---

STYLES = ("gpt2", "llama")
TRANSFORMER_KEYS = ("kind", "name", "family", "vocab", "context", "width", "depth", "heads", "ffn",
                    "style", "tied", "classes")
INIT_STD = 0.02     # GPT-2's init: weights ~ std 0.02, residual projections / sqrt(2 depth)


@dataclass(frozen=True)
class Tensor:
    """One parameter tensor of a transformer: its name, shape, the unit it belongs to (embed,
    block<i>, head: what ElasticZO partitions), and how it starts (init_weights)."""
    name: str
    shape: tuple
    unit: int
    init: str            # "normal" (std INIT_STD), "residual" (INIT_STD / sqrt(2 depth)), "zeros", "ones"

    @property
    def size(self) -> int:
        return math.prod(self.shape)


@dataclass(frozen=True)
class Transformer:
    """A decoder-only transformer as data. Two styles share one layout scheme:

    - "gpt2": token and learned position embeddings; each block is LayerNorm (weight, bias),
      causal multi-head self-attention (one fused qkv projection [3D, D] with bias, an output
      projection [D, D] with bias), LayerNorm, MLP D -> ffn -> D with GELU (tanh form) and
      biases, both sub-layers residual; a final LayerNorm; the LM head tied to the token
      embedding unless tied = false.
    - "llama": token embedding only (rotary positions, RoPE base 10000, on q and k); RMSNorm
      (weight only, eps 1e-5); attention as above without biases; a SwiGLU MLP (gate [ffn, D],
      up [ffn, D], down [D, ffn], no biases); a final RMSNorm; an untied LM head.

    classes > 0 adds a classification head [classes, D] + bias, read at the last position after
    the final norm: the fine-tuning task of a text data set with labels (with_classes).

    The flat parameter vector is the tensors in order (tensors()), each row-major, as for the
    layer models: zobench-z's ZO index, weights files and weights_sha256 use it. The units are
    what a method partitions: 0 = the embeddings, 1..depth = the blocks, depth + 1 = the head
    (final norm, untied LM head, classification head). ElasticZO with bp_layers = K trains the
    last K units by BP and the rest by ZO; a tied LM head is the token embedding, in unit 0, and
    so is trained by ZO unless K covers every unit (docs/transformers.md)."""
    name: str
    vocab: int
    context: int          # positions it is built for (learned positions: the table's rows)
    width: int            # D
    depth: int            # blocks
    heads: int
    ffn: int              # MLP hidden width
    family: str = "gpt2"  # the ladder it belongs to (zobench fit --model-family)
    style: str = "gpt2"   # STYLES
    tied: bool = True
    classes: int = 0
    kind = "transformer"  # not a field: what to_dict writes, and how descriptions are told apart
    points = False

    def __post_init__(self):
        def bad(what):
            return ModelError(f"model {self.name}: {what}")
        if not re.fullmatch(NAME, self.name):
            raise bad(f"name {self.name!r}: expected lower-case letters, digits, '.', '_' and '-'")
        for key in ("vocab", "context", "width", "depth", "heads", "ffn"):
            v = getattr(self, key)
            if not isinstance(v, int) or isinstance(v, bool) or v < 1:
                raise bad(f"{key}: expected a positive integer, got {v!r}")
        if self.width % self.heads:
            raise bad(f"width {self.width} is not a multiple of heads {self.heads}")
        if self.style not in STYLES:
            raise bad(f"style {self.style!r}: expected one of {', '.join(map(repr, STYLES))}")
        if self.style == "llama" and (self.tied or (self.width // self.heads) % 2):
            raise bad("a llama-style model has an untied head and an even head width (rotary pairs)")
        if not isinstance(self.classes, int) or self.classes < 0 or self.classes == 1:
            raise bad(f"classes: expected 0 (language model only) or >= 2, got {self.classes!r}")

    @property
    def head_dim(self) -> int:
        return self.width // self.heads

    @property
    def input_shape(self) -> tuple:
        return (self.context,)

    @property
    def units(self) -> int:
        return self.depth + 2

    def tensors(self) -> list[Tensor]:
        """Every parameter tensor, in layout order."""
        d, f, gpt2 = self.width, self.ffn, self.style == "gpt2"
        out = [Tensor("wte", (self.vocab, d), 0, "normal")]
        if gpt2:
            out.append(Tensor("wpe", (self.context, d), 0, "normal"))

        def norm(name, unit):
            return [Tensor(f"{name}.weight", (d,), unit, "ones")] + \
                ([Tensor(f"{name}.bias", (d,), unit, "zeros")] if gpt2 else [])

        def linear(name, shape, unit, init="normal"):
            return [Tensor(f"{name}.weight", shape, unit, init)] + \
                ([Tensor(f"{name}.bias", (shape[0],), unit, "zeros")] if gpt2 else [])

        for i in range(self.depth):
            u, b = i + 1, f"h{i}"
            out += norm(f"{b}.ln1", u) + linear(f"{b}.attn.qkv", (3 * d, d), u) + \
                linear(f"{b}.attn.proj", (d, d), u, "residual") + norm(f"{b}.ln2", u)
            if gpt2:
                out += linear(f"{b}.mlp.fc", (f, d), u) + linear(f"{b}.mlp.proj", (d, f), u, "residual")
            else:
                out += linear(f"{b}.mlp.gate", (f, d), u) + linear(f"{b}.mlp.up", (f, d), u) + \
                    linear(f"{b}.mlp.down", (d, f), u, "residual")
        head = self.depth + 1
        out += norm("ln_f", head)
        if not self.tied:
            out.append(Tensor("lm_head.weight", (self.vocab, d), head, "normal"))
        if self.classes:
            out += [Tensor("cls.weight", (self.classes, d), head, "normal"),
                    Tensor("cls.bias", (self.classes,), head, "zeros")]
        return out

    def offsets(self) -> list[tuple[str, int, tuple]]:
        out, off = [], 0
        for t in self.tensors():
            out.append((t.name, off, t.shape))
            off += t.size
        return out

    @property
    def params_total(self) -> int:
        return sum(t.size for t in self.tensors())

    def unit_sizes(self) -> list[int]:
        sizes = [0] * self.units
        for t in self.tensors():
            sizes[t.unit] += t.size
        return sizes

    def head_layers(self) -> int:
        """The most units ElasticZO can train by BP: every block and the head."""
        return self.depth + 1

    def first_bp_layer(self, method: str, bp_layers: int) -> int:
        """Index of the first unit trained by BP (as Model.first_bp_layer, over units)."""
        if method == "full-bp":
            return 0
        if method == "full-zo":
            return self.units
        if not 1 <= bp_layers <= self.head_layers():
            raise ValueError(f"bp_layers must be between 1 and {self.head_layers()} for {self.name} "
                             f"(its head and {self.depth} blocks)")
        return self.units - bp_layers

    def split(self, method: str, bp_layers: int) -> int:
        return sum(self.unit_sizes()[:self.first_bp_layer(method, bp_layers)])

    def init_weights(self, seed: int) -> np.ndarray:
        """GPT-2's init from zobench-z: normal tensors U(-b, b) with the std of N(0, 0.02) (b =
        0.02 sqrt 3), residual projections scaled by 1/sqrt(2 depth), norms' weights 1, biases
        0. Drawn a tensor at a time, so a 1.5B-parameter model needs no 8-byte-per-parameter
        temporary."""
        flat = np.empty(self.params_total, dtype=np.float32)
        key = zrng.stream_key(seed, zrng.STREAM_INIT, 0)
        for t, (_, off, _) in zip(self.tensors(), self.offsets()):
            out = flat[off:off + t.size]
            if t.init in ("zeros", "ones"):
                out[:] = 0.0 if t.init == "zeros" else 1.0
                continue
            std = INIT_STD / (math.sqrt(2 * self.depth) if t.init == "residual" else 1.0)
            b = np.float32(std * math.sqrt(3.0))
            for lo in range(0, t.size, zrng.CHUNK):
                n = min(zrng.CHUNK, t.size - lo)
                u = zrng.uniform(key, off + lo, n)
                out[lo:lo + n] = (u * np.float32(2.0) - np.float32(1.0)) * b
        return flat

    def forward_flops(self, context: int = 0) -> int:
        """Multiply-add FLOPs (2 each) of one sequence's forward pass at this context: the
        matrix products of every block, attention's scores and weighted sum, and the head."""
        t, d, f = context or self.context, self.width, self.ffn
        mlp = (3 if self.style == "llama" else 2) * d * f
        per_token = self.depth * (4 * d * d + mlp) + (self.vocab * d if not self.classes else 0)
        attention = self.depth * 2 * t * t * d          # q k^T and the weighted sum of v, causal not halved
        return 2 * (t * per_token + attention)

    def loss_chunk(self, rows: int, setting: int = 0) -> int:
        """Tokens a language model's LM head and cross-entropy take at a time (hyper.loss_chunk):
        a forward-only method needs the loss, not the [rows, vocab] logits, so the head runs a
        chunk of rows at a time and only one chunk's logits are ever alive (Liger Kernel's fused
        linear cross-entropy, Apple's Cut Cross-Entropy). setting > 0: that many tokens (at most
        rows); 0: Liger's rule, the power of two that makes a chunk's logits about the size of the
        batch's hidden states [rows, width] (rows / ceil(vocab / width), rounded up), so the loss
        costs about one more activation whatever the vocabulary; < 0: every row at once, the
        logits whole (0 returned: the unchunked loss). A classifier's logits are [B, classes],
        never worth chunking: 0."""
        if setting < 0 or self.classes:
            return 0
        if setting:
            return min(setting, rows)
        per = -(-rows // -(-self.vocab // self.width))
        return min(rows, 1 << (per - 1).bit_length())

    def with_classes(self, n: int) -> "Transformer":
        """The same network with a classification head of n classes (a text data set's labels)."""
        return dataclasses.replace(self, classes=n)

    def to_dict(self) -> dict:
        return {"kind": self.kind, **{k: getattr(self, k) for k in TRANSFORMER_KEYS if k != "kind"}}

    @classmethod
    def from_dict(cls, d: dict) -> "Transformer":
        unknown = set(d) - set(TRANSFORMER_KEYS)
        if unknown:
            raise ModelError(f"unknown keys {sorted(unknown)}; expected {', '.join(TRANSFORMER_KEYS)}")
        ints = ("vocab", "context", "width", "depth", "heads", "ffn")
        return cls(**{k: _take(d, k, str) for k in ("name",)},
                   **{k: _take(d, k, int) for k in ints},
                   family=_take(d, "family", str, "", "gpt2"), style=_take(d, "style", str, "", "gpt2"),
                   tied=_take(d, "tied", bool, "", True), classes=_take(d, "classes", int, "", 0))


def from_dict(d) -> Model | Transformer:
    """A model description from data, of either kind; ModelError names what is wrong."""
    if isinstance(d, dict) and d.get("kind") == Transformer.kind:
        return Transformer.from_dict(d)
    return Model.from_dict(d)


def _gpt2(name, vocab, context, width, depth, heads):
    return Transformer(name, vocab, context, width, depth, heads, 4 * width)


def _llama(name, vocab, context, width, depth, heads, ffn):
    return Transformer(name, vocab, context, width, depth, heads, ffn, family="llama", style="llama",
                       tied=False)


# The ladders zobench fit climbs. The small rungs use TEXT_VOCAB, the BPE vocabulary zobench
# trains on its text data set (harness/preparation/text.py), so they run here; the rest have the shapes
# of GPT-2 (Radford et al. 2019: 124M, 355M, 774M, 1.5B) and Llama 2 (7B, 13B) with their
# vocabularies, for the memory model and for boards large enough to run them.
TEXT_VOCAB = 4096
TRANSFORMERS = (
    _gpt2("gpt2-1m", TEXT_VOCAB, 256, 128, 2, 4),
    _gpt2("gpt2-4m", TEXT_VOCAB, 256, 256, 4, 4),
    _gpt2("gpt2-12m", TEXT_VOCAB, 512, 384, 6, 6),
    _gpt2("gpt2-29m", TEXT_VOCAB, 512, 512, 8, 8),
    _gpt2("gpt2-small", 50257, 1024, 768, 12, 12),
    _gpt2("gpt2-medium", 50257, 1024, 1024, 24, 16),
    _gpt2("gpt2-large", 50257, 1024, 1280, 36, 20),
    _gpt2("gpt2-xl", 50257, 1024, 1600, 48, 25),
    _llama("llama-5m", TEXT_VOCAB, 512, 256, 4, 4, 688),
    _llama("llama2-7b", 32000, 4096, 4096, 32, 32, 11008),
    _llama("llama2-13b", 32000, 4096, 5120, 40, 40, 13824),
)

MODELS = {m.name: m for m in (LENET5, POINTNET, *TRANSFORMERS)}


def ladder(family: str) -> list[Transformer]:
    """A family's transformers, smallest first."""
    return sorted((m for m in TRANSFORMERS if m.family == family), key=lambda m: m.params_total)
