"""The ONNX Runtime runner: `python -m workloads.ort_runner --spec S --out R`.

Forward-only ZO training for a CPU board that has onnxruntime and numpy and
nothing else: this module imports neither torch nor the harness (tested).

- The parameters are one float32 numpy buffer in the models.py layout. The
  exported graph (workloads/onnx_export.py, path in spec.onnx_model) takes the
  ZO layers' weights as inputs; each is bound once through IOBinding to a view
  of that buffer, so perturbing or updating the buffer in place is all a step
  does to the weights -- nothing is copied into the session.
- z is zobench-z, the same values as every other runtime. numpy cannot fuse
  generation into the update the way the C++ loop does, and generating z is
  the costliest part of a perturbation, so the runner draws z once per step
  into one n_zo scratch vector and applies it three times (+eps, -2 eps,
  eps - lr g). That scratch (4 bytes per ZO parameter) is the one buffer this
  runner holds that the C++ binary does not.
- ElasticZO's BP head (the model's last FC layers, each followed by a ReLU
  where the description says so, then softmax cross-entropy) runs forward and
  backward in numpy on the graph's output, keeping the activations of both
  perturbed passes as methods.py prescribes; its update is SGD, or Adam written
  once for numpy and torch (methods.adam_update).
"""
from __future__ import annotations

import sys

import numpy as np

from . import methods, zrng
from .methods import Engine
from .runner import main
from .spec import SpecError


