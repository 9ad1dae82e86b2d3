"""Image datasets as uint8 arrays, normalised per batch through a lookup table.

Samples stay uint8 in memory (Fashion-MNIST's 60k training images are 47 MB
instead of 188 MB as float32) so a runner's peak RSS is dominated by training,
not by the dataset. Pixels become float32 through a 256-entry table computed in
float64, which is bit-identical in every runtime.
"""
from __future__ import annotations

import gzip
import importlib.util
import os
import struct
from dataclasses import dataclass
from pathlib import Path

import numpy as np

SYSTEM_DIR = Path("/usr/share/datasets")
HOW_TO_GET = {
    "fashion-mnist": "install Debian's dataset-fashion-mnist package (apt-get install dataset-fashion-mnist)",
    "mnist": "put the four MNIST IDX files (train-images-idx3-ubyte[.gz], ...) in $ZOBENCH_DATA/mnist",
}
# (mean, std) of the training pixels scaled to [0, 1]
NORMALISATION = {"mnist": (0.1307, 0.3081), "fashion-mnist": (0.2860, 0.3530), "digits": (0.3365, 0.3214)}
DATASETS = tuple(NORMALISATION)


class DatasetError(Exception):
    """A dataset is missing or malformed; the message says how to get it."""


@dataclass
class Split:
    images: np.ndarray   # uint8 [N, 28, 28]
    labels: np.ndarray   # int64 [N]
    lut: np.ndarray      # float32 [256] (int8 [256] for int8 training)

    def __len__(self) -> int:
        return len(self.labels)

    def batch(self, idx: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
        """float32 [B, 1, 28, 28] normalised images and int64 labels for sample indices idx."""
        x = self.lut[self.images[idx]]
        return x.reshape(len(idx), 1, *self.images.shape[1:]), self.labels[idx]


def lookup_table(name: str) -> np.ndarray:
    mean, std = NORMALISATION[name]
    return ((np.arange(256, dtype=np.float64) / 255.0 - mean) / std).astype(np.float32)


def read_idx(path: Path) -> np.ndarray:
    """Read an IDX file (gzip or raw) into a numpy array, checking its header."""
    opener = gzip.open if path.suffix == ".gz" else open
    with opener(path, "rb") as f:
        data = f.read()
    if len(data) < 4 or data[0] != 0 or data[1] != 0 or data[2] != 0x08:
        raise DatasetError(f"{path}: not an unsigned-byte IDX file")
    ndim = data[3]
    dims = struct.unpack(f">{ndim}I", data[4:4 + 4 * ndim])
    body = np.frombuffer(data, dtype=np.uint8, offset=4 + 4 * ndim)
    if body.size != int(np.prod(dims)):
        raise DatasetError(f"{path}: header says {dims} but holds {body.size} bytes")
    return body.reshape(dims)


def search_dirs(name: str, data_dir: str | None = None) -> list[Path]:
    dirs = []
    if data_dir:
        dirs.append(Path(data_dir).expanduser() / name)
    if os.environ.get("ZOBENCH_DATA"):
        dirs.append(Path(os.environ["ZOBENCH_DATA"]).expanduser() / name)
    dirs.append(SYSTEM_DIR / name)
    return dirs


def _find(name: str, stem: str, dirs: list[Path]) -> Path:
    for d in dirs:
        for suffix in ("", ".gz"):
            p = d / (stem + suffix)
            if p.is_file():
                return p
    raise DatasetError(
        f"dataset {name!r}: {stem}[.gz] not found in {', '.join(map(str, dirs))}; "
        f"{HOW_TO_GET.get(name, 'put its IDX files in $ZOBENCH_DATA/' + name)}")


def files(name: str, split: str, data_dir: str | None = None) -> tuple[Path, Path]:
    """The (images, labels) IDX files of an IDX dataset's split; DatasetError if missing."""
    prefix = "train" if split == "train" else "t10k"
    dirs = search_dirs(name, data_dir)
    return _find(name, f"{prefix}-images-idx3-ubyte", dirs), _find(name, f"{prefix}-labels-idx1-ubyte", dirs)


def check(name: str, data_dir: str | None = None) -> None:
    """Raise DatasetError now, rather than in a job, if a dataset cannot be found."""
    if name not in NORMALISATION:
        raise DatasetError(f"unknown dataset {name!r}; expected one of {', '.join(DATASETS)}")
    if name == "digits":
        if importlib.util.find_spec("sklearn") is None:
            raise DatasetError("dataset 'digits' needs scikit-learn (pip install scikit-learn)")
        return
    for split in ("train", "test"):
        files(name, split, data_dir)


def split_size(name: str, split: str, data_dir: str | None = None) -> int:
    """How many samples a split holds, from its labels file's header (the data stays unread),
    so a plan can refuse more samples than there are."""
    if name == "digits":
        cut = _digits_cut(DIGITS_SAMPLES)
        return cut if split == "train" else DIGITS_SAMPLES - cut
    _, labels = files(name, split, data_dir)
    with (gzip.open if labels.suffix == ".gz" else open)(labels, "rb") as f:
        head = f.read(8)
    if len(head) < 8 or head[:4] != b"\x00\x00\x08\x01":
        raise DatasetError(f"{labels}: not an unsigned-byte IDX file of one dimension")
    return struct.unpack(">I", head[4:])[0]


def _idx_split(name: str, split: str, data_dir: str | None) -> tuple[np.ndarray, np.ndarray]:
    image_file, label_file = files(name, split, data_dir)
    images, labels = read_idx(image_file), read_idx(label_file)
    if images.ndim != 3 or labels.ndim != 1 or len(images) != len(labels):
        raise DatasetError(f"dataset {name!r} {split}: images {images.shape} do not match labels {labels.shape}")
    return images, labels


DIGITS_SAMPLES = 1797     # scikit-learn's bundled digits


def _digits_cut(n: int) -> int:
    """How many of digits' n samples are the train split (the first 80%)."""
    return int(n * 0.8)


def _digits_split(split: str) -> tuple[np.ndarray, np.ndarray]:
    """scikit-learn's bundled 8x8 digits, bilinearly upscaled to 28x28; first 80% train."""
    from sklearn.datasets import load_digits  # only this dataset needs scikit-learn

    d = load_digits()
    img = d.images / 16.0
    # bilinear resize 8 -> 28 with aligned corners, as separable matrix products
    pos = np.linspace(0, 7, 28)
    lo = np.floor(pos).astype(int).clip(0, 6)
    w = pos - lo
    r = np.zeros((28, 8))
    r[np.arange(28), lo] = 1 - w
    r[np.arange(28), lo + 1] += w
    up = np.einsum("ij,njk,lk->nil", r, img, r)
    images = np.rint(up.clip(0, 1) * 255).astype(np.uint8)
    cut = _digits_cut(len(images))
    sl = slice(0, cut) if split == "train" else slice(cut, None)
    return images[sl], d.target[sl]


def load(name: str, split: str, limit: int = 0, data_dir: str | None = None, precision: str = "fp32") -> Split:
    """The first `limit` samples (0 = all) of a split ('train' or 'test'). For int8 the
    table maps a pixel to pixel >> 1, the 7-bit input with exponent -7 (docs/int8.md)."""
    if name not in NORMALISATION:
        raise DatasetError(f"unknown dataset {name!r}; expected one of {', '.join(DATASETS)}")
    images, labels = _digits_split(split) if name == "digits" else _idx_split(name, split, data_dir)
    if limit:   # a copy, so the full split is freed and does not count in the runner's RSS
        images, labels = images[:limit].copy(), labels[:limit].copy()
    lut = (np.arange(256) >> 1).astype(np.int8) if precision == "int8" else lookup_table(name)
    return Split(np.ascontiguousarray(images), labels.astype(np.int64), lut)
