"""The PyTorch runner: `python -m workloads.torch_runner --spec S --out R`.

The parameters live in one contiguous float32 tensor (the layout of
models.py); each weight and bias is a view into it, so a ZO perturbation is
an in-place add over a prefix of that buffer and the BP part's SGD or Adam
step writes straight into it. What the network computes on those views is a
per-kind object (LayerNet here, transformer_torch.TransformerNet): it runs
units lo..hi of the model (a layer, or a transformer's embeddings, blocks and
head) and knows its task's loss; the engine, and so every method, is the
same for both kinds.
"""
from __future__ import annotations

import math
import sys

import numpy as np
import torch
import torch.nn.functional as F

from . import methods, wait_policy, zrng, zrng_torch
from .clock import EventClock, cuda_event
from .methods import Engine
from .models import Transformer
from .runner import main
from .spec import SpecError
from .transformer_torch import TransformerNet

HALF = {"bf16": torch.bfloat16, "fp16": torch.float16}     # vocab.HALF's dtypes


class LayerNet:
    """models.Model's forward on the engine's views: a unit is a layer (with its ReLU and pool),
    the task classification."""

    def __init__(self, model, views):
        self.model, self.views = model, views
        self.units = len(model.layers)
        self.inputs = views[0].dtype

    def run(self, x, lo: int, hi: int):
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

    def loss(self, out, y):
        return F.cross_entropy(out, y)

    def evaluate(self, out, y) -> tuple[float, int]:
        return F.cross_entropy(out, y, reduction="sum").item(), int((out.argmax(1) == y).sum().item())


