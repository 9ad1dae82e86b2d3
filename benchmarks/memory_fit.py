"""The transformer memory model's peak (harness/search/memory_model.py, Breakdown.peak_bytes) against one
real training step of the torch engine, per model, context and method (docs/transformers.md,
"Model vs measured").

Each configuration runs in a fresh interpreter (`--one`), so that no earlier configuration's
freed memory, kept by the allocator, hides part of this one's peak. There the engine is built as
a runner builds it (make_engine), and one warm-up step on the measured batch runs first, as a
runner job's does before its peak is reset: a first step also makes what then lives as long as
the process -- the math libraries' buffers for these shapes (about 2-3 MiB here, which a
warm-up on a smaller batch leaves to the measured step), the autograd engine, on a GPU
cuBLAS's workspace -- which is no part of a step's memory and would weigh most on the small
configurations. Then the baseline is taken: everything resident now -- the weights, Adam's
moments, the batch, its context's tables (the causal mask, llama's rotary cos and sin), the
interpreter and its libraries -- is what the model's parameters, optimizer and inputs parts
count (plus the runtime's footprint, which the model leaves out). So the measured number is
the increment over that baseline during the second step:
- CPU: the resident set's high-water mark (VmHWM, reset to the baseline just before the step)
  less the resident set at the baseline;
- CUDA (--device cuda): torch.cuda.max_memory_allocated less memory_allocated at the baseline
  (the caching allocator's reserve is not counted: it is what the allocator keeps, not what
  the step holds).
It is compared with the model's peak less those three parts.

The step is methods.step, eager (a GPU job replays it as a CUDA graph, whose private pool is
another matter). On the CPU the resident set also holds what glibc's malloc keeps after a free:
a freed block under its mmap threshold (128 KiB, raised up to 32 MiB by the first large mmapped
block freed) goes back to the heap, not to the kernel, and is reused by the next allocations.
--malloc fixed sets MALLOC_MMAP_THRESHOLD_ (which also turns the raising off) so that every
large tensor is its own mapping, returned on free: the resident set then follows the live
tensors. The default is malloc as a runner job sees it, where the second step finds most of
what it needs already resident from the first. One intra-op thread (--threads): more threads add their stacks and malloc arenas.

Prints the table and, per method, the largest |error|; asserts nothing.
"""
from __future__ import annotations

import argparse
import gc
import json
import os
import subprocess
import sys
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))

from harness.search import memory_model  # noqa: E402
from workloads.models import MODELS  # noqa: E402

MIB = 2 ** 20
# (label, method, bp_layers, optimizer, checkpointing)
METHODS = [("full-bp", "full-bp", 0, "sgd", False), ("full-bp adam", "full-bp", 0, "adam", False),
           ("full-bp +ckpt", "full-bp", 0, "sgd", True), ("full-zo", "full-zo", 0, "sgd", False),
           ("elastic-zo:1", "elastic-zo", 1, "sgd", False), ("elastic-zo:2", "elastic-zo", 2, "sgd", False)]
MODELS_HERE = ("gpt2-1m", "gpt2-4m", "llama-5m", "gpt2-12m", "gpt2-29m")
CONTEXTS = (64, 128, 256)


def measure(model_name: str, method: str, k: int, optimizer: str, checkpointing: bool, batch: int, context: int,
            device: str, threads: int) -> int:
    """The bytes one step adds to what is resident (allocated, on CUDA) before it."""
    import numpy as np
    import torch

    from workloads import memory, methods
    from workloads.clock import NullClock
    from workloads.spec import JobSpec
    from workloads.torch_runner import make_engine

    model = MODELS[model_name]
    spec = JobSpec.from_dict({"job_id": "memory-fit", "method": method, "bp_layers": k, "threads": threads,
                              "device": device,
                              "workload": {"model": model.name, "architecture": model.to_dict(), "dataset": "fortunes"},
                              "hyper": {"optimizer": optimizer, "checkpointing": checkpointing,
                                        "batch_size": batch, "context": context}})
    engine = make_engine(spec, model, model.init_weights(0))
    rng = np.random.default_rng(0)
    x, y = engine.load_batch(*(rng.integers(0, model.vocab, (batch, context)) for _ in range(2)))

    def step(t):
        methods.step(engine, spec, x, y, t, 0, 1e-4, 1e-4, NullClock())

    step(0)
    gc.collect()
    if engine.cuda:
        torch.cuda.synchronize()
        torch.cuda.reset_peak_memory_stats()
        before = torch.cuda.memory_allocated()
        step(1)
        torch.cuda.synchronize()
        return torch.cuda.max_memory_allocated() - before
    before = memory.rss_bytes()
    if not memory.reset_peak():
        raise SystemExit("memory_fit: this kernel does not let VmHWM be reset (/proc/self/clear_refs)")
    step(1)
    return memory.peak_rss_bytes() - before


