"""The job spec a runner receives (spec.json), with validation that names the key.

The harness builds specs from suite TOML and `--set`, and validates them with
the same code before anything is launched, so a typo is reported once, on the
host, with the file and key -- never as a failed job on a board.
"""
from __future__ import annotations

import dataclasses
import functools
import json
import math
import re
import typing
from dataclasses import dataclass, field

from . import vocab, zrng
from .datasets import DATASETS
from . import models
from .models import MODELS, Model, ModelError, Transformer


class SpecError(ValueError):
    """A spec value is missing, unknown or of the wrong type; the message names the key."""


# A name that becomes part of a path on the host or a board (target, job): never "..", "/" or a space.
NAME = r"[A-Za-z0-9][A-Za-z0-9_.-]{0,63}"
NAME_TEXT = "up to 64 letters, digits, '.', '_' and '-', starting with a letter or digit"
INT32_MAX = 2**31 - 1     # the C++ binary reads its integers as int
# why an INT8 job's hyper.optimizer is sgd: the spec's refusal and the plan's note say it
# why half precision is refused where it is (support.unsupported says the same)
HALF_LAYERS = "half precision trains the transformers; a layer model trains in fp32 or int8"
FP16_RMSNORM = ("a llama's RMSNorm backward overflows fp16 (rsqrt's derivative at a small mean square passes "
                "65,504, whatever the loss scale): train it in bf16, or full-zo, which has no backward")
HALF_ZO_PARTS = "half precision trains the ZO part by MeZO's step alone (docs/transformers.md)"
ADAM_INT8 = "adam trains FP32 only; INT8 trains its BP part with NITI's integer update (docs/int8.md)"
# The hyperparameters that make the ZO part (docs/zo-optimizers.md): each is MeZO's at its default.
ZO_PART_FIELDS = ("zo_estimator", "zo_queries", "zo_update", "zo_momentum", "zo_sparsity", "zo_layers",
                  "zo_mask_fraction", "zo_mask_every", "zo_mask_draw", "zo_distribution", "weight_decay")
# why conservative takes no weight decay: the spec's refusal and the binary's say it
CONSERVATIVE_DECAY = ("conservative keeps the best of θ and θ ± lr d on the batch, and no peer decays it "
                      "(ZO-Bench's conservative runs set weight_decay 0): give it weight_decay = 0")
INT8_ZO_PARTS = ("INT8 trains its ZO part by Alg. 2, the sign of the two-point loss difference (docs/int8.md): "
                 "the other estimators and update rules are FP32's")


@dataclass(frozen=True)
class Bounds:
    """The values a number may take: finite, from lo (excluded when open_lo) up to hi (excluded
    when open_hi). Suites, --set, inventories and command-line options all check their numbers
    with it, so every range has one home and every refusal one shape."""
    lo: float | None = None
    hi: float | None = None
    open_lo: bool = False
    open_hi: bool = False

    def problem(self, value) -> str | None:
        """'expected ..., got ...' when value is not finite or out of bounds, else None."""
        if isinstance(value, float) and not math.isfinite(value):
            return f"expected a finite number, got {value!r}"
        low = self.lo is not None and (value <= self.lo if self.open_lo else value < self.lo)
        high = self.hi is not None and (value >= self.hi if self.open_hi else value > self.hi)
        if low or high:
            return f"expected {self}, got {value!r}"
        return None

    def __str__(self) -> str:
        num = lambda x: f"{x:g}" if isinstance(x, float) else str(x)
        parts = ([f"{'>' if self.open_lo else '>='} {num(self.lo)}"] if self.lo is not None else []) + \
            ([f"{'<' if self.open_hi else '<='} {num(self.hi)}"] if self.hi is not None else [])
        return "a value " + " and ".join(parts) if parts else "a finite number"


