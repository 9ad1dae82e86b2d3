"""The files the host makes for jobs, cached under ~/.cache/zobench: datasets as raw IDX
(the C++ binary reads no gzip; point clouds converted from their release or generated, text
tokenised), initial weights, ONNX graphs.

Every file is named by what it is made from, so a changed input can never reuse an old file:
a data set's folder by the bytes of its source files (a text set's also by the tokenizer's
settings), an initial-weights file (and the synthetic point set's folder) by the source code of
its generator, an ONNX graph by its own bytes. Each file is written under a temporary name of
its own and renamed, so two runs or two threads writing the same file never meet and a reader
sees a whole file or none.

The INIT and ONNX folders have the layout of a board's bundle; a data set has a folder of
its own here (DATA/<name>-<key>/<name>/, a rotated one DATA/<name>-rot<angle>-<key>/<name>/,
the two text sets one DATA/fortunes-<key>/fortunes/) and DATA/<variant>/<name>/ in a bundle
(datasets.data_name; DATA/<variant>/fortunes/ for a text set), and bundle.Site gives each
job the folder of its data set on either."""
from __future__ import annotations

import functools
import gzip
import hashlib
import importlib.metadata
import inspect
import json
import os
import shutil
import zlib
from dataclasses import dataclass
from pathlib import Path

import numpy as np

from workloads import datasets, models, support, zrng
from workloads.jsonfile import temp_name
from workloads.models import Model

from harness.preparation import pointclouds

# The folders of the cache and of a board's bundle.
DATA, INIT, ONNX = "data", "init", "onnx"

# The source of the code that makes the initial weights, as it was when imported: part of
# their file names, so an edit of either file (even one a reviewer thinks changes nothing)
# makes new files instead of reusing ones the old code drew.
GENERATOR = hashlib.sha256(b"".join(Path(m.__file__).read_bytes() for m in (models, zrng))).hexdigest()[:12]


def sha256(path: Path) -> str:
    return content_id(path)[0]


def content_id(path: Path) -> tuple[str, int]:
    """The sha256 and the size of the bytes read, both of one reading: a stat taken apart from
    it could see another version of a file being edited meanwhile."""
    h, size = hashlib.sha256(), 0
    with open(path, "rb") as f:
        for block in iter(lambda: f.read(1 << 20), b""):
            h.update(block)
            size += len(block)
    return h.hexdigest(), size


def root() -> Path:
    return Path(datasets.CACHE).expanduser()


def write_once(path: Path, write) -> Path:
    """path, made by write(tmp) under a temporary name of this call's own and renamed into
    place, unless it is there already; a write that fails leaves nothing behind."""
    if not path.is_file():
        path.parent.mkdir(parents=True, exist_ok=True)
        tmp = Path(temp_name(path))
        try:
            write(tmp)
            os.replace(tmp, path)
        finally:
            tmp.unlink(missing_ok=True)
    return path


@dataclass(frozen=True)
class DataFiles:
    dir: Path                   # a runner's data_dir: it holds <name>/<file> (fortunes/<file> for a text set)
    files: dict[str, Path]      # "<name>/<file>" -> the file in dir


def raw_idx(name: str, data_dir: str) -> DataFiles:
    """The data set's IDX files uncompressed (the C++ binary reads no gzip) in a cache folder
    named by the sha256 of the source files' bytes: another ZOBENCH_DATA or a file replaced
    in place gives another folder, never the old data. Hashing the sources on every use costs
    ~60 ms for Fashion-MNIST; a key on (path, size, mtime) would miss a file rewritten with
    its size and mtime kept (cp -p, rsync -t, a restored backup). Raw sources are copied in
    too, so the folder always holds every file it names. A truncated or damaged source
    raises DatasetError naming it. A point set's folder is made by point_idx, a text set's by
    text_idx."""
    if datasets.is_points(name):
        return point_idx(name, data_dir)
    if datasets.is_text(name):
        return text_idx(name)
    sources = {f: _read(name, f) for split in ("train", "test") for f in datasets.files(name, split, data_dir or None)}
    key = hashlib.sha256(json.dumps([[f.name, hashlib.sha256(b).hexdigest()] for f, b in sources.items()])
                         .encode()).hexdigest()[:16]
    folder = root() / DATA / f"{name}-{key}"
    files = {}
    for f, blob in sources.items():
        dest = write_once(folder / name / f.name.removesuffix(".gz"), lambda tmp: _uncompress(name, f, blob, tmp))
        files[f"{name}/{dest.name}"] = dest
    return DataFiles(folder, files)


