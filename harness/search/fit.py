"""`zobench fit`: the largest model of a ladder (or batch, or context) that a method trains on a
target within a memory budget -- Katti et al.'s question, answered for one board.

The analytic memory model (harness/search/memory_model.py) predicts; short real runs under the budget
confirm. A prediction alone is not the answer: a runtime's own footprint (the interpreter,
torch's libraries, the data, allocator slack) is no part of the model, and it differs by board
and runtime. So the first probe is the smallest configuration: it measures that footprint (the
runner's resident set once loaded, before its first step: loaded_rss_bytes) and tells at once whether anything
fits. Then the search starts at the largest configuration predicted to fit with that footprint
added, and walks up while probes end ok, or down while they end oom: the answer is a
configuration that ended ok whose next one up ended oom (or the top of the ladder). Each probe
is an ordinary job of one run in the store, under the target's memory limit set to the budget
(workloads/launch.py: a memory cgroup, else RLIMIT_AS), so every probe's status, peak and
reason are kept whatever the later ones do.
"""
from __future__ import annotations

import dataclasses
from dataclasses import dataclass, field

from workloads import datasets
from workloads.launch import parse_size
from workloads.models import MODELS, Transformer, ladder
from workloads.spec import Hyper

from harness.search import memory_model
from harness import paths
from harness.planning import plan, runs
from harness.preparation.bundle import prepare
from harness.errors import UserError
from harness.planning.inventory import MEM_LIMIT, Target
from harness.execution.progress import ProgressView
from harness.execution.scheduler import execute
from harness.boards.transport import Stop
from harness.stores.store import Store
from harness.planning.suites import MethodChoice, Suite

VARY = ("model", "batch", "context")
STEPS = 3              # timed steps a probe trains: enough to reach every step's peak
MAX_BATCH = 4096


@dataclass(frozen=True)
class Config:
    model: Transformer
    batch: int
    context: int

    @property
    def label(self) -> str:
        return f"{self.model.name}.b{self.batch}.t{self.context}"


@dataclass
class Probe:
    config: Config
    predicted_bytes: int     # the memory model's total plus the measured footprint
    job_id: str
    status: str = ""
    peak_rss_bytes: int | None = None
    error: str | None = None


@dataclass
class Method:
    choice: MethodChoice
    optimizer: str = "sgd"
    checkpointing: bool = False
    zo: dict = field(default_factory=dict)      # the ZO parts (spec.ZO_PART_FIELDS): the probes train with them
    precision: str = "fp32"                     # fp32, bf16 or fp16: the weights', activations' and gradients' type

    def model_bytes(self, c: Config) -> int:
        """The larger of the parts' total and the predicted peak: a runner's resident set is
        glibc's high-water mark, which keeps freed tensors resident, so the live peak alone is
        too little, and with few tokens and a large vocabulary the peak passes the total."""
        b = memory_model.breakdown(c.model, self.choice.method, c.batch, self.precision, self.choice.bp_layers,
                                   self.optimizer, c.context, self.checkpointing, Hyper(**self.zo))
        return max(b.total_bytes, b.peak_bytes)


def asked(target: Target, budget: str | None, vary: str, model_name: str | None, family: str, method: str,
          optimizer: str, checkpointing: bool, batch: int, context: int,
          zo: dict | None = None, precision: str = "fp32") -> tuple[Method, list[Config], int]:
    """`zobench fit`'s request checked (a UserError naming the option otherwise): the method, the
    candidates smallest first, and the budget in bytes (--budget, else the target's mem_limit)."""
    if not budget and not target.mem_limit:
        raise UserError(f"fit: no --budget, and target {target.name} has no mem_limit to default to")
    budget_bytes = parse_budget(budget or target.mem_limit)
    transformers = {n: m for n, m in MODELS.items() if isinstance(m, Transformer)}
    if vary == "model":
        if model_name:
            raise UserError("fit --model: only --vary batch or context grows one model; --vary model climbs "
                            "--model-family")
        model = None
    else:
        model = transformers.get(model_name or "")
        if model is None:
            raise UserError(f"fit --vary {vary}: --model names one of the transformers: {', '.join(transformers)}")
    families = sorted({m.family for m in transformers.values()})
    if family not in families:
        raise UserError(f"fit --model-family {family!r}: expected one of {', '.join(families)}")
    try:
        choice = MethodChoice.parse(method)
    except ValueError as e:
        raise UserError(f"fit --method {method!r}: {e}") from None
    if checkpointing and choice.method == "full-zo":
        raise UserError("fit --checkpointing: full-zo keeps no activations to checkpoint")
    if precision == "int8":
        raise UserError("fit --precision int8: transformers train in fp32, bf16 or fp16")
    return Method(choice, optimizer, checkpointing, zo or {}, precision), configs(vary, family, model, batch, context), \
        budget_bytes


def configs(vary: str, family: str, model: Transformer | None, batch: int, context: int) -> list[Config]:
    """The candidates, smallest first: the family's ladder at one batch and context (a model with
    fewer learned positions than the context is left out), or one model's batches (powers of 2)
    or contexts (powers of 2 from 16 up to its positions; a llama-style model, whose rotary
    positions have no table, up to 32,768)."""
    if vary == "model":
        out = [Config(m, batch, context or m.context) for m in ladder(family)
               if m.style != "gpt2" or (context or m.context) <= m.context]
        if not out:
            raise UserError(f"fit: no model of family {family!r} takes a context of {context}")
        return out
    assert model is not None
    if vary == "batch":
        return [Config(model, 1 << i, context or model.context) for i in range(MAX_BATCH.bit_length())]
    top = model.context if model.style == "gpt2" else 1 << 15
    return [Config(model, batch, 1 << i) for i in range(4, top.bit_length()) if 1 << i <= top]