@dataclass
class Hyper:
    epochs: int = 5
    batch_size: int = 32
    lr_bp: float = 0.05           # learning rate of the BP part (SGD's, or Adam's)
    lr_zo: float = 1e-3           # SGD learning rate of the ZO part
    lr_decay: float = 0.8         # multiply both rates by this ...
    lr_decay_every: int = 10      # ... every this many epochs (ElasticZO Sec. 5.1.1)
    eps: float = 1e-3             # SPSA perturbation scale
    # the BP part's optimizer (methods.adam_update): Adam keeps 2 values per BP-trained parameter
    # (the memory model's Eq. 5); FP32 only, and a no-op choice for full-zo, which has no BP part
    optimizer: str = "sgd"
    adam_beta1: float = 0.9
    adam_beta2: float = 0.999
    adam_eps: float = 1e-8
    zo_grad_clip: float = 5.0     # projected gradient clipped to +-this
    # The ZO part as parts (docs/zo-optimizers.md): its estimator, the directions a step averages
    # (q-query SPSA: 2q forwards a step, q + 1 one-sided; the rate is split among them), and its
    # update rule (vocab.ZO_ESTIMATORS, vocab.ZO_UPDATES). The defaults are MeZO's step. FP32 only:
    # INT8's ZO step is Alg. 2's, the sign of the loss difference already.
    zo_estimator: str = "two-point"
    zo_queries: int = 1
    zo_update: str = "sgd"
    zo_momentum: float = 0.9      # zo_update momentum: m = zo_momentum m + d (adam takes adam_beta1, _beta2, _eps)
    # which ZO parameters a step perturbs and updates (vocab.ZO_SPARSITIES): all; zo_layers of the
    # ZO part's units drawn each step (LeZO); or each ZO tensor's zo_mask_fraction of smallest
    # |weights|, the mask recomputed every zo_mask_every steps (Sparse MeZO); or a random mask of
    # that fraction, redrawn every zo_mask_every steps (ZO-Bench's), drawn zo_mask_draw's way
    zo_sparsity: str = "all"
    zo_layers: int = 1
    zo_mask_fraction: float = 0.25
    zo_mask_every: int = 50
    zo_mask_draw: str = "zo-bench"
    # z's distribution (vocab.ZO_DISTRIBUTIONS): zobench-z's Irwin-Hall, or a Gaussian table of it
    # (MeZO's and ZO-Bench's torch.normal), both from the same 32 bits (docs/zrng.md)
    zo_distribution: str = "irwin-hall"
    # weight decay of the ZO part's weights (not its biases or norms: models.decayed), as the peers
    # apply it: coupled, theta -= lr (d + weight_decay theta), for sgd, sign and momentum (MeZO's
    # step, torch.optim's SGD); decoupled, theta *= 1 - lr weight_decay, for adam (AdamW). The BP
    # part takes none (docs/zo-optimizers.md)
    weight_decay: float = 0.0
    train_samples: int = 0        # first N training samples (0 = all)
    test_samples: int = 0         # first N test samples (0 = all)
    zo_scale: int = 8             # int8: the perturbation z is uniform on [-zo_scale, zo_scale]
    trace_steps: int = 0          # record losses and projected gradient of the first N steps
    points: int = 0               # point-cloud models: points per cloud (0 = the model's, 1,024 for PointNet)
    context: int = 0              # transformers: tokens per sequence (0 = the model's context)
    # transformers: the BP part keeps only each block's input and recomputes the block's
    # activations during backward (per-block activation checkpointing)
    checkpointing: bool = False
    # transformers: tokens the LM head and its cross-entropy take at a time, so that a step never
    # holds more than one chunk's logits (models.Transformer.loss_chunk): 0 = Liger Kernel's rule,
    # a chunk's logits about the batch's hidden states; -1 = the logits whole, as before
    # (docs/transformers.md, "The loss in chunks")
    loss_chunk: int = 0
    # stop at the first step boundary where the timed training reaches this many seconds (0 = no
    # limit): the epoch in progress is evaluated and recorded with the steps it made, and no other
    # starts. Methods then get the same wall-clock time, not the same steps (Katti et al. Fig. 4)
    max_train_seconds: float = 0.0
    warmup_steps: int = -1        # untimed steps before training, weights restored after (-1 = the device's default)
    fault: str = ""               # test-only fault injection: KIND[@METHOD_KEY], KIND in hang, crash, oom
    inject_slowdown: float = 0.0  # test-only: busy-wait this fraction of every step (0.2 = 20% slower)
    inject_work: float = 0.0      # test-only: this fraction more steps, on a restored state (0.2 = 20% more work)

    # The fields the C++ binary does not take (its list: ZOBENCH_HYPER in workloads/cpp/common.hpp,
    # held equal to the other fields by tests/test_cpp.py), and why.
    CPP_LEAVES: typing.ClassVar[dict] = {
        "context": "transformers only, which the binary does not run (support.cpp_refuses)",
        "checkpointing": "transformers only, which the binary does not run (support.cpp_refuses)",
        "loss_chunk": "transformers only, which the binary does not run (support.cpp_refuses)"}
    # Defaults that are placeholders the host resolves before any runner sees the spec (-1 = the
    # device's default), so a runner's own default for them may differ.
    RESOLVED_BY_HOST: typing.ClassVar[tuple] = ("warmup_steps",)
    PATTERNS: typing.ClassVar[dict] = {
        "fault": (r"((hang|crash|oom)(@[a-z0-9-]+)?)?", "a fault like \"hang\" or \"crash@full-zo\"")}
    CHOICES: typing.ClassVar[dict] = {"optimizer": ("sgd", "adam"), "zo_estimator": vocab.ZO_ESTIMATORS,
                                      "zo_update": vocab.ZO_UPDATES, "zo_sparsity": vocab.ZO_SPARSITIES,
                                      "zo_mask_draw": vocab.ZO_MASK_DRAWS, "zo_distribution": vocab.ZO_DISTRIBUTIONS}
    # Every runtime takes every value in these bounds. epochs: epochs x steps fit the binary's int;
    # zo_scale: the int8 perturbation z in [-zo_scale, zo_scale] fits an int8. The data set's size
    # bounds train_samples, test_samples and batch_size too: the plan checks those (plan.check_data).
    BOUNDS: typing.ClassVar[dict] = {
        "epochs": Bounds(1, 10_000), "batch_size": Bounds(1, INT32_MAX), "lr_bp": Bounds(0), "lr_zo": Bounds(0),
        "lr_decay": Bounds(0, 1.0, open_lo=True), "lr_decay_every": Bounds(1, INT32_MAX),
        "eps": Bounds(0, open_lo=True), "zo_grad_clip": Bounds(0), "train_samples": Bounds(0, INT32_MAX),
        "test_samples": Bounds(0, INT32_MAX), "zo_scale": Bounds(1, 127), "trace_steps": Bounds(0, INT32_MAX),
        "points": Bounds(0, 1 << 16), "context": Bounds(0, 1 << 20), "loss_chunk": Bounds(-1, INT32_MAX),
        "inject_slowdown": Bounds(0), "inject_work": Bounds(0, 100),
        "max_train_seconds": Bounds(0),
        "adam_beta1": Bounds(0, 1.0, open_hi=True), "adam_beta2": Bounds(0, 1.0, open_hi=True),
        "adam_eps": Bounds(0, open_lo=True),
        "warmup_steps": Bounds(-1, 10_000), "zo_queries": Bounds(1, zrng.MAX_QUERIES),
        "zo_momentum": Bounds(0, 1.0, open_hi=True), "zo_layers": Bounds(1, INT32_MAX),
        "zo_mask_fraction": Bounds(0, 1.0, open_lo=True), "zo_mask_every": Bounds(1, INT32_MAX),
        "weight_decay": Bounds(0)}

    def idle(self, method: str) -> list[str]:
        """The settings given away from their defaults that change nothing for a job of `method`,
        each with why ("zo_mask_fraction: no mask (zo_sparsity is all)"): a part's constant
        without its part, a ZO part for full-bp, Adam's constants without Adam."""
        default = Hyper()
        zo = method != "full-bp"
        off = {"zo_momentum": "zo_update is not momentum" if self.zo_update != "momentum" else "",
               "zo_layers": f"zo_sparsity is {self.zo_sparsity}, not layers" if self.zo_sparsity != "layers" else "",
               "zo_mask_fraction": f"no mask (zo_sparsity is {self.zo_sparsity})" if self.zo_sparsity not in vocab.ZO_MASKS else "",
               "zo_mask_every": f"no mask (zo_sparsity is {self.zo_sparsity})" if self.zo_sparsity not in vocab.ZO_MASKS else "",
               "zo_mask_draw": f"zo_sparsity is {self.zo_sparsity}, not random" if self.zo_sparsity != "random" else ""}
        adam = self.zo_update == "adam" and zo or self.optimizer == "adam" and method != "full-zo"
        off.update(dict.fromkeys(("adam_beta1", "adam_beta2", "adam_eps"), "" if adam else "no part of it trains by Adam"))
        if not zo:
            off.update(dict.fromkeys(ZO_PART_FIELDS, "full-bp has no ZO part"))
        return [f"{k}: {why}" for k, why in off.items() if why and getattr(self, k) != getattr(default, k)]

    def zo_parts(self, method: str = "full-zo") -> str:
        """The ZO parts of a job of `method` that are not MeZO's, as words ("one-sided q=4
        momentum=0.9 layers=2"); "" for MeZO's step, and for full-bp, which has no ZO part. A
        part's own constant is named with it (a momentum's β, the layers a step, the mask's
        fraction and period), and only there: it changes nothing without its part."""
        if method == "full-bp":
            return ""
        words = ["gaussian" if self.zo_distribution == "gaussian" else "",
                 self.zo_estimator if self.zo_estimator != vocab.ZO_ESTIMATORS[0] else "",
                 f"q={self.zo_queries}" if self.zo_queries != 1 else "",
                 {"sgd": "", "momentum": f"momentum={self.zo_momentum:g}"}.get(self.zo_update, self.zo_update),
                 {"all": "", "layers": f"layers={self.zo_layers}",
                  "magnitude": f"mask={self.zo_mask_fraction:g}/{self.zo_mask_every}",
                  "random": f"random={self.zo_mask_fraction:g}/{self.zo_mask_every}"
                            + (" exact" if self.zo_mask_draw == "exact" else "")}[self.zo_sparsity],
                 f"wd={self.weight_decay:g}" if self.weight_decay else ""]
        return " ".join(filter(None, words))