def _read(name: str, f: Path) -> bytes:
    try:
        return f.read_bytes()
    except OSError as e:
        raise datasets.DatasetError(f"dataset {name!r}: cannot read {f}: {e.strerror}") from None


def _uncompress(name: str, f: Path, blob: bytes, tmp: Path) -> None:
    """Write the IDX bytes of source f (read as blob) to tmp, checked as datasets.read_idx
    checks a file, so a damaged source is refused here and not in a job on a board."""
    try:
        tmp.write_bytes(gzip.decompress(blob) if f.suffix == ".gz" else blob)
    except (EOFError, zlib.error, gzip.BadGzipFile) as e:
        raise datasets.DatasetError(f"dataset {name!r}: {f} is truncated or damaged ({e}); replace it") from None
    try:
        datasets.read_idx(tmp)
    except datasets.DatasetError as e:
        raise datasets.DatasetError(f"dataset {name!r}: {f}: {str(e).removeprefix(f'{tmp}: ')}; replace it") from None


def point_idx(name: str, data_dir: str) -> DataFiles:
    """A point set as the IDX files every runner reads (workloads/datasets.py: float32 clouds
    [N, 1024, 3], uint8 labels), made once per key: ModelNet40's from its release files, keyed on
    their bytes (as raw_idx), the synthetic set's from the generator alone. Either key includes
    the code that makes the clouds (pointclouds.py, zrng.py), so new sampling is a new folder."""
    if name == pointclouds.SYNTHETIC:
        found, sums = [], []
    else:
        dirs = datasets.search_dirs(name, data_dir or None)
        folder = next((d for d in dirs if pointclouds.sources(d)), None)
        if folder is None:
            raise datasets.DatasetError(f"dataset {name!r}: neither ply_data_*.h5 files nor {pointclouds.MESH_DIR}/ "
                                        f"found in {', '.join(map(str, dirs))}; {datasets.HOW_TO_GET[name]}")
        found = pointclouds.sources(folder)
        sums = [[str(f.relative_to(folder)), hashlib.sha256(_read(name, f)).hexdigest()] for f in found]
    key = hashlib.sha256(json.dumps([name, sums, hashlib.sha256(pointclouds.source_text()).hexdigest()])
                         .encode()).hexdigest()[:16]
    out = root() / DATA / f"{name}-{key}" / name
    files = {f"{split}-{kind}": out / f"{'train' if split == 'train' else 't10k'}-{kind}"
             for split in pointclouds.SPLITS for kind in ("points-idx3-float", "labels-idx1-ubyte")}
    for split in pointclouds.SPLITS:     # one split in memory at a time
        points, labels = files[f"{split}-points-idx3-float"], files[f"{split}-labels-idx1-ubyte"]
        if not (points.is_file() and labels.is_file()):
            clouds, y = pointclouds.read_release(found, split) if found else pointclouds.synthetic(split)
            write_once(points, lambda tmp: datasets.write_idx(tmp, clouds, 0x0D))
            write_once(labels, lambda tmp: datasets.write_idx(tmp, y, 0x08))
    return DataFiles(out.parent, {f"{name}/{f.name}": f for f in files.values()})


# What a text set's files are made by besides the corpus: the code that splits and tokenises it
# and the tokenizers library that trains the BPE (another version may merge otherwise).
TEXT_CODE = Path(__file__).with_name("text.py")


