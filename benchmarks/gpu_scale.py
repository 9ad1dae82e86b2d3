"""Katti et al. at real size on one GPU, as one run that fits a lent GPU's minutes
(docs/transformers.md, "At real size"; issues 32 and 45).

    python benchmarks/gpu_scale.py [--out DIR] [--budget S] [--doc]   # on a GPU
    python benchmarks/gpu_scale.py --dry-run [--out DIR]              # the same plan on this CPU, tiny shapes

The parts, the most important first. Each is written to DIR/gpu_scale.json as it ends, with the
tables (gpu_scale.md) and Katti's Fig. 3 (fig3.png) drawn from that JSON, so a run that is cut
off (--budget seconds, a kill, the device's time running out) still leaves what finished:
1. memory: the memory model's predicted peak (Breakdown.peak_bytes: the weights, optimizer state
   and inputs, and the step's largest moment) against what the step's tensors took at their
   most (torch.cuda.max_memory_allocated from before the weights were made), and NVML's used
   memory, which adds the CUDA context (measured alone first) and the allocator's reserve: the
   ladder from GPT-2 small to the Llama-2-7B shape, B = 8, T = 512, bf16, Full BP (SGD, Adam,
   checkpointing), MeZO and ElasticZO k=1; GPT-2 small and medium in FP32 too. Target: within 5%
   where the configuration fits.
2. (run sixth) fit: the largest model of that ladder (13B too) each method trains within 16, 24 and 80 GB
   at B = 8, T = 512: the model's prediction picks where to start, runs under a device-memory
   cap of the budget (the runner's: torch_runner.cap_device_memory) confirm it (harness/search/
   fit.search's walk), and the MeZO / BP ratio of parameters stands beside Katti's Fig. 4
   (GPT-2 medium for BP against Llama-2-7B for MeZO at about 17 GB).
3. lenet: LeNet-5's Full ZO step at batch 32 and 256 as a job runs it (loop.train, its clock's
   phases), the training set gathered on the host and on the device (workloads/device_data.py),
   against the limit, the captured graph replayed back to back. Target: within 1.5x.
4. hf: the transformer MeZO step (the runner's engine, one CUDA graph) against a MeZO loop on
   Hugging Face's GPT-2 (built from a config, random weights; Malladi et al.'s loop: torch.normal
   per parameter from a reseeded generator, each loss read on the host), GPT-2 small and medium,
   B = 8, T = 512, bf16: ms/step and peak memory. Target: 2x faster, no more memory.
5. profile: GPT-2 medium's MeZO step, ours and HF's, under torch's profiler: each kernel's time.
6. residuals: the allocator's history replayed to a step's peak, the live blocks by the line
   that made them (Llama-2-7B and GPT-2 small with checkpointing at T = 2,048 and 1,024, MeZO at 1,024).
7. fit, then contexts: part 1 at contexts 128 to 2048 (Fig. 3's sweep).

Weights are drawn on the device (a 7B model's init from numpy would take minutes): memory does
not depend on their values. --dry-run runs every part on the CPU with the small models and
budgets scaled down, peaks from the resident set (the live tensors' bytes at their most,
workloads/tensor_peak.py): it checks the plan, not the numbers (tests/test_gpu_scale.py runs it).
"""
from __future__ import annotations

import argparse
import contextlib
import dataclasses
import gc
import io
import json
import statistics
import sys
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))

import numpy as np  # noqa: E402
import torch  # noqa: E402

from harness.search import fit  # noqa: E402
from harness.search.memory_model import breakdown, human  # noqa: E402
from workloads import datasets, device_data, energy, envinfo, gpuinfo, methods, zrng  # noqa: E402
from workloads.clock import EventClock, NullClock, PhaseClock  # noqa: E402
from workloads.loop import TrainState, stepper, train, warm_up  # noqa: E402
from workloads.models import MODELS, Transformer  # noqa: E402
from workloads.spec import JobSpec  # noqa: E402
from workloads.tensor_peak import Live  # noqa: E402
from workloads.torch_runner import HALF, TorchEngine, cap_device_memory, make_engine  # noqa: E402
from workloads.vocab import TRAIN_PHASES  # noqa: E402

GIB = 2 ** 30
DOC = ROOT / "docs" / "transformers.md"
FIGURE = ROOT / "docs" / "transformers" / "fig3.png"
BEGIN, END = "<!-- gpu_scale: begin -->", "<!-- gpu_scale: end -->"
# (label, method, bp_layers, optimizer, checkpointing)
METHODS = (("full-bp", "full-bp", 0, "sgd", False), ("full-bp adam", "full-bp", 0, "adam", False),
           ("full-bp +ckpt", "full-bp", 0, "sgd", True), ("full-zo", "full-zo", 0, "sgd", False),
           ("elastic-zo:1", "elastic-zo", 1, "sgd", False))
FIT_METHODS = ("full-bp", "full-bp +ckpt", "full-zo", "elastic-zo:1")


@dataclasses.dataclass(frozen=True)
class Plan:
    """What each part runs: the GPU's real sizes, or the dry run's small ones."""
    device: str
    ladder: tuple          # part 1's models
    fp32: tuple            # ... measured in FP32 too
    fit_ladder: tuple      # part 2's
    budgets: tuple         # part 2's, bytes
    batch: int
    context: int
    contexts: tuple        # part 5's
    context_models: tuple  # ... on these models
    hf: tuple              # part 4's models
    lenet_batches: tuple
    lenet_steps: int       # part 3's least steps a timed job
    seconds: float         # each timed loop's least duration
    repeats: int           # timed loops a side, alternating (medians); steps profiled
    warm: int              # steps before a timed loop (a GPU captures its graphs on the fourth and fifth)
    profile: str           # part 6's model
    residuals: tuple       # part 7's (model, method label, context)