@dataclass
class Workload:
    model: str = "lenet5"
    dataset: str = "fashion-mnist"
    data_dir: str = ""            # searched before $ZOBENCH_DATA and /usr/share/datasets
    # the network as data (models.Model.to_dict()); empty = models.MODELS[model]. The harness
    # always fills it, so a runner (the C++ binary too) executes the description it is given.
    architecture: dict = field(default_factory=dict)
    # the images of train and test turned by this many degrees counter-clockwise (Rotated MNIST):
    # the host rotates them once and every runtime reads those files (docs/datasets.md)
    rotate: float = 0.0
    # hold out this many training samples (drawn with zobench-z, zrng.holdout): the job trains on
    # the rest and is evaluated on them in place of the test set. The host splits the files once
    # and every runtime reads them (docs/datasets.md); zobench tune scores its trials so.
    validation: int = 0
    # train on this many training samples and test on as many test samples, each drawn at random
    # (zobench-z, zrng.holdout) before any validation split: the ElasticZO paper's fine-tuning
    # data ("we randomly choose N images from train and test splits"). Drawn by the host once, the
    # same for every angle and runtime (docs/datasets.md); 0 = the whole splits.
    subset: int = 0

    CHOICES: typing.ClassVar[dict] = {"dataset": DATASETS}
    BOUNDS: typing.ClassVar[dict] = {"rotate": Bounds(-360.0, 360.0), "validation": Bounds(0, INT32_MAX),
                                     "subset": Bounds(0, INT32_MAX)}

    def resolve(self) -> Model | Transformer:
        """The model this workload trains; SpecError names what is wrong with it."""
        if not self.architecture:
            if self.model not in MODELS:
                raise SpecError(f"workload.model: expected one of {', '.join(map(repr, MODELS))} "
                                f"(or an architecture), got {self.model!r}")
            return MODELS[self.model]
        try:
            m = models.from_dict(self.architecture)
        except ModelError as e:
            raise SpecError(f"workload.architecture: {e}") from None
        if m.name != self.model:
            raise SpecError(f"workload.architecture: describes {m.name!r}, not workload.model {self.model!r}")
        return m


