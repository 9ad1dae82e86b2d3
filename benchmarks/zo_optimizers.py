"""The ZO optimizers' cost (docs/zo-optimizers.md): per optimizer, ms/step, the ZO share
(zo_perturb + zo_update over training time: what generating z and moving θ cost) and ms/step
without it, for LeNet-5 at batch 32, on this machine's own build of the C++ binary (the default)
or the torch runner on a device (--runtime torch --device cuda: a GPU's dense steps are CUDA
graphs, its sparse and Forward-Grad steps eager). The optimizers take turns, --repeats times
after a dropped warm-up round; medians. Issue 30's goal: SGD's, momentum's and sign's ZO share
at most 8% on the binary here; Adam's and the sparse ones' are reported as they are. Issue 46's:
Gaussian z (a table lookup) must not double MeZO's ZO share.
Prints; asserts nothing.
"""
from __future__ import annotations

import sys
import tempfile
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))

from benchmarks.kernel_paths import alternating, alternating_options, medians  # noqa: E402
from benchmarks.runtimes import bench_spec  # noqa: E402
from harness.preparation.artifacts import raw_idx  # noqa: E402
from harness.search.memory_model import breakdown  # noqa: E402
from harness.planning.suites import MethodChoice  # noqa: E402
from testkit.binaries import native_binary  # noqa: E402
from testkit.runners import TORCH_RUNNER  # noqa: E402
from workloads import vocab  # noqa: E402
from workloads.models import LENET5  # noqa: E402
from workloads.spec import Hyper  # noqa: E402

OPTIMIZERS = {
    "mezo (sgd)": {}, "sign": {"zo_update": "sign"}, "momentum": {"zo_update": "momentum"},
    "adam": {"zo_update": "adam"}, "conservative": {"zo_update": "conservative"},
    "one-sided": {"zo_estimator": "one-sided"}, "q=4": {"zo_queries": 4},
    "lezo (2 units)": {"zo_sparsity": "layers", "zo_layers": 2},
    "sparse mezo (mask)": {"zo_sparsity": "magnitude"},
    "random mask (zo-bench)": {"zo_sparsity": "random"},
    "mezo gaussian z": {"zo_distribution": "gaussian"},
    # weight decay splits MeZO's merged restore-and-update pass (methods.zo_step): what that costs
    "mezo weight decay": {"weight_decay": 0.01}, "adamw": {"zo_update": "adam", "weight_decay": 0.01},
}
# torch alone has forward-mode AD
TORCH_ONLY = {"forward-grad": {"zo_estimator": "forward-grad"}}


def main() -> None:
    ap = alternating_options(__doc__)
    ap.add_argument("--method", default="full-zo", help="full-zo, or elastic-zo:K (its C++ runs one query a step)")
    ap.add_argument("--runtime", choices=("cpp", "torch"), default="cpp")
    ap.add_argument("--device", default="cpu", help="the torch runner's device (cpu, cuda)")
    ap.add_argument("--only", nargs="+", choices=list(OPTIMIZERS) + list(TORCH_ONLY), metavar="NAME",
                    help="these optimizers alone (side by side, as the whole set)")
    ap.add_argument("--wait-policy", choices=vocab.OMP_WAIT_POLICIES, default=vocab.OMP_WAIT_POLICY,
                    help="as a target's omp_wait_policy sets it (default auto, the harness's)")
    args = ap.parse_args()
    method = MethodChoice.parse(args.method)
    data_dir = str(raw_idx("fashion-mnist", "").dir)
    command = native_binary() if args.runtime == "cpp" else TORCH_RUNNER
    optimizers = OPTIMIZERS if args.runtime == "cpp" else {**OPTIMIZERS, **TORCH_ONLY}
    optimizers = {k: v for k, v in optimizers.items() if not args.only or k in args.only}

    def spec(parts: dict) -> dict:
        s = bench_spec(method.method, method.bp_layers, args.batch, args.steps, data_dir, threads=args.threads,
                       **({"device": args.device} if args.runtime == "torch" else {}))
        s["hyper"].update(parts)
        return s

    where = "native build" if args.runtime == "cpp" else args.device
    print(f"{args.runtime} ({where}), lenet5 {method}, batch {args.batch}, {args.steps} steps, {args.repeats} repeats "
          f"(medians); threads {args.threads or 'all'}, OpenMP wait policy {args.wait_policy}")
    print(f"{'optimizer':22} {'parts':32} {'ms/step':>8} {'zo %':>6} {'ms w/o zo':>10} {'model MiB':>10} "
          f"{'held MiB':>9}")
    with tempfile.TemporaryDirectory() as d:
        res = alternating({name: (spec(p), command) for name, p in optimizers.items()}, Path(d), args.repeats,
                          args.wait_policy)
    for name, parts in optimizers.items():
        ms, zo, rest = medians(res[name])
        h = Hyper(**parts)
        model = breakdown(LENET5, method.method, args.batch, bp_layers=method.bp_layers, zo=h).total_bytes
        print(f"{name:22} {h.zo_parts() or '-':32} {ms:8.3f} {100 * zo:6.1f} {rest:10.3f} "
              f"{model / 2**20:10.3f} {held(res[name][0]) / 2**20:9.3f}", flush=True)


def held(r: dict) -> float:
    """What the run measured holding: the binary's own buffers, a GPU's peak of allocated
    memory (the CUDA graph's pool, cuDNN's workspace and the data's batch included), else nan."""
    m = r["memory"]
    return m["buffers_bytes"] or m["device_peak_bytes"] or float("nan")


if __name__ == "__main__":
    main()
