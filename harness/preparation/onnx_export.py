"""A model's ZO front as an ONNX graph, for the forward-only ONNX Runtime runner.

The graph is written from the model description in models.py (the same layers
the torch runner runs), not traced from torch: it is small, deterministic
(the same bytes every time, so its sha256 names it) and needs only the `onnx`
package on the host. Boards never import this module; they get the file.

- The trainable weights are graph *inputs* named as in the model's offsets(), not
  initializers: the runner binds its own float32 buffer once and perturbs it in
  place, so the session never holds a second copy of the parameters. Every tensor of
  the ZO part is an input, read or not (a classifier's LM head), so the runner binds
  exactly that part of its buffer.
- The batch dimension is dynamic ("batch"), and for a point-cloud model the number of
  points too ("points"), for a transformer the sequence length ("tokens"): the weights
  do not depend on them.
- A layer model's layer is its op (Conv; Gemm on the flattened input for fc; Transpose,
  MatMul and Add for pointwise, whose input is [batch, points, C]), then Relu if the
  description says so, then MaxPool (max2x2) or ReduceMax over the points axis (global-max).
- A transformer (models.Transformer) computes what workloads/transformer_torch.py does, op
  for op, on int32 token ids [batch, tokens] (the data sets' type: nothing to convert). Its
  residual stream is [batch * tokens, D], so every projection is one Gemm with transB (no
  transposed copy of a weight); only attention reshapes to heads. Opset 17 has
  LayerNormalization; RMSNorm, GELU (tanh form) and SiLU are written from primitives. The
  causal mask and the rotary tables are made in the graph from the sequence length, the
  rotary angles in float64 as torch makes them: the file holds no table whose bytes would
  depend on the host's libm.
- The graph runs the units before the partition point and outputs their activation:
  for full-zo that is the logits; for ElasticZO it is the input of the BP head, which
  the runner computes in numpy because it needs the head's activations for its backward
  pass anyway. A layer model's is flattened to [batch, features]. A language model's has
  a row per token, [batch * tokens, D or vocab] as the residual stream is: the last Gemm
  writes the logits straight into the runner's buffer, where a reshape to [batch, tokens,
  vocab] would copy the step's largest array. A classifier's is its last position,
  [batch, D or classes] (the only position its head reads).
"""
from __future__ import annotations

import hashlib
import os
from pathlib import Path

import numpy as np
import onnx
from onnx import TensorProto, helper, numpy_helper

from workloads.models import Model, Transformer

OPSET = 17
OUTPUT = "front"
EPS = 1e-5              # LayerNorm's and RMSNorm's, as transformer_torch's
ROPE_BASE = 10000.0


class _Nodes:
    """The graph's nodes as they are written: each call adds one and returns its output's name."""

    def __init__(self):
        self.nodes = []

    def __call__(self, op: str, args: list, out: str, **attrs) -> str:
        self.nodes.append(helper.make_node(op, args, [out], **attrs))
        return out

    def split(self, x: str, outs: list[str], axis: int) -> list[str]:
        """x cut into len(outs) equal parts along axis."""
        self.nodes.append(helper.make_node("Split", [x], outs, axis=axis))
        return outs

    def const(self, out: str, value, dtype) -> str:
        return self("Constant", [], out, value=numpy_helper.from_array(np.asarray(value, dtype=dtype), out))


def graph(model: Model | Transformer, layers: int) -> onnx.ModelProto:
    """The front of `layers` layers (a transformer's units) of the model."""
    nodes = _Nodes()
    if model.kind == Transformer.kind:
        x = helper.make_tensor_value_info("x", TensorProto.INT32, ["batch", "tokens"])
        out = _transformer(model, layers, nodes)
    else:
        x_shape = ["batch", "points", *model.input_shape[1:]] if model.points else ["batch", *model.input_shape]
        x = helper.make_tensor_value_info("x", TensorProto.FLOAT, x_shape)
        out = _layers(model, layers, nodes)
    inputs = [x] + [helper.make_tensor_value_info(name, TensorProto.FLOAT, list(shape))
                    for name, shape in _weights(model, layers)]
    g = helper.make_graph(nodes.nodes, f"{model.name}-front{layers}", inputs,
                          [helper.make_tensor_value_info(OUTPUT, TensorProto.FLOAT, out)])
    proto = helper.make_model(g, opset_imports=[helper.make_opsetid("", OPSET)], producer_name="zobench")
    proto.ir_version = 8            # readable by every onnxruntime since 1.10
    onnx.checker.check_model(proto, full_check=True)
    return proto


def _weights(model, layers: int) -> list[tuple[str, tuple]]:
    """The graph's weight inputs: every tensor of its layers (units), in layout order."""
    if model.kind == Transformer.kind:
        return [(t.name, t.shape) for t in model.tensors() if t.unit < layers]
    return [(name, shape) for name, _, shape in model.offsets()[:2 * layers]]


