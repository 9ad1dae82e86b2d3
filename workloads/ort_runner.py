"""The ONNX Runtime runner: `python -m workloads.ort_runner --spec S --out R`.

Forward-only ZO training for a CPU board that has onnxruntime and numpy and
nothing else: this module imports neither torch nor the harness (tested).

- The parameters are one float32 numpy buffer in the models.py layout. The
  exported graph (harness/preparation/onnx_export.py, path in spec.onnx_model) takes the
  ZO part's tensors as inputs; each is bound once through IOBinding to a view
  of that buffer, so perturbing or updating the buffer in place is all a step
  does to the weights -- nothing is copied into the session.
- z is zobench-z, the same values as every other runtime. numpy cannot fuse
  generation into the update the way the C++ loop does, and generating z is
  the costliest part of a perturbation, so the runner draws z once per step
  into one n_zo scratch vector and applies it three times (+eps, -2 eps,
  eps - lr g). That scratch (4 bytes per ZO parameter) is a buffer this
  runner holds that the C++ binary does not; the other is the step's direction d
  of momentum and Adam with one query, which the binary folds into its restore
  (docs/zo-optimizers.md).
- ElasticZO's BP head runs forward and backward in numpy on the graph's output,
  keeping the activations of both perturbed passes as methods.py prescribes; its
  update is SGD, or Adam written once for numpy and torch (methods.adam_update).
  A layer model's head is its last FC layers, each followed by a ReLU where the
  description says so; a transformer's is its head unit alone (bp_layers = 1: the
  final norm and the LM or classification head): BP through its blocks would be
  attention's backward written again in numpy, which is the torch runtime's job.
  Either head ends in softmax cross-entropy, over every token of a language model.
- A language model's logits are made whole, whatever hyper.loss_chunk says (torch's setting):
  the graph ends at the logits, or at the head's input whose numpy head keeps each pass's
  softmax for backward; its models are the small ladder's (docs/transformers.md, "The loss in
  chunks").
"""
from __future__ import annotations

import os
import sys

import numpy as np

from . import methods, wait_policy, zrng
from .methods import Engine
from .models import Transformer
from .runner import main
from .spec import SpecError
from .support import no_forward_ad, ort_front_layers

EPS = 1e-5      # a transformer's norms' (transformer_torch.EPS)


def softmax_ce(logits: np.ndarray, y: np.ndarray) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    """Per-row cross-entropy losses of logits [rows, classes], and the softmax as e = exp(logits -
    row max), made in logits' own buffer, and the row sums s (softmax = e / s). In place: a
    language model's logits are the largest array of a step, and nothing reads them after."""
    picked = logits[np.arange(len(y)), y]
    m = logits.max(axis=1, keepdims=True)
    logits -= m
    np.exp(logits, out=logits)
    s = logits.sum(axis=1, keepdims=True)
    return (np.log(s) + m)[:, 0] - picked, logits, s


class Linear:
    """a @ w^T (+ b), then a ReLU where the description has one. Without a gradient w is read,
    not trained: a tied LM head is the token embedding, in the ZO part, so a kept pass keeps its
    own copy as perturbed then (the ZO update moves it before backward), as the torch engine does."""

    def __init__(self, w, b, gw, gb, relu: bool = False):
        self.w, self.b, self.gw, self.gb, self.relu = w, b, gw, gb, relu

    def forward(self, a: np.ndarray, keep: bool) -> tuple[np.ndarray, tuple]:
        w = self.w.copy() if keep and self.gw is None else self.w
        out = a @ w.T
        if self.b is not None:
            out += self.b
        if self.relu:
            np.maximum(out, 0, out=out)
        return out, (a, w, out if self.relu else None)

    def backward(self, d: np.ndarray, kept: tuple, propagate: bool) -> np.ndarray | None:
        a, w, out = kept
        if self.relu:       # out is the ReLU's: > 0 exactly where it passes the error
            d *= out > 0
        if self.gw is not None:
            self.gw += d.T @ a
        if self.gb is not None:
            self.gb += d.sum(axis=0)
        return d @ w if propagate else None


