"""The C++ binary's ZO step against a MeZO-style PyTorch loop on this machine's CPU, side by side.

Both train LeNet-5 (or --model) at the same batch, from the same weights on the same batches,
with every core: the binary as a job runs it (the harness's default wait policy, a build for
this machine and one for AVX2, x86-64-v3), and the peer as a hand-written MeZO loop does (Malladi
et al., 2023; benchmarks/gpu.py's EagerPeer): per parameter tensor a torch.normal from a
reseeded generator, each loss read with .item(), eager kernels, its restore and update in one
pass. They take turns, --repeats times after a dropped round. Prints ms/step medians and the
speed-ups (the issue's goal: at least 5x); asserts nothing.

    python benchmarks/mezo_peer.py [--steps 200] [--repeats 5] [--method full-zo]
"""
from __future__ import annotations

import argparse
import os
import platform
import statistics
import sys
import tempfile
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))

from workloads import wait_policy  # noqa: E402

# the peer runs in this process: its libgomp waits as auto's launcher would start a torch job now
# (read when torch loads, so set before the import)
if not {"OMP_WAIT_POLICY", "GOMP_SPINCOUNT"} & set(os.environ):
    os.environ.update(wait_policy.environment(wait_policy.pick(wait_policy.other_share())))

import torch  # noqa: E402

from benchmarks.gpu import EagerPeer  # noqa: E402
from benchmarks.runtimes import WORKLOADS, bench_spec, ms_per_step  # noqa: E402
from harness.planning.suites import MethodChoice  # noqa: E402
from harness.preparation.artifacts import raw_idx  # noqa: E402
from testkit.binaries import native_binary  # noqa: E402
from testkit.runners import policy_env, run_runner  # noqa: E402
from workloads import datasets, methods, zrng  # noqa: E402
from workloads.clock import NullClock  # noqa: E402
from workloads.spec import JobSpec  # noqa: E402


def peer_ms(spec: dict, steps: int) -> float:
    """ms/step of the MeZO-style loop on spec's model, batch and batches (after 10 untimed steps)."""
    job = JobSpec.from_dict({k: v for k, v in spec.items() if k != "workload"} |
                            {"workload": {"model": spec["workload"]["model"], "dataset": spec["workload"]["dataset"]}})
    model = job.model()
    points = model.input_shape[0] if model.points else 0
    split = datasets.load(job.workload.dataset, "train", job.hyper.batch_size * (steps + 10), "", "fp32", points)
    engine = EagerPeer(job, model, model.init_weights(job.seed))
    order, b, h = zrng.permutation(job.seed, 0, len(split)), job.hyper.batch_size, job.hyper
    batches = [engine.load_batch(*split.batch(order[i * b:(i + 1) * b])) for i in range(steps + 10)]
    for t, (x, y) in enumerate(batches):
        if t == 10:
            t0 = time.perf_counter()
        methods.step(engine, job, x, y, t, 0, h.lr_zo, h.lr_bp, NullClock())
    return 1e3 * (time.perf_counter() - t0) / steps


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--steps", type=int, default=200)
    ap.add_argument("--repeats", type=int, default=5)
    ap.add_argument("--batch", type=int, default=32)
    ap.add_argument("--method", default="full-zo", help="full-zo or elastic-zo:K")
    ap.add_argument("--model", choices=tuple(WORKLOADS), default="lenet5")
    args = ap.parse_args()
    choice = MethodChoice.parse(args.method)
    data_dir = str(raw_idx(WORKLOADS[args.model][0], "").dir)
    binaries = {"native": native_binary()}
    if platform.machine() == "x86_64":
        binaries["avx2"] = native_binary("x86-64-v3")
    spec = bench_spec(choice.method, choice.bp_layers, args.batch, args.steps, data_dir, model=args.model)
    print(f"{args.model} {choice}, batch {args.batch}, {args.steps} steps, {args.repeats} repeats (medians); "
          f"torch {torch.__version__} on {torch.get_num_threads()} threads ({wait_policy.libgomp_wait()})")
    ms = {name: [] for name in (*binaries, "peer")}
    with tempfile.TemporaryDirectory() as d:
        for r in range(args.repeats + 1):
            for name, binary in binaries.items():
                res = run_runner(spec, Path(d), binary, check=True, env=policy_env(binary))
                if r:
                    ms[name].append(ms_per_step(res))
            peer = peer_ms(spec, args.steps)
            if r:
                ms["peer"].append(peer)
    med = {name: statistics.median(v) for name, v in ms.items()}
    for name in binaries:
        print(f"binary ({name} build): {med[name]:.3f} ms/step; MeZO-style torch loop {med['peer']:.3f} ms/step: "
              f"{med['peer'] / med[name]:.2f}x")


if __name__ == "__main__":
    main()