def _layers(model: Model, layers: int, node: _Nodes) -> list:
    x = "x"
    for layer, shapes in zip(model.layers[:layers], model.shapes):
        w, b, n = f"{layer.name}.weight", f"{layer.name}.bias", layer.name
        if layer.kind == "conv2d":
            x = node("Conv", [x, w, b], f"{n}.conv", pads=[layer.padding] * 4,
                     kernel_shape=list(layer.weight_shape[2:]))
        elif layer.kind == "fc":
            if len(shapes.input) > 1:
                x = node("Flatten", [x], f"{n}.in", axis=1)
            x = node("Gemm", [x, w, b], f"{n}.gemm", transB=1)
        else:   # [batch, points, C] @ W^T + b: Gemm takes 2-D inputs only
            wt = node("Transpose", [w], f"{n}.weight_t", perm=[1, 0])
            x = node("Add", [node("MatMul", [x, wt], f"{n}.matmul"), b], f"{n}.add")
        if layer.relu:
            x = node("Relu", [x], f"{n}.relu")
        if layer.pool == "max2x2":
            x = node("MaxPool", [x], f"{n}.pool", kernel_shape=[2, 2], strides=[2, 2])
        elif layer.pool == "global-max":
            x = node("ReduceMax", [x], f"{n}.pool", axes=[1], keepdims=0)
    flat = len(model.shapes[layers - 1].pooled if layers else model.input_shape) == 1
    node("Identity" if flat else "Flatten", [x], OUTPUT, **({} if flat else {"axis": 1}))
    return ["batch", None]


