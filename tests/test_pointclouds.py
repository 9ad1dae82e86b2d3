"""Point-cloud data: ModelNet40's two releases read through the real loaders into the cache's
IDX files, the synthetic stand-in, and what a runner reads back (harness/preparation/pointclouds.py,
workloads/datasets.py, harness/preparation/artifacts.py)."""
import struct
import tracemalloc
from pathlib import Path
from types import SimpleNamespace

import h5py
import numpy as np
import pytest

from harness.preparation import artifacts
from harness.preparation.bundle import bundle_files
from harness.errors import UserError
from workloads import datasets
from harness.preparation import pointclouds
from workloads.datasets import DatasetError
from workloads.spec import Workload

from testkit.runners import checked

SUITE = SimpleNamespace(path="suite.toml")
CUBE = """OFF
8 12 0
0 0 0
1 0 0
1 1 0
0 1 0
0 0 1
1 0 1
1 1 1
0 1 1
3 0 2 1
3 0 3 2
3 4 5 6
3 4 6 7
3 0 1 5
3 0 5 4
3 1 2 6
3 1 6 5
3 2 3 7
3 2 7 6
3 3 0 4
3 3 4 7
"""


@pytest.fixture
def home(tmp_path, monkeypatch):
    """An empty cache of its own (artifacts.root() follows HOME), no $ZOBENCH_DATA."""
    monkeypatch.setenv("HOME", str(tmp_path / "home"))
    monkeypatch.delenv("ZOBENCH_DATA", raising=False)
    return tmp_path / "home"


def write_hdf5(folder: Path, sizes=(("train0", 12), ("train1", 6), ("test0", 8)), seed=0) -> dict:
    """The HDF5 release's layout (ply_data_*.h5: data [N, 2048, 3], label [N, 1]); returns the arrays."""
    rng = np.random.default_rng(seed)
    folder.mkdir(parents=True, exist_ok=True)
    out = {}
    for stem, n in sizes:
        data = rng.normal(size=(n, 2048, 3)).astype(np.float32)
        label = rng.integers(0, 40, (n, 1)).astype(np.uint8)
        with h5py.File(folder / f"ply_data_{stem}.h5", "w") as h:
            h["data"], h["label"] = data, label
        out[stem] = (data, label)
    return out


def write_meshes(folder: Path, classes=40) -> None:
    """The mesh release's layout: ModelNet40/<class>/{train,test}/<class>_NNNN.off, one cube each."""
    for k in range(classes):
        for split in ("train", "test"):
            d = folder / "ModelNet40" / f"class{k:02d}" / split
            d.mkdir(parents=True)
            (d / f"class{k:02d}_0001.off").write_text(CUBE)


def assert_normalised(clouds: np.ndarray) -> None:
    assert np.abs(clouds.mean(axis=1)).max() < 1e-5
    assert np.allclose(np.linalg.norm(clouds, axis=2).max(axis=1), 1, atol=1e-5)


def test_idx_float_round_trip_and_checks(tmp_path):
    a = np.random.default_rng(1).normal(size=(7, 5, 3)).astype(np.float32)
    datasets.write_idx(tmp_path / "p", a, 0x0D)
    assert (tmp_path / "p").read_bytes()[:4] == b"\x00\x00\x0d\x03"
    assert (tmp_path / "p").read_bytes()[16:20] == struct.pack(">f", a[0, 0, 0])   # big-endian
    back = datasets.read_idx(tmp_path / "p", 0x0D)
    assert back.dtype == np.float32 and np.array_equal(back, a)
    assert np.array_equal(datasets.read_idx(tmp_path / "p", 0x0D, limit=2), a[:2])
    with pytest.raises(DatasetError, match="not an unsigned-byte IDX"):
        datasets.read_idx(tmp_path / "p")
    (tmp_path / "short").write_bytes((tmp_path / "p").read_bytes()[:-3])
    with pytest.raises(DatasetError, match=r"short: header says \(7, 5, 3\) but holds 417 bytes"):
        datasets.read_idx(tmp_path / "short", 0x0D)


def test_reads_only_the_first_clouds(tmp_path):
    """A 2.4 GB (sparse) points file: the first 10 clouds are read and nothing else is loaded."""
    f = tmp_path / "big"
    n = 200_000
    with open(f, "wb") as out:
        out.write(bytes([0, 0, 0x0D, 3]) + n.to_bytes(4, "big") + (1024).to_bytes(4, "big") + (3).to_bytes(4, "big"))
        out.write(np.arange(3 * 1024 * 3, dtype=">f4").tobytes())
        out.truncate(16 + n * 1024 * 3 * 4)
    tracemalloc.start()
    try:
        got = datasets.read_idx(f, 0x0D, limit=10)
        peak = tracemalloc.get_traced_memory()[1]
    finally:
        tracemalloc.stop()
    assert got.shape == (10, 1024, 3) and np.array_equal(got[:3].ravel(), np.arange(3 * 1024 * 3))
    assert not got[3:].any() and peak < 1 << 20


