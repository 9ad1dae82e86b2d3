"""Suites: named experiment plans (workloads/suites/*.toml)."""
from __future__ import annotations

import re

from dataclasses import dataclass, field
from pathlib import Path

from workloads import vocab
from workloads.models import MODELS, Transformer
from workloads.spec import Bounds, Hyper, JobSpec, SpecError, Workload, check_value

from harness import paths, tomlfile
from harness.errors import UserError
from harness.planning.inventory import MEM_LIMIT

# A job's timeout, from a suite or --timeout: positive, and at most 30 days (a finite deadline)
TIMEOUT_S = Bounds(0, 30 * 86400, open_lo=True)
LEASE_TIMEOUT_S = Bounds(0, 30 * 86400)       # 0: a job does not wait for a board another run holds
REPEATS = Bounds(1, 1000)


@dataclass
class MethodChoice:
    method: str
    bp_layers: int = 0

    @classmethod
    def parse(cls, text: str) -> "MethodChoice":
        """'full-zo', 'elastic-zo:1' -> method and bp_layers (ValueError if malformed)."""
        method, _, k = text.partition(":")
        if method not in vocab.METHODS:
            raise ValueError(f"expected one of {', '.join(vocab.METHODS)} (elastic-zo:K for bp_layers K)")
        if method == "elastic-zo":
            if not k.isdigit() or int(k) < 1:
                raise ValueError("expected elastic-zo:K with K >= 1 BP layers, e.g. elastic-zo:1")
            return cls(method, int(k))
        if k:
            raise ValueError(f"only elastic-zo takes :K, got {text!r}")
        return cls(method)

    def __str__(self) -> str:
        return vocab.method_choice(self.method, self.bp_layers)


@dataclass
class Pretrain:
    """A suite's first stage: per precision and data set one job whose final weights every
    fine-tuning job of that precision and data set starts from (the ElasticZO paper's Table 2
    pretrains once with BP, then fine-tunes with each method on shifted data)."""
    target: str = "local"           # where it runs: the host by default, or a named target
    runtime: str = "torch"
    method: MethodChoice = field(default_factory=lambda: MethodChoice("full-bp"))
    rotate: float = 0.0             # the data it learns: the data set unrotated, by default
    dataset: str = ""               # ... or another data set: "" = the fine-tuning jobs' own; a
                                    # transformer fine-tuned on fortunes-topics learns fortunes first
    hyper: dict = field(default_factory=dict)   # precision -> its hyper, over the suite's [hyper] and --set


@dataclass
class EqualMemory:
    """Katti et al.'s Fig. 4: under one memory budget each method trains the largest model of a
    family that fits it (models[method], else what zobench fit finds on the suite's target when
    the run starts), every job under that budget, for the same hyper.max_train_seconds."""
    budget: str                     # as a target's mem_limit is written: "700M", "2G"
    family: str = "gpt2"
    models: dict = field(default_factory=dict)      # method as the suite writes it -> model name


