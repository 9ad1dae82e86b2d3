"""What every Python runner does besides training: the CLI, the result, the errors.

`<runner> --spec spec.json --out result.json` -- progress as JSON lines on
stdout, result.json written atomically and only at the end, and written even
when the run fails (status "failed"/"oom" with a one-line reason and whatever
epochs completed).
"""
from __future__ import annotations

import argparse
import hashlib
import json
import os
import time
import traceback
from pathlib import Path

import numpy as np

from . import datasets, device_data, energy, envinfo, gpuinfo, memory, vocab, zrng
from .jsonfile import write_atomic
from .result import skeleton
from .clock import EventClock, PhaseClock
from .loop import TrainState, emit, evaluate_start, train, warm_up
from .models import Transformer
from .spec import JobSpec, SpecError
from .timed_loop_load import own_cpu_seconds



def initial_weights(spec: JobSpec, model):
    """What the engine starts from: the init_weights file (a trained network, to fine-tune) in
    the layout of the spec's precision, else the init drawn from the seed; None for an int8
    engine, which draws its integer init itself (int8.init_weights)."""
    if spec.init_weights and not Path(spec.init_weights).is_file():
        raise SpecError(f"init_weights: {spec.init_weights}: no such file")
    if spec.precision == "int8":   # the torch runner's alone: int8.py needs torch, which ort's boards lack
        from .int8 import read_weights
        return read_weights(spec.init_weights, model) if spec.init_weights else None
    if not spec.init_weights:
        return model.init_weights(spec.seed)
    w = np.fromfile(spec.init_weights, dtype="<f4")
    body = model.with_classes(0).params_total if model.kind == Transformer.kind and model.classes else None
    if w.size == body:
        # a language model's weights under a classifier: its head's tensors come last in the
        # layout (Transformer.tensors), so the file is the body and the head is drawn from the seed
        return np.concatenate([w, model.init_weights(spec.seed)[body:]]).astype(np.float32)
    if w.size != model.params_total:
        raise SpecError(f"init_weights: {spec.init_weights} holds {w.size} float32 values, "
                        f"expected {model.params_total} for {model.name}"
                        + (f" (or {body}, its language model without the classification head)" if body else ""))
    return w.astype(np.float32)


def started_from(engine, spec: JobSpec) -> str:
    """The sha256 of the engine's starting weights, as far as they came from the init_weights
    file: all of them, or the body of a classifier fine-tuned from a language model, whose head
    was drawn from the seed (the harness checks it against the file's own hash)."""
    data = engine.weights_bytes()
    if spec.init_weights:
        data = data[:os.path.getsize(spec.init_weights)]
    return hashlib.sha256(data).hexdigest()


def save_weights(result_path: str, data: bytes) -> str:
    """The final weights beside the result (save_weights), whole or not at all; the file's name."""
    path = Path(result_path).with_name(vocab.WEIGHTS_FILE)
    tmp = path.with_name(f"{path.name}.tmp-{os.getpid()}")
    tmp.write_bytes(data)
    os.replace(tmp, path)
    return path.name


def energy_record(meter, state: TrainState) -> dict:
    """The timed loops' energy, its rate per step and the mean power; nulls with the reason."""
    joules = state.joules if state.epochs else None
    per = lambda d: joules / d if joules is not None and d else None     # noqa: E731
    return {"source": meter.source if joules is not None else None, "joules": joules,
            "joules_per_step": per(state.steps), "avg_power_w": per(state.train_seconds),
            "unavailable": None if joules is not None else
            meter.unavailable or f"{meter.source}: no reading in a timed loop"}


def device_failure(e: Exception, spec: JobSpec | None) -> dict:
    """A failure's status and one-line error: a GPU that ran out of memory ends the job oom,
    with the device-memory cap it ran under (JobSpec.device_mem_limit); anything else failed."""
    first = str(e).strip().splitlines()[0] if str(e).strip() else ""
    if type(e).__name__ != "OutOfMemoryError":     # torch's; no torch import here (ort's boards lack it)
        return {"error": f"{type(e).__name__}: {e}"}
    cap = spec.device_mem_limit if spec is not None else 0
    under = f" under its {cap / 2**30:.2f} GiB device-memory cap (mem_limit)" if cap else ""
    return {"status": "oom", "error": f"the GPU ran out of memory{under}: {first}"}