class Norm:
    """A transformer's final LayerNorm (weight and bias) or RMSNorm (weight), as
    transformer_torch's. It is the head's first piece (a transformer's BP part is its head
    unit), so its backward gives the gradients of its weights and no input gradient."""

    def __init__(self, w, b, gw, gb):
        self.w, self.b, self.gw, self.gb = w, b, gw, gb

    def forward(self, a: np.ndarray, keep: bool) -> tuple[np.ndarray, np.ndarray]:
        if self.b is None:
            n = a * (np.float32(1) / np.sqrt((a * a).mean(axis=-1, keepdims=True) + np.float32(EPS)))
        else:
            c = a - a.mean(axis=-1, keepdims=True)
            n = c / np.sqrt((c * c).mean(axis=-1, keepdims=True) + np.float32(EPS))
        out = n * self.w
        if self.b is not None:
            out += self.b
        return out, n

    def backward(self, d: np.ndarray, n: np.ndarray, propagate: bool) -> None:
        self.gw += (d * n).sum(axis=0)
        if self.gb is not None:
            self.gb += d.sum(axis=0)


class Head:
    """The BP head: pieces (Linear, Norm) on views into the flat buffer and its gradient, run on
    the graph's output with one row per sample or token, each with the same forward(a, keep) and
    backward(d, kept, propagate). A transformer's is its final norm, then its classification
    head or LM head. A tied language model's LM head is the token embedding, which is in the ZO
    part (unit 0): the head reads it and trains the final norm alone."""

    def __init__(self, model, first: int, views: dict, grads: dict):
        def linear(weight, bias, relu=False):
            return Linear(views[weight], views.get(bias), grads[weight], grads.get(bias), relu)

        if model.kind != Transformer.kind:
            self.pieces = [linear(f"{layer.name}.weight", f"{layer.name}.bias", layer.relu)
                           for layer in model.layers[first:]]
            return
        norm = Norm(views["ln_f.weight"], views.get("ln_f.bias"), grads["ln_f.weight"], grads.get("ln_f.bias"))
        if model.classes:
            self.pieces = [norm, linear("cls.weight", "cls.bias")]
        else:
            self.pieces = [norm, linear("wte" if model.tied else "lm_head.weight", None)]

    def forward(self, a: np.ndarray, keep: bool) -> tuple[np.ndarray, list]:
        """Logits, and what each piece keeps for backward."""
        kept = []
        for piece in self.pieces:
            a, k = piece.forward(a, keep)
            kept.append(k)
        return a, kept

    def backward(self, d: np.ndarray, kept: list) -> None:
        """Accumulate the head's gradients for dloss/dlogits = d."""
        for i in reversed(range(len(self.pieces))):
            d = self.pieces[i].backward(d, kept[i], i > 0)