@dataclass
class Suite:
    name: str
    path: Path
    description: str = ""
    targets: list = field(default_factory=lambda: ["local"])
    runtimes: list = field(default_factory=lambda: ["torch"])
    precisions: list = field(default_factory=lambda: ["fp32"])
    zo_losses: list = field(default_factory=lambda: ["float"])
    methods: list = field(default_factory=list)
    repeats: int = 1
    seed: int = 0
    timeout_s: float = 1800.0
    workload: dict = field(default_factory=dict)
    hyper: dict = field(default_factory=dict)        # [hyper]'s own keys: every job's
    # [hyper.SCOPE] tables over them: a precision (fp32, int8, or int8-float / int8-integer for
    # INT8 / INT8*), a method as the suite writes it or its name for every K, or a method's
    # precision ([hyper."full-zo".fp32]): the paper tunes its learning rates per method
    # (Sec. 5.1.1). Scope -> its hyper; hyper_for applies them.
    scoped: dict = field(default_factory=dict)
    # the data each job learns, one job per (data set, angle); [] = the workload's own
    datasets: list = field(default_factory=list)
    rotations: list = field(default_factory=list)
    pretrain: Pretrain | None = None
    equal_memory: EqualMemory | None = None
    # [optimizers]: name -> the hyper of one ZO optimizer (its parts, docs/zo-optimizers.md, and
    # what is tuned for it, lr_zo above all), with a table per method where a method needs its
    # own value (momentum = { ..., lr_zo = 3e-4, "elastic-zo:1" = { lr_zo = 1e-4 } }: a rate
    # tuned on Full ZO need not hold for ElasticZO). Every method with a ZO part runs once per
    # optimizer, over hyper_for's hyper; full-bp once. {}: the suite's hyper alone, as before.
    optimizers: dict = field(default_factory=dict)

    def optimizers_for(self, method: MethodChoice) -> list[tuple[str, dict]]:
        """(name, hyper) of each optimizer a method runs with: one unnamed without [optimizers] or
        for full-bp, which has no ZO part."""
        if not self.optimizers or method.method == "full-bp":
            return [("", {})]
        return [(name, self.optimizer_hyper(name, method)) for name in self.optimizers]

    def optimizer_hyper(self, name: str, method: MethodChoice) -> dict:
        """An optimizer's hyper for one method: its own keys, then its table for the method's
        name, then for the method with its K (elastic-zo, then elastic-zo:1)."""
        table = self.optimizers.get(name, {})
        out = {k: v for k, v in table.items() if not isinstance(v, dict)}
        for scope in dict.fromkeys([method.method, str(method)]):
            out.update(table.get(scope, {}))
        return out

    def hyper_for(self, method: MethodChoice, precision: str, zo_loss: str = "float", dataset: str = "") -> dict:
        """A job's hyperparameters from the suite: [hyper], then its precision's table (int8
        before int8-float), then its method's (the name before the name with :K), each with
        its precision's table inside, the more specific one winning; then the same tables inside
        its data set's ([hyper.mnist."full-zo".fp32]: the paper tunes "for each model and
        dataset"), over all of those (--set goes over all)."""
        precisions = dict.fromkeys([precision, vocab.precision_key(precision, zo_loss, method.method)])
        general = [*precisions, *(scope for m in dict.fromkeys([method.method, str(method)])
                                  for scope in (m, *(f"{m}.{p}" for p in precisions)))]
        scopes = general + ([dataset, *(f"{dataset}.{scope}" for scope in general)] if dataset else [])
        out = dict(self.hyper)
        for scope in scopes:
            out.update(self.scoped.get(scope, {}))
        return out

    def data_sets(self) -> list[tuple[str, float]]:
        """(data set, rotation) of every group of jobs, in the suite's order."""
        return [(d, float(r)) for d in self.datasets or [self.workload.get("dataset", Workload.dataset)]
                for r in self.rotations or [self.workload.get("rotate", 0.0)]]


def names() -> list[str]:
    return sorted(p.stem for p in paths.SUITES_DIR.glob("*.toml"))


def find(name_or_path: str) -> Path:
    p = Path(name_or_path)
    if p.suffix == ".toml" or "/" in name_or_path:
        if not p.is_file():
            raise UserError(f"suite file {name_or_path}: no such file")
        return p
    p = paths.SUITES_DIR / f"{name_or_path}.toml"
    if not p.is_file():
        raise UserError(f"unknown suite {name_or_path!r}; expected one of {', '.join(names())} or a .toml path")
    return p


