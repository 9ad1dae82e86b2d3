"""The PyTorch runner: `python -m workloads.torch_runner --spec S --out R`.

The parameters live in one contiguous float32 tensor (the layout of
models.py); each layer's weight and bias are views into it, so a ZO
perturbation is an in-place add over a prefix of that buffer and the BP
head's SGD step writes straight into it. Layers run as torch.nn.functional
calls on those views.
"""
from __future__ import annotations

import sys

import numpy as np
import torch
import torch.nn.functional as F

from . import zrng, zrng_torch
from .methods import Engine
from .runner import main
from .spec import SpecError


class TorchEngine(Engine):
    def __init__(self, spec, model, init: np.ndarray, z_on_device: bool | None = None):
        """z_on_device: draw zobench-z with torch ops where the weights are (zrng_torch) rather
        than with numpy on the host; the same bits either way. Default: on a GPU, where it saves
        a host-to-device copy per chunk; on the CPU numpy is ~1.2x faster at it."""
        self.device = torch.device(spec.device)
        on_device = self.device.type != "cpu" if z_on_device is None else z_on_device
        self.z_chunks = (lambda key, n: zrng_torch.normal_chunks(key, 0, n, self.device)) if on_device else \
            (lambda key, n: ((off, torch.from_numpy(z)) for off, z in zrng.normal_chunks(key, 0, n)))
        self.model = model
        self.flat = torch.from_numpy(init.copy()).to(self.device)   # float64 init -> float64 engine (tests)
        # the BP part: full-bp trains every layer, elastic-zo the last bp_layers, full-zo none
        self.first_bp = model.first_bp_layer(spec.method, spec.bp_layers)
        self.n_zo = model.split(spec.method, spec.bp_layers)
        self.n_bp = model.params_total - self.n_zo
        self.views = [self._alias(o, s) for _, o, s in model.offsets()]
        self.bp_params = self.views[2 * self.first_bp:] if self.n_bp else []
        for p in self.bp_params:
            p.requires_grad_(True)
        self.kept = []
        self.sync = torch.cuda.synchronize if self.device.type == "cuda" else None

    def _alias(self, offset: int, shape: tuple):
        """A tensor over flat[offset:...] with its own version counter: plain views share
        flat's, so the in-place ZO perturbation of the prefix would invalidate the saved
        tensors of the BP head, which it never touches."""
        return torch.empty(0, dtype=self.flat.dtype, device=self.device).set_(
            self.flat.untyped_storage(), offset, shape)

    def load_batch(self, x, y):
        return (torch.from_numpy(x).to(self.device, self.flat.dtype, non_blocking=True),
                torch.from_numpy(y).to(self.device, non_blocking=True))

    def _layers(self, x, lo: int, hi: int):
        """Layers lo..hi-1 of the description: the layer, then its ReLU, then its pool."""
        for i in range(lo, hi):
            layer = self.model.layers[i]
            w, b = self.views[2 * i], self.views[2 * i + 1]
            if layer.kind == "conv2d":
                x = F.conv2d(x, w, b, padding=layer.padding)
            else:   # fc flattens its input; pointwise is the same product on every point of [B, N, C]
                x = F.linear(x.flatten(1) if layer.kind == "fc" else x, w, b)
            if layer.relu:
                x = F.relu(x)
            if layer.pool == "max2x2":
                x = F.max_pool2d(x, 2)
            elif layer.pool == "global-max":
                x = x.amax(dim=1)
        return x

    def forward(self, x, keep: bool):
        if not keep:
            with torch.no_grad():
                return self._layers(x, 0, len(self.model.layers))
        with torch.no_grad():   # the ZO front keeps nothing: its activations are freed as it goes
            h = self._layers(x, 0, self.first_bp)
        return self._layers(h, self.first_bp, len(self.model.layers))

    def loss(self, out, y) -> float:
        loss = F.cross_entropy(out, y)
        if out.requires_grad:
            self.kept.append(loss)
        return loss.item()

    def backward(self) -> None:
        (sum(self.kept) / len(self.kept)).backward()
        self.kept.clear()

    def bp_update(self, lr: float) -> None:
        with torch.no_grad():
            for p in self.bp_params:
                p.add_(p.grad, alpha=-lr)
                p.grad = None

    @torch.no_grad()
    def perturb(self, key: int, alpha: float) -> None:
        for off, z in self.z_chunks(key, self.n_zo):
            self.flat[off:off + len(z)].add_(z.to(self.device), alpha=alpha)

    @torch.no_grad()
    def evaluate(self, x, y) -> tuple[float, int]:
        out = self._layers(x, 0, len(self.model.layers))
        return (F.cross_entropy(out, y, reduction="sum").item(),
                int((out.argmax(1) == y).sum().item()))

    def weights(self) -> np.ndarray:
        return self.flat.detach().cpu().numpy().copy()

    def device_peak_bytes(self):
        return torch.cuda.max_memory_allocated(self.device) if self.device.type == "cuda" else None


def make_engine(spec, model, init: np.ndarray | None):
    """The engine for spec's precision; init is the float init (None for int8, which draws its own)."""
    if torch.device(spec.device).type == "cuda" and not torch.cuda.is_available():
        raise SpecError(f"device: CUDA not available on {spec.target or 'this machine'}: torch {torch.__version__}")
    if spec.threads:
        torch.set_num_threads(spec.threads)
    if spec.precision == "int8":
        from .int8 import Int8Engine
        return Int8Engine(spec, model)
    return TorchEngine(spec, model, init)


if __name__ == "__main__":
    sys.exit(main(make_engine, ("numpy", "torch")))