class TorchEngine(Engine):
    def __init__(self, spec, model, init: np.ndarray, z_on_device: bool = False, graphed: bool = True):
        """z_on_device: on the CPU, draw zobench-z with zrng_torch's torch ops (what a GPU without
        Triton runs, fused_perturb) instead of numpy, ~1.2x faster here; the same bits either way.
        A GPU always perturbs with fused_perturb (_add_z).
        graphed: on a GPU, replay each step as a CUDA graph (GraphStep)."""
        self.device = torch.device(spec.device)
        self.cuda = self.device.type == "cuda"
        g = self.gaussian = spec.hyper.zo_distribution == "gaussian"
        # Gaussian z's table, where z is drawn (the memory model's "zo" part counts it)
        self.z_table = None if not g else zrng_torch.gauss_table(self.device) \
            if z_on_device or self.device.type == "cuda" else zrng.gauss_table()
        self.z_chunks = (lambda key, lo, n: zrng_torch.normal_chunks(key, lo, n, self.device, g)) if z_on_device else \
            (lambda key, lo, n: ((off, torch.from_numpy(z)) for off, z in zrng.normal_chunks(key, lo, n, g)))
        # float64 init -> float64 engine (tests); a half precision's weights in its dtype, rounded once.
        # init may be a tensor on the device already (benchmarks/gpu_scale.py: a 7B model's weights
        # drawn there), which becomes the buffer itself where its type is the job's
        init = init if isinstance(init, torch.Tensor) else torch.from_numpy(init.copy())
        self.flat = init.to(self.device, HALF.get(spec.precision))
        self.half = spec.precision in HALF
        # what outlives a step besides the weights (optimizer state, the rates and alpha a CUDA
        # graph reads) stays FP32 in half precision: Adam's v = g^2 underflows fp16, and a rate
        # rounded to bf16 keeps 3 digits
        self.state_dtype = torch.float32 if self.half else self.flat.dtype
        # the BP part: full-bp trains every unit, elastic-zo the last bp_layers, full-zo none
        self.first_bp = model.first_bp_layer(spec.method, spec.bp_layers)
        self.n_zo = model.split(spec.method, spec.bp_layers)
        self.n_bp = model.params_total - self.n_zo
        # fp16's BP gradients underflow without a loss scale (bf16 has FP32's range)
        self.scaler = LossScale(self.device) if self.flat.dtype == torch.float16 and self.n_bp else None
        views = [self._alias(o, s) for _, o, s in model.offsets()]
        self.model = model
        self.loss_chunk = spec.hyper.loss_chunk
        self.net = self._net(views, spec.hyper.checkpointing)
        bp = [(o, p) for (_, o, _), p in zip(model.offsets(), views) if o >= self.n_zo]
        self.bp_params = [p for _, p in bp]
        for p in self.bp_params:
            p.requires_grad_(True)
        self.hyper = spec.hyper
        # Adam's moments, one contiguous buffer each over the BP part, viewed per parameter as
        # its gradients are, and its update count (bp_update)
        self.adam = spec.hyper.optimizer == "adam" and self.n_bp > 0
        self.state = [self.flat]    # all that outlives a step: what save() keeps
        if self.scaler is not None:
            self.state += [self.scaler.scale, self.scaler.growth, self.scaler.skipped]
        if self.adam:
            moments = [torch.zeros(self.n_bp, dtype=self.state_dtype, device=self.device) for _ in range(2)]
            self.moment_views = [[buf[o - self.n_zo:o - self.n_zo + p.numel()].view(p.shape) for o, p in bp]
                                 for buf in moments]
            self.adam_t = torch.zeros((), dtype=torch.float64, device=self.device)
            self.state += [*moments, self.adam_t]
        # the ZO parts' state (methods.zo_state): sparsity, and momentum's or Adam's moments over
        # the ZO part with Adam's count; d is the step's direction when a rule keeps state
        methods.zo_state(self, spec, model, lambda n: torch.zeros(n, dtype=self.flat.dtype, device=self.device),
                         torch.zeros((), dtype=torch.float64, device=self.device))
        self.state += self.zo_moments + ([self.zo_t] if len(self.zo_moments) == 2 else [])
        self.sqrt = torch.sqrt
        self.kept = []
        if self.cuda:
            self.sync = torch.cuda.synchronize
            # the step's key and perturbation scale as device scalars: the perturbation kernel
            # reads them there, so a CUDA graph replays it with each step's values
            self.key = zrng_torch.device_key(self.n_zo, self.device)
            # a q-query step's keys (zrng.zo_keys), the first of them self.key
            self.keys = [self.key] + [torch.zeros_like(self.key) for _ in range(spec.hyper.zo_queries - 1)]
            self.alpha = torch.zeros((), dtype=self.state_dtype, device=self.device)
            self.one = torch.ones((), dtype=self.flat.dtype, device=self.device)
            self.fused_perturb = fused_perturb()
            # a CUDA graph replays fixed ranges: a sparse step's change, and forward-grad's jvp
            # builds its own views; those steps run eagerly
            if graphed and self.sparsity is None and spec.hyper.zo_estimator != "forward-grad":
                self.run_step = GraphStep(self)

    def _net(self, views, checkpointing: bool = False):
        return TransformerNet(self.model, views, checkpointing, self.loss_chunk) if self.model.kind == Transformer.kind \
            else LayerNet(self.model, views)

    def _alias(self, offset: int, shape: tuple):
        """A tensor over flat[offset:...] with its own version counter: plain views share
        flat's, so the in-place ZO perturbation of the prefix would invalidate the saved
        tensors of the BP head, which it never touches."""
        return torch.empty(0, dtype=self.flat.dtype, device=self.device).set_(
            self.flat.untyped_storage(), offset, shape)

    @property
    def inputs(self):
        """The type a batch's x is computed in: the parameters', or token ids."""
        return self.net.inputs

    def load_batch(self, x, y):
        """Images or clouds in the parameters' type, token ids and labels as int64 (the data sets
        hold a language model's next tokens as int32)."""
        return (torch.from_numpy(x).to(self.device, self.net.inputs, non_blocking=True),
                torch.from_numpy(y).to(self.device, torch.long, non_blocking=True))

    def forward(self, x, keep: bool):
        units = self.net.units
        if not keep:
            with torch.no_grad():
                return self.net.run(x, 0, units)
        with torch.no_grad():   # the ZO front keeps nothing: its activations are freed as it goes
            h = self.net.run(x, 0, self.first_bp)
        return self.net.run(h, self.first_bp, units)

    def loss(self, out, y):
        """The mean loss: a float on the CPU; on a GPU a float64 device scalar, so the projected
        gradient is formed on the device and the step never waits for the host."""
        loss = self.net.loss(out, y)
        if out.requires_grad:
            self.kept.append(loss)
        return loss.detach().double() if self.cuda else loss.item()

    def backward(self) -> None:
        loss = sum(self.kept) / len(self.kept)
        (loss if self.scaler is None else loss * self.scaler.scale).backward()
        self.kept.clear()

    def bp_update(self, lr) -> None:
        """SGD or Adam on the BP part; lr a float, or a device scalar in a CUDA graph. Adam's
        update count is a device scalar incremented in place, and the bias corrections are
        computed from it on the device (as torch.optim's capturable Adam does): a captured CUDA
        graph then replays each step with its own t, so adam jobs run graphed like sgd ones,
        rather than eagerly, which would cost a GPU step its launch overheads. A tensor the task
        does not read (a classifier's LM head) has no gradient, and keeps its value and moments,
        as torch.optim leaves them."""
        with torch.no_grad():
            if self.scaler is not None:
                lr = self.scaler.unscale([p.grad for p in self.bp_params if p.grad is not None], lr)
            if self.adam:
                self.adam_t += 1
                for p, m, v in zip(self.bp_params, *self.moment_views):
                    if p.grad is not None:
                        methods.adam_update(p, p.grad.to(m.dtype), m, v, lr, self.adam_t, self.hyper, torch.sqrt)
                        p.grad = None
                return
            for p in self.bp_params:
                if p.grad is None:
                    continue
                if isinstance(lr, torch.Tensor):
                    p.sub_(p.grad * lr)
                else:
                    p.add_(p.grad, alpha=-lr)
                p.grad = None

    @torch.no_grad()
    def perturb(self, key, alpha) -> None:
        """theta[:n_zo] += alpha z(key), over the step's ranges and mask (set_sparsity)."""
        self._add_z(self.flat, key, alpha)

    def _add_z(self, target, key, alpha) -> None:
        """target[:n_zo] += alpha z(key). On a GPU the fused kernel, with the key and alpha as
        device scalars (alpha may already be one: eps - lr g, never read on the host): one pass
        over the prefix, or over each of a sparse step's ranges; a masked step's z is drawn by
        it a chunk at a time (the chunks the CPU draws too) and multiplied by the mask."""
        if self.cuda:
            if not isinstance(key, torch.Tensor):
                key = zrng_torch.set_key(self.key, key)
            if not isinstance(alpha, torch.Tensor):
                alpha = self.alpha.fill_(alpha)
            if self.mask is None:
                for lo, hi in self.ranges or [(0, self.n_zo)]:
                    self.fused_perturb(target[lo:hi], key, alpha, lo, self.gaussian)
                return
            chunk = zrng_torch.CHUNKS["cuda"]
            for lo in range(0, self.n_zo, chunk):
                z = torch.zeros(min(chunk, self.n_zo - lo), dtype=target.dtype, device=self.device)
                self.fused_perturb(z, key, self.one, lo, self.gaussian)
                target[lo:lo + len(z)].add_(z.mul_(self.mask[lo:lo + len(z)]).mul_(alpha))
            return
        for lo, hi in self.ranges or [(0, self.n_zo)]:
            for off, z in self.z_chunks(key, lo, hi - lo):
                a, b = lo + off, lo + off + len(z)
                if self.mask is not None:
                    z = z * self.mask[a:b]
                z = zrng_torch.as_added(z, target.dtype)
                if isinstance(alpha, torch.Tensor):
                    target[a:b].add_(z.mul_(alpha))
                else:
                    target[a:b].add_(z, alpha=alpha)
                del z       # not alive beside the next chunk while that one is drawn: one chunk at a time

    def set_sparsity(self, ranges=None, mask=None) -> None:
        self.ranges = ranges
        self.mask = None if mask is None else torch.from_numpy(mask).to(self.device)

    @torch.no_grad()
    def zo_direction(self, keys, coefs):
        self.d.zero_()
        for k, c in zip(keys, coefs):
            self._add_z(self.d, k, c)
        return self.d

    def zo_params(self):
        return self.flat[:self.n_zo]

    def jvp(self, x, y, key):
        """(L(θ), ∇L(θ)·z) at once by forward-mode AD (torch.func.jvp), z(key) as touched by
        perturb: the network runs on views of the ZO part as the function's input, the BP part's
        weights as constants. Costs the tangent (n_zo values) and a dual value per activation."""
        tangent = torch.zeros(self.n_zo, dtype=self.flat.dtype, device=self.device)
        self._add_z(tangent, key, 1.0)
        shapes = self.model.offsets()

        def loss(front):
            views = [(front if o < self.n_zo else self.flat.detach())[o:o + math.prod(s)].view(s)
                     for _, o, s in shapes]
            return self.net.loss(self._net(views).run(x, 0, self.net.units), y)

        value, g = torch.func.jvp(loss, (self.flat[:self.n_zo].detach(),), (tangent,))
        return (value.detach().double(), g.double()) if self.cuda else (value.item(), g.item())

    @torch.no_grad()
    def evaluate(self, x, y) -> tuple[float, float]:
        return self.net.evaluate(self.net.run(x, 0, self.net.units), y)

    def weights(self) -> np.ndarray:
        """Float32 in half precision (exactly the half values), else the engine's own type."""
        return self.flat.detach().to(self.state_dtype if self.half else self.flat.dtype).cpu().numpy().copy()

    def save(self):
        return [x.detach().clone() for x in self.state]

    def restore(self, saved) -> None:
        """In place: a captured CUDA graph reads and writes these very buffers."""
        with torch.no_grad():
            for x, s in zip(self.state, saved):
                x.copy_(s)