def load(name_or_path: str) -> Suite:
    path = find(name_or_path)
    t = tomlfile.Table(tomlfile.load(path), path)
    s = Suite(name=path.stem, path=path)
    s.description = t.take("description", str, default="")
    s.targets = t.take("targets", list, default=s.targets, item=str)
    s.runtimes = t.take("runtimes", list, default=s.runtimes, choices=vocab.RUNTIMES, item=str)
    s.precisions = t.take("precisions", list, default=s.precisions, choices=vocab.PRECISIONS, item=str)
    s.zo_losses = t.take("zo_losses", list, default=s.zo_losses, choices=vocab.ZO_LOSSES, item=str)
    raw_methods = t.take("methods", list, default=..., item=str)
    s.repeats = t.take("repeats", int, default=1, bounds=REPEATS)
    s.seed = t.take("seed", int, default=0, bounds=JobSpec.BOUNDS["seed"])
    s.timeout_s = t.take("timeout_s", float, default=s.timeout_s, bounds=TIMEOUT_S)
    s.workload = t.take("workload", dict, default={})
    s.hyper = t.take("hyper", dict, default={})
    s.hyper, s.scoped = {k: v for k, v in s.hyper.items() if not isinstance(v, dict)}, \
        _scopes({k: v for k, v in s.hyper.items() if isinstance(v, dict)})
    s.datasets = t.take("datasets", list, default=[], item=str)
    s.rotations = t.take("rotations", list, default=[])
    pretrain = t.take("pretrain", dict, default=None)
    equal = t.take("equal_memory", dict, default=None)
    s.optimizers = t.take("optimizers", dict, default={})
    t.done()
    for name, table in s.optimizers.items():
        if not re.fullmatch(r"[a-z0-9][a-z0-9_-]{0,31}", name):
            raise t.error(f"optimizers.{name}", "expected a name of up to 32 lowercase letters, digits, '-' and '_' "
                                                "(it is in the jobs' ids)")
        if not isinstance(table, dict):
            raise t.error(f"optimizers.{name}", f"expected a table of hyperparameters, got {table!r}")
    if any(isinstance(r, bool) or not isinstance(r, (int, float)) for r in s.rotations):
        raise t.error("rotations", f"expected a list of angles in degrees, got {s.rotations!r}")
    for key, listing in (("dataset", "datasets"), ("rotate", "rotations")):
        if getattr(s, listing) and key in s.workload:    # one home for what each job learns
            raise t.error(f"workload.{key}", f"the suite has a {listing} list too; give one of the two")
    if pretrain is not None:
        s.pretrain = _pretrain(tomlfile.Table(pretrain, path, "pretrain."))
    for m in raw_methods:
        try:
            s.methods.append(MethodChoice.parse(m))
        except ValueError as e:
            raise t.error("methods", f"{e}, got {m!r}") from None
    zo_methods = [m for c in s.methods if c.method != "full-bp" for m in (str(c), c.method)]
    for name, table in s.optimizers.items():
        for scope in (k for k, v in table.items() if isinstance(v, dict)):
            if scope not in zo_methods:
                raise t.error(f"optimizers.{name}.{scope_name(scope)}", "expected a hyperparameter or a method of "
                              f"the suite with a ZO part ({', '.join(dict.fromkeys(zo_methods)) or 'none'})")
    if equal is not None:
        s.equal_memory = _equal_memory(tomlfile.Table(equal, path, "equal_memory."), s)
        if "model" in s.workload:       # one home for each job's model
            raise t.error("workload.model", "an equal_memory suite gives each method its model "
                                            "(equal_memory.models, or zobench fit's answer); leave it out")
        if len(s.targets) != 1:
            raise t.error("targets", "an equal_memory suite fits its models to one target; expected one")
    for key, values in (("methods", [str(m) for m in s.methods]), ("targets", s.targets),
                        ("runtimes", s.runtimes), ("precisions", s.precisions), ("zo_losses", s.zo_losses),
                        ("datasets", s.datasets), ("rotations", [float(r) for r in s.rotations])):
        if not values and key not in ("datasets", "rotations"):     # those two are optional
            raise t.error(key, "expected a non-empty list")
        twice = next((v for i, v in enumerate(values) if v in values[:i]), None)
        if twice is not None:   # two jobs of one id would share a result file
            raise t.error(key, f"expected each value once, got {twice!r} twice")
    try:
        for k, v in s.workload.items():
            check_value(Workload, k, v, "workload.")
        for key, listing in (("dataset", "datasets"), ("rotate", "rotations")):
            for v in getattr(s, listing):
                check_value(Workload, key, v, f"{listing}: ")
        for k, v in s.hyper.items():
            check_value(Hyper, k, v, "hyper.")
        for scope, hyper in s.scoped.items():
            for k, v in hyper.items():
                check_value(Hyper, k, v, f"hyper.{scope_name(scope)}.")
        for name, table in s.optimizers.items():
            for scope, hyper in [("", table), *((f"{scope_name(k)}.", v) for k, v in table.items() if isinstance(v, dict))]:
                for k, v in hyper.items():
                    if not isinstance(v, dict):
                        check_value(Hyper, k, v, f"optimizers.{name}.{scope}")
        for precision, hyper in (s.pretrain.hyper.items() if s.pretrain else ()):
            for k, v in hyper.items():
                check_value(Hyper, k, v, f"pretrain.{precision}.")
    except SpecError as e:
        raise UserError(f"{path}: {e}") from None
    _check_scopes(s, t)
    return s


