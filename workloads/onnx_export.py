"""A model's ZO front as an ONNX graph, for the forward-only ONNX Runtime runner.

The graph is written from the model description in models.py (the same layers
the torch runner runs), not traced from torch: it is small, deterministic
(the same bytes every time, so its sha256 names it) and needs only the `onnx`
package on the host. Boards never import this module; they get the file.

- The trainable weights are graph *inputs* named as in Model.offsets(), not
  initializers: the runner binds its own float32 buffer once and perturbs it in
  place, so the session never holds a second copy of the parameters.
- The batch dimension is dynamic ("batch"), and for a point-cloud model the number of
  points too ("points"): the weights do not depend on it.
- Each layer is its op (Conv; Gemm on the flattened input for fc; Transpose, MatMul and
  Add for pointwise, whose input is [batch, points, C]), then Relu if the description
  says so, then MaxPool (max2x2) or ReduceMax over the points axis (global-max).
- The graph runs the layers before the partition point and outputs their
  activation, flattened to [batch, features]: for full-zo that is the logits;
  for ElasticZO it is the input of the BP head, which the runner computes in
  numpy because it needs the head's activations for its backward pass anyway.
"""
from __future__ import annotations

import hashlib
import os
from pathlib import Path

import onnx
from onnx import TensorProto, helper

from .models import Model

OPSET = 17
OUTPUT = "front"


def front_layers(model: Model, method: str, bp_layers: int) -> int:
    """How many leading layers the graph runs: all for full-zo, all but the head for elastic-zo."""
    if method not in ("full-zo", "elastic-zo"):
        raise ValueError(f"the ONNX front exists for full-zo and elastic-zo only, not {method}")
    return model.first_bp_layer(method, bp_layers)


def graph(model: Model, layers: int) -> onnx.ModelProto:
    tensors = model.offsets()[:2 * layers]
    x_shape = ["batch", "points", *model.input_shape[1:]] if model.points else ["batch", *model.input_shape]
    inputs = [helper.make_tensor_value_info("x", TensorProto.FLOAT, x_shape)]
    inputs += [helper.make_tensor_value_info(name, TensorProto.FLOAT, list(shape)) for name, _, shape in tensors]
    nodes, x = [], "x"

    def node(op: str, args: list, out: str, **attrs) -> str:
        nodes.append(helper.make_node(op, args, [out], **attrs))
        return out

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
    out = helper.make_tensor_value_info(OUTPUT, TensorProto.FLOAT, ["batch", None])
    g = helper.make_graph(nodes, f"{model.name}-front{layers}", inputs, [out])
    proto = helper.make_model(g, opset_imports=[helper.make_opsetid("", OPSET)], producer_name="zobench")
    proto.ir_version = 8            # readable by every onnxruntime since 1.10
    onnx.checker.check_model(proto, full_check=True)
    return proto


def file_name(model: Model, layers: int) -> tuple[str, bytes]:
    data = graph(model, layers).SerializeToString(deterministic=True)
    return f"{model.name}-front{layers}-{hashlib.sha256(data).hexdigest()[:16]}.onnx", data


def export(model: Model, layers: int, directory: Path) -> Path:
    """The graph's file in `directory`, written once (its name carries its hash)."""
    name, data = file_name(model, layers)
    path = Path(directory) / name
    if not path.is_file():
        path.parent.mkdir(parents=True, exist_ok=True)
        tmp = path.with_name(f"{name}.part-{os.getpid()}")
        tmp.write_bytes(data)
        os.replace(tmp, path)
    return path