def predicted(model_name, method, k, optimizer, checkpointing, batch, context) -> int:
    """The model's peak less what is allocated before the step (the measured baseline)."""
    r = memory_model.breakdown(MODELS[model_name], method, batch, "fp32", k, optimizer, context, checkpointing)
    return r.peak_bytes - r.parts["parameters"] - r.parts["optimizer"] - r.parts["inputs"]


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--models", nargs="+", default=MODELS_HERE,
                    choices=[m for m in MODELS if m.startswith(("gpt2", "llama"))])
    ap.add_argument("--contexts", nargs="+", type=int, default=CONTEXTS)
    ap.add_argument("--batch", type=int, default=8)
    ap.add_argument("--methods", nargs="+", default=[m[0] for m in METHODS], choices=[m[0] for m in METHODS])
    ap.add_argument("--device", default="cpu")
    ap.add_argument("--threads", type=int, default=1)
    ap.add_argument("--jobs", type=int, default=2, help="configurations measured at once")
    ap.add_argument("--malloc", choices=("default", "fixed"), default="default",
                    help="fixed: MALLOC_MMAP_THRESHOLD_=131072, every large tensor its own mapping")
    ap.add_argument("--one", help=argparse.SUPPRESS)    # a JSON configuration: measure it here, print the bytes
    args = ap.parse_args(argv)
    if args.one:
        print(measure(*json.loads(args.one), args.device, args.threads))
        return 0
    if args.device.startswith("cuda"):
        import torch
        if not torch.cuda.is_available():
            print("memory_fit: no CUDA device here")
            return 0
    env = {**os.environ, **({"MALLOC_MMAP_THRESHOLD_": "131072"} if args.malloc == "fixed" else {})}
    configs = [(label, [name, method, k, optimizer, ckpt, args.batch, context])
               for name in args.models for context in args.contexts
               if MODELS[name].style != "gpt2" or context <= MODELS[name].context
               for label, method, k, optimizer, ckpt in METHODS if label in args.methods]

    def run(config):
        return subprocess.run([sys.executable, __file__, "--one", json.dumps(config), "--device", args.device,
                               "--threads", str(args.threads)], capture_output=True, text=True, env=env)

    print(f"peak memory of one step over what is resident before it: model vs measured "
          f"({args.device}, B = {args.batch}, malloc {args.malloc})")
    print(f"{'model':10} {'T':>5} {'method':14} {'model MiB':>10} {'measured':>10} {'error':>8}")
    worst = {}
    # each process measures only its own resident set, so two at a time change nothing measured
    with ThreadPoolExecutor(args.jobs) as pool:
        for (label, config), p in zip(configs, pool.map(run, (c for _, c in configs))):
            name, context = config[0], config[-1]
            if p.returncode:
                print(f"{name:10} {context:5d} {label:14} failed: {p.stderr.strip().splitlines()[-1:]}")
                continue
            got, want = int(p.stdout.split()[-1]), predicted(*config)
            err = (want - got) / got
            worst[label] = max(worst.get(label, 0.0), abs(err))
            print(f"{name:10} {context:5d} {label:14} {want / MIB:10.1f} {got / MIB:10.1f} {100 * err:+7.1f}%",
                  flush=True)
    print("largest |error| per method: " + ", ".join(f"{m} {100 * e:.1f}%" for m, e in worst.items()))
    return 0


if __name__ == "__main__":
    sys.exit(main())
