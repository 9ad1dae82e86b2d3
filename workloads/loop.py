"""The epoch loop every Python runtime shares: data order, lr schedule, warm-up, eval, energy,
progress."""
from __future__ import annotations

import math
import os
import sys
import time
from dataclasses import dataclass, field

import numpy as np

from . import methods, vocab, zrng
from .clock import NullClock
from .jsonfile import dumps
from .spec import SpecError
from .timed_loop_load import TimedLoopLoad

EMIT_EVERY_S = 0.5


def emit(event: str, **fields) -> None:
    """One strict JSON object per line on stdout (a diverged loss is null, named under
    "nonfinite"): the harness turns these into progress bars."""
    sys.stdout.write(dumps({"event": event, **fields}, indent=None) + "\n")
    sys.stdout.flush()


@dataclass
class TrainState:
    """Filled in as training goes, so a run that fails midway still reports what it did."""
    steps: int = 0
    train_seconds: float = 0.0
    epochs: list = field(default_factory=list)
    trace: list = field(default_factory=list)
    warmup: dict | None = None
    start_eval: dict | None = None    # eval_start: the test set's loss and accuracy before training
    joules: float | None = 0.0    # the timed loops' energy; None once an epoch had no reading
    load: TimedLoopLoad = field(default_factory=TimedLoopLoad)   # the machine's, while they ran


def as_number(value):
    """A step's number as a Python number: a GPU step leaves its losses and projected gradient
    on the device, so reading one synchronizes, and is done only where a number is shown. A list
    (a q-query step's projected gradients) is read element by element."""
    if isinstance(value, list):
        return [as_number(v) for v in value]
    return value.item() if hasattr(value, "item") else value


def inject_fault(fault: str, method_key: str) -> None:
    """Test-only faults (hyper.fault = KIND[@METHOD_KEY]), so the harness's fault handling
    is tested for real; with @METHOD_KEY only that method's jobs of a run fail."""
    fault, _, only = fault.partition("@")
    if only and only != method_key:
        return
    if fault == "hang":
        while True:
            time.sleep(3600)
    if fault == "crash":
        os.abort()
    if fault == "oom":
        np.empty(1 << 50, dtype=np.uint8)   # a real allocation that fails: MemoryError


def evaluate(engine, split, batch_size: int) -> tuple[float, float]:
    loss_sum, correct = 0.0, 0
    for lo in range(0, len(split), batch_size):
        x, y = engine.load_batch(*split.batch(np.arange(lo, min(lo + batch_size, len(split)))))
        l, c = engine.evaluate(x, y)
        loss_sum, correct = loss_sum + l, correct + c
    return loss_sum / len(split), correct / len(split)


