"""The ZO optimizers' cost on the C++ binary (docs/zo-optimizers.md): per optimizer, ms/step, the
ZO share (zo_perturb + zo_update over training time: what generating z and moving θ cost) and
ms/step without it, for LeNet-5 at batch 32 on this machine's own build. The optimizers take
turns, --repeats times after a dropped warm-up round; medians. Issue 30's goal: SGD's, momentum's
and sign's ZO share at most 8% here; Adam's and the sparse ones' are reported as they are.
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
from harness.planning.suites import MethodChoice  # noqa: E402
from testkit.binaries import native_binary  # noqa: E402
from workloads.spec import Hyper  # noqa: E402

OPTIMIZERS = {
    "mezo (sgd)": {}, "sign": {"zo_update": "sign"}, "momentum": {"zo_update": "momentum"},
    "adam": {"zo_update": "adam"}, "conservative": {"zo_update": "conservative"},
    "one-sided": {"zo_estimator": "one-sided"}, "q=4": {"zo_queries": 4},
    "lezo (2 units)": {"zo_sparsity": "layers", "zo_layers": 2},
    "sparse mezo (mask)": {"zo_sparsity": "magnitude"},
}


def main() -> None:
    ap = alternating_options(__doc__)
    ap.add_argument("--method", default="full-zo", help="full-zo, or elastic-zo:K (its C++ runs one query a step)")
    args = ap.parse_args()
    method = MethodChoice.parse(args.method)
    data_dir = str(raw_idx("fashion-mnist", "").dir)
    binary = native_binary()

    def spec(parts: dict) -> dict:
        s = bench_spec(method.method, method.bp_layers, args.batch, args.steps, data_dir, threads=args.threads)
        s["hyper"].update(parts)
        return s

    print(f"cpp (native build), lenet5 {method}, batch {args.batch}, {args.steps} steps, {args.repeats} repeats "
          f"(medians); threads {args.threads or 'all'}")
    print(f"{'optimizer':22} {'parts':32} {'ms/step':>8} {'zo %':>6} {'ms w/o zo':>10}")
    with tempfile.TemporaryDirectory() as d:
        res = alternating({name: (spec(p), binary) for name, p in OPTIMIZERS.items()}, Path(d), args.repeats)
    for name, parts in OPTIMIZERS.items():
        ms, zo, rest = medians(res[name])
        print(f"{name:22} {Hyper(**parts).zo_parts() or '-':32} {ms:8.3f} {100 * zo:6.1f} {rest:10.3f}", flush=True)


if __name__ == "__main__":
    main()
