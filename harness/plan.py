"""From a suite, targets, filters and --set overrides to the list of jobs of a run."""
from __future__ import annotations

import re
import subprocess
import sys
from dataclasses import dataclass

from workloads import datasets, vocab
from workloads.spec import Hyper, JobSpec, SpecError, Workload, check_value

from . import paths
from .errors import UserError
from .inventory import ARCHES, Target
from .suites import MethodChoice, Suite

if sys.version_info >= (3, 11):
    import tomllib
else:  # pragma: no cover
    import tomli as tomllib

# What each runtime implements: per precision the devices it trains on, the methods and the data
# sets it reads; every other combination is left out of a plan, with the reason. (The int8
# reference computes on CPU tensors; the C++ binary's lookup table knows MNIST's two.)
SUPPORT = {
    "torch": {"devices": {"fp32": ("cpu", "cuda"), "int8": ("cpu",)}, "methods": vocab.METHODS,
              "datasets": datasets.DATASETS},
    "cpp": {"devices": {"fp32": ("cpu",), "int8": ("cpu",)}, "methods": vocab.METHODS,
            "datasets": ("mnist", "fashion-mnist")},
    "ort": {"devices": {"fp32": ("cpu",)}, "methods": ("full-zo", "elastic-zo"), "datasets": datasets.DATASETS,
            "why": "ONNX Runtime runs forward passes only, by design (use torch or cpp for full-bp)"},
}


@dataclass
class Job:
    job_id: str
    target: str
    timeout_s: float
    spec: dict

    def to_dict(self) -> dict:
        return {"job_id": self.job_id, "target": self.target, "timeout_s": self.timeout_s, "spec": self.spec}


def unsupported(runtime: str, method: str, precision: str, dataset: str, device: str) -> str | None:
    s = SUPPORT.get(runtime)
    if s is None:
        return f"the {runtime} runtime is not available in this version"
    if precision not in s["devices"]:
        return f"the {runtime} runtime has no {precision} training"
    if method not in s["methods"]:
        return f"the {runtime} runtime cannot train {method}" + (f": {s['why']}" if "why" in s else "")
    if dataset not in s["datasets"]:
        return f"the {runtime} runtime reads {' and '.join(s['datasets'])}, not {dataset}"
    if device not in s["devices"][precision]:
        return f"the {runtime} runtime trains {precision} on {' and '.join(s['devices'][precision])}, not {device}"
    return None


def parse_set(items: list[str]) -> dict:
    """--set KEY=VALUE (VALUE in TOML syntax; a bare word is a string) -> validated hyper overrides."""
    out = {}
    for item in items:
        key, sep, text = item.partition("=")
        key = key.strip()
        if not sep or not key:
            raise UserError(f"--set {item!r}: expected KEY=VALUE, e.g. --set epochs=1")
        try:
            value = tomllib.loads(f"v = {text}")["v"]
        except tomllib.TOMLDecodeError:
            value = text
        try:
            out[key] = check_value(Hyper, key, value, "")
        except SpecError as e:
            raise UserError(f"--set {item}: {e}") from None
    return out


def harness_commit() -> str:
    try:
        rev = subprocess.run(["git", "-C", str(paths.REPO), "describe", "--always", "--dirty", "--abbrev=12"],
                             capture_output=True, text=True, timeout=10)
        return rev.stdout.strip()
    except (OSError, subprocess.SubprocessError):
        return ""


def safe_name(text: str) -> str:
    """A file-name-safe version of a target or job name (the real name stays in the spec)."""
    return re.sub(r"[^A-Za-z0-9._-]+", "_", text).strip("._") or "_"


def check_data(suite: Suite, workload: Workload, hyper: Hyper, overrides: dict) -> None:
    """Refuse now, naming the setting, a data set that is missing or smaller than the samples
    and the batch the hyperparameters take from it: a runner would fail, or cut it silently."""
    def origin(key: str) -> str:
        return f"--set {key}={overrides[key]}: {key}" if key in overrides else f"{suite.path}: hyper.{key}"

    try:
        datasets.check(workload.dataset, workload.data_dir)
        size = {split: datasets.split_size(workload.dataset, split, workload.data_dir) for split in ("train", "test")}
    except datasets.DatasetError as e:
        raise UserError(f"{suite.path}: workload.dataset: {e}") from None
    for key, split in (("train_samples", "train"), ("test_samples", "test")):
        if getattr(hyper, key) > size[split]:
            raise UserError(f"{origin(key)}: expected at most the {size[split]} samples of {workload.dataset} "
                            f"{split} (0 = all of them), got {getattr(hyper, key)}")
    train = hyper.train_samples or size["train"]
    if hyper.batch_size > train:
        raise UserError(f"{origin('batch_size')}: expected at most the {train} training samples, "
                        f"got {hyper.batch_size}")