def rates(h, epoch: int) -> tuple[float, float]:
    """(lr_zo, lr_bp) of an epoch: the initial rates decayed by lr_decay every lr_decay_every
    epochs (the ElasticZO paper's schedule; lr_decay = 1 keeps them constant, as ZO-Bench does)."""
    decay = h.lr_decay ** (epoch // h.lr_decay_every)
    return h.lr_zo * decay, h.lr_bp * decay


def stepper(engine):
    """How engine takes a step: a GPU engine replays its CUDA graph, the others run methods.step."""
    return getattr(engine, "run_step", methods.step)


def warm_up(engine, spec, data) -> dict:
    """hyper.warmup_steps whole steps on epoch 0's first batch, untimed, then the trainable state
    put back exactly: caches, thread pools, a GPU's kernels and its CUDA graph are ready before
    the clock starts, and the run trains from the same weights, step for step, as without.
    data: the training split's batches (device_data.batches)."""
    h, t0 = spec.hyper, time.perf_counter()
    if h.warmup_steps:
        saved = engine.save()
        data.epoch(zrng.permutation(spec.seed, 0, len(data.split)))
        x, y = data(0, h.batch_size)
        clock, run_step = NullClock(), stepper(engine)
        for t in range(h.warmup_steps):
            run_step(engine, spec, x, y, t, 0, h.lr_zo, h.lr_bp, clock)
        engine.restore(saved)
        getattr(engine, "sync", lambda: None)()     # a GPU's queue drained: all of it was warm-up
    return {"steps": h.warmup_steps, "seconds": time.perf_counter() - t0}


def extra_work(engine, spec, x, y, t: int, epoch: int, lr_zo: float, lr_bp: float, clock) -> None:
    """hyper.inject_work (test-only), as the C++ binary's extra_work: a slowdown made of real work.
    After step t, floor((t + 1) F) - floor(t F) more steps on the same batch and step key, from
    a copy of the trainable state put back after them, so the training is the one without."""
    f = spec.hyper.inject_work
    extra = math.floor((t + 1) * f) - math.floor(t * f)
    if extra <= 0:
        return
    saved, run_step = engine.save(), stepper(engine)
    for _ in range(extra):
        run_step(engine, spec, x, y, t, epoch, lr_zo, lr_bp, clock)
    engine.restore(saved)
    clock.lap("data")


def evaluate_start(engine, spec, test_split) -> dict | None:
    """With eval_start, the starting weights (warm-up has put them back) on the test set, untimed
    and as the epochs' evaluation does it: a fine-tuning job's accuracy without fine-tuning."""
    if not spec.eval_start:
        return None
    test_loss, test_acc = evaluate(engine, test_split, spec.hyper.batch_size)
    return {"test_loss": test_loss, "test_accuracy": test_acc}


def out_of_time(h, seconds: float) -> bool:
    """hyper.max_train_seconds is spent (the C++ binary's train.cpp applies the same rule)."""
    return 0 < h.max_train_seconds <= seconds


def train(engine, spec, data, test_split, clock, state: TrainState, meter) -> None:
    """The timed epochs. data: the training split's batches (device_data.batches: gathered on
    the device where the split fits there); clock times the phases; meter measures each epoch's
    timed loop's energy."""
    h = spec.hyper
    n, batch = len(data.split), h.batch_size
    steps_per_epoch = n // batch   # the last partial batch is dropped: every step has shape [batch, ...]
    if steps_per_epoch == 0:
        raise SpecError(f"hyper.batch_size: {batch} is larger than the {n} training samples")
    run_step = stepper(engine)
    emit("start", job_id=spec.job_id, epochs=h.epochs, steps_total=h.epochs * steps_per_epoch)
    last_emit = time.perf_counter()
    for epoch in range(h.epochs):
        lr_zo, lr_bp = rates(h, epoch)
        data.epoch(zrng.permutation(spec.seed, epoch, n))
        snap = clock.snapshot()
        loss_sum = 0.0
        meter.begin()
        state.load.begin()
        clock.start()
        t0 = time.perf_counter()
        for b in range(steps_per_epoch):
            step_t0 = time.perf_counter()
            x, y = data(b * batch, (b + 1) * batch)
            clock.lap("data")
            clock.step_end()    # a GPU's step before the last is read here: the last one runs meanwhile
            r = run_step(engine, spec, x, y, state.steps, epoch, lr_zo, lr_bp, clock)
            if h.inject_work:
                extra_work(engine, spec, x, y, state.steps, epoch, lr_zo, lr_bp, clock)
            if h.inject_slowdown:     # test-only: a real, CPU-bound slowdown for the regression gate
                spin_until = time.perf_counter() + h.inject_slowdown * (time.perf_counter() - step_t0)
                while time.perf_counter() < spin_until:
                    pass
                clock.lap("data")
            loss_sum += r["loss"]
            if state.steps < h.trace_steps:
                state.trace.append({"step": state.steps, **{k: as_number(v) for k, v in r.items()}})
            state.steps += 1
            if h.fault:
                inject_fault(h.fault, vocab.method_key(spec.method, spec.bp_layers))
            if time.perf_counter() - last_emit > EMIT_EVERY_S:
                last_emit = time.perf_counter()
                emit("step", step=state.steps, loss=as_number(r["loss"]))
            if out_of_time(h, state.train_seconds + time.perf_counter() - t0):
                break
        clock.drain()
        steps = b + 1
        seconds = time.perf_counter() - t0
        state.load.end(seconds)
        joules = meter.end(seconds)
        state.train_seconds += seconds
        state.joules = None if joules is None or state.joules is None else state.joules + joules
        clock.start()
        # in training-sized batches, for every precision and runtime: int8 requantizes by each
        # tensor's batch-wide max, and the C++ binary sizes its activation buffers from the batch
        test_loss, test_acc = evaluate(engine, test_split, h.batch_size)
        clock.lap("eval")
        clock.drain()
        record = {"epoch": epoch + 1, "seconds": seconds, "phases": clock.since(snap),
                  "train_loss": as_number(loss_sum) / steps, "test_loss": test_loss,
                  "test_accuracy": test_acc, "joules": joules}
        state.epochs.append(record)
        emit("epoch", step=state.steps, **{k: v for k, v in record.items() if k != "phases"})
        if out_of_time(h, state.train_seconds):
            break