def search(candidates: list[Config], budget: int, predict, run) -> tuple[Config | None, list[Probe]]:
    """The largest candidate that runs ok, by the rule of the module docstring. predict(config,
    footprint) -> bytes; run(config, predicted) -> the ended Probe, whose result carries the
    footprint (loaded_rss_bytes) as its second value: run returns (probe, footprint)."""
    probes: list[Probe] = []
    status: dict[int, str] = {}

    def probe(i: int, footprint: int) -> tuple[str, int]:
        p, measured = run(candidates[i], predict(candidates[i], footprint))
        probes.append(p)
        status[i] = p.status
        if p.status not in ("ok", "oom"):
            raise UserError(f"fit: probe {p.job_id} ended {p.status}: {p.error}; nothing is concluded "
                            "from a probe that neither trained nor ran out of memory")
        return p.status, measured or footprint

    first, footprint = probe(0, 0)
    if first != "ok":
        return None, probes
    i = max((i for i, c in enumerate(candidates) if predict(c, footprint) <= budget), default=0)
    if i not in status:
        probe(i, footprint)
    if status[i] == "ok":
        while i + 1 < len(candidates) and (status.get(i + 1) or probe(i + 1, footprint)[0]) == "ok":
            i += 1
    else:
        while status.get(i) != "ok":
            i -= 1
            if i not in status:
                probe(i, footprint)
    return candidates[i], probes


def suite_for(base: Suite, c: Config, method: Method, dataset: str) -> Suite:
    """The in-memory suite of one probe: STEPS steps of the configuration, one epoch, a test set
    of one batch (evaluation's own peak is part of training's)."""
    hyper = {**base.hyper, "epochs": 1, "batch_size": c.batch, "context": c.context,
             "train_samples": c.batch * STEPS, "test_samples": c.batch, "optimizer": method.optimizer,
             "checkpointing": method.checkpointing, "warmup_steps": 1, **method.zo}
    return dataclasses.replace(base, methods=[method.choice], runtimes=base.runtimes[:1], precisions=[method.precision],
                               workload={"model": c.model.name, "dataset": dataset}, hyper=hyper, repeats=1)


class Stopped(Exception):
    """A signal stopped the search: the probe in progress was killed, nothing is concluded."""


def run(store: Store, target: Target, candidates: list[Config], method: Method, budget: int, *,
        vary: str = "model", dataset: str = "fortunes", runtime: str = "torch", timeout_s: float = 900.0,
        seed: int = 0, stop: Stop | None = None):
    """Search candidates on target under budget; returns (largest Config or None, probes, run id).
    The run's plan grows by one job per probe, so its results are exactly the probes made. A
    Stop (set by a signal) kills the probe running and raises Stopped."""
    check_dataset(dataset)
    limit = f"{-(-budget // 1024)}K"
    base = Suite("fit", paths.SUITES_DIR / "fit", runtimes=[runtime], seed=seed, timeout_s=timeout_s)
    meta = {"vary": vary, "family": candidates[0].model.family, "method": str(method.choice), "optimizer": method.optimizer,
            "precision": method.precision,
            "checkpointing": method.checkpointing, "budget_bytes": budget, "target": target.name,
            "dataset": dataset, "runtime": runtime}
    run_id = store.new_run(runs.record(suite="fit", fit=meta, jobs=[]))

    def predict(c: Config, footprint: int) -> int:
        return method.model_bytes(c) + footprint

    def probe(c: Config, predicted: int) -> tuple[Probe, int]:
        jobs, _ = plan.make(suite_for(base, c, method, dataset), [target])
        job = dataclasses.replace(jobs[0], mem_limit=limit)
        job.job_id = job.spec["job_id"] = runs.safe_name(f"fit.{c.label}.{job.job_id}")
        store.extend_plan(run_id, [job.to_dict()])
        with ProgressView({target.name: 1}) as view:
            done = execute(store, run_id, [job], {target.name: target}, prepare([job], {target.name: target}), view, stop)
        if stop is not None and stop.is_set():
            raise Stopped(f"fit run {run_id}: {stop.reason} during probe {job.job_id}, its runner killed; "
                          f"nothing is concluded from a search cut short: run it again")
        (result,) = done
        mem = result.get("memory") or {}
        if "device_peak_bytes" in mem:
            # on a GPU the cap is the allocator's, which holds tensors alone (the model's parts):
            # no footprint to add, and the peak is the tensors'
            return Probe(c, predicted, job.job_id, result["status"], mem["device_peak_bytes"], result.get("error")), 0
        return (Probe(c, predicted, job.job_id, result["status"], mem.get("peak_rss_bytes"), result.get("error")),
                mem.get("loaded_rss_bytes") or mem.get("baseline_rss_bytes") or 0)

    best, probes = search(candidates, budget, predict, probe)
    return best, probes, run_id


def check_dataset(name: str) -> None:
    if not datasets.is_text(name):
        raise UserError(f"fit --dataset {name}: expected a text data set "
                        f"({', '.join(d for d in datasets.DATASETS if datasets.is_text(d))})")


def parse_budget(text: str) -> int:
    """A budget is written as a target's mem_limit is ("512M", "2G"): one rule for both."""
    if not MEM_LIMIT.match(text):
        raise UserError(f"fit --budget {text!r}: expected a size above zero like 512M or 2G")
    return parse_size(text)