class LossScale:
    """fp16's dynamic loss scale, as torch.amp.GradScaler's (and with its kernels): the loss is
    multiplied by the scale before backward; the update checks the gradients for inf and NaN and
    unscales them in place, halves the scale and skips the step (its rate made 0, its gradients
    zeroed) when one is found, and doubles it after GROWTH good steps. All on the device, with no
    host sync, so a CUDA graph replays it; a skipped Adam step still decays Adam's moments."""
    INIT, GROWTH = 2.0 ** 16, 2000

    def __init__(self, device):
        self.scale = torch.full((), self.INIT, dtype=torch.float32, device=device)
        self.growth = torch.zeros((), dtype=torch.int32, device=device)
        self.found = torch.zeros((), dtype=torch.float32, device=device)
        self.skipped = torch.zeros((), dtype=torch.int64, device=device)    # steps skipped so far

    def unscale(self, grads: list, lr):
        """The gradients unscaled (zeros when one is not finite) and the step's rate (0 then)."""
        self.found.zero_()
        torch._amp_foreach_non_finite_check_and_unscale_(grads, self.found, self.scale.reciprocal())
        bad = self.found > 0
        for g in grads:
            g.masked_fill_(bad, 0)
        self.skipped += bad
        keep = 1 - self.found
        torch._amp_update_scale_(self.scale, self.growth, self.found, 2.0, 0.5, self.GROWTH)
        return keep * lr


