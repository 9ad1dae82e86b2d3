"""A training set gathered on the device (workloads/device_data.py), run here with the CPU as the
device: the batches are the host's to the bit, every split type, a job trains step for step as
with the host's, and where it cannot gather there (a set over the cap) the host does, and the
result says why. The GPU's own run is benchmarks/gpu_scale.py's lenet
part and tests/test_cuda.py, on a lent GPU. Also EventClock's one-step lag, on stand-in events."""
import dataclasses
import io
from contextlib import redirect_stdout

import numpy as np
import pytest
import torch

from workloads import datasets, device_data, energy, zrng
from workloads.clock import EventClock
from workloads.loop import TrainState, train, warm_up
from workloads.models import LENET5, MODELS
from workloads.spec import JobSpec
from workloads.torch_runner import make_engine

from testkit.runners import TORCH_RUNNER, job_spec, run_runner


def engine_for(model, dataset, precision="fp32", batch=16, seed=0):
    spec = JobSpec.from_dict({"job_id": "d", "method": "full-zo", "threads": 1, "precision": precision, "seed": seed,
                              "workload": {"model": model.name, "architecture": model.to_dict(), "dataset": dataset},
                              "hyper": {"batch_size": batch, "epochs": 2, "warmup_steps": 2, "lr_zo": 1e-3}})
    init = model.init_weights(seed) if precision != "int8" else None
    return spec, make_engine(spec, model, init)


def same_batches(engine, split, n=5, batch=16):
    host = device_data.batches(engine, split, 0, "host")
    dev = device_data.batches(engine, split, 0, "device")
    assert host.facts()["where"] == "host" and dev.facts() == {"where": "device", "bytes": dev.bytes}
    for epoch in range(2):
        order = zrng.permutation(7, epoch, len(split))
        host.epoch(order)
        dev.epoch(order)
        for b in range(n):
            (hx, hy), (dx, dy) = host(b * batch, (b + 1) * batch), dev(b * batch, (b + 1) * batch)
            assert hx.dtype == dx.dtype and hy.dtype == dy.dtype and hx.shape == dx.shape
            assert torch.equal(hx, dx) and torch.equal(hy, dy)


@pytest.mark.parametrize("precision", ["fp32", "int8"])
def test_images_gathered_on_the_device_are_the_hosts_to_the_bit(precision):
    split = datasets.load("fashion-mnist", "train", 256, precision=precision)
    _, engine = engine_for(LENET5, "fashion-mnist", precision)
    same_batches(engine, split)


def test_clouds_token_windows_and_padded_entries_gathered_on_the_device_are_the_hosts():
    rng = np.random.default_rng(0)
    points = datasets.PointSplit(rng.uniform(-1, 1, (96, 64, 3)).astype(np.float32), rng.integers(0, 40, 96))
    pointnet = MODELS["pointnet"]
    _, engine = engine_for(pointnet, "modelnet40")
    same_batches(engine, points)
    gpt = MODELS["gpt2-1m"]
    tokens = datasets.TokenSplit(rng.integers(0, gpt.vocab, 16 * 33 * 6 + 1).astype(np.int32), 32)
    _, engine = engine_for(gpt, "fortunes")
    same_batches(engine, tokens, n=5)
    # fortunes-topics: each entry's last T tokens, the short ones left-padded
    counts = rng.integers(1, 60, 96)
    starts = np.concatenate([[0], np.cumsum(counts + 1)[:-1]])
    entries = datasets.EntrySplit(rng.integers(0, gpt.vocab - 1, int(starts[-1] + counts[-1] + 1)).astype(np.int32),
                                  np.stack([starts, counts], 1), rng.integers(0, 8, 96), 32, gpt.vocab - 1)
    assert (counts < 32).any() and (counts > 32).any()
    same_batches(engine, entries)


def trained(where: str, cap: int = 0):
    """LeNet-5, two epochs of Full ZO on 128 images, its batches from `where`: the final weights
    and the first steps' losses."""
    spec, engine = engine_for(LENET5, "fashion-mnist")
    split = datasets.load("fashion-mnist", "train", 128)
    test = datasets.load("fashion-mnist", "test", 32)
    spec = dataclasses.replace(spec, hyper=dataclasses.replace(spec.hyper, trace_steps=8))
    data = device_data.batches(engine, split, cap, where)
    state = TrainState()
    warm_up(engine, spec, data)
    from workloads.clock import PhaseClock
    with redirect_stdout(io.StringIO()):
        train(engine, spec, data, test, PhaseClock(), state, energy.Unavailable("test"))
    return engine.weights_sha256(), [t["loss"] for t in state.trace], data.facts(), state.steps


def test_a_job_trains_step_for_step_as_with_the_hosts_batches():
    host, dev = trained("host"), trained("device")
    assert dev[2]["where"] == "device" and host[2]["where"] == "host" and dev[3] == host[3] == 16
    assert dev[1] == host[1] and len(set(dev[1])) > 1        # the losses, each step
    assert dev[0] == host[0]                                  # and the weights after two epochs


def test_where_it_cannot_the_host_gathers_and_says_why():
    over = trained("device", cap=1000)
    assert over[2]["where"] == "host" and "over 25% of the device's cap, 1,000" in over[2]["reason"]
    assert over[0] == trained("host")[0]
    _, engine = engine_for(LENET5, "fashion-mnist")
    split = datasets.load("fashion-mnist", "train", 64)
    assert device_data.batches(engine, split, 0).facts() == {"where": "host", "reason": "the device is the host"}
    assert device_data.batches(engine, split, 0, "host").facts() == {"where": "host", "reason": "asked for the host"}


def test_a_result_says_where_its_training_set_lived(tmp_path):
    r = run_runner(job_spec("full-zo", 0, seed=1, steps=2, test_samples=32), tmp_path, TORCH_RUNNER, check=True)
    assert r["env"]["data"] == {"where": "host", "reason": "the device is the host"}


class Event:
    """A stand-in CUDA event: record() stamps the next tick of a shared counter; synchronize()
    notes that the host waited for it."""

    def __init__(self, clock):
        self.clock, self.at = clock, None

    def record(self):
        self.clock["tick"] += 1
        self.at = self.clock["tick"]

    def synchronize(self):
        self.clock["waited"].append(self.at)

    def elapsed_time(self, other):
        return float(other.at - self.at)       # ms


def test_the_event_clock_reads_the_step_before_the_last_and_tiles_the_loop():
    ticks = {"tick": 0, "waited": []}
    clock = EventClock(lambda: Event(ticks))
    clock.start()
    ends = []
    for step in range(4):
        clock.lap("data")
        clock.step_end()
        ends.append(ticks["tick"])     # the step's end event was the last recorded
        # the step itself: two laps, as a graph's replay records them
        clock.lap("forward")
        clock.lap("zo_update")
        if step:
            # the host waited for the step before the one it had just closed, not for that one
            assert ticks["waited"][-1] == ends[step - 1] and ends[step] not in ticks["waited"]
    clock.drain()
    assert ticks["waited"][-1] == ticks["tick"]
    assert sum(clock.seconds.values()) == pytest.approx(ticks["tick"] / 1e3 - 1e-3)   # every tick but the start
    assert clock.calls["forward"] == clock.calls["zo_update"] == 4 and clock.calls["data"] == 4
