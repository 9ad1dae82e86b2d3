"""From a suite, targets, filters and --set overrides to the list of jobs of a run."""
from __future__ import annotations

import re
import subprocess
import sys
from dataclasses import dataclass

from workloads import vocab
from workloads.spec import Hyper, JobSpec, SpecError, check_value

from . import paths
from .errors import UserError
from .inventory import Target
from .suites import MethodChoice, Suite

if sys.version_info >= (3, 11):
    import tomllib
else:  # pragma: no cover
    import tomli as tomllib

# What each runtime implements; other combinations are left out of a plan, with the reason.
SUPPORT = {
    "torch": {"precisions": {"fp32", "int8"}, "methods": set(vocab.METHODS)},
    "cpp": {"precisions": {"fp32", "int8"}, "methods": set(vocab.METHODS)},
    "ort": {"precisions": {"fp32"}, "methods": {"full-zo", "elastic-zo"},
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


def unsupported(runtime: str, method: str, precision: str) -> str | None:
    s = SUPPORT.get(runtime)
    if s is None:
        return f"the {runtime} runtime is not available in this version"
    if precision not in s["precisions"]:
        return f"the {runtime} runtime has no {precision} training"
    if method not in s["methods"]:
        return f"the {runtime} runtime cannot train {method}" + (f": {s['why']}" if "why" in s else "")
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
    hyper = {**suite.hyper, **(overrides or {})}
    commit = harness_commit()
    jobs, notes = [], []
    for target in targets:
        for runtime in runtime_list:
            if runtime not in target.runtimes:
                notes.append(f"{target.name}: has no {runtime} runtime (it has {', '.join(target.runtimes)})")
                continue
            for precision in precision_list:
                for zo_loss in (suite.zo_losses if precision == "int8" else ["float"]):
                    for m in method_list:
                        if m.method == "full-bp" and zo_loss != suite.zo_losses[0]:
                            continue    # full-bp computes no ZO loss: one job, not one per zo_loss
                        why = unsupported(runtime, m.method, precision)
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
    return jobs, list(dict.fromkeys(notes))
