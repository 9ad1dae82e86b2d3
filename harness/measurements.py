"""Results grouped into measurements: one per job key, with its samples and fingerprint.

`compare` and `export` both read runs through this module, and `compare` reads an exported
file back through it as well. A key is (workload, method, precision, runtime, target). Its
samples are the per-step time and the peak RSS of each repeat. A single repeat falls back to
its per-epoch step times: they are correlated, so a comparison says when it used them.
"""
from __future__ import annotations

import json
from dataclasses import dataclass, field
from pathlib import Path

from workloads import vocab

from .errors import UserError
from .store import Store

FINGERPRINT = ("cpu_model", "cores", "governor", "kernel", "versions")


@dataclass
class Measurement:
    key: str
    facts: dict                                   # workload, method, bp_layers, precision, zo_loss, runtime, target
    step_s: list = field(default_factory=list)    # seconds per step, one per repeat (or per epoch)
    peak_rss: list = field(default_factory=list)  # bytes, one per repeat
    per_epoch: bool = False                       # step_s holds one repeat's epochs
    fingerprint: dict = field(default_factory=dict)
    binary_sha256: str | None = None
    harness_commit: str = ""


def job_key(job: dict) -> tuple[str, dict]:
    w = job.get("workload") or {}
    precision = vocab.precision_key(job.get("precision", "fp32"), job.get("zo_loss", "float"), job["method"])
    facts = {"workload": f"{w.get('model', 'lenet5')}/{w.get('dataset', 'fashion-mnist')}",
             "method": vocab.method_key(job["method"], job.get("bp_layers", 0)), "precision": precision,
             "runtime": job.get("runtime", "torch"), "target": job.get("target", "")}
    return " ".join(facts.values()), facts


def fingerprint(env: dict) -> dict:
    return {k: env.get(k) for k in FINGERPRINT}


def from_results(results: list[dict]) -> dict[str, Measurement]:
    """The ok results grouped by job key."""
    out: dict[str, Measurement] = {}
    epochs: dict[str, list] = {}
    for r in results:
        if r.get("status") != "ok" or not r.get("steps"):
            continue
        key, facts = job_key(r["job"])
        env = r.get("env") or {}
        m = out.setdefault(key, Measurement(key, facts, fingerprint=fingerprint(env),
                                            binary_sha256=env.get("binary_sha256"),
                                            harness_commit=env.get("harness_commit", "")))
        m.step_s.append(r["train_seconds"] / r["steps"])
        m.peak_rss.append((r.get("memory") or {}).get("peak_rss_bytes") or 0)
        epochs[key] = [(e["seconds"], r["steps"] / len(r["epochs"])) for e in r.get("epochs") or []]
    for key, m in out.items():
        if len(m.step_s) == 1 and len(epochs[key]) > 1:
            m.step_s = [seconds / steps for seconds, steps in epochs[key]]
            m.per_epoch = True
    return out


def load(source: str, results_dir: Path) -> tuple[str, dict[str, Measurement]]:
    """A run id of the store, several joined by commas (their repeats pooled: runs taken
    in turn with the other side's cancel a slow drift of the machine), or a file written by
    `zobench export --format pytest-benchmark`."""
    path = Path(source)
    if path.suffix == ".json" and path.is_file():
        try:
            data = json.loads(path.read_text())
            return str(path), {b["extra_info"]["zobench"]["key"]: from_benchmark(b) for b in data["benchmarks"]}
        except (json.JSONDecodeError, KeyError, TypeError) as e:
            raise UserError(f"{path}: not a zobench pytest-benchmark export ({type(e).__name__}: {e})") from None
    store, results = Store(results_dir), []
    for run_id in source.split(","):
        try:
            results += store.results(run_id)
        except UserError as e:      # the store's unknown-run error, which lists the runs there
            raise UserError(f"{run_id!r} is neither a run id nor an exported .json file: {e}") from None
    return source, from_results(results)


def from_benchmark(b: dict) -> Measurement:
    z = b["extra_info"]["zobench"]
    return Measurement(z["key"], z["facts"], list(b["stats"]["data"]), list(z["peak_rss_bytes"]),
                       z["per_epoch"], z["fingerprint"], z["binary_sha256"], z["harness_commit"])
