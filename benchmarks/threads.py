"""How a runtime's threads wait, on a quiet machine: its default ("auto", docs/threads.md) against
every fixed policy and one thread, side by side, for every method and precision.

For each method (full-bp, full-zo, elastic-zo k=1 and k=2) and precision (fp32, int8, int8*) the
configurations take turns on the same steps from the same seed, --repeats times after a dropped
round: the runtime's default under auto, OMP_WAIT_POLICY passive and active on every core, and one
thread. The table gives medians of ms/step per configuration, the default over the fastest
(the issue's goal: at most 1.05) and one thread over the default (two threads' speed-up).
auto for a Python runner is what the launcher picks from the load it measures just before the
start (workloads/wait_policy.py); the C++ binary's team decides as it runs, and its spinning
share is printed. Run it with nothing else on the machine; benchmarks/omp_contention.py measures
the loaded side. Prints; asserts nothing.

    python benchmarks/threads.py [--runtime cpp|torch|ort] [--model lenet5|pointnet] [--repeats 5] [--steps 200]
"""
from __future__ import annotations

import statistics
import sys
import tempfile
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))

from benchmarks.kernel_paths import alternating_options  # noqa: E402
from benchmarks.runtimes import WORKLOADS, bench_spec, ms_per_step  # noqa: E402
from harness.planning.suites import MethodChoice  # noqa: E402
from harness.preparation.artifacts import onnx_graph, raw_idx  # noqa: E402
from testkit.binaries import native_binary  # noqa: E402
from testkit.runners import ORT_RUNNER, TORCH_RUNNER, policy_env, run_runner  # noqa: E402
from workloads.models import MODELS  # noqa: E402
from workloads.vocab import PAPER_CONFIGS  # noqa: E402

# (threads, wait policy as a target names it) of each configuration; auto first: the default
CONFIGS = {"auto": (0, "auto"), "passive": (0, "passive"), "active": (0, "active"), "1 thread": (1, "auto")}
PRECISIONS = (("fp32", "float"), ("int8", "float"), ("int8", "integer"))


def main() -> None:
    ap = alternating_options(__doc__)
    ap.add_argument("--runtime", choices=("cpp", "torch", "ort"), default="cpp")
    ap.add_argument("--model", choices=tuple(WORKLOADS), default="lenet5")
    ap.add_argument("--methods", help="comma-separated, e.g. full-zo,elastic-zo:1 (default: the paper's four)")
    args = ap.parse_args()
    model = MODELS[args.model]
    data_dir = str(raw_idx(WORKLOADS[args.model][0], "").dir)
    command = {"cpp": native_binary(), "torch": TORCH_RUNNER, "ort": ORT_RUNNER}[args.runtime]
    methods = [MethodChoice.parse(m) for m in args.methods.split(",")] if args.methods else \
        [MethodChoice(m, k) for m, k in PAPER_CONFIGS]
    print(f"{args.runtime}, {args.model}, batch {args.batch}, {args.steps} steps, {args.repeats} repeats (medians), "
          f"ms/step; default = auto on every core")
    print(f"{'method':16} {'prec':6} " + " ".join(f"{c:>9}" for c in CONFIGS) +
          f" {'default/fastest':>15} {'1t/default':>10}  spinning or picked")
    with tempfile.TemporaryDirectory() as d:
        tmp = Path(d)
        for choice in methods:
            if args.runtime == "ort" and choice.method == "full-bp":
                continue                      # forward-only by design
            for precision, zo_loss in PRECISIONS:
                if precision == "int8" and (args.runtime == "ort" or (zo_loss == "integer" and choice.method == "full-bp")):
                    continue
                specs = {}
                for name, (threads, _) in CONFIGS.items():
                    spec = bench_spec(choice.method, choice.bp_layers, args.batch, args.steps, data_dir,
                                      threads=threads, model=args.model, precision=precision, zo_loss=zo_loss)
                    if args.runtime == "ort":
                        spec["onnx_model"] = str(onnx_graph(model, choice.method, choice.bp_layers))
                    specs[name] = spec
                ms, how = {name: [] for name in CONFIGS}, []
                for r in range(args.repeats + 1):
                    for name, (_, policy) in CONFIGS.items():
                        res = run_runner(specs[name], tmp, command, check=True, env=policy_env(command, policy))
                        if r:
                            ms[name].append(ms_per_step(res))
                            if name == "auto":
                                t = res["env"].get("threads") or {}
                                how.append(f"{t['spinning_share']:.2f}" if "spinning_share" in t else t.get("wait"))
                med = {name: statistics.median(v) for name, v in ms.items()}
                label = {"float": precision, "integer": "int8*"}[zo_loss]
                print(f"{choice!s:16} {label:6} " + " ".join(f"{med[c]:9.3f}" for c in CONFIGS) +
                      f" {med['auto'] / min(med.values()):15.2f} {med['1 thread'] / med['auto']:10.2f}  "
                      f"{' '.join(sorted(set(how)))}", flush=True)


if __name__ == "__main__":
    main()