def fused_perturb():
    """The GPU's perturbation: one Triton kernel where Triton is installed, else the same z from
    torch ops (zrng_torch), unfused."""
    try:
        from . import zrng_triton
        return zrng_triton.perturb_
    except ImportError:
        return zrng_torch.perturb_


class GraphStep:
    """A GPU's optimizer step as a CUDA graph: the first EAGER steps run eagerly on a side stream
    (kernels loaded, cuDNN's choices made, the fused perturbation compiled), the next two are
    captured, each into its own graph over one memory pool, and every step after replays them
    in turn, with the batch, key and rates copied into their static inputs. methods.step is what
    is captured: the algorithm stays written once. The phases are CUDA events captured in the
    graphs, read by the EventClock after the replay; one graph more than the steps the clock
    reads behind (EventClock.LAG), so that it reads a step's events while the next step runs (a
    replay records its graph's events again): the host never waits for the step it has just
    queued."""
    EAGER = 3
    GRAPHS = EventClock.LAG + 1

    def __init__(self, engine: "TorchEngine"):
        self.graphs, self.outs, self.laps, self.calls = [], [], [], 0
        self.stream = torch.cuda.Stream(engine.device)
        dev, dt = engine.device, engine.state_dtype
        self.lr_zo, self.lr_bp = (torch.zeros((), dtype=dt, device=dev) for _ in range(2))
        self.x = self.y = self.rates = None

    @property
    def graph(self):
        """The first graph (benchmarks replay it alone, back to back: the step's limit)."""
        return self.graphs[0] if self.graphs else None

    def __call__(self, engine, spec, x, y, t, epoch, lr_zo, lr_bp, clock) -> dict:
        if not self.graphs and self.calls < self.EAGER:
            self.calls += 1
            return self._on_side_stream(lambda: methods.step(engine, spec, x, y, t, epoch, lr_zo, lr_bp, clock))
        for device_key, key in zip(engine.keys, zrng.zo_keys(spec.seed, t, spec.hyper.zo_queries)):
            zrng_torch.set_key(device_key, key)
        if self.rates != (lr_zo, lr_bp):     # they change once an epoch at most
            self.rates = (lr_zo, lr_bp)
            self.lr_zo.fill_(lr_zo)
            self.lr_bp.fill_(lr_bp)
        if len(self.graphs) < self.GRAPHS:
            if self.x is None:
                self.x, self.y = x.clone(), y.clone()
            graph, laps = torch.cuda.CUDAGraph(), _Laps()
            with torch.cuda.graph(graph, stream=self.stream, pool=self.graphs[0].pool() if self.graphs else None):
                self.outs.append(methods.step(engine, spec, self.x, self.y, t, epoch, self.lr_zo, self.lr_bp,
                                              laps, key=engine.keys))
            self.graphs.append(graph)
            self.laps.append(laps.laps)
        i = (self.calls - self.EAGER) % self.GRAPHS
        self.calls += 1
        self.x.copy_(x)
        self.y.copy_(y)
        clock.lap("data", call=False)    # the copies into the graph's inputs are the batch's too
        self.graphs[i].replay()
        clock.replayed(self.laps[i])
        return self.outs[i]

    def _on_side_stream(self, fn):
        self.stream.wait_stream(torch.cuda.current_stream())
        with torch.cuda.stream(self.stream):
            out = fn()
        torch.cuda.current_stream().wait_stream(self.stream)
        return out


