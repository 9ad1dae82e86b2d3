"""What each runtime runs, in one table that the plan reads to leave a job out (with the reason)
and that each runtime reads to refuse a spec: per precision the devices it trains on, the methods,
the data sets, and each runtime's rules about a model its description allows. The C++ binary
cannot read Python; tests/test_cpp.py holds its parse_arch to cpp_refuses here, case by case.

It runs on a board too (the ort runner asks it), so it imports no runner, no torch and nothing
of the harness."""
from __future__ import annotations

from . import datasets, vocab
from .models import Transformer
from .spec import ADAM_INT8, HALF_LAYERS, HALF_ZO_PARTS, INT8_ZO_PARTS, Hyper, SpecError

# (The int8 reference computes on the job's device, exactly on a GPU too; the C++ binary reads the
# image and point sets stored as IDX files, not scikit-learn's digits, which are made on the
# board, nor text.)
SUPPORT = {
    "torch": {"devices": {"fp32": ("cpu", "cuda"), "int8": ("cpu", "cuda"), "bf16": ("cpu", "cuda"),
                          "fp16": ("cpu", "cuda")}, "methods": vocab.METHODS,
              "datasets": datasets.DATASETS},
    "cpp": {"devices": {"fp32": ("cpu",), "int8": ("cpu",)}, "methods": vocab.METHODS,
            "datasets": tuple(d for d in datasets.DATASETS if d != "digits" and not datasets.is_text(d))},
    "ort": {"devices": {"fp32": ("cpu",)}, "methods": ("full-zo", "elastic-zo"), "datasets": datasets.DATASETS,
            "why": "ONNX Runtime runs forward passes only, by design (use torch or cpp for full-bp)"},
}


# why the C++ binary leaves elastic-zo with several queries out (it refuses it in these words too:
# train.cpp check_zo_parts)
CPP_HEAD_QUERIES = ("the cpp runtime keeps the BP head's activations of two passes, so elastic-zo runs one "
                    "query a step there; torch and ort run more")


def no_forward_ad(runtime: str) -> str:
    """Why a runtime other than torch leaves forward-grad out (the ort runner and train.cpp
    check_zo_parts refuse it in these words too)."""
    return (f"forward-grad needs forward-mode AD (a Jacobian-vector product), which the {runtime} runtime "
            "does not have; torch runs it")


def cpp_refuses(model) -> str | None:
    """Why the C++ binary cannot run a model its description allows (workloads/cpp/common.hpp
    parse_arch refuses the same), or None. (Its rule that pointwise layers come first needs no
    twin: models.py describes no pointwise layer after a conv2d or fc one.)"""
    for l in model.layers:
        if l.kind == "conv2d" and l.padding > min(l.weight_shape[2:]) - 1:
            return f"layer {l.name}: it runs a conv2d padding of at most kernel - 1, not {l.padding}"
    if model.points and model.input_shape[1] != 3:
        return "it reads point clouds of 3 coordinates"
    if model.classes > 1024:
        return "it runs at most 1,024 classes"
    return None


def ort_front_layers(model, method: str, bp_layers: int) -> int:
    """How many leading layers (a transformer's units) the ort runner's graph runs: all for
    full-zo, all but the BP head for elastic-zo. SpecError for what that runtime does not train."""
    if method not in SUPPORT["ort"]["methods"]:
        raise SpecError(f"method: the ort runtime runs forward passes only; it trains full-zo and "
                        f"elastic-zo, not {method}")
    if model.kind == Transformer.kind and method == "elastic-zo" and bp_layers != 1:
        raise SpecError(f"bp_layers: the ort runtime trains a transformer's head unit alone by BP "
                        f"(bp_layers = 1), not {bp_layers} units: BP through its blocks runs in torch")
    return model.first_bp_layer(method, bp_layers)


def _listed(words) -> str:
    """'a', 'a and b', 'a, b and c'."""
    return " and ".join(filter(None, (", ".join(words[:-1]), words[-1])))


def unsupported(runtime: str, method: str, precision: str, dataset: str, device: str,
                model=None, hyper: Hyper | None = None, bp_layers: int = 0) -> str | None:
    """Why runtime cannot run the combination, or None; hyper: the job's hyperparameters (its BP
    part's optimizer and its ZO parts matter here; None: the defaults). Every runtime trains
    FP32 with either optimizer (the ort runtime's BP head too); INT8 with sgd only (JobSpec.from_dict
    refuses). The torch runtime runs every ZO part (workloads/methods.py); the ort runtime and the
    C++ binary every one but forward-grad, which needs forward-mode AD, and the binary elastic-zo
    with one query a step, and INT8 is Alg. 2's (JobSpec.from_dict refuses)."""
    h = hyper or Hyper()
    parts = h.zo_parts(method)
    s = SUPPORT.get(runtime)
    if s is None:
        return f"the {runtime} runtime is not available in this version"
    if precision not in s["devices"]:
        return f"the {runtime} runtime has no {precision} training"
    if method not in s["methods"]:
        return f"the {runtime} runtime cannot train {method}" + (f": {s['why']}" if "why" in s else "")
    if dataset not in s["datasets"]:
        return f"the {runtime} runtime reads {_listed(s['datasets'])}, not {dataset}"
    if device not in s["devices"][precision]:
        return f"the {runtime} runtime trains {precision} on {_listed(s['devices'][precision])}, not {device}"
    if runtime == "cpp" and model is not None and (why := cpp_refuses(model)):
        return f"the cpp runtime cannot run {model.name}: {why}"
    if runtime == "ort" and model is not None:
        try:
            ort_front_layers(model, method, bp_layers)
        except SpecError as e:
            return str(e).partition(": ")[2]       # the runner's own reason, without its key
        except ValueError:      # bp_layers out of the model's range: JobSpec names it
            pass
    if precision in vocab.HALF and model is not None and model.kind != Transformer.kind:
        return HALF_LAYERS
    if precision in vocab.HALF and parts:
        return f"{HALF_ZO_PARTS}, not {parts}"
    if precision == "int8" and h.optimizer != "sgd":
        return ADAM_INT8
    if precision == "int8" and parts:
        return f"{INT8_ZO_PARTS}, not {parts}"
    if runtime != "torch" and parts and h.zo_estimator == "forward-grad":
        return no_forward_ad(runtime)
    if runtime == "cpp" and method == "elastic-zo" and h.zo_queries > 1:
        return CPP_HEAD_QUERIES
    return None
