"""The torch runner's GPU step against a MeZO-style eager peer, side by side in one process.

For each method (full-zo, elastic-zo k=1 and k=2, full-bp) and batch (32, 256) both train the
same model on the same data from the same weights, alternating, --repeats times:
- zobench: the runner's engine as a job runs it (workloads.torch_runner.TorchEngine): zobench-z
  drawn on the device by one fused kernel per use, the whole step one CUDA graph, phases timed by
  CUDA events, one synchronisation per step;
- peer: what a hand-written MeZO loop does (Malladi et al., 2023): per parameter tensor a
  torch.normal from a reseeded generator, the loss read with .item() after each pass, eager
  kernels; its step merges the restore and the update, as ours does, so it is one pass of
  noise cheaper than MeZO's own.
Each timed loop runs at least --seconds, so NVML's energy counter (which steps every ~250 ms)
measures it. The table gives medians: ms/step, the speed-up, the ZO perturb+update share of a
step, device peak memory and J/step. Then the correctness lines: z drawn on the device equals
zobench-z bit for bit, and INT8 on the GPU ends with the CPU's weights_sha256.

Prints; asserts nothing. On a machine without CUDA it says so and exits 0.
"""
from __future__ import annotations

import argparse
import gc
import statistics
import sys
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))

import numpy as np  # noqa: E402
import torch  # noqa: E402

from benchmarks.runtimes import WORKLOADS, ZO_PHASES  # noqa: E402
from harness.planning.suites import MethodChoice  # noqa: E402
from workloads import datasets, device_data, energy, gpuinfo, methods, zrng, zrng_torch  # noqa: E402
from workloads.clock import EventClock, NullClock  # noqa: E402
from workloads.loop import stepper, warm_up  # noqa: E402
from workloads.models import MODELS  # noqa: E402
from workloads.spec import JobSpec  # noqa: E402
from workloads.torch_runner import TorchEngine, make_engine  # noqa: E402
from workloads.vocab import PAPER_CONFIGS  # noqa: E402

DATASET = {model: dataset for model, (dataset, _) in WORKLOADS.items()}


class EagerPeer(TorchEngine):
    """A MeZO-style loop on the same model: eager kernels, torch.normal per parameter tensor
    from a generator reseeded with the step's key, each loss read on the host."""

    def __init__(self, spec, model, init):
        super().__init__(spec, model, init, graphed=False)
        self.zo_views = self.net.views[:2 * self.first_bp]

    @torch.no_grad()
    def perturb(self, key: int, alpha: float) -> None:
        gen = torch.Generator(self.device).manual_seed(key & (2 ** 63 - 1))
        for p in self.zo_views:
            p.add_(torch.normal(0.0, 1.0, p.shape, generator=gen, device=self.device), alpha=alpha)

    def loss(self, out, y) -> float:
        loss = torch.nn.functional.cross_entropy(out, y)
        if out.requires_grad:
            self.kept.append(loss)
        return loss.item()


def spec_for(method: str, k: int, batch: int, model: str, warmup: int = 20, **fields) -> JobSpec:
    return JobSpec.from_dict({"job_id": "gpu-bench", "method": method, "bp_layers": k, "device": "cuda",
                              "workload": {"model": model, "dataset": DATASET[model]},
                              "hyper": {"batch_size": batch, "warmup_steps": warmup}, **fields})


def timed_loop(engine, spec, data, seconds: float, meter) -> dict:
    """Steps over the split (cycling) for at least `seconds`, its batches where a job gathers
    them (device_data.batches): ms/step, phase shares, J/step."""
    clock, run_step, batch, n = EventClock(), stepper(engine), spec.hyper.batch_size, len(data.split)
    data.epoch(zrng.permutation(spec.seed, 0, n))
    h = spec.hyper
    meter.begin()
    clock.start()
    steps, t0 = 0, time.perf_counter()
    while time.perf_counter() - t0 < seconds:
        lo = (steps * batch) % (n - batch + 1)
        x, y = data(lo, lo + batch)
        clock.lap("data")
        clock.step_end()
        run_step(engine, spec, x, y, steps, 0, h.lr_zo, h.lr_bp, clock)
        steps += 1
    clock.drain()
    elapsed = time.perf_counter() - t0
    joules = meter.end(elapsed)
    phases = sum(clock.seconds.values())
    return {"ms": 1e3 * elapsed / steps, "zo_share": sum(clock.seconds[p] for p in ZO_PHASES) / phases,
            "phase_sum": phases / elapsed, "j_step": joules / steps if joules is not None else None}


def measure(cls, spec, model, init, split, seconds, meter) -> dict:
    engine = cls(spec, model, init)
    data = device_data.batches(engine, split, device_data.cap(spec))
    warm_up(engine, spec, data)
    gpuinfo.reset_peak("cuda")
    r = timed_loop(engine, spec, data, seconds, meter)
    r["peak_mib"] = torch.cuda.max_memory_allocated() / 2 ** 20
    del engine
    gc.collect()     # now, not during the next engine's graph capture (a graph freed then breaks it)
    torch.cuda.empty_cache()
    return r