def test_int8_rule():
    x = np.array([-1.0, -0.00390625, 0.00390625, 0.5, 0.99, 1.0, -0.9961], np.float32)
    assert datasets.quantise_points(x).tolist() == [-127, 0, 1, 64, 127, 127, -127]


def test_load_points_and_int8(tmp_path):
    d = tmp_path / "modelnet40-synthetic"
    d.mkdir()
    clouds, labels = pointclouds.synthetic("test", 80)
    for prefix in ("train", "t10k"):
        datasets.write_idx(d / f"{prefix}-points-idx3-float", clouds, 0x0D)
        datasets.write_idx(d / f"{prefix}-labels-idx1-ubyte", labels, 0x08)
    s = datasets.load("modelnet40-synthetic", "train", 50, str(tmp_path), points=256)
    x, y = s.batch(np.array([3, 0]))
    assert len(s) == 50 and x.dtype == np.float32 and x.shape == (2, 256, 3) and y.dtype == np.int64
    assert np.array_equal(x, clouds[[3, 0], :256]) and np.array_equal(y, labels[[3, 0]])
    q, _ = datasets.load("modelnet40-synthetic", "test", 0, str(tmp_path), "int8").batch(np.arange(80))
    assert q.dtype == np.int8 and q.shape == (80, 1024, 3)
    assert np.array_equal(q, np.clip(np.floor(clouds * np.float32(128) + np.float32(0.5)), -127, 127))
    assert datasets.split_size("modelnet40-synthetic", "test", str(tmp_path)) == 80
    with pytest.raises(DatasetError, match=r"expected \[>= 2048, 3\]"):
        datasets.load("modelnet40-synthetic", "train", 0, str(tmp_path), points=2048)


def test_synthetic_set_is_deterministic_and_normalised():
    clouds, labels = pointclouds.synthetic("train", 120)
    again, again_labels = pointclouds.synthetic("train", 120)
    assert clouds.tobytes() == again.tobytes() and labels.tobytes() == again_labels.tobytes()
    assert clouds.shape == (120, 1024, 3) and clouds.dtype == np.float32 and labels.dtype == np.uint8
    assert np.bincount(labels, minlength=40).tolist() == [3] * 40
    assert len(set(labels[:40])) > 20                   # stored shuffled: a prefix holds many classes
    assert_normalised(clouds)
    other, _ = pointclouds.synthetic("train", 120, seed=1)
    assert not np.array_equal(other, clouds)
    assert not np.array_equal(pointclouds.synthetic("test", 120)[0], clouds)


def test_hdf5_release_through_the_cache(home, tmp_path):
    src = write_hdf5(tmp_path / "data" / "modelnet40")
    r = artifacts.raw_idx("modelnet40", str(tmp_path / "data"))
    assert sorted(r.files) == sorted(f"modelnet40/{s}" for s in (
        "train-points-idx3-float", "train-labels-idx1-ubyte", "t10k-points-idx3-float", "t10k-labels-idx1-ubyte"))
    train = datasets.load("modelnet40", "train", 0, str(r.dir))
    x, y = train.batch(np.arange(len(train)))
    want = np.concatenate([src["train0"][0], src["train1"][0]])[:, :1024]
    assert np.allclose(x, pointclouds.normalise(want), atol=1e-6)
    assert np.array_equal(y, np.concatenate([src["train0"][1], src["train1"][1]]).ravel())
    assert_normalised(x)
    assert datasets.split_size("modelnet40", "test", str(r.dir)) == 8
    assert artifacts.raw_idx("modelnet40", str(tmp_path / "data")) == r                  # cached
    files = bundle_files({("modelnet40", str(tmp_path / "data"), 0.0, 0, 0)})
    assert files["data/modelnet40/modelnet40/train-points-idx3-float"] == r.files["modelnet40/train-points-idx3-float"]
    write_hdf5(tmp_path / "data" / "modelnet40", seed=1)                                  # new bytes, new folder
    assert artifacts.raw_idx("modelnet40", str(tmp_path / "data")).dir != r.dir