GPU = Plan("cuda", ("gpt2-small", "gpt2-medium", "gpt2-large", "gpt2-xl", "llama2-7b"), ("gpt2-small", "gpt2-medium"),
           ("gpt2-small", "gpt2-medium", "gpt2-large", "gpt2-xl", "llama2-7b", "llama2-13b"),
           (16 * GIB, 24 * GIB, 80 * GIB), 8, 512, (128, 256, 1024, 2048),
           ("gpt2-small", "gpt2-medium", "gpt2-large", "gpt2-xl", "llama2-7b"), ("gpt2-small", "gpt2-medium"),
           (32, 256), 1500, 2.0, 3, 5, "gpt2-medium",
           (("llama2-7b", "full-bp +ckpt", 2048), ("gpt2-small", "full-bp +ckpt", 1024), ("llama2-7b", "full-zo", 1024)))
DRY = Plan("cpu", ("gpt2-1m", "llama-5m"), ("gpt2-1m",), ("gpt2-1m", "gpt2-4m", "llama-5m"), (16 * 2 ** 20,),
           2, 32, (16,), ("gpt2-1m",), ("gpt2-1m",), (32,), 8, 0.05, 1, 1, "gpt2-1m", (("llama-5m", "full-zo", 32),))


PARTS = ("memory", "lenet", "hf", "profile", "residuals", "fit", "contexts")     # in the order they run


class Deadline(Exception):
    """--budget seconds are spent: the parts not yet run are left out."""


class Run:
    """The JSON being written, a part at a time."""

    def __init__(self, out: Path, plan: Plan, dry: bool, budget: float):
        self.out, self.plan, self.ends = out, plan, time.monotonic() + budget
        gpu = gpuinfo.facts(plan.device)
        self.data = {"dry_run": dry, "device": plan.device, "gpu": gpu, "torch": torch.__version__,
                     "host": envinfo.facts("torch"), "command": " ".join(sys.argv), "plan": dataclasses.asdict(plan),
                     "context_bytes": None, "parts": {}, "seconds": {}, "left_out": []}

    def check(self) -> None:
        if time.monotonic() > self.ends:
            raise Deadline()

    def rows(self, name: str) -> list:
        """A part's rows, kept in the JSON as they come (flush), so a cut-off part keeps them."""
        return self.data["parts"].setdefault(name, [])

    def flush(self) -> None:
        save(self.out, self.data, tables_too=False)

    def write(self, name: str, value) -> None:
        self.data["parts"][name] = value
        self.flush()


def save(out: Path, data: dict, tables_too: bool = True) -> None:
    out.mkdir(parents=True, exist_ok=True)
    tmp = out / "gpu_scale.json.tmp"
    tmp.write_text(json.dumps(data, indent=1))
    tmp.replace(out / "gpu_scale.json")
    if not tables_too:
        return
    (out / "gpu_scale.md").write_text(tables(data))
    from reports.transformers import scale_figure
    fig = scale_figure(data)
    if fig is not None:
        fig.savefig(out / "fig3.png", dpi=110, bbox_inches="tight")


# -- measuring ------------------------------------------------------------------------------

def sync(device: str) -> None:
    if device == "cuda":
        torch.cuda.synchronize()


def release(device: str) -> None:
    """What the last configuration left, given back: on a GPU the allocator's peak counts it. A
    CPU's Live counts only the storages made inside, so it needs no collection (a quarter of the
    dry run's time was gc)."""
    if device == "cuda":
        gc.collect()
        torch.cuda.empty_cache()


@contextlib.contextmanager
def peak_of(device: str):
    """The most the tensors made inside took at once, in the yielded dict's "bytes" on leaving:
    the caching allocator's peak on a GPU, the live storages' (tensor_peak.Live) on a CPU."""
    out = {}
    release(device)
    if device == "cuda":
        torch.cuda.reset_peak_memory_stats()
        start = torch.cuda.memory_allocated()
        yield out
        sync(device)
        out["bytes"] = torch.cuda.max_memory_allocated() - start
        return
    with Live() as live:
        yield out
    out["bytes"] = live.peak


def ms_per_step(step, plan: Plan, first: int = 0) -> float:
    """step(t) for t = first, first + 1, ... for at least plan.seconds: ms a step, the device
    synchronised at the end (a GPU's steps are queued)."""
    steps, t0 = 0, time.perf_counter()
    while time.perf_counter() - t0 < plan.seconds:
        step(first + steps)
        steps += 1
    sync(plan.device)
    return 1e3 * (time.perf_counter() - t0) / steps


def spec_for(name: str, method: str, k: int, optimizer: str, ckpt: bool, batch: int, context: int, precision: str,
             device: str, cap: int = 0) -> JobSpec:
    m = MODELS[name]
    return JobSpec.from_dict({"job_id": "gpu-scale", "method": method, "bp_layers": k, "device": device,
                              "precision": precision, "threads": 0, "device_mem_limit": cap,
                              "workload": {"model": m.name, "architecture": m.to_dict(), "dataset": "fortunes"},
                              "hyper": {"optimizer": optimizer, "checkpointing": ckpt, "batch_size": batch,
                                        "context": context, "lr_bp": 1e-5, "lr_zo": 1e-6}})