def med(rs: list, key: str):
    vals = [r[key] for r in rs if r[key] is not None]
    return statistics.median(vals) if vals else None


def check_z(n: int = 1_000_003) -> bool:
    """The device's fused perturbation of zeros by z, against zobench-z from numpy."""
    spec = spec_for("full-zo", 0, 32, "lenet5")
    e = TorchEngine(spec, MODELS["lenet5"], np.zeros(MODELS["lenet5"].params_total, np.float32))
    w = torch.zeros(n, device="cuda")
    key = zrng.stream_key(3, zrng.STREAM_ZO, 11)
    e.fused_perturb(w, zrng_torch.set_key(e.key, key), e.alpha.fill_(1.0))
    return np.array_equal(w.cpu().numpy(), zrng.normal(key, 0, n))


def int8_sha(method: str, k: int, device: str, model: str, steps: int) -> str:
    spec = spec_for(method, k, 32, model, warmup=0, device=device, precision="int8", zo_loss="integer")
    m = spec.model()
    split = datasets.load(DATASET[model], "train", 32 * steps, "", "int8", m.input_shape[0] if m.points else 0)
    engine = make_engine(spec, m, None)
    order = zrng.permutation(spec.seed, 0, len(split))
    for t in range(steps):
        x, y = engine.load_batch(*split.batch(order[t * 32:(t + 1) * 32]))
        methods.step(engine, spec, x, y, t, 0, 0.0, 0.0, NullClock())
    return engine.weights_sha256()


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__)
    ap.add_argument("--model", choices=tuple(DATASET), default="lenet5")
    ap.add_argument("--batches", default="32,256")
    ap.add_argument("--repeats", type=int, default=3)
    ap.add_argument("--seconds", type=float, default=1.5, help="each timed loop's least duration")
    ap.add_argument("--int8-steps", type=int, default=20)
    args = ap.parse_args()
    if not torch.cuda.is_available():
        print(f"no CUDA: torch {torch.__version__}; nothing to measure")
        return 0
    gpu = gpuinfo.facts("cuda")
    print(f"{gpu['name']}, driver {gpu.get('driver')}, CUDA {gpu['cuda']}, torch {torch.__version__}; "
          f"{args.model}, {args.repeats} repeats of >= {args.seconds} s (medians)")
    meter = energy.meter("cuda")
    if meter.unavailable:
        print(f"energy: {meter.unavailable}")
    model = MODELS[args.model]
    init = model.init_weights(0)
    points = model.input_shape[0] if model.points else 0
    split = datasets.load(DATASET[args.model], "train", 0, "", "fp32", points)
    print(f"{'method':14} {'batch':>5} {'ours ms':>8} {'peer ms':>8} {'speedup':>7} {'ours zo%':>8} "
          f"{'peer zo%':>8} {'ours MiB':>8} {'peer MiB':>8} {'ours J/st':>9} {'peer J/st':>9} {'phases/t':>8}")
    for batch in map(int, args.batches.split(",")):
        for method, k in (("full-zo", 0), ("elastic-zo", 1), ("elastic-zo", 2), ("full-bp", 0)):
            spec = spec_for(method, k, batch, args.model)
            runs = {"ours": [], "peer": []}
            for _ in range(args.repeats):
                runs["ours"].append(measure(TorchEngine, spec, model, init, split, args.seconds, meter))
                runs["peer"].append(measure(EagerPeer, spec, model, init, split, args.seconds, meter))
            o, p = runs["ours"], runs["peer"]
            j = lambda v: f"{v:9.4f}" if v is not None else f"{'-':>9}"  # noqa: E731
            print(f"{MethodChoice(method, k)!s:14} {batch:5d} {med(o, 'ms'):8.3f} {med(p, 'ms'):8.3f} "
                  f"{med(p, 'ms') / med(o, 'ms'):7.2f} {100 * med(o, 'zo_share'):8.1f} {100 * med(p, 'zo_share'):8.1f} "
                  f"{med(o, 'peak_mib'):8.1f} {med(p, 'peak_mib'):8.1f} {j(med(o, 'j_step'))} {j(med(p, 'j_step'))} "
                  f"{med(o, 'phase_sum'):8.3f}", flush=True)
    meter.close()
    print(f"z drawn on the GPU equals zobench-z bit for bit: {'yes' if check_z() else 'NO'}")
    for method, k in PAPER_CONFIGS:
        same = int8_sha(method, k, "cuda", args.model, args.int8_steps) == \
            int8_sha(method, k, "cpu", args.model, args.int8_steps)
        print(f"INT8* {MethodChoice(method, k)!s:14} {args.int8_steps} steps on the GPU: "
              f"weights_sha256 {'identical to' if same else 'DIFFERENT from'} the CPU's")
    return 0


if __name__ == "__main__":
    sys.exit(main())