class OrtEngine(Engine):
    def __init__(self, spec, model, init: np.ndarray):
        import onnxruntime as ort

        if spec.precision != "fp32":
            raise SpecError(f"precision: the ort runtime trains fp32 only, not {spec.precision}")
        first = ort_front_layers(model, spec.method, spec.bp_layers)
        if spec.hyper.zo_estimator == "forward-grad":
            raise SpecError(f"hyper.zo_estimator: {no_forward_ad('ort')}")
        if not spec.onnx_model:
            raise SpecError("onnx_model: the ort runtime needs the exported graph of the model's ZO front "
                            "(the harness writes it with harness/preparation/onnx_export.py)")
        self.model = model
        self.transformer = model.kind == Transformer.kind
        self.gaussian = spec.hyper.zo_distribution == "gaussian"
        self.flat = np.array(init, dtype=np.float32)
        self.n_zo = model.split(spec.method, spec.bp_layers)
        self.n_bp = model.params_total - self.n_zo
        tensors = model.offsets()
        self.views = {name: self.flat[o:o + int(np.prod(s))].reshape(s) for name, o, s in tensors}
        self.grad = np.zeros(self.n_bp, dtype=np.float32)
        grads = {name: self.grad[o - self.n_zo:o - self.n_zo + int(np.prod(s))].reshape(s) if o >= self.n_zo else None
                 for name, o, s in tensors}
        self.head = Head(model, first, self.views, grads) if self.n_bp else None
        self.hyper = spec.hyper
        self.adam = spec.hyper.optimizer == "adam" and self.n_bp > 0
        # Adam's moments over the head and its update count (methods.adam_update): with the
        # parameters, all that outlives a step
        self.moments = [np.zeros(self.n_bp, dtype=np.float32) for _ in range(2)] if self.adam else []
        self.adam_t = 0

        opts = ort.SessionOptions()
        opts.intra_op_num_threads = spec.threads      # 0 = ONNX Runtime's default: all cores
        opts.inter_op_num_threads = 1
        spin = wait_policy.spinning()       # the target's policy, or auto's pick (workloads/wait_policy.py)
        opts.add_session_config_entry("session.intra_op.allow_spinning", "1" if spin else "0")
        self.thread_pool = {"team": spec.threads or os.cpu_count() or 1, "wait": "spin" if spin else "passive"}
        try:
            self.session = ort.InferenceSession(spec.onnx_model, opts, providers=["CPUExecutionProvider"])
        except Exception as e:
            raise SpecError(f"onnx_model: ONNX Runtime cannot load {spec.onnx_model}: {e}") from None
        zo = [name for name, o, _ in tensors if o < self.n_zo]
        have = {i.name for i in self.session.get_inputs()}
        if have != {"x", *zo}:
            raise SpecError(f"onnx_model: {spec.onnx_model} is not {model.name}'s front of {first} "
                            f"{'units' if self.transformer else 'layers'} (its inputs are {sorted(have)})")
        self.binding = self.session.io_binding()
        self._bound = []   # the OrtValues share the numpy buffers; keep them alive
        for name in zo:
            value = ort.OrtValue.ortvalue_from_numpy(self.views[name])
            self.binding.bind_ortvalue_input(name, value)
            self._bound.append(value)
        self._ort = ort
        # the graph's output: the logits, or the input of the head's first piece; one row per
        # token of a language model, per sample otherwise
        self.x_type = np.int32 if self.transformer else np.float32
        self.per_token = self.transformer and not model.classes
        if self.transformer:
            self.front_features = model.width if self.n_bp else model.classes or model.vocab
        else:
            self.front_features = model.classes if first == len(model.layers) else model.layers[first].weight_shape[1]
        self._outputs = {}
        self.z = np.empty(self.n_zo, dtype=np.float32)
        self.z_key = None
        # the ZO parts' state (methods.zo_state): sparsity, momentum's or Adam's moments over the
        # ZO part with Adam's count, and the step's direction d when a rule keeps state
        methods.zo_state(self, spec, model, lambda n: np.zeros(n, dtype=np.float32), 0)
        self.sqrt = np.sqrt
        self.kept = []

    def load_batch(self, x, y):
        """Images or clouds as float32, token ids as int32 (the graph's input), labels or next
        tokens as int64."""
        return np.ascontiguousarray(x, dtype=self.x_type), np.asarray(y, dtype=np.int64)

    def _front(self, x: np.ndarray) -> np.ndarray:
        """The graph's output for x, in a buffer bound once per batch shape."""
        shape = (x.size if self.per_token else len(x), self.front_features)
        if shape not in self._outputs:
            out = np.empty(shape, dtype=np.float32)
            self._outputs[shape] = (out, self._ort.OrtValue.ortvalue_from_numpy(out))
        out, value = self._outputs[shape]
        self.binding.bind_ortvalue_output("front", value)
        self.binding.bind_cpu_input("x", x)
        self.session.run_with_iobinding(self.binding)
        return out

    def forward(self, x, keep: bool):
        """Logits [rows, classes] (a row per sample, or per token of a language model), and what
        the head keeps for backward (None unless keep)."""
        a = self._front(x)
        if self.head is None:
            return a, None
        if keep:    # the bound output buffer is overwritten by the next pass; BP needs this one's
            a = a.copy()
        logits, kept = self.head.forward(a, keep)
        return logits, kept if keep else None

    def loss(self, out, y) -> float:
        logits, kept = out
        y = y.reshape(-1)
        losses, e, s = softmax_ce(logits, y)
        if kept is not None:
            self.kept.append((e, s, y, kept))
        return float(losses.astype(np.float64).mean())

    def backward(self) -> None:
        """BP through the mean of the kept losses: d(mean_k mean_rows l)/dlogits = (e / s - onehot) / (rows k),
        formed in the pass's own e."""
        for e, s, y, kept in self.kept:
            n = np.float32(len(y) * len(self.kept))
            e *= np.float32(1) / (s * n)
            e[np.arange(len(y)), y] -= np.float32(1) / n
            self.head.backward(e, kept)
        self.kept.clear()

    def bp_update(self, lr: float) -> None:
        if self.adam:
            self.adam_t += 1
            methods.adam_update(self.flat[self.n_zo:], self.grad, *self.moments, lr, self.adam_t, self.hyper, np.sqrt)
        else:
            self.flat[self.n_zo:] -= np.float32(lr) * self.grad
        self.grad[:] = 0.0

    def _z(self, key: int) -> np.ndarray:
        """z(key) over the step's ranges, times its mask: drawn once per key into the scratch."""
        if key != self.z_key:
            for lo, hi in self.ranges or [(0, self.n_zo)]:
                for off, z in zrng.normal_chunks(key, lo, hi - lo, self.gaussian):
                    self.z[lo + off:lo + off + z.size] = z
            if self.mask is not None:
                self.z *= self.mask
            self.z_key = key
        return self.z

    def _pieces(self):
        """The step's ranges in cache-sized pieces: no full-size temporary."""
        for lo, hi in self.ranges or [(0, self.n_zo)]:
            for off in range(lo, hi, zrng.CHUNK):
                yield off, min(off + zrng.CHUNK, hi)

    def perturb(self, key: int, alpha: float) -> None:
        z, a = self._z(key), np.float32(alpha)
        for lo, hi in self._pieces():
            p = self.flat[lo:hi]
            p += a * z[lo:hi]

    def set_sparsity(self, ranges=None, mask=None) -> None:
        self.ranges, self.mask, self.z_key = ranges, mask, None

    def zo_direction(self, keys, coefs) -> np.ndarray:
        self.d[:] = 0
        for k, c in zip(keys, coefs):
            z, a = self._z(k), np.float32(c)
            for lo, hi in self._pieces():
                d = self.d[lo:hi]
                d += a * z[lo:hi]
        return self.d

    def zo_params(self) -> np.ndarray:
        return self.flat[:self.n_zo]

    def evaluate(self, x, y) -> tuple[float, float]:
        """(the sum over samples of each one's mean loss, the sum of each one's fraction predicted
        right): a language model's sample is a sequence of tokens, another model's one label."""
        logits, _ = self.forward(x, keep=False)
        right = logits.argmax(axis=1) == y.reshape(-1)
        losses = softmax_ce(logits, y.reshape(-1))[0]
        per_sample = (v.astype(np.float64).reshape(len(y), -1).mean(axis=1).sum() for v in (losses, right))
        return tuple(map(float, per_sample))

    def weights(self) -> np.ndarray:
        return self.flat.copy()

    def save(self) -> tuple:
        return [x.copy() for x in (self.flat, *self.moments, *self.zo_moments)], self.adam_t, self.zo_t

    def restore(self, saved: tuple) -> None:
        arrays, self.adam_t, self.zo_t = saved
        for x, s in zip((self.flat, *self.moments, *self.zo_moments), arrays):
            x[:] = s    # in place: the session's bound inputs are views of the flat buffer


if __name__ == "__main__":
    sys.exit(main(OrtEngine, ("numpy", "onnxruntime")))