def _select(kind: str, values: list, wanted: list[str], known) -> list:
    if not wanted:
        return values
    for w in wanted:
        if w not in known:
            raise UserError(f"--{kind} {w!r}: expected one of {', '.join(known)}")
    picked = [v for v in values if str(v) in wanted or getattr(v, "method", None) in wanted]
    if not picked:
        raise UserError(f"--{kind} {', '.join(wanted)}: the suite has none of these "
                        f"(it has {', '.join(map(str, values))})")
    return picked


def make(suite: Suite, targets: list[Target], *, methods=(), runtimes=(), precisions=(),
         overrides: dict | None = None, timeout_s: float | None = None) -> tuple[list[Job], list[str]]:
    """The jobs of a run, and notes on the combinations left out (and why)."""
    for m in methods:
        if ":" in m:
            try:
                MethodChoice.parse(m)
            except ValueError as e:
                raise UserError(f"--method {m!r}: {e}") from None
    known_methods = list(vocab.METHODS) + [str(m) for m in suite.methods]
    method_list = _select("method", suite.methods, list(methods), known_methods)
    runtime_list = _select("runtime", suite.runtimes, list(runtimes), vocab.RUNTIMES)
    precision_list = _select("precision", suite.precisions, list(precisions), vocab.PRECISIONS)
    overrides = overrides or {}
    hyper = {**suite.hyper, **overrides}
    workload = Workload(**suite.workload)
    check_data(suite, workload, Hyper(**hyper), overrides)
    commit = harness_commit()
    jobs, notes = [], []
    for target in targets:
        for runtime in runtime_list:
            if runtime not in target.runtimes:
                notes.append(f"{target.name}: has no {runtime} runtime (it has {', '.join(target.runtimes)})")
                continue
            if runtime == "cpp" and target.transport != "local" and not target.arch:
                raise UserError(f"{target.source}: targets.{target.name}.arch: missing; the cpp runtime is "
                                f"built for the board's arch, one of {', '.join(ARCHES)}")
            for precision in precision_list:
                zo_losses = suite.zo_losses if precision == "int8" else ["float"]
                for zo_loss in zo_losses:
                    for m in method_list:
                        if m.method == "full-bp" and zo_loss != zo_losses[0]:
                            continue    # full-bp computes no ZO loss: one job per precision, not per zo_loss
                        why = unsupported(runtime, m.method, precision, workload.dataset, target.device)
                        if why:
                            notes.append(f"{m} {precision} on {runtime}: {why}")
                            continue
                        for r in range(suite.repeats):
                            job_id = safe_name(f"{target.name}.{runtime}.{vocab.method_key(m.method, m.bp_layers)}"
                                               f".{vocab.precision_key(precision, zo_loss, m.method)}.r{r}")
                            spec = {"job_id": job_id, "method": m.method, "runtime": runtime,
                                    "bp_layers": m.bp_layers, "precision": precision, "zo_loss": zo_loss,
                                    "device": target.device, "seed": suite.seed, "threads": target.threads,
                                    "workload": dict(suite.workload), "hyper": dict(hyper),
                                    "target": target.name, "repeat": r, "harness_commit": commit}
                            try:
                                spec = JobSpec.from_dict(spec).to_dict()
                            except SpecError as e:
                                raise UserError(f"{suite.path}: {e}") from None
                            jobs.append(Job(job_id, target.name, timeout_s or suite.timeout_s, spec))
    if not jobs:
        raise UserError("the plan has no job: " + ("; ".join(dict.fromkeys(notes)) or "nothing selected"))
    # Each target runs its jobs round-robin over repeats (every key's repeat 0, then every
    # key's repeat 1, ...), as pyperf and Google Benchmark's interleaving do: a busy minute of a
    # shared machine then slows one repeat of many keys, not all the repeats of one key, and
    # two runs of one plan meet the machine's drift in the same order.
    where = {t.name: i for i, t in enumerate(targets)}
    jobs.sort(key=lambda j: (where[j.target], j.spec["repeat"]))
    return jobs, list(dict.fromkeys(notes))