def text_idx(name: str) -> DataFiles:
    """Both text sets' token files (harness/preparation/text.py: each split's stream, entries and topics
    as IDX, the manifest and the tokenizer), made once from the fortune files of Debian's
    package into a folder keyed by their names and bytes, the vocabulary size, text.py's source
    and the tokenizers version: another package version, or another tokenizer, is a new folder.
    Making it takes a few seconds (text.tokenise), once."""
    from harness.preparation import text     # tokenizers: only the host of a run with a text set needs it

    sources = {f: _read(name, f) for f in datasets.topic_files()}
    sums = [[f.name, hashlib.sha256(b).hexdigest()] for f, b in sources.items()]
    key = hashlib.sha256(json.dumps([sums, models.TEXT_VOCAB, hashlib.sha256(TEXT_CODE.read_bytes()).hexdigest(),
                                     importlib.metadata.version("tokenizers")]).encode()).hexdigest()[:16]
    out = root() / DATA / f"{datasets.TEXT_FOLDER}-{key}" / datasets.TEXT_FOLDER
    stems = {(split, kind): f"{datasets.prefix(split)}-{kind}-{stem}"
             for split in text.SPLITS for kind, (stem, _) in datasets.TEXT_FILES.items()}
    names = [*stems.values(), datasets.TOKENIZER, datasets.MANIFEST]
    if not all((out / n).is_file() for n in names):
        made = text.tokenise(sources)
        for (split, kind), stem in stems.items():
            write_once(out / stem, lambda tmp: datasets.write_idx(tmp, made.splits[split][kind],
                                                                  datasets.TEXT_FILES[kind][1]))
        write_once(out / datasets.TOKENIZER, lambda tmp: tmp.write_text(made.tokenizer, encoding="utf-8"))
        write_once(out / datasets.MANIFEST, lambda tmp: tmp.write_text(json.dumps(made.manifest, indent=1) + "\n"))
    return DataFiles(out.parent, {f"{datasets.TEXT_FOLDER}/{n}": out / n for n in names})


def rotate_images(images: np.ndarray, degrees: float) -> np.ndarray:
    """uint8 images [N, H, W] turned counter-clockwise (as displayed, row 0 at the top) about
    their centre by `degrees`: bilinear (order=1: no overshoot, and a quarter turn moves pixel
    centres onto pixel centres, so 90 degrees is exactly np.rot90), the same size, what comes
    from outside the image 0 (the background), rounded half to even. In float64 and in
    chunks, so 60,000 images never need more than ~50 MB; each image is rotated on its own,
    so the chunking changes no byte."""
    from scipy import ndimage     # only a run with rotated jobs pays its import

    out = np.empty_like(images)
    for lo in range(0, len(images), 4096):
        turned = ndimage.rotate(images[lo:lo + 4096].astype(np.float64), degrees, axes=(2, 1), reshape=False,
                                order=1, mode="constant", cval=0.0)
        out[lo:lo + 4096] = np.rint(np.clip(turned, 0, 255))
    return out


# The rule rotate_images follows and the scipy that computes it: part of a rotated folder's key,
# so a changed rule (or a scipy that computes it otherwise) makes a new folder, never reuses one.
ROTATION = hashlib.sha256(f"{inspect.getsource(rotate_images)}{importlib.metadata.version('scipy')}".encode()
                          ).hexdigest()[:12]


def rotated_idx(name: str, data_dir: str, degrees: float) -> DataFiles:
    """The image set's train and test images turned by `degrees` (rotate_images), its labels
    copied as they are, and the rotation file naming the angle (datasets.ROTATION_FILE) that a
    runner checks, made once from raw_idx's files into a folder keyed by their folder's key,
    the exact angle and ROTATION. An angle of whole turns is raw_idx's own folder, byte for
    byte. A point set or digits rotated raises DatasetError (the plan refuses them first)."""
    datasets.check_rotatable(name, degrees)
    return _turned(name, raw_idx(name, data_dir), degrees)


def _turned(name: str, source: DataFiles, degrees: float, subset: int = 0, held: int = 0) -> DataFiles:
    """source's images turned by `degrees`, its other files (labels, a subset or validation
    file) copied, and the rotation file, in a folder keyed by source's folder, the angle and
    ROTATION."""
    if not datasets.rotated(degrees):
        return source
    key = hashlib.sha256(json.dumps([source.dir.name, repr(float(degrees)), ROTATION]).encode()).hexdigest()[:16]
    out = root() / DATA / f"{datasets.data_name(name, degrees, held, subset)}-{key}" / name
    files = {}
    for rel, src in source.files.items():
        write = ((lambda tmp, src=src: datasets.write_idx(tmp, rotate_images(datasets.read_idx(src), degrees), 0x08))
                 if "-images-" in src.name else (lambda tmp, src=src: shutil.copyfile(src, tmp)))
        files[rel] = write_once(out / src.name, write)
    marker = write_once(out / datasets.ROTATION_FILE, lambda tmp: tmp.write_text(datasets.marker_text(degrees)))
    files[f"{name}/{marker.name}"] = marker
    return DataFiles(out.parent, files)