@dataclass
class JobSpec:
    job_id: str
    method: str
    runtime: str = "torch"
    bp_layers: int = 0
    precision: str = "fp32"
    zo_loss: str = "float"
    device: str = "cpu"
    seed: int = 0
    threads: int = 0              # 0 = the runtime's default
    workload: Workload = field(default_factory=Workload)
    hyper: Hyper = field(default_factory=Hyper)
    init_weights: str = ""        # optional weights file to start from (fp32: models.weights_bytes, int8: int8.weights_bytes)
    save_weights: bool = False    # write the final weights beside the result (vocab.WEIGHTS_FILE)
    # evaluate the starting weights (after warm-up, untimed) into the result's start_eval: a
    # fine-tuning job's accuracy without fine-tuning
    eval_start: bool = False
    # fine-tuning: the job of the run whose final weights this one starts from, and their sha256
    # (the harness sets init_weights to that file on the target and checks the runner started from it)
    pretrained_from: str = ""
    init_sha256: str = ""
    onnx_model: str = ""          # ort runtime: the exported graph of the ZO front (onnx_export.py)
    # a GPU job: the bytes its tensors may take on the device (its target's mem_limit, or a fit
    # probe's budget), where the torch runner caps its caching allocator; 0: the whole device
    device_mem_limit: int = 0
    target: str = ""              # set by the harness: where the job ran
    repeat: int = 0               # set by the harness: index of this repeat
    harness_commit: str = ""

    CHOICES: typing.ClassVar[dict] = {
        "method": vocab.METHODS, "runtime": vocab.RUNTIMES, "precision": vocab.PRECISIONS,
        "zo_loss": vocab.ZO_LOSSES, "device": vocab.DEVICES}
    # job ids name folders on the host and the boards: the plan's target.runtime.method.precision.rN
    PATTERNS: typing.ClassVar[dict] = {"job_id": (r"[A-Za-z0-9][A-Za-z0-9_.-]{0,127}", "a job id of letters, "
                                                  "digits, '.', '_' and '-'"),
                                       "target": (f"({NAME})?", f"a target name of {NAME_TEXT}"),
                                       "pretrained_from": (r"([A-Za-z0-9][A-Za-z0-9_.-]{0,127})?", "a job id"),
                                       "init_sha256": (r"([0-9a-f]{64})?", "a sha256 in hex")}
    # seed: zobench-z's 64-bit key; threads: a thread count every runtime accepts
    BOUNDS: typing.ClassVar[dict] = {"bp_layers": Bounds(0, INT32_MAX), "seed": Bounds(0, 2**64 - 1),
                                     "threads": Bounds(0, 1024), "repeat": Bounds(0), "device_mem_limit": Bounds(0)}

    def to_dict(self) -> dict:
        return dataclasses.asdict(self)

    def model(self) -> Model | Transformer:
        """The network this job runs, on the spec's number of points for a point-cloud model."""
        m = self.workload.resolve()
        return m.with_points(self.hyper.points) if m.points and self.hyper.points else m

    @property
    def transformer(self) -> bool:
        return self.workload.resolve().kind == Transformer.kind

    @classmethod
    def from_dict(cls, d: dict) -> "JobSpec":
        spec = from_dict(cls, d)
        model = spec.model()
        if spec.hyper.warmup_steps < 0:     # resolved here, so every spec a runner reads has the number
            spec.hyper.warmup_steps = vocab.WARMUP_STEPS[spec.device]
        if spec.precision == "int8" and spec.transformer:
            raise SpecError("precision int8: transformers train in fp32, bf16 or fp16")
        if spec.precision in vocab.HALF and not spec.transformer:
            raise SpecError(f"precision {spec.precision}: {HALF_LAYERS}")
        if spec.precision in vocab.HALF and (parts := spec.hyper.zo_parts(spec.method)):
            raise SpecError(f"hyper: {HALF_ZO_PARTS}, not {parts}")
        if spec.precision == "fp16" and spec.transformer and model.style == "llama" and spec.method != "full-zo":
            raise SpecError(f"precision fp16: {FP16_RMSNORM}")
        if spec.precision == "int8" and spec.hyper.optimizer != "sgd":
            raise SpecError(f"hyper.optimizer: {ADAM_INT8}")
        if spec.precision == "int8" and (parts := spec.hyper.zo_parts(spec.method)):
            raise SpecError(f"hyper: {INT8_ZO_PARTS}, not {parts}")
        if spec.hyper.weight_decay and spec.hyper.zo_update == "conservative" and spec.method != "full-bp":
            raise SpecError(f"hyper.weight_decay: {CONSERVATIVE_DECAY}")
        if spec.hyper.points and not model.points:
            raise SpecError(f"hyper.points: {model.name} does not take point clouds")
        if (spec.hyper.context or spec.hyper.checkpointing or spec.hyper.loss_chunk) and not spec.transformer:
            key = "context" if spec.hyper.context else "checkpointing" if spec.hyper.checkpointing else "loss_chunk"
            raise SpecError(f"hyper.{key}: only a transformer takes it; {model.name} is not one")
        if spec.transformer and spec.hyper.context > model.context and model.style == "gpt2":
            raise SpecError(f"hyper.context: {model.name} has {model.context} learned positions, got "
                            f"{spec.hyper.context}")
        if spec.hyper.checkpointing and spec.method == "full-zo":
            raise SpecError("hyper.checkpointing: full-zo has no BP part, and so no activations to checkpoint")
        if spec.method == "elastic-zo":
            if spec.bp_layers < 1:
                raise SpecError(f"bp_layers: expected >= 1 for elastic-zo, got {spec.bp_layers}")
            try:
                model.first_bp_layer(spec.method, spec.bp_layers)
            except ValueError as e:
                raise SpecError(f"bp_layers: {e}") from None
        elif spec.bp_layers:
            raise SpecError(f"bp_layers: only elastic-zo takes bp_layers, got {spec.bp_layers} for {spec.method}")
        units = model.first_bp_layer(spec.method, spec.bp_layers)
        if spec.method != "full-bp" and spec.hyper.zo_sparsity == "layers" and spec.hyper.zo_layers > units:
            raise SpecError(f"hyper.zo_layers: {model.name}'s ZO part has {units} units (layers, or a transformer's "
                            f"embeddings and blocks), not {spec.hyper.zo_layers}")
        return spec