def main(make_engine, packages: tuple[str, ...], argv=None) -> int:
    ap = argparse.ArgumentParser(description="Run one zobench training job.")
    ap.add_argument("--spec", required=True, help="job spec (JSON)")
    ap.add_argument("--out", required=True, help="where to write result.json")
    args = ap.parse_args(argv)

    wall0 = time.perf_counter()
    result = skeleton(None, {**envinfo.facts(*packages), "zrng": zrng.VERSION})
    state, engine, clock, meter, spec = TrainState(), None, None, None, None
    init_sha256, weights_file = None, None
    try:
        with open(args.spec) as f:
            result["job"] = json.load(f)
        spec = JobSpec.from_dict(result["job"])
        result["env"]["harness_commit"] = spec.harness_commit
        result["env"]["gpu"] = gpuinfo.facts(spec.device)
        model = spec.model()
        points = model.input_shape[0] if model.points else 0     # a point model's clouds keep this many
        context = (spec.hyper.context or model.context) if spec.transformer else 0   # tokens a sequence
        w = spec.workload
        train_split, test_split = (datasets.load(w.dataset, split, limit, w.data_dir, spec.precision, points, w.rotate,
                                                 context, w.validation, w.subset)
                                   for split, limit in (("train", spec.hyper.train_samples),
                                                        ("test", spec.hyper.test_samples)))
        engine = make_engine(spec, model, initial_weights(spec, model))
        init_sha256 = started_from(engine, spec)
        result["env"]["threads"] = getattr(engine, "thread_pool", None)     # the pool it trains with
        # before warm-up, whose steps leave the allocator holding a step's memory: peak less this
        # is what training needs beyond the runtime, the data and the weights (a memory model's
        # measure); baseline_rss_bytes, after warm-up, is what the timed steps start from
        result["memory"]["loaded_rss_bytes"] = memory.rss_bytes()
        data = device_data.batches(engine, train_split, device_data.cap(spec))
        result["env"]["data"] = data.facts()
        state.warmup = warm_up(engine, spec, data)
        state.start_eval = evaluate_start(engine, spec, test_split)
        result["memory"]["baseline_rss_bytes"] = memory.rss_bytes()
        memory.reset_peak()
        gpuinfo.reset_peak(spec.device)
        clock = EventClock() if spec.device.startswith("cuda") else PhaseClock()
        meter = energy.meter(spec.device)
        train(engine, spec, data, test_split, clock, state, meter)
        if spec.save_weights:
            weights_file = save_weights(args.out, engine.weights_bytes())
        result["status"] = "ok"
    except MemoryError as e:
        result.update(status="oom", error=f"MemoryError: {e}".strip().rstrip(":"))
    except (SpecError, datasets.DatasetError, OSError, json.JSONDecodeError) as e:
        result["error"] = str(e)
    except Exception as e:  # any other failure is recorded, with its traceback on stderr (a GPU's OOM has its line)
        failure = device_failure(e, spec)
        if "status" not in failure:
            traceback.print_exc()
        result.update(failure)
    finally:
        if engine is not None:
            result["model"] = {"name": spec.workload.model, "params_total": engine.n_zo + engine.n_bp,
                               "params_zo": engine.n_zo, "params_bp": engine.n_bp,
                               "weights_sha256": engine.weights_sha256(), "init_sha256": init_sha256}
            if weights_file:
                result["model"]["weights_file"] = weights_file
            result["memory"].update(gpuinfo.device_memory(spec.device))
        if state.warmup is not None:
            result["warmup"] = state.warmup
        if meter is not None:
            meter.close()
            result["energy"] = energy_record(meter, state)
        if clock is not None:
            result["phases"] = clock.as_result()
        result.update(steps=state.steps, train_seconds=state.train_seconds, epochs=state.epochs,
                      start_eval=state.start_eval, timed_loop_load=state.load.record())
        if state.trace:
            result["trace"] = state.trace
        result["memory"]["peak_rss_bytes"] = memory.peak_rss_bytes()
        result["wall_seconds"] = time.perf_counter() - wall0
        result["cpu_seconds"] = own_cpu_seconds()   # what the harness nets out of the machine's load
        write_atomic(args.out, result)
        emit("done", status=result["status"], error=result["error"])
    return 0 if result["status"] == "ok" else 1