# zrng.holdout's seeds for a subset's draws (a validation split's is 0): the training and test
# splits' draws are independent of each other and of the split.
SUBSET_SEEDS = {"train": 1, "test": 2}


def subset_idx(name: str, data_dir: str, rotate: float, n: int) -> DataFiles:
    """The data set cut to `n` samples of each split, drawn with zobench-z (zrng.holdout with
    SUBSET_SEEDS), each kept in its order, with the subset file naming the count a runner
    checks, then turned by `rotate` (rotate_images turns each image on its own, so drawing
    first is the same bytes as turning first, and turns 2n images instead of the whole set).
    The draw depends on a split's size and n alone, never on the angle: every angle of a
    fine-tuning study trains and tests on the same images, and a larger subset holds every
    sample of a smaller one. No subset is rotated_idx's folder."""
    if not n:
        return rotated_idx(name, data_dir, rotate)
    datasets.check_rotatable(name, rotate)
    datasets.check_splittable(name, 0, n)
    source = raw_idx(name, data_dir)
    sizes = {split: datasets.split_size(name, split, str(source.dir)) for split in SUBSET_SEEDS}
    if n > min(sizes.values()):
        raise datasets.DatasetError(f"dataset {name!r}: workload.subset: expected at most the {min(sizes.values())} "
                                    f"samples of its smaller split, got {n}")
    key = hashlib.sha256(json.dumps([source.dir.name, "subset", n, zrng.VERSION]).encode()).hexdigest()[:16]
    out = root() / DATA / f"{datasets.data_name(name, 0.0, 0, n)}-{key}" / name
    picks = {datasets.prefix(split): (datasets.prefix(split), zrng.holdout(sizes[split], n, seed))
             for split, seed in SUBSET_SEEDS.items()}
    return _turned(name, _select(name, source, out, picks, {datasets.SUBSET_FILE: n}), rotate, n)


def validation_idx(name: str, data_dir: str, rotate: float, held: int, subset: int = 0) -> DataFiles:
    """The data set (rotated by `rotate`) with a validation split: `held` training samples drawn
    with zobench-z (zrng.holdout) become its test files, the rest its train files, each kept in
    its order, and the validation file names the count a runner checks. Made once into a folder
    keyed by the source folder's key and the count; no split is the source's own folder, byte for
    byte. With a `subset`, the train files are the subset's own training samples and the held-out
    ones are drawn from the rest of the training set (_subset_held)."""
    if not held:
        return subset_idx(name, data_dir, rotate, subset)
    datasets.check_splittable(name, held, subset)
    if subset:
        return _turned(name, _subset_held(name, data_dir, held, subset), rotate, subset, held)
    source = rotated_idx(name, data_dir, rotate)
    n = datasets.split_size(name, "train", str(source.dir))
    if held >= n:
        raise datasets.DatasetError(f"dataset {name!r}: workload.validation: expected fewer than its {n} training "
                                    f"samples, got {held}")
    key = hashlib.sha256(json.dumps([source.dir.name, held, zrng.VERSION]).encode()).hexdigest()[:16]
    out = root() / DATA / f"{datasets.data_name(name, rotate, held)}-{key}" / name
    out_mask = np.zeros(n, dtype=bool)
    out_mask[zrng.holdout(n, held)] = True
    picks = {"train": ("train", np.flatnonzero(~out_mask)), "t10k": ("train", np.flatnonzero(out_mask))}
    return _select(name, source, out, picks, {datasets.VALIDATION_FILE: held})


def _subset_held(name: str, data_dir: str, held: int, subset: int) -> DataFiles:
    """A subset's validation split, unrotated: train files the subset's `subset` training samples
    (subset_idx's draw), test files `held` other training samples (zrng.holdout, passing over the
    subset's). A trial of `zobench tune` then fine-tunes on exactly the images the job it tunes
    does, at its steps per epoch, and is scored on images it never trained on; holding them out
    of the subset would have trained it on fewer."""
    source = raw_idx(name, data_dir)
    n = datasets.split_size(name, "train", str(source.dir))
    if subset + held > n:
        raise datasets.DatasetError(f"dataset {name!r}: workload.validation: expected at most the {n - subset} "
                                    f"training samples outside its subset of {subset}, got {held}")
    key = hashlib.sha256(json.dumps([source.dir.name, "subset", subset, held, zrng.VERSION]).encode()).hexdigest()[:16]
    out = root() / DATA / f"{datasets.data_name(name, 0.0, held, subset)}-{key}" / name
    inside = zrng.holdout(n, subset, SUBSET_SEEDS["train"])
    picks = {"train": ("train", inside), "t10k": ("train", zrng.holdout(n, held, exclude=inside))}
    return _select(name, source, out, picks, {datasets.SUBSET_FILE: subset, datasets.VALIDATION_FILE: held})