# the precision scopes of [hyper]: a precision, or INT8's with its ZO loss (vocab.precision_key)
PRECISION_SCOPES = (*vocab.PRECISIONS, *(f"int8-{z}" for z in vocab.ZO_LOSSES))


def _scopes(tables: dict, prefix: str = "") -> dict:
    """[hyper]'s tables flattened to scope -> hyper: "fp32", "full-zo", "elastic-zo:1.int8",
    "mnist.full-zo.fp32"."""
    out = {}
    for name, table in tables.items():
        out[prefix + name] = {k: v for k, v in table.items() if not isinstance(v, dict)}
        out.update(_scopes({k: v for k, v in table.items() if isinstance(v, dict)}, f"{prefix}{name}."))
    return out


def scope_name(scope: str) -> str:
    """A scope as TOML writes its table's name: hyper.mnist."elastic-zo:1".fp32 (a name that is
    not a bare key quoted)."""
    return ".".join(part if re.fullmatch(r"[A-Za-z0-9_-]+", part) else f'"{part}"' for part in scope.split("."))


def _check_scopes(s: Suite, t: tomlfile.Table) -> None:
    """Every scope names a precision or a method of the suite, and a method's inner table one of
    the suite's precisions, each maybe inside one of its data sets' tables: a misspelt scope
    would otherwise set nothing, silently."""
    methods = [str(m) for m in s.methods] + [m.method for m in s.methods]
    precisions = [p for p in PRECISION_SCOPES if p.split("-")[0] in s.precisions]
    data = list(dict.fromkeys(d for d, _ in s.data_sets()))
    for scope in s.scoped:
        outer, _, rest = scope.partition(".")
        inside = outer in data          # a data set's table: the same tables inside it
        if inside and not rest:
            continue
        head, _, tail = (rest if inside else scope).partition(".")
        at = f"{outer}.{head}" if inside else head
        if not tail and head in PRECISION_SCOPES:
            if head not in precisions:
                raise t.error(f"hyper.{scope_name(at)}", f"the suite trains {', '.join(s.precisions)} only")
            continue
        if head not in methods:
            raise t.error(f"hyper.{scope_name(at)}", "expected a hyperparameter, a precision "
                          f"({', '.join(precisions)}), a method of the suite ({', '.join(dict.fromkeys(methods))})"
                          + ("" if inside else f" or one of its data sets ({', '.join(data)})"))
        if tail and tail not in precisions:
            raise t.error(f"hyper.{scope_name(scope)}", f"expected a precision of the suite ({', '.join(precisions)}) "
                          "or a hyperparameter")


def _pretrain(t: tomlfile.Table) -> Pretrain:
    p = Pretrain()
    p.target = t.take("target", str, default=p.target)
    p.runtime = t.take("runtime", str, default=p.runtime, choices=vocab.RUNTIMES)
    method = t.take("method", str, default=str(p.method))
    p.rotate = t.take("rotate", float, default=p.rotate)
    p.dataset = t.take("dataset", str, default=p.dataset)
    for precision in vocab.PRECISIONS:
        p.hyper[precision] = t.take(precision, dict, default={})
    t.done()
    try:
        p.method = MethodChoice.parse(method)
    except ValueError as e:
        raise t.error("method", f"{e}, got {method!r}") from None
    return p


def _equal_memory(t: tomlfile.Table, suite: Suite) -> EqualMemory:
    families = sorted({m.family for m in MODELS.values() if isinstance(m, Transformer)})
    e = EqualMemory(t.take("budget", str, default=...))
    e.family = t.take("family", str, default=e.family, choices=families)
    e.models = t.take("models", dict, default={})
    t.done()
    if not MEM_LIMIT.match(e.budget):
        raise t.error("budget", f"expected a size above zero like \"512M\" or \"2G\", got {e.budget!r}")
    ladder = [n for n, m in MODELS.items() if isinstance(m, Transformer) and m.family == e.family]
    for method, name in e.models.items():
        if method not in [str(m) for m in suite.methods]:
            raise t.error(f"models.{method}", f"not a method of the suite ({', '.join(map(str, suite.methods))})")
        if name not in ladder:
            raise t.error(f"models.{method}", f"expected a {e.family} model, one of {', '.join(ladder)}; got {name!r}")
    return e