class _Laps:
    """The clock a step is captured with: each lap becomes an event node of the graph."""

    def __init__(self):
        self.laps = []

    def lap(self, phase: str, call: bool = True) -> None:
        ev = cuda_event()
        ev.record()
        self.laps.append((phase, ev))


def cap_device_memory(device, limit: int) -> None:
    """The job's tensors may take `limit` bytes of the GPU (its caching allocator's share of the
    device, which raises torch.OutOfMemoryError beyond it; runner.main ends the job oom). A
    device named without its index ("cuda") is the current one: torch's setter wants the index."""
    device = torch.device(device)
    if device.index is None:
        device = torch.device("cuda", torch.cuda.current_device())
    total = torch.cuda.get_device_properties(device).total_memory
    if limit > total:
        raise SpecError(f"device_mem_limit: {limit / 2**30:.1f} GiB is more than "
                        f"{torch.cuda.get_device_name(device)}'s {total / 2**30:.1f} GiB")
    torch.cuda.set_per_process_memory_fraction(limit / total, device)


def check_half(device, precision: str) -> None:
    """SpecError, with the reason, where this device cannot train the half precision: a GPU
    before compute capability 8.0 has no bf16 arithmetic, and a CPU's torch may lack a kernel
    (tried on a tiny forward and backward of the ops a transformer runs)."""
    dtype = HALF[precision]
    where = f"this {device.type}"
    if device.type == "cuda":
        where = torch.cuda.get_device_name(device)
        if dtype == torch.bfloat16 and not torch.cuda.is_bf16_supported(including_emulation=False):
            raise SpecError(f"precision bf16: {where} has no bf16 arithmetic (compute capability 8.0 or "
                            "later has); train fp16 or fp32 there")
    try:
        x = torch.ones(2, 4, 8, dtype=dtype, device=device, requires_grad=True)
        h = F.layer_norm(F.gelu(F.linear(x, torch.ones(8, 8, dtype=dtype, device=device)), approximate="tanh"), (8,))
        F.cross_entropy(torch.softmax(h @ h.transpose(1, 2), -1).flatten(0, 1).float(),
                        torch.zeros(8, dtype=torch.long, device=device)).backward()
    except RuntimeError as e:
        raise SpecError(f"precision {precision}: torch {torch.__version__} cannot train {precision} on {where}: "
                        f"{str(e).splitlines()[0]}") from None


def make_engine(spec, model, init):
    """The engine for spec's precision from its init (runner.initial_weights)."""
    cuda = torch.device(spec.device).type == "cuda"
    if cuda and not torch.cuda.is_available():
        raise SpecError(f"device: CUDA not available on {spec.target or 'this machine'}: torch {torch.__version__}")
    if spec.threads:
        torch.set_num_threads(spec.threads)
    if cuda and spec.device_mem_limit:
        cap_device_memory(torch.device(spec.device), spec.device_mem_limit)
    pool = {"team": torch.get_num_threads(), "wait": wait_policy.libgomp_wait()}   # env.threads
    if cuda:
        # FP32 is FP32: TF32 (cuDNN's default for convolutions) keeps 10 bits of mantissa, which
        # a ZO step's loss difference over 2 eps would have to survive (docs/runners.md)
        torch.backends.cudnn.allow_tf32 = False
        torch.backends.cuda.matmul.allow_tf32 = False
    if spec.precision in HALF:
        check_half(torch.device(spec.device), spec.precision)
    if spec.precision == "int8":
        from .int8 import Int8Engine
        if cuda:
            # exact integer sums need plain float products: cuDNN may pick Winograd or FFT
            # convolutions, which are not exact (docs/int8.md)
            torch.backends.cudnn.enabled = False
        engine = Int8Engine(spec, model, init)
    else:
        engine = TorchEngine(spec, model, init)
    engine.thread_pool = pool
    return engine


if __name__ == "__main__":
    sys.exit(main(make_engine, ("numpy", "torch")))