def _select(name: str, source: DataFiles, out: Path, picks: dict, markers: dict[str, int]) -> DataFiles:
    """A folder `out` of IDX files made from source's: picks maps each split's prefix there to
    (the source split's prefix, the indices of the samples it keeps, ascending); the source's
    other files (a rotation or subset file) copied as they are, and each of `markers` saying its
    count."""
    files = {}
    for kind, type_byte in ((datasets.SAMPLES[datasets.is_points(name)], datasets.sample_type(name)),
                            (datasets.LABELS, 0x08)):
        for prefix, (source_prefix, keep) in picks.items():
            src = source.files[f"{name}/{source_prefix}-{kind}"]
            dest = write_once(out / f"{prefix}-{kind}",
                              lambda tmp, src=src, keep=keep, t=type_byte: datasets.write_idx(
                                  tmp, np.ascontiguousarray(datasets.read_idx(src, t)[keep]), t))
            files[f"{name}/{dest.name}"] = dest
    for rel, src in source.files.items():
        if not rel.startswith((f"{name}/train-", f"{name}/t10k-")):
            files[rel] = write_once(out / src.name, lambda tmp, src=src: shutil.copyfile(src, tmp))
    for marker, count in markers.items():
        made = write_once(out / marker, lambda tmp, count=count: tmp.write_text(f"{count}\n"))
        files[f"{name}/{made.name}"] = made
    return DataFiles(out.parent, files)


def init_weights_dir() -> Path:
    return root() / INIT


def init_weights_file(model: Model, seed: int) -> Path:
    """The initial weights of (model, seed) written once, as little-endian float32 in the
    models.py layout, so every runtime of a run starts from the same bytes."""
    return write_once(init_weights_dir() / init_weights_name(model, seed),
                      lambda tmp: model.init_weights(seed).astype("<f4").tofile(tmp))


def description_id(model: Model) -> str:
    """A short hash of a model's description: two networks under one name never share a file."""
    return hashlib.sha256(json.dumps(model.to_dict(), sort_keys=True).encode()).hexdigest()[:12]


def init_weights_name(model: Model, seed: int) -> str:
    return f"{model.name}-{description_id(model)}-seed{seed}-{GENERATOR}.f32"


def pretrained_weights_name(sha256: str) -> str:
    """A pretraining job's final weights are named by their hash: fine-tuning jobs of any run
    that start from the same bytes share one file, here and on a board."""
    return f"pretrained-{sha256}.bin"


def pretrained_weights_file(source: Path, sha256: str) -> Path:
    """source (a pretraining job's weights file, whose sha256 was checked) in the cache's INIT
    folder, where the fine-tuning jobs of this machine read it and a board's bundle takes it from.
    The name is the content's hash: a cached file that does not hold it (cut off, edited, a disk
    error) is made again, or every fine-tuning job and every --resume would fail on it."""
    path = init_weights_dir() / pretrained_weights_name(sha256)
    if path.is_file() and content_id(path)[0] != sha256:
        path.unlink()
    return write_once(path, lambda tmp: tmp.write_bytes(source.read_bytes()))


def onnx_dir() -> Path:
    return root() / ONNX


def onnx_graph(model: Model, method: str, bp_layers: int) -> Path:
    """The ONNX graph of the model's ZO front for an ort job, in the cache (its file name
    carries its sha256). The name is worked out once per process; the file is written again
    whenever it is missing there (a cleared cache, another HOME)."""
    path = onnx_dir() / _onnx_name(model, method, bp_layers)
    if not path.is_file():
        from harness.preparation import onnx_export

        onnx_export.export(model, support.ort_front_layers(model, method, bp_layers), onnx_dir())
    return path


@functools.lru_cache(maxsize=None)
def _onnx_name(model: Model, method: str, bp_layers: int) -> str:
    from harness.preparation import onnx_export   # onnx loads in ~0.2 s: only runs with ort jobs pay it

    return onnx_export.file_name(model, support.ort_front_layers(model, method, bp_layers))[0]