def _transformer(m: Transformer, units: int, node: _Nodes) -> list:
    """Units 0..units-1 of m: the embeddings and every block, then the head if units is all of
    them (a language model's logits, a classifier's) or else the head's input; its shape."""
    if units not in (m.units, m.units - 1):
        raise ValueError(f"{m.name}: the graph of a transformer ends before its head or after it, "
                         f"not after unit {units} of {m.units}")
    D, H, hd, gpt2 = m.width, m.heads, m.head_dim, m.style == "gpt2"

    def norm(x, name):
        w = f"{name}.weight"
        if gpt2:
            return node("LayerNormalization", [x, w, f"{name}.bias"], f"{name}.out", axis=-1, epsilon=EPS)
        ms = node("ReduceMean", [node("Mul", [x, x], f"{name}.sq")], f"{name}.ms", axes=[-1], keepdims=1)
        r = node("Reciprocal", [node("Sqrt", [node("Add", [ms, eps], f"{name}.var")], f"{name}.rms")], f"{name}.r")
        return node("Mul", [node("Mul", [x, r], f"{name}.x_r"), w], f"{name}.out")

    def linear(x, name, bias=gpt2, weight="", out=""):
        args = [x, weight or f"{name}.weight"] + ([f"{name}.bias"] if bias else [])
        return node("Gemm", args, out or f"{name}.out", transB=1)

    def scalar(name, value):
        return node.const(name, value, np.float32)

    def rotate(x, name):
        """Rotary embedding, rotate-half convention: x cos + (-x2, x1) sin, x1 and x2 x's halves."""
        x1, x2 = node.split(x, [f"{name}.x1", f"{name}.x2"], axis=-1)
        turned = node("Concat", [node("Neg", [x2], f"{name}.neg_x2"), x1], f"{name}.turned", axis=-1)
        return node("Add", [node("Mul", [x, cos], f"{name}.cos"), node("Mul", [turned, sin], f"{name}.sin")],
                    f"{name}.rope")

    def reshape(x, tail: list, out: str) -> str:
        """x as [B, T, *tail]."""
        return node("Reshape", [x, node("Concat", [bt, node.const(f"{out}.tail", tail, np.int64)],
                                        f"{out}.shape", axis=0)], out)

    # what every block reads: the sequence's shape, the causal mask, llama's rotary tables
    bt = node("Shape", ["x"], "bt")                                     # [B, T]
    t = node("Shape", ["x"], "t", start=1)                              # [T]
    axis0, axis1 = node.const("axis0", [0], np.int64), node.const("axis1", [1], np.int64)
    scale, minus_inf = scalar("scale", hd ** -0.5), scalar("minus_inf", -np.inf)
    flat = node.const("flat", [-1, D], np.int64)
    positions = node("Range", [node.const("zero", 0, np.int64), node("Squeeze", [t], "t_scalar"),
                               node.const("one", 1, np.int64)], "positions")
    # [T, T]: True where key j comes after query i, masked as torch's masked_fill(-inf)
    future = node("Greater", [node("Unsqueeze", [positions, axis0], "key_pos"),
                              node("Unsqueeze", [positions, axis1], "query_pos")], "future")
    if gpt2:
        kappa, beta = scalar("gelu_kappa", 0.044715), scalar("gelu_beta", np.sqrt(2 / np.pi))
        half, one = scalar("half", 0.5), scalar("one_f", 1.0)
    else:
        eps = scalar("eps", EPS)
        # angles[t, i] = t base^(-2i/hd) in float64; the exponents are exact IEEE quotients
        exponents = node.const("rope_exponents", [-(j / hd) for j in range(0, hd, 2)], np.float64)
        inv = node("Pow", [node.const("rope_base", ROPE_BASE, np.float64), exponents], "rope_inv")
        pos = node("Unsqueeze", [node("Cast", [positions], "pos_f64", to=TensorProto.DOUBLE), axis1], "pos_col")
        angles = node("Mul", [pos, inv], "rope_angles")                 # [T, hd/2]
        t1hd = node.const("rope_shape", [0, 1, hd], np.int64)           # [T, 1, hd]: the same for every head
        tables = []
        for f in ("Cos", "Sin"):
            half = node("Cast", [node(f, [angles], f"rope_{f}64")], f"rope_{f}_half", to=TensorProto.FLOAT)
            tables.append(node("Reshape", [node("Concat", [half, half], f"rope_{f}_hd", axis=-1), t1hd],
                               f"rope_{f}"))
        cos, sin = tables

    x = node("Gather", ["wte", "x"], "tok_emb", axis=0)                 # [B, T, D]
    if gpt2:
        x = node("Add", [x, node("Slice", ["wpe", node.const("zero_1d", [0], np.int64), t, axis0], "pos_emb")],
                 "emb")
    x = node("Reshape", [x, flat], "emb_flat")                          # [B T, D]: the residual stream

    for i in range(m.depth):
        b = f"h{i}"
        q, k, v = node.split(linear(norm(x, f"{b}.ln1"), f"{b}.attn.qkv"), [f"{b}.{n}" for n in "qkv"], axis=-1)
        q, k, v = (reshape(u, [H, hd], f"{u}.bthd") for u in (q, k, v))
        if not gpt2:
            q, k = rotate(q, f"{b}.q"), rotate(k, f"{b}.k")
        q, v = (node("Transpose", [u], f"{u}.bhtd", perm=[0, 2, 1, 3]) for u in (q, v))
        k_t = node("Transpose", [k], f"{b}.k_t", perm=[0, 2, 3, 1])    # [B, H, hd, T]
        s = node("Mul", [node("MatMul", [q, k_t], f"{b}.qk"), scale], f"{b}.scores")
        p = node("Softmax", [node("Where", [future, minus_inf, s], f"{b}.masked")], f"{b}.p", axis=-1)
        a = node("Transpose", [node("MatMul", [p, v], f"{b}.pv")], f"{b}.pv_bthd", perm=[0, 2, 1, 3])
        a = linear(node("Reshape", [a, flat], f"{b}.attn"), f"{b}.attn.proj")
        x = node("Add", [x, a], f"{b}.x_attn")
        h = norm(x, f"{b}.ln2")
        if gpt2:    # 0.5 u (1 + tanh(sqrt(2/pi) (u + 0.044715 u^3))): torch's gelu(approximate="tanh")
            u = linear(h, f"{b}.mlp.fc")
            cube = node("Mul", [node("Mul", [u, u], f"{b}.u2"), u], f"{b}.u3")
            inner = node("Add", [u, node("Mul", [cube, kappa], f"{b}.ku3")], f"{b}.inner")
            th = node("Tanh", [node("Mul", [inner, beta], f"{b}.arg")], f"{b}.tanh")
            g = node("Mul", [node("Mul", [u, half], f"{b}.half_u"), node("Add", [th, one], f"{b}.one_th")],
                     f"{b}.gelu")
            y = linear(g, f"{b}.mlp.proj")
        else:       # SwiGLU: down(silu(gate h) * up h)
            gate = linear(h, f"{b}.mlp.gate")
            silu = node("Mul", [gate, node("Sigmoid", [gate], f"{b}.sig")], f"{b}.silu")
            y = linear(node("Mul", [silu, linear(h, f"{b}.mlp.up")], f"{b}.swiglu"), f"{b}.mlp.down")
        x = node("Add", [x, y], f"{b}.x")

    head = units == m.units
    if m.classes:       # only the last position goes on
        last = node("Slice", [reshape(x, [D], "x_btd"), node.const("last", [-1], np.int64),
                              node.const("end", [np.iinfo(np.int64).max], np.int64), axis1], "x_last")
        x = node("Squeeze", [last, axis1], "x_bd")                      # [B, D]
        if head:
            linear(norm(x, "ln_f"), "cls", bias=True, out=OUTPUT)
        else:
            node("Identity", [x], OUTPUT)
        return ["batch", m.classes if head else D]
    if not head:
        node("Identity", [x], OUTPUT)
        return ["batch_tokens", D]
    linear(norm(x, "ln_f"), "lm_head", bias=False, weight="wte" if m.tied else "", out=OUTPUT)
    return ["batch_tokens", m.vocab]


def file_name(model, layers: int) -> tuple[str, bytes]:
    data = graph(model, layers).SerializeToString(deterministic=True)
    return f"{model.name}-front{layers}-{hashlib.sha256(data).hexdigest()[:16]}.onnx", data


def export(model, layers: int, directory: Path) -> Path:
    """The graph's file in `directory`, written once (its name carries its hash)."""
    name, data = file_name(model, layers)
    path = Path(directory) / name
    if not path.is_file():
        path.parent.mkdir(parents=True, exist_ok=True)
        tmp = path.with_name(f"{name}.part-{os.getpid()}")
        tmp.write_bytes(data)
        os.replace(tmp, path)
    return path