def _type_name(t) -> str:
    return {int: "an integer", float: "a number", str: "a string", bool: "true or false"}.get(t, str(t))


@functools.cache
def _field_types(cls) -> dict:
    """A spec dataclass's fields and their types, resolved once: typing.get_type_hints evaluates
    every annotation's string anew (this module's annotations are strings), about 15 ms a
    JobSpec, which reading a run's results paid per result."""
    hints = typing.get_type_hints(cls)
    return {f.name: hints[f.name] for f in dataclasses.fields(cls)}


def check_value(cls, key: str, value, where: str = ""):
    """Validate one field of a spec dataclass; returns the value coerced to the field type."""
    types = _field_types(cls)
    if key not in types:
        raise SpecError(f"{where}{key}: unknown key; expected one of {', '.join(types)}")
    t = types[key]
    if dataclasses.is_dataclass(t):
        if not isinstance(value, dict):
            raise SpecError(f"{where}{key}: expected a table, got {value!r}")
        return from_dict(t, value, f"{where}{key}.")
    ok = isinstance(value, t) and not (t is not bool and isinstance(value, bool))
    if t is float and isinstance(value, int) and not isinstance(value, bool):
        value, ok = float(value), True
    if not ok:
        raise SpecError(f"{where}{key}: expected {_type_name(t)}, got {value!r}")
    pattern = getattr(cls, "PATTERNS", {}).get(key)
    if pattern is not None and not re.fullmatch(pattern[0], value):
        raise SpecError(f"{where}{key}: expected {pattern[1]}, got {value!r}")
    choices = getattr(cls, "CHOICES", {}).get(key)
    if choices is not None and value not in choices:
        raise SpecError(f"{where}{key}: expected one of {', '.join(repr(c) for c in choices)}, got {value!r}")
    if t in (int, float):
        problem = cls.BOUNDS[key].problem(value)
        if problem:
            raise SpecError(f"{where}{key}: {problem}")
    return value


def from_dict(cls, d: dict, where: str = ""):
    """Build a spec dataclass from a dict, rejecting unknown keys and wrong types."""
    if not isinstance(d, dict):
        raise SpecError(f"{where.rstrip('.') or 'spec'}: expected a table, got {d!r}")
    required = [f.name for f in dataclasses.fields(cls)
                if f.default is dataclasses.MISSING and f.default_factory is dataclasses.MISSING]
    for key in required:
        if key not in d:
            raise SpecError(f"{where}{key}: missing")
    return cls(**{k: check_value(cls, k, v, where) for k, v in d.items()})


def load(path: str) -> JobSpec:
    with open(path) as f:
        try:
            d = json.load(f)
        except json.JSONDecodeError as e:
            raise SpecError(f"{path}: not valid JSON ({e})") from None
    return JobSpec.from_dict(d)