def softmax_ce(logits: np.ndarray, y: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    """Per-sample cross-entropy losses and the softmax probabilities (float64 sums, as torch)."""
    m = logits.max(axis=1, keepdims=True)
    e = np.exp(logits - m)
    s = e.sum(axis=1, keepdims=True)
    losses = (np.log(s) + m)[:, 0] - logits[np.arange(len(y)), y]
    return losses, e / s


class Head:
    """The BP head: FC layers `first`..end of the model on views into the flat buffer."""

    def __init__(self, model, first: int, views: list, grad_views: list):
        self.layers = list(range(first, len(model.layers)))
        self.relu = [layer.relu for layer in model.layers]
        self.views, self.grad_views = views, grad_views

    def forward(self, a: np.ndarray) -> tuple[np.ndarray, list]:
        """Logits, and the input of every head layer (what backward needs)."""
        inputs = []
        for i in self.layers:
            inputs.append(a)
            w, b = self.views[2 * i], self.views[2 * i + 1]
            a = a @ w.T + b
            if self.relu[i]:
                np.maximum(a, 0, out=a)
        return a, inputs

    def backward(self, d: np.ndarray, inputs: list) -> None:
        """Accumulate the head's gradients for dloss/dlogits = d."""
        for i, a in zip(reversed(self.layers), reversed(inputs)):
            gw, gb = self.grad_views[2 * i], self.grad_views[2 * i + 1]
            gw += d.T @ a
            gb += d.sum(axis=0)
            if i > self.layers[0]:
                d = d @ self.views[2 * i]
                if self.relu[i - 1]:    # a is that ReLU's output: > 0 exactly where it passes the error
                    d *= a > 0


class OrtEngine(Engine):
    def __init__(self, spec, model, init: np.ndarray):
        import onnxruntime as ort

        if spec.precision != "fp32":
            raise SpecError(f"precision: the ort runtime trains fp32 only, not {spec.precision}")
        if spec.method not in ("full-zo", "elastic-zo"):
            raise SpecError(f"method: the ort runtime runs forward passes only; it trains full-zo and "
                            f"elastic-zo, not {spec.method}")
        if not spec.onnx_model:
            raise SpecError("onnx_model: the ort runtime needs the exported graph of the model's ZO front "
                            "(the harness writes it with workloads/onnx_export.py)")
        self.model = model
        self.flat = np.array(init, dtype=np.float32)
        self.n_zo = model.split(spec.method, spec.bp_layers)
        self.n_bp = model.params_total - self.n_zo
        first = model.first_bp_layer(spec.method, spec.bp_layers)
        tensors = model.offsets()
        self.views = [self.flat[o:o + int(np.prod(s))].reshape(s) for _, o, s in tensors]
        self.grad = np.zeros(self.n_bp, dtype=np.float32)
        grad_views = [self.grad[o - self.n_zo:o - self.n_zo + int(np.prod(s))].reshape(s) if o >= self.n_zo else None
                      for _, o, s in tensors]
        self.head = Head(model, first, self.views, grad_views) if self.n_bp else None
        self.hyper = spec.hyper
        self.adam = spec.hyper.optimizer == "adam" and self.n_bp > 0
        # Adam's moments over the head and its update count (methods.adam_update): with the
        # parameters, all that outlives a step
        self.moments = [np.zeros(self.n_bp, dtype=np.float32) for _ in range(2)] if self.adam else []
        self.adam_t = 0

        opts = ort.SessionOptions()
        opts.intra_op_num_threads = spec.threads      # 0 = ONNX Runtime's default: all cores
        opts.inter_op_num_threads = 1
        opts.add_session_config_entry("session.intra_op.allow_spinning", "0")
        try:
            self.session = ort.InferenceSession(spec.onnx_model, opts, providers=["CPUExecutionProvider"])
        except Exception as e:
            raise SpecError(f"onnx_model: ONNX Runtime cannot load {spec.onnx_model}: {e}") from None
        want = {"x"} | {name for name, _, _ in tensors[:2 * first]}
        have = {i.name for i in self.session.get_inputs()}
        if have != want:
            raise SpecError(f"onnx_model: {spec.onnx_model} is not {model.name}'s front of {first} layers "
                            f"(its inputs are {sorted(have)})")
        self.binding = self.session.io_binding()
        self._bound = []   # the OrtValues share the numpy buffers; keep them alive
        for (name, _, _), view in zip(tensors[:2 * first], self.views):
            value = ort.OrtValue.ortvalue_from_numpy(view)
            self.binding.bind_ortvalue_input(name, value)
            self._bound.append(value)
        self._ort = ort
        # the graph's output: the logits, or the input of the head's first FC layer
        self.front_features = model.classes if first == len(model.layers) else model.layers[first].weight_shape[1]
        self._outputs = {}
        self.z = np.empty(self.n_zo, dtype=np.float32)
        self.z_key = None
        self.kept = []

    def load_batch(self, x, y):
        return np.ascontiguousarray(x, dtype=np.float32), np.asarray(y, dtype=np.int64)

    def _front(self, x: np.ndarray) -> np.ndarray:
        """The graph's output for x, in a buffer bound once per batch size."""
        if len(x) not in self._outputs:
            out = np.empty((len(x), self.front_features), dtype=np.float32)
            self._outputs[len(x)] = (out, self._ort.OrtValue.ortvalue_from_numpy(out))
        out, value = self._outputs[len(x)]
        self.binding.bind_ortvalue_output("front", value)
        self.binding.bind_cpu_input("x", x)
        self.session.run_with_iobinding(self.binding)
        return out

    def forward(self, x, keep: bool):
        a = self._front(x)
        if self.head is None:
            return a, None
        if keep:    # the bound output buffer is overwritten by the next pass; BP needs this one's
            a = a.copy()
        logits, inputs = self.head.forward(a)
        return logits, inputs if keep else None

    def loss(self, out, y) -> float:
        logits, inputs = out
        losses, probs = softmax_ce(logits, y)
        if inputs is not None:
            self.kept.append((probs, y, inputs))
        return float(losses.astype(np.float64).mean())

    def backward(self) -> None:
        """BP through the mean of the kept losses: d(mean_k mean_b l)/dlogits = (p - onehot) / (B k)."""
        for probs, y, inputs in self.kept:
            d = probs.copy()
            d[np.arange(len(y)), y] -= 1.0
            d /= np.float32(len(y) * len(self.kept))
            self.head.backward(d, inputs)
        self.kept.clear()

    def bp_update(self, lr: float) -> None:
        if self.adam:
            self.adam_t += 1
            methods.adam_update(self.flat[self.n_zo:], self.grad, *self.moments, lr, self.adam_t, self.hyper, np.sqrt)
        else:
            self.flat[self.n_zo:] -= np.float32(lr) * self.grad
        self.grad[:] = 0.0

    def perturb(self, key: int, alpha: float) -> None:
        if key != self.z_key:
            for off, z in zrng.normal_chunks(key, 0, self.n_zo):
                self.z[off:off + z.size] = z
            self.z_key = key
        a = np.float32(alpha)
        for off in range(0, self.n_zo, zrng.CHUNK):   # in cache-sized pieces: no full-size temporary
            end = min(off + zrng.CHUNK, self.n_zo)
            p = self.flat[off:end]
            p += a * self.z[off:end]

    def evaluate(self, x, y) -> tuple[float, int]:
        logits, _ = self.forward(x, keep=False)
        losses, _ = softmax_ce(logits, y)
        return float(losses.astype(np.float64).sum()), int((logits.argmax(axis=1) == y).sum())

    def weights(self) -> np.ndarray:
        return self.flat.copy()

    def save(self) -> tuple:
        return [x.copy() for x in (self.flat, *self.moments)], self.adam_t

    def restore(self, saved: tuple) -> None:
        arrays, self.adam_t = saved
        for x, s in zip((self.flat, *self.moments), arrays):
            x[:] = s    # in place: the session's bound inputs are views of the flat buffer


if __name__ == "__main__":
    sys.exit(main(OrtEngine, ("numpy", "onnxruntime")))