def device_init(m: Transformer, device: str, precision: str) -> torch.Tensor:
    """Weights drawn on the device in the job's type (their values change no byte of a step)."""
    gen = torch.Generator(device).manual_seed(0)
    dtype = HALF.get(precision, torch.float32)
    return torch.randn(m.params_total, generator=gen, device=device, dtype=dtype).mul_(0.02)


def step_peak(spec: JobSpec, steps: int = 2) -> dict:
    """Build the engine and run `steps` steps: the most the tensors took (from before the
    weights), NVML's used memory at that point, and the status (oom where it did not fit)."""
    m, device = spec.model(), spec.device
    engine = None
    try:
        with peak_of(device) as peak:
            engine = make_engine(spec, m, device_init(m, device, spec.precision))
            rng = np.random.default_rng(0)
            x, y = engine.load_batch(*(rng.integers(0, m.vocab, (spec.hyper.batch_size, spec.hyper.context))
                                       for _ in range(2)))
            for t in range(steps):
                methods.step(engine, spec, x, y, t, 0, spec.hyper.lr_zo, spec.hyper.lr_bp, NullClock())
            sync(device)
    except torch.OutOfMemoryError as e:
        return {"status": "oom", "error": str(e).splitlines()[0]}
    finally:
        del engine
    cuda = device == "cuda"
    return {"status": "ok", "peak_bytes": peak["bytes"], "used_bytes": gpuinfo.used_bytes(0) if cuda else None,
            "reserved_bytes": torch.cuda.max_memory_reserved() if cuda else None}


def memory_rows(run: Run, part: str, contexts, models=None, precisions=("bf16",)) -> list[dict]:
    """Part 1 (and 5): each configuration's predicted peak beside the measured one."""
    plan, rows = run.plan, run.rows(part)
    for precision in precisions:
        for name in models or plan.ladder:
            for context in contexts:
                m = MODELS[name]
                if m.style == "gpt2" and context > m.context:
                    continue
                for label, method, k, opt, ckpt in METHODS:
                    run.check()
                    b = breakdown(m, method, plan.batch, precision, k, opt, context, ckpt)
                    got = step_peak(spec_for(name, method, k, opt, ckpt, plan.batch, context, precision, plan.device))
                    row = {"model": name, "params": m.params_total, "method": label, "precision": precision,
                           "batch": plan.batch, "context": context, "loss_chunk": 0, "predicted_bytes": b.peak_bytes,
                           "total_bytes": b.total_bytes, "peak_at": b.peak_at, **got}
                    if got["status"] == "ok":
                        row["error"] = (b.peak_bytes - got["peak_bytes"]) / got["peak_bytes"]
                    rows.append(row)
                    run.flush()
                    print(line(row), flush=True)
    return rows


def line(r: dict) -> str:
    got = f"{r['peak_bytes'] / GIB:8.3f}" if r["status"] == "ok" else f"{r['status']:>8}"
    err = f"{100 * r['error']:+6.1f}%" if "error" in r and isinstance(r["error"], float) else ""
    return (f"{r['model']:12} {r['precision']:5} T={r['context']:<5} {r['method']:14} model {r['predicted_bytes'] / GIB:8.3f} "
            f"GiB  measured {got} GiB {err}")


def fit_rows(run: Run) -> list[dict]:
    """Part 2: per budget and method, fit.search's walk over the ladder with probes under the cap."""
    plan, rows = run.plan, run.rows("fit")
    ladder = sorted((MODELS[n] for n in plan.fit_ladder), key=lambda m: m.params_total)
    candidates = [fit.Config(m, plan.batch, plan.context) for m in ladder]
    total = torch.cuda.get_device_properties(0).total_memory if plan.device == "cuda" else None
    for budget in plan.budgets:
        for label in FIT_METHODS:
            _, method, k, opt, ckpt = next(x for x in METHODS if x[0] == label)
            probes = []

            def predict(c, footprint):
                return breakdown(c.model, method, c.batch, "bf16", k, opt, c.context, ckpt).peak_bytes

            def probe(c, predicted):
                run.check()
                cap = budget if total is None or budget < total else 0
                spec = spec_for(c.model.name, method, k, opt, ckpt, c.batch, c.context, "bf16", plan.device)
                if plan.device == "cuda" and cap:
                    cap_device_memory(torch.device("cuda"), cap)
                got = step_peak(spec)
                if plan.device == "cuda":
                    torch.cuda.set_per_process_memory_fraction(1.0)
                elif got["status"] == "ok" and got["peak_bytes"] > budget:
                    got = {"status": "oom", "error": "dry run: the peak passed the budget"}   # no cap on a CPU
                p = fit.Probe(c, predicted, c.label, got["status"], got.get("peak_bytes"), got.get("error"))
                probes.append(p)
                return p, 0

            best, _ = fit.search(candidates, budget, predict, probe)
            row = {"budget_bytes": budget, "method": label, "largest": best.model.name if best else None,
                   "params": best.model.params_total if best else 0,
                   "probes": [{"model": p.config.model.name, "predicted_bytes": p.predicted_bytes, "status": p.status,
                               "peak_bytes": p.peak_rss_bytes} for p in probes]}
            rows.append(row)
            run.flush()
            print(f"fit {budget / GIB:6.2f} GiB {label:14} largest {row['largest']}", flush=True)
    return rows


