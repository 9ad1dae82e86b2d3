"""A training set kept on the engine's device and its batches gathered there.

A GPU step of LeNet-5 takes a quarter of a millisecond; gathering its batch on the host (the
images' lookup into float32) and copying it over took longer than the step (docs/transformers.md,
"LeNet-5 as a job runs it"). So where the split fits under the job's device-memory cap, its
arrays cross to the device once, each epoch's order crosses once, and a step's batch is a gather
on the device: no copy from the host and no wait for one in the loop. The indices are the ones
the loop draws (zrng.permutation), and the values are split.batch's to the bit: the same table
lookup, the same windows (tests/test_device_data.py), so every runtime keeps the same batches.

Where it cannot (no device but the CPU, a set over the cap) the host gathers as before and the result
says why (result's env.data: where the training set lived)."""
from __future__ import annotations

import numpy as np

from . import datasets

# the most of a device's memory cap a resident training set may take: the rest is the job's
SHARE = 0.25


class HostBatches:
    """split.batch then engine.load_batch: the host gathers, the batch is copied over."""
    where = "host"

    def __init__(self, engine, split, reason: str = ""):
        self.engine, self.split, self.reason = engine, split, reason

    def epoch(self, order: np.ndarray) -> None:
        self.order = order

    def __call__(self, lo: int, hi: int):
        return self.engine.load_batch(*self.split.batch(self.order[lo:hi]))

    def facts(self) -> dict:
        return {"where": self.where, "reason": self.reason}


class DeviceBatches(HostBatches):
    """The split's arrays on the device; a batch is order[lo:hi] gathered there."""
    where = "device"

    def __init__(self, engine, split, arrays: dict, gather, nbytes: int):
        import torch

        super().__init__(engine, split)
        self.arrays = {k: torch.from_numpy(np.ascontiguousarray(v)).to(engine.device) for k, v in arrays.items()}
        self.gather, self.inputs, self.bytes = gather, engine.inputs, nbytes

    def epoch(self, order: np.ndarray) -> None:
        import torch

        self.order = torch.from_numpy(order.astype(np.int64)).to(self.engine.device)

    def __call__(self, lo: int, hi: int):
        x, y = self.gather(self.arrays, self.order[lo:hi])
        return x.to(self.inputs), y.long()

    def facts(self) -> dict:
        return {"where": self.where, "bytes": self.bytes}


def _images(a, idx):
    return a["images"][idx].unsqueeze(1), a["labels"][idx]


def _points(a, idx):
    return a["points"][idx], a["labels"][idx]


def _windows(a, idx):
    t = a["tokens"][idx[:, None] * a["context"] + a["span"]]
    return t[:, :-1], t[:, 1:]


def _entries(a, idx):
    import torch     # here, not at the top: a board's numpy or ONNX Runtime runner imports this module

    e = a["entries"][idx]
    start = e[:, :1]
    pos = start + e[:, 1:] - a["context"] + a["span"]
    return torch.where(pos >= start, a["tokens"][pos.clamp(min=0)], a["pad"]), a["labels"][idx]


def device_arrays(split):
    """(arrays, gather) of a split: what crosses to the device, and the batch made there from
    it, each the split type's batch() in torch ops."""
    if isinstance(split, datasets.Split):
        # the images through their lookup table once, here: a step then gathers with one kernel
        # rather than three (its index, the widening, the table's), which on a GPU is a batch of
        # 32's whole cost; four times the bytes of uint8 in FP32, the same in INT8
        return {"images": split.lut[split.images], "labels": split.labels}, _images
    if isinstance(split, datasets.PointSplit):
        return {"points": split.points, "labels": split.labels}, _points
    if isinstance(split, datasets.TokenSplit):
        T = split.context
        return {"tokens": split.tokens, "context": np.array(T), "span": np.arange(T + 1)}, _windows
    T = split.context
    return {"tokens": split.tokens, "entries": split.entries, "labels": split.labels, "context": np.array(T),
            "span": np.arange(T), "pad": np.array(split.pad, dtype=split.tokens.dtype)}, _entries


def cap(spec) -> int:
    """The bytes a job's tensors may take on its device: its device_mem_limit, else a GPU's
    memory; 0 on a CPU (no cap)."""
    if spec.device_mem_limit or not spec.device.startswith("cuda"):
        return spec.device_mem_limit
    import torch

    return torch.cuda.get_device_properties(torch.device(spec.device)).total_memory


def batches(engine, split, cap: int, where: str = "auto"):
    """How the loop gets its batches: on the device where it can (see above), else the host's.
    where: "auto" (a GPU's where the split takes at most SHARE of the cap), "device" (also when the
    device is the CPU: the tests' way to run this path without a GPU) or "host"; cap: the bytes
    the job's tensors may take on the device (0: no cap)."""
    device = getattr(engine, "device", None)
    if where == "host":
        reason = "asked for the host"
    elif device is None or (device.type == "cpu" and where == "auto"):
        reason = "the device is the host"
    else:
        arrays, gather = device_arrays(split)
        need = sum(np.asarray(v).nbytes for v in arrays.values())
        if not cap or need <= SHARE * cap:
            return DeviceBatches(engine, split, arrays, gather, need)
        reason = f"the training set's {need:,} bytes are over {SHARE:.0%} of the device's cap, {cap:,}"
    return HostBatches(engine, split, reason)