def test_mesh_release_through_the_cache(home, tmp_path):
    write_meshes(tmp_path / "data" / "modelnet40")
    r = artifacts.raw_idx("modelnet40", str(tmp_path / "data"))
    for split in ("train", "test"):
        x, y = datasets.load("modelnet40", split, 0, str(r.dir)).batch(np.arange(40))
        assert sorted(y) == list(range(40)) and x.shape == (40, 1024, 3)
        assert_normalised(x)
        # on a cube's surface: every point lies on a face of its cloud's bounding box
        lo, hi = x.min(axis=1, keepdims=True), x.max(axis=1, keepdims=True)
        assert np.minimum(np.abs(x - lo), np.abs(x - hi)).min(axis=2).max() < 1e-5
    points = r.files["modelnet40/train-points-idx3-float"].read_bytes()
    first = datasets.load("modelnet40", "train", 0, str(r.dir)).points
    assert not np.array_equal(first[0], first[1])            # each mesh has points of its own
    (tmp_path / "home").rename(tmp_path / "old-home")         # a fresh cache samples the same points
    assert artifacts.raw_idx("modelnet40", str(tmp_path / "data")).files[
        "modelnet40/train-points-idx3-float"].read_bytes() == points


@pytest.mark.parametrize("damage, why", [
    ("truncated", "not a readable ModelNet40 HDF5 file"),
    ("shape", r"its data is \(6, 2048, 2\), expected \[N, >= 1024, 3\]"),
    ("off", "ply_data_train1.h5"),
])
def test_a_bad_hdf5_file_is_one_clear_error(home, tmp_path, damage, why):
    folder = tmp_path / "data" / "modelnet40"
    write_hdf5(folder)
    bad = folder / "ply_data_train1.h5"
    if damage == "truncated":
        bad.write_bytes(bad.read_bytes()[:5000])
    elif damage == "shape":
        with h5py.File(bad, "w") as h:
            h["data"], h["label"] = np.zeros((6, 2048, 2), np.float32), np.zeros((6, 1), np.uint8)
    else:
        with h5py.File(bad, "w") as h:
            h["data"], h["label"] = np.zeros((6, 2048, 3), np.float32), np.full((6, 1), 40, np.uint8)
        why = "labels outside 0..39"
    with pytest.raises(DatasetError, match=f"dataset 'modelnet40': {bad}: {why}") as e:
        artifacts.raw_idx("modelnet40", str(tmp_path / "data"))
    assert "\n" not in str(e.value)


@pytest.mark.parametrize("text", ["OFF\n3 1 0\n0 0\n1 0 0\n0 1 0\n3 0 1 2\n",        # a vertex of two numbers
                                  "OFF\n3 1 0\n0 0 0\n1 0 0\n0 1 0\n3 0 1 7\n",     # a face past the vertices
                                  "not a mesh at all\n"])
def test_a_malformed_off_file_is_one_clear_error(home, tmp_path, text):
    write_meshes(tmp_path / "data" / "modelnet40")
    bad = tmp_path / "data" / "modelnet40" / "ModelNet40" / "class07" / "train" / "class07_0001.off"
    bad.write_text(text)
    with pytest.raises(DatasetError, match=f"dataset 'modelnet40': {bad}: ") as e:
        artifacts.raw_idx("modelnet40", str(tmp_path / "data"))
    assert "\n" not in str(e.value)


def test_missing_release_says_how_to_get_it(home, tmp_path):
    with pytest.raises(DatasetError, match="neither ply_data_.*modelnet40_ply_hdf5_2048.zip"):
        artifacts.raw_idx("modelnet40", str(tmp_path / "nothing"))


def check(dataset: str, model: str = "pointnet", data_dir: str = "", **hyper) -> None:
    checked(Workload(model=model, dataset=dataset, data_dir=data_dir), hyper)


def test_plan_checks_the_data_fits_the_model(home, tmp_path):
    with pytest.raises(UserError, match="workload.dataset: modelnet40-synthetic holds point clouds, but "
                                        "workload.model lenet5 takes images"):
        check("modelnet40-synthetic", "lenet5")
    with pytest.raises(UserError, match="fashion-mnist holds images, but workload.model pointnet takes point clouds"):
        check("fashion-mnist")
    with pytest.raises(UserError, match=r"suite.toml: hyper.points: expected at most the 1024 points"):
        check("modelnet40-synthetic", points=2048)
    write_hdf5(tmp_path / "data" / "modelnet40")
    check("modelnet40", data_dir=str(tmp_path / "data"), train_samples=18, test_samples=8, batch_size=4, points=512)
    with pytest.raises(UserError, match="hyper.train_samples: expected at most the 18 samples of modelnet40 train"):
        check("modelnet40", data_dir=str(tmp_path / "data"), train_samples=19, batch_size=4)
    with pytest.raises(UserError, match="^dataset 'modelnet40': neither"):
        check("modelnet40", data_dir=str(tmp_path / "nothing"))