def lenet_rows(run: Run) -> list[dict]:
    """Part 3: LeNet-5's Full ZO step as a job runs it (loop.train: its batches, its clock, the
    phases on the device's clock) with the training set gathered on the host and on the device
    (device_data), against the limit: on a GPU the captured graph replayed back to back; on a
    CPU (dry run) the step alone on one batch. Per batch of the plan, alternating, medians."""
    plan, rows = run.plan, run.rows("lenet")
    for b in plan.lenet_batches:
        spec = JobSpec.from_dict({"job_id": "gpu-scale", "method": "full-zo", "device": plan.device,
                                  "workload": {"model": "lenet5", "dataset": "fashion-mnist"},
                                  "hyper": {"batch_size": b, "warmup_steps": -1}})
        m = spec.model()
        split = datasets.load("fashion-mnist", "train", 0 if plan.device == "cuda" else b * plan.lenet_steps, "", "fp32")
        test = datasets.load("fashion-mnist", "test", b, "", "fp32")
        epochs = -(-plan.lenet_steps // (len(split) // b))
        spec = dataclasses.replace(spec, hyper=dataclasses.replace(spec.hyper, epochs=epochs))
        engine = make_engine(spec, m, m.init_weights(0))
        feeds = {where: device_data.batches(engine, split, device_data.cap(spec), where) for where in ("host", "device")}
        warm_up(engine, spec, feeds["host"])
        h, data = spec.hyper, feeds["host"]
        data.epoch(zrng.permutation(0, 0, len(split)))
        x1, y1 = data(0, b)
        graph = getattr(getattr(engine, "run_step", None), "graph", None)

        def limit_step(t: int) -> None:
            if graph is not None:
                graph.replay()
            else:
                methods.step(engine, spec, x1, y1, t, 0, h.lr_zo, h.lr_bp, NullClock())

        got = {where: [] for where in feeds}
        limit = []
        for _ in range(plan.repeats):
            run.check()
            for where, feed in feeds.items():
                got[where].append(job_ms(engine, spec, feed, test))
            limit.append(ms_per_step(limit_step, plan))
        limit_ms = statistics.median(limit)
        for where, runs in got.items():
            ms = statistics.median(r["ms"] for r in runs)
            row = {"batch": b, "data": feeds[where].facts(), "job_ms": ms, "limit_ms": limit_ms, "ratio": ms / limit_ms,
                   "limit": "graph replayed" if plan.device == "cuda" else "step alone (eager, dry run)",
                   "phases_ms": {p: statistics.median(r["phases_ms"][p] for r in runs) for p in runs[0]["phases_ms"]}}
            rows.append(row)
            run.flush()
            print(f"lenet5 b{b} data on the {where}: job {ms:.3f} ms/step, limit ({row['limit']}) {limit_ms:.3f}: "
                  f"{row['ratio']:.2f}x; phases " + " ".join(f"{k} {v:.3f}" for k, v in row["phases_ms"].items() if v),
                  flush=True)
        del engine, feeds
        release(plan.device)
    return rows


def job_ms(engine, spec, data, test) -> dict:
    """ms a step of loop.train's epochs (the evaluation after each is not in them) and each
    training phase's ms a step, on the job's clock."""
    clock = EventClock() if spec.device == "cuda" else PhaseClock()
    state = TrainState()
    with contextlib.redirect_stdout(io.StringIO()):     # the loop's progress events
        train(engine, spec, data, test, clock, state, energy.Unavailable("benchmark"))
    return {"ms": 1e3 * state.train_seconds / state.steps,
            "phases_ms": {p: 1e3 * clock.seconds[p] / state.steps for p in TRAIN_PHASES}}


def hf_rows(run: Run) -> list[dict]:
    """Part 4: ours against a MeZO loop on Hugging Face's GPT-2 of the same shape, alternating."""
    try:
        from transformers import GPT2Config, GPT2LMHeadModel
    except ImportError as e:
        return [{"status": "skipped", "error": f"transformers is not installed here: {e}"}]
    plan, rows = run.plan, run.rows("hf")
    dtype = "bf16"
    for name in plan.hf:
        m = MODELS[name]
        spec = spec_for(name, "full-zo", 0, "sgd", False, plan.batch, plan.context, dtype, plan.device)
        rng = np.random.default_rng(0)
        tokens = rng.integers(0, m.vocab, (plan.batch, plan.context + 1))
        ours, unfused, theirs = [], [], []
        for _ in range(plan.repeats):
            run.check()
            ours.append(ours_loop(spec, m, tokens, plan))
            unfused.append(ours_loop(spec, m, tokens, plan, fused=False))
            theirs.append(hf_loop(GPT2Config, GPT2LMHeadModel, m, tokens, plan, HALF[dtype]))
        o_ms, h_ms = statistics.median(r[0] for r in ours), statistics.median(r[0] for r in theirs)
        u_ms = statistics.median(r[0] for r in unfused)
        row = {"model": name, "precision": dtype, "batch": plan.batch, "context": plan.context, "status": "ok",
               "ours_ms": o_ms, "hf_ms": h_ms, "speedup": h_ms / o_ms, "unfused_ms": u_ms,
               "ours_peak_bytes": max(r[1] for r in ours), "hf_peak_bytes": max(r[1] for r in theirs),
               "unfused_peak_bytes": max(r[1] for r in unfused)}
        rows.append(row)
        run.flush()
        print(f"hf {name}: ours {o_ms:.2f} ms/step (unfused {u_ms:.2f}), HF MeZO {h_ms:.2f}: {row['speedup']:.2f}x; "
              f"peak {row['ours_peak_bytes'] / GIB:.3f} (unfused {row['unfused_peak_bytes'] / GIB:.3f}) vs "
              f"{row['hf_peak_bytes'] / GIB:.3f} GiB", flush=True)
    return rows





def ours_loop(spec, m, tokens, plan, fused: bool = True) -> tuple[float, int]:
    """fused=False: a ZO pass's attention and activations as a BP pass's (TransformerNet.fused),
    the engine before issue 63."""
    with peak_of(plan.device) as peak:
        ms = _ours(spec, m, tokens, plan, fused)
    return ms, peak["bytes"]


def _ours(spec, m, tokens, plan, fused: bool) -> float:
    engine = make_engine(spec, m, device_init(m, plan.device, spec.precision))
    engine.net.fused = fused
    x, y = engine.load_batch(tokens[:, :-1], tokens[:, 1:])
    run_step = stepper(engine)

    def step(t: int) -> None:
        run_step(engine, spec, x, y, t, 0, spec.hyper.lr_zo, 0.0, NullClock())

    for t in range(plan.warm):      # a GPU captures its graphs on the fourth and fifth
        step(t)
    sync(plan.device)
    return ms_per_step(step, plan, first=5)


def hf_loop(config_cls, model_cls, m, tokens, plan, dtype, eps=1e-3, lr=1e-6) -> tuple[float, int]:
    """MeZO's loop (Malladi et al. 2023, its trainer's zo_step) on GPT2LMHeadModel."""
    with peak_of(plan.device) as peak:
        ms = _hf(config_cls, model_cls, m, tokens, plan, dtype, eps, lr)
    return ms, peak["bytes"]


def _hf(config_cls, model_cls, m, tokens, plan, dtype, eps, lr) -> float:
    step = hf_step(config_cls, model_cls, m, tokens, plan.device, dtype, eps, lr)
    for t in range(plan.warm):
        step(t)
    sync(plan.device)
    return ms_per_step(step, plan, first=plan.warm)


def hf_step(config_cls, model_cls, m, tokens, device, dtype, eps=1e-3, lr=1e-6):
    """One step of MeZO's loop (Malladi et al. 2023, its trainer's zo_step) on GPT2LMHeadModel
    built from m's shape: step(seed)."""
    cfg = config_cls(vocab_size=m.vocab, n_positions=m.context, n_embd=m.width, n_layer=m.depth, n_head=m.heads,
                     n_inner=m.ffn, bos_token_id=0, eos_token_id=0)
    model = model_cls(cfg).to(device, dtype).eval()
    ids = torch.from_numpy(tokens).to(device)
    x, y = ids[:, :-1], ids[:, :-1].clone()   # HF shifts the labels itself
    params = [p for p in model.parameters() if p.requires_grad]

    def perturb(seed: int, scale: float) -> None:
        gen = torch.Generator(device).manual_seed(seed)
        for p in params:
            p.data.add_(torch.normal(0, 1, p.shape, generator=gen, device=p.device, dtype=p.dtype), alpha=scale * eps)

    @torch.no_grad()
    def step(seed: int) -> None:
        perturb(seed, 1)
        l1 = model(input_ids=x, labels=y).loss.item()
        perturb(seed, -2)
        l2 = model(input_ids=x, labels=y).loss.item()
        g = (l1 - l2) / (2 * eps)
        perturb(seed, 1)
        gen = torch.Generator(device).manual_seed(seed)
        for p in params:
            p.data.add_(torch.normal(0, 1, p.shape, generator=gen, device=p.device, dtype=p.dtype), alpha=-lr * g)

    return step


def profile_rows(run: Run) -> list[dict]:
    """Part 6: where the plan's profile model's MeZO step spends the device, ours (the engine run
    eagerly: a CUDA graph is one launch to the profiler) against the HF loop's: per step, each
    kernel's time and launches, the 25 dearest, and the totals."""
    try:
        from transformers import GPT2Config, GPT2LMHeadModel
    except ImportError as e:
        return [{"status": "skipped", "error": f"transformers is not installed here: {e}"}]
    from torch.profiler import ProfilerActivity, profile

    plan, rows = run.plan, run.rows("profile")
    name, steps = plan.profile, plan.repeats
    m = MODELS[name]
    spec = spec_for(name, "full-zo", 0, "sgd", False, plan.batch, plan.context, "bf16", plan.device)
    tokens = np.random.default_rng(0).integers(0, m.vocab, (plan.batch, plan.context + 1))
    cuda = plan.device == "cuda"
    activity = ProfilerActivity.CUDA if cuda else ProfilerActivity.CPU

    def ours(fused: bool = True):
        engine = TorchEngine(spec, m, device_init(m, plan.device, "bf16"), graphed=False)
        engine.net.fused = fused
        x, y = engine.load_batch(tokens[:, :-1], tokens[:, 1:])
        return lambda t: methods.step(engine, spec, x, y, t, 0, spec.hyper.lr_zo, 0.0, NullClock())

    def theirs():
        return hf_step(GPT2Config, GPT2LMHeadModel, m, tokens, plan.device, HALF["bf16"])

    for side, make in (("ours", ours), ("ours unfused", lambda: ours(False)), ("hf", theirs)):
        run.check()
        release(plan.device)
        step = make()
        for t in range(plan.warm):
            step(t)
        sync(plan.device)
        with profile(activities=[activity]) as prof:
            for t in range(plan.warm, plan.warm + steps):
                step(t)
            sync(plan.device)
        kernels = []
        for e in prof.key_averages():
            us = (e.self_device_time_total if cuda else e.self_cpu_time_total) / steps
            if us > 0 and (not cuda or e.device_type == torch.autograd.DeviceType.CUDA):
                kernels.append({"name": e.key[:160], "us": us, "calls": e.count / steps})
        kernels.sort(key=lambda k: -k["us"])
        row = {"side": side, "model": name, "batch": plan.batch, "context": plan.context, "status": "ok",
               "us_per_step": sum(k["us"] for k in kernels), "launches_per_step": sum(k["calls"] for k in kernels),
               "kernels": kernels[:25]}
        rows.append(row)
        run.flush()
        print(f"profile {side} {name}: {row['us_per_step'] / 1e3:.2f} ms of kernels a step, "
              f"{row['launches_per_step']:.0f} launches; " +
              "; ".join(f"{k['name'][:40]} {k['us'] / 1e3:.2f} ms" for k in kernels[:5]), flush=True)
        del step
    rows.append(lm_head_row(run, m, plan.batch * plan.context))
    run.flush()
    return rows


def lm_head_row(run: Run, m, n: int) -> dict:
    """The LM head's product for one loss chunk in bf16, as [c, D] x [D, V] (the logits' rows V
    values, odd for GPT-2) and transposed, [V, D] x [D, c] (what _chunk_logits does on a GPU):
    microseconds each, medians of the plan's repeats."""
    c, dev = m.loss_chunk(n), run.plan.device
    h = torch.randn(c, m.width, device=dev, dtype=torch.bfloat16)
    w = torch.randn(m.vocab, m.width, device=dev, dtype=torch.bfloat16)
    ways = {"rows": lambda t: torch.mm(h, w.t()), "transposed": lambda t: torch.mm(w, h.t())}
    got = {k: [] for k in ways}
    for _ in range(run.plan.repeats):
        for k, f in ways.items():
            got[k].append(1e3 * ms_per_step(f, dataclasses.replace(run.plan, seconds=run.plan.seconds / 4)))
    row = {"side": "lm head", "status": "ok", "chunk": c, "width": m.width, "vocab": m.vocab,
           **{f"{k}_us": statistics.median(v) for k, v in got.items()}}
    print(f"lm head [{c}, {m.width}] x [{m.width}, {m.vocab}]: {row['rows_us']:.1f} us, transposed "
          f"{row['transposed_us']:.1f} us", flush=True)
    return row


def residual_rows(run: Run) -> list[dict]:
    """Part 7: what is alive at a step's peak, from the caching allocator's own history: each
    allocation and free replayed to the moment the allocated bytes were at their most, the live
    blocks there summed by the line of ours that made them, beside the memory model's parts and
    moment (issue 63's two residuals and, as a control, a configuration the model gets right). A
    CPU keeps no such history: the dry run records the peaks alone."""
    plan, rows = run.plan, run.rows("residuals")
    cuda = plan.device == "cuda"
    for name, label, context in plan.residuals:
        run.check()
        _, method, k, opt, ckpt = next(x for x in METHODS if x[0] == label)
        m = MODELS[name]
        b = breakdown(m, method, plan.batch, "bf16", k, opt, context, ckpt)
        spec = spec_for(name, method, k, opt, ckpt, plan.batch, context, "bf16", plan.device)
        if cuda:
            release(plan.device)
            torch.cuda.memory._record_memory_history(enabled="all", context="alloc", stacks="python",
                                                     max_entries=400_000)
        try:
            got = step_peak(spec)
            trace = peak_blocks(torch.cuda.memory._snapshot()) if cuda else None
        finally:
            if cuda:
                torch.cuda.memory._record_memory_history(enabled=None)
        row = {"model": name, "method": label, "precision": "bf16", "batch": plan.batch, "context": context,
               "predicted_bytes": b.peak_bytes, "peak_at": b.peak_at, "parts": b.parts, **got, "at_peak": trace}
        if got["status"] == "ok":
            row["error"] = (b.peak_bytes - got["peak_bytes"]) / got["peak_bytes"]
        rows.append(row)
        run.flush()
        print(line(row) + (f"; at the peak {trace['bytes'] / GIB:.3f} GiB in {trace['blocks']} blocks: " +
                           "; ".join(f"{g['where']} {g['bytes'] / GIB:.3f}" for g in trace["by_line"][:6])
                           if trace else ""), flush=True)
    return rows


def peak_blocks(snapshot: dict) -> dict:
    """The allocator's trace replayed (alloc adds a block, free_completed takes it away, as its
    allocated-bytes count does): the live blocks at the most, by the innermost line of
    workloads/ or benchmarks/ in their Python stack."""
    trace = [e for dev in snapshot["device_traces"] for e in dev]
    live, now, most, at = {}, 0, 0, -1
    for i, e in enumerate(trace):
        if e["action"] == "alloc":
            live[e["addr"]] = e["size"]
            now += e["size"]
        elif e["action"] == "free_completed" and e["addr"] in live:
            now -= live.pop(e["addr"])
        if now > most:
            most, at = now, i
    live = {}
    for e in trace[:at + 1]:
        if e["action"] == "alloc":
            live[e["addr"]] = e
        elif e["action"] == "free_completed":
            live.pop(e["addr"], None)
    by = {}
    for e in live.values():
        # autograd's engine runs backward in C++, with no Python frame: those by their size
        where = next((f"{Path(f['filename']).name}:{f['line']} {f['name']}" for f in e.get("frames", [])
                      if "/workloads/" in f["filename"] or "/benchmarks/" in f["filename"]),
                     f"no line of ours, {e['size']:,} bytes each")
        g = by.setdefault(where, {"where": where, "bytes": 0, "blocks": 0})
        g["bytes"] += e["size"]
        g["blocks"] += 1
    return {"bytes": most, "blocks": len(live), "events": len(trace), "event": at,
            "by_line": sorted(by.values(), key=lambda g: -g["bytes"])[:40]}


# -- the tables -----------------------------------------------------------------------------

def tables(data: dict) -> str:
    """The docs' tables, from the JSON alone."""
    parts, out = data["parts"], []
    gpu = data.get("gpu") or {}
    where = "this CPU, a dry run (tiny shapes: the numbers check the plan, not a GPU)" if data["dry_run"] else \
        f"{gpu.get('name')}, driver {gpu.get('driver')}, CUDA {gpu.get('cuda')}, torch {data['torch']}"
    out.append(f"Measured by `{data['command']}` on {where}.\n")
    if data.get("context_bytes") is not None:
        out.append(f"The CUDA context alone: {data['context_bytes'] / GIB:.2f} GiB of NVML's used memory.\n")
    for part, title in (("memory", "Memory model against the device (T = plan's context)"),
                        ("contexts", "Memory model against the device, other contexts")):
        rows = parts.get(part)
        if not rows:
            continue
        out.append(f"**{title}**\n\n| model | precision | T | method | model peak GiB | measured GiB | error | NVML used GiB |\n"
                   "|---|---|---:|---|---:|---:|---:|---:|")
        for r in rows:
            got = f"{r['peak_bytes'] / GIB:.3f}" if r["status"] == "ok" else r["status"]
            err = f"{100 * r['error']:+.1f}%" if r["status"] == "ok" else "-"
            used = f"{r['used_bytes'] / GIB:.2f}" if r.get("used_bytes") else "-"
            out.append(f"| {r['model']} | {r['precision']} | {r['context']} | {r['method']} | "
                       f"{r['predicted_bytes'] / GIB:.3f} | {got} | {err} | {used} |")
        fits = [abs(r["error"]) for r in rows if r["status"] == "ok"]
        if fits:
            out.append(f"\nLargest |error| where it fits: {100 * max(fits):.1f}% over {len(fits)} configurations "
                       "(target 5%).\n")
    if parts.get("fit"):
        out.append("**Largest model within a budget** (B and T as the plan's, bf16)\n\n"
                   "| budget | method | largest | parameters | MeZO / this |\n|---:|---|---|---:|---:|")
        by = {(r["budget_bytes"], r["method"]): r for r in parts["fit"]}
        for r in parts["fit"]:
            zo = by.get((r["budget_bytes"], "full-zo"), {}).get("params", 0)
            ratio = f"{zo / r['params']:.1f}x" if r["params"] else "-"
            out.append(f"| {human(r['budget_bytes'])} | {r['method']} | {r['largest'] or 'nothing'} | "
                       f"{r['params'] / 1e6:,.0f}M | {ratio} |")
        out.append("\nKatti et al.'s Fig. 4: at about 17 GB, BP fine-tunes GPT-2 medium and MeZO Llama-2-7B (19x).\n")
    if parts.get("lenet"):
        lenet = parts["lenet"] if isinstance(parts["lenet"], list) else [parts["lenet"]]   # one row before issue 63
        out.append("**LeNet-5 Full ZO as a job runs it** against its limit (target 1.5x)\n\n"
                   "| batch | data gathered on | job ms/step | limit ms/step | ratio | limit | the job's phases, ms a step |\n"
                   "|---:|---|---:|---:|---:|---|---|")
        for r in lenet:
            where = (r.get("data") or {}).get("where", "host")
            phases = ", ".join(f"{k} {v:.3f}" for k, v in (r.get("phases_ms") or {}).items() if v) or "-"
            out.append(f"| {r['batch']} | {where} | {r['job_ms']:.3f} | {r['limit_ms']:.3f} | {r['ratio']:.2f}x | "
                       f"{r['limit']} | {phases} |")
        out.append("")
    if parts.get("hf"):
        out.append("**The transformer MeZO step against Hugging Face's GPT-2 MeZO loop**\n\n"
                   "| model | B | T | ours ms | HF MeZO ms | speed-up | ours peak GiB | HF peak GiB |\n"
                   "|---|---:|---:|---:|---:|---:|---:|---:|")
        for r in parts["hf"]:
            if r["status"] != "ok":
                out.append(f"| {r['error']} |")
                continue
            out.append(f"| {r['model']} | {r['batch']} | {r['context']} | {r['ours_ms']:.2f} | {r['hf_ms']:.2f} | "
                       f"{r['speedup']:.2f}x | {r['ours_peak_bytes'] / GIB:.3f} | {r['hf_peak_bytes'] / GIB:.3f} |")
        out.append("")
    prof = [r for r in parts.get("profile") or [] if r["status"] == "ok" and "kernels" in r]
    head = [r for r in parts.get("profile") or [] if r.get("side") == "lm head"]
    if prof:
        out.append(f"**Where a {prof[0]['model']} MeZO step's device time goes** (B = {prof[0]['batch']}, "
                   f"T = {prof[0]['context']}, bf16, eager; per step)\n\n| side | kernel ms | launches | dearest five |\n"
                   "|---|---:|---:|---|")
        for r in prof:
            top = "; ".join(f"`{k['name'][:48]}` {k['us'] / 1e3:.2f} ms x{k['calls']:.0f}" for k in r["kernels"][:5])
            out.append(f"| {r['side']} | {r['us_per_step'] / 1e3:.2f} | {r['launches_per_step']:.0f} | {top} |")
        out.append("")
    for r in head:
        out.append(f"**One loss chunk's LM head** in bf16, [{r['chunk']}, {r['width']}] x [{r['width']}, {r['vocab']}]: "
                   f"{r['rows_us']:.1f} us; transposed, [{r['vocab']}, {r['width']}] x [{r['width']}, {r['chunk']}] "
                   f"(transformer_torch._chunk_logits on a GPU): {r['transposed_us']:.1f} us.\n")
    if parts.get("residuals"):
        out.append("**What is alive at the peak** (the allocator's history replayed; bf16)\n\n"
                   "| model | method | T | model peak GiB (moment) | measured GiB | error | the largest lines at the peak, GiB |\n"
                   "|---|---|---:|---:|---:|---:|---|")
        for r in parts["residuals"]:
            got = f"{r['peak_bytes'] / GIB:.3f}" if r["status"] == "ok" else r["status"]
            err = f"{100 * r['error']:+.1f}%" if r["status"] == "ok" else "-"
            top = "; ".join(f"`{g['where']}` {g['bytes'] / GIB:.3f}" for g in (r.get("at_peak") or {}).get("by_line", [])[:6])
            out.append(f"| {r['model']} | {r['method']} | {r['context']} | {r['predicted_bytes'] / GIB:.3f} "
                       f"({r['peak_at']}) | {got} | {err} | {top or '-'} |")
        out.append("")
    if data["dry_run"] and (parts.get("lenet") or parts.get("hf")):
        out.append("(A dry run's times are no speeds: the transformer loops run under the CPU's tensor tracker, "
                   "and a CPU has no graph.)\n")
    if data["left_out"]:
        out.append(f"Left out when the run's time ran out: {', '.join(data['left_out'])}.\n")
    for part, why in (data.get("failed") or {}).items():
        out.append(f"Part {part} failed: {why}.\n")
    return "\n".join(out) + "\n"


def write_doc(text: str, out: Path) -> None:
    """The tables between the doc's markers, and Fig. 3 beside it (docs/transformers/fig3.png)."""
    if (out / "fig3.png").is_file():
        FIGURE.parent.mkdir(exist_ok=True)
        FIGURE.write_bytes((out / "fig3.png").read_bytes())
        text += f"\n![Katti et al.'s Fig. 3 from this run's JSON]({FIGURE.relative_to(DOC.parent)})\n"
    doc = DOC.read_text()
    head, _, rest = doc.partition(BEGIN)
    _, _, tail = rest.partition(END)
    DOC.write_text(f"{head}{BEGIN}\n{text}{END}{tail}")


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--out", type=Path, default=ROOT / "results" / "gpu_scale")
    ap.add_argument("--dry-run", action="store_true", help="the whole plan on this CPU, tiny shapes")
    ap.add_argument("--budget", type=float, default=480.0, help="seconds; the parts not started by then are left out")
    ap.add_argument("--doc", action="store_true", help="put the tables into docs/transformers.md")
    ap.add_argument("--parts", help=f"comma-separated, the parts to run (default all: {', '.join(PARTS)})")
    args = ap.parse_args(argv)
    chosen = args.parts.split(",") if args.parts else list(PARTS)
    if unknown := [p for p in chosen if p not in PARTS]:
        ap.error(f"--parts: no part {', '.join(unknown)} (the parts: {', '.join(PARTS)})")
    if not args.dry_run and not torch.cuda.is_available():
        print(f"gpu_scale: no CUDA here (torch {torch.__version__}); --dry-run runs the plan on the CPU")
        return 2
    plan = DRY if args.dry_run else GPU
    run = Run(args.out, plan, args.dry_run, args.budget)
    if plan.device == "cuda":
        torch.zeros(1, device="cuda")
        run.data["context_bytes"] = gpuinfo.used_bytes(0)
    def memory_part():
        memory_rows(run, "memory", (plan.context,))
        return memory_rows(run, "memory", (plan.context,), plan.fp32, ("fp32",))

    parts = {"memory": memory_part, "lenet": lambda: lenet_rows(run), "hf": lambda: hf_rows(run),
             "profile": lambda: profile_rows(run), "residuals": lambda: residual_rows(run), "fit": lambda: fit_rows(run),
             "contexts": lambda: memory_rows(run, "contexts", plan.contexts, plan.context_models)}
    parts = [(name, parts[name]) for name in PARTS if name in chosen]
    try:
        for i, (name, part) in enumerate(parts):
            t0 = time.monotonic()
            try:
                run.write(name, part())
                run.data["seconds"][name] = round(time.monotonic() - t0, 1)
            except Deadline:
                run.data["left_out"] = [n for n, _ in parts[i:]]     # the first of them may have rows
                print(f"gpu_scale: {args.budget:g} s spent; left out {', '.join(run.data['left_out'])}")
                break
            except Exception as e:  # a part that breaks is recorded with its reason; the next ones still run
                import traceback
                traceback.print_exc()
                run.data.setdefault("failed", {})[name] = f"{type(e).__name__}: {str(e).splitlines()[0] if str(e) else ''}"
                release(plan.device)
    finally:
        save(args.out, run.data)        # the tables and Fig. 3 of what finished, however it ended
    if args.doc:
        write_doc(tables(run.data), args.out)
    print(f"gpu_scale: {args.out / 'gpu_scale.json'}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
