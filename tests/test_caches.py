"""The host's caches (harness/preparation/artifacts.py, harness/preparation/build.py) are keyed on what their files are
made from: a changed source gets new files, a damaged one a clear error, and nothing else
in the cache is touched."""
import gzip
import os
import shutil
import struct
import subprocess
import sys
from pathlib import Path

import numpy as np
import pytest

from harness.preparation import artifacts
from harness.preparation.build import configuration
from harness.stores.store import Store
from workloads.datasets import DatasetError
from workloads.models import LENET5

from testkit.runners import REPO, SHORT, zobench
from testkit.sshd import board_toml, client_home

STEMS = ("train-images-idx3-ubyte", "train-labels-idx1-ubyte", "t10k-images-idx3-ubyte", "t10k-labels-idx1-ubyte")


def idx_bytes(array: np.ndarray) -> bytes:
    return bytes([0, 0, 8, array.ndim]) + struct.pack(f">{array.ndim}I", *array.shape) + array.astype(np.uint8).tobytes()


def fake_fashion_mnist(folder: Path, seed: int, gz: bool = True) -> dict[str, bytes]:
    """A small Fashion-MNIST (320 train, 64 test samples) of random pixels in folder/fashion-mnist;
    returns each file's IDX bytes by stem."""
    rng = np.random.default_rng(seed)
    raw = {}
    for prefix, n in (("train", 320), ("t10k", 64)):
        raw[f"{prefix}-images-idx3-ubyte"] = idx_bytes(rng.integers(0, 256, (n, 28, 28)))
        raw[f"{prefix}-labels-idx1-ubyte"] = idx_bytes(rng.integers(0, 10, n))
    d = folder / "fashion-mnist"
    d.mkdir(parents=True, exist_ok=True)
    for stem, data in raw.items():
        (d / (stem + ".gz" if gz else stem)).write_bytes(gzip.compress(data, mtime=0) if gz else data)
    return raw


def rewrite_keeping_mtime(path: Path, data: bytes) -> None:
    """Replace a file's bytes in place as `cp -p` or a restored backup does: same name, same mtime."""
    st = path.stat()
    path.write_bytes(data)
    os.utime(path, ns=(st.st_atime_ns, st.st_mtime_ns))


def parts(root: Path) -> list[Path]:
    return [p for p in root.rglob("*") if ".part-" in p.name]


@pytest.fixture
def home(tmp_path, monkeypatch):
    """An empty cache of its own (artifacts.root() follows HOME)."""
    monkeypatch.setenv("HOME", str(tmp_path / "home"))
    return artifacts.root()


def test_a_data_source_changed_in_place_gets_a_cache_of_its_own(home, tmp_path):
    first = fake_fashion_mnist(tmp_path / "data", seed=1)
    a = artifacts.raw_idx("fashion-mnist", str(tmp_path / "data"))
    assert {p.name for p in a.files.values()} == set(STEMS)
    assert all(p.read_bytes() == first[p.name] for p in a.files.values())
    # the images replaced in place, size and mtime kept: the old key (name, mtime) reused the old data
    second = fake_fashion_mnist(tmp_path / "new", seed=2)
    rewrite_keeping_mtime(tmp_path / "data" / "fashion-mnist" / "train-images-idx3-ubyte.gz",
                          (tmp_path / "new" / "fashion-mnist" / "train-images-idx3-ubyte.gz").read_bytes())
    b = artifacts.raw_idx("fashion-mnist", str(tmp_path / "data"))
    assert b.dir != a.dir
    assert b.files["fashion-mnist/train-images-idx3-ubyte"].read_bytes() == second["train-images-idx3-ubyte"]
    assert b.files["fashion-mnist/train-labels-idx1-ubyte"].read_bytes() == first["train-labels-idx1-ubyte"]
    # the first folder is still whole: a run still using it loses nothing
    assert all(p.read_bytes() == first[p.name] for p in a.files.values())
    # the key is the content, not the place: the same bytes elsewhere share the folder
    shutil.copytree(tmp_path / "data", tmp_path / "copy")
    assert artifacts.raw_idx("fashion-mnist", str(tmp_path / "copy")).dir == b.dir
    assert parts(home) == []


def test_raw_sources_are_copied_into_the_cache_so_its_folder_holds_every_file(home, tmp_path):
    raw = fake_fashion_mnist(tmp_path / "data", seed=3, gz=False)
    r = artifacts.raw_idx("fashion-mnist", str(tmp_path / "data"))
    assert sorted(p.name for p in (r.dir / "fashion-mnist").iterdir()) == sorted(STEMS)
    assert all(p.parent == r.dir / "fashion-mnist" and p.read_bytes() == raw[p.name] for p in r.files.values())
    # a copy, not a link: the source rewritten in place leaves the cached bytes as they were
    src = tmp_path / "data" / "fashion-mnist" / "t10k-labels-idx1-ubyte"
    rewrite_keeping_mtime(src, idx_bytes(np.zeros(64)))
    assert r.files["fashion-mnist/t10k-labels-idx1-ubyte"].read_bytes() == raw["t10k-labels-idx1-ubyte"]


def test_a_local_cpp_run_reads_raw_sources_from_the_cache(native, tmp_path):
    """The binary here reads the cache's folder of the data set: raw (not gzipped) sources were
    left out of it, so it found no data, or another data set's files of the same names."""
    raw = fake_fashion_mnist(tmp_path / "data", seed=8, gz=False)
    env = {"HOME": str(tmp_path / "home"), "ZOBENCH_DATA": str(tmp_path / "data")}
    out = zobench("run", "--target", "local", "--runtime", "cpp", "--method", "full-zo", "--no-report",
                  "--results", tmp_path / "results", *SHORT, env=env)
    assert out.returncode == 0, out.stderr
    store = Store(tmp_path / "results")
    (r,) = store.results(store.latest())
    assert r["status"] == "ok" and r["job"]["runtime"] == "cpp", r["error"]
    folder = Path(r["job"]["workload"]["data_dir"], "fashion-mnist")
    assert folder.is_relative_to(tmp_path / "home" / ".cache" / "zobench" / "data")
    assert {p.name: p.read_bytes() for p in folder.iterdir()} == raw


@pytest.mark.parametrize("gz", [True, False])
def test_a_truncated_source_is_refused_naming_it_and_leaves_no_part_file(home, tmp_path, gz):
    good = fake_fashion_mnist(tmp_path / "good", seed=4, gz=gz)
    kept = artifacts.raw_idx("fashion-mnist", str(tmp_path / "good"))
    fake_fashion_mnist(tmp_path / "data", seed=5, gz=gz)
    src = tmp_path / "data" / "fashion-mnist" / ("train-images-idx3-ubyte" + (".gz" if gz else ""))
    src.write_bytes(src.read_bytes()[:5000])
    with pytest.raises(DatasetError) as e:
        artifacts.raw_idx("fashion-mnist", str(tmp_path / "data"))
    assert str(src) in str(e.value) and "replace it" in str(e.value)
    assert ("truncated or damaged" if gz else "header says (320, 28, 28) but holds") in str(e.value)
    assert parts(home) == []
    assert all(p.read_bytes() == good[p.name] for p in kept.files.values())


def test_init_weights_are_named_by_the_source_of_their_generator(home, tmp_path):
    """A copy of the checkout with zrng.py, then models.py, edited: each edit names new files."""
    copy = tmp_path / "checkout"
    for pkg in ("harness", "workloads"):
        shutil.copytree(REPO / pkg, copy / pkg, ignore=shutil.ignore_patterns("__pycache__", "cpp"))

    def name() -> str:
        return subprocess.run([sys.executable, "-c", "from harness.preparation.artifacts import init_weights_name as n; "
                               "from workloads.models import LENET5; print(n(LENET5, 7))"],
                              cwd=copy, env={**os.environ, "PYTHONPATH": str(copy)},
                              capture_output=True, text=True, check=True).stdout.strip()

    here = artifacts.init_weights_name(LENET5, 7)
    assert name() == here
    names = {here}
    for module in ("zrng.py", "models.py"):
        with open(copy / "workloads" / module, "a") as f:
            f.write("\n# an edit that changes no number\n")
        names.add(name())
    assert len(names) == 3
    path = artifacts.init_weights_file(LENET5, 7)
    assert path.name == here
    assert np.array_equal(np.fromfile(path, "<f4"), LENET5.init_weights(7))
    assert parts(home) == []


def test_an_onnx_graph_missing_from_the_cache_is_written_again(home):
    pytest.importorskip("onnx")
    path = artifacts.onnx_graph(LENET5, "elastic-zo", 1)
    data = path.read_bytes()
    path.unlink()                           # a cleared cache while the process still runs
    assert artifacts.onnx_graph(LENET5, "elastic-zo", 1) == path
    assert path.read_bytes() == data


def test_the_build_folder_is_keyed_on_toolchain_compiler_and_flags(tmp_path, monkeypatch):
    toolchain = tmp_path / "aarch64-linux-gnu.cmake"
    shutil.copyfile(REPO / "targets" / "toolchains" / "aarch64-linux-gnu.cmake", toolchain)
    options = ["-DCMAKE_BUILD_TYPE=Release", "-DZOBENCH_CPU_FLAGS=-mcpu=cortex-a53",
               f"-DCMAKE_TOOLCHAIN_FILE={toolchain}"]
    monkeypatch.delenv("CXXFLAGS", raising=False)
    key = configuration(options, toolchain)
    assert configuration(options, toolchain) == key                   # nothing changed: the same folder
    assert configuration(["-DCMAKE_BUILD_TYPE=Debug", *options[1:]], toolchain) != key
    assert configuration([options[0], "-DZOBENCH_CPU_FLAGS=-mcpu=cortex-a72", options[2]], toolchain) != key
    monkeypatch.setenv("CXXFLAGS", "-O1")
    assert configuration(options, toolchain) != key
    monkeypatch.delenv("CXXFLAGS")
    sysroot = "set(CMAKE_FIND_ROOT_PATH /usr/aarch64-linux-gnu)"
    toolchain.write_text(toolchain.read_text().replace(sysroot, "set(CMAKE_FIND_ROOT_PATH /opt/sysroot)"))
    assert configuration(options, toolchain) != key
    toolchain.write_text(toolchain.read_text().replace("aarch64-linux-gnu-g++", "g++"))   # another compiler
    other = configuration(options, toolchain)
    toolchain.write_text(toolchain.read_text().replace("set(CMAKE_FIND_ROOT_PATH /opt/sysroot)", sysroot))
    assert configuration(options, toolchain) not in (key, other)


def test_an_ssh_run_trains_on_the_data_zobench_data_names_now(farm, tmp_path):
    """The reported case: a second run, with the data set changed in place, trained on the
    first run's cached copy; then a truncated source left a .part file and a traceback."""
    inv = tmp_path / "inventory.toml"
    inv.write_text(board_toml("board-a", farm["boards"]["board-a"], farm["key"], tmp_path / "work",
                              runtimes=["ort"]))     # the quickest runner to start: this is about its data
    # a HOME of its own: the cache holds only what these runs made (the farm's is the session's workers')
    home = client_home(tmp_path / "home", [farm["boards"]["board-a"]])
    env = {"HOME": str(home), "ZOBENCH_DATA": str(tmp_path / "data")}
    args = ("run", "--inventory", inv, "--target", "board-a", "--method", "full-zo", "--no-report", *SHORT)
    cache = home / ".cache" / "zobench"

    store = Store(tmp_path / "results")

    def run_on(data: dict[str, bytes]) -> dict:
        out = zobench(*args, "--results", store.root, env=env)
        assert out.returncode == 0, out.stderr
        (r,) = store.results(store.latest())
        assert r["status"] == "ok", r["error"]
        trained_on = Path(r["job"]["workload"]["data_dir"], "fashion-mnist", "train-images-idx3-ubyte")
        assert "/work/bundles/" in str(trained_on) and trained_on.read_bytes() == data["train-images-idx3-ubyte"]
        return r

    first = run_on(fake_fashion_mnist(tmp_path / "data", seed=6))
    new = fake_fashion_mnist(tmp_path / "new", seed=7)
    for stem in STEMS:
        rewrite_keeping_mtime(tmp_path / "data" / "fashion-mnist" / f"{stem}.gz",
                              (tmp_path / "new" / "fashion-mnist" / f"{stem}.gz").read_bytes())
    second = run_on(new)
    assert second["model"]["weights_sha256"] != first["model"]["weights_sha256"]

    src = tmp_path / "data" / "fashion-mnist" / "train-images-idx3-ubyte.gz"
    src.write_bytes(src.read_bytes()[:1000])
    second_run = store.latest()
    out = zobench(*args, "--results", store.root, env=env)
    assert out.returncode == 2 and "Traceback" not in out.stderr
    (line,) = [l for l in out.stderr.splitlines() if l.startswith("zobench: error:")]
    assert f"dataset 'fashion-mnist': {src} is truncated or damaged" in line
    assert parts(cache) == []
    assert store.results(second_run) == [second]                # what was there before is kept


def test_a_damaged_pretrained_weights_file_in_the_cache_is_made_again(home, tmp_path):
    """Named for its content's sha256: a cached file that no longer holds it would fail every
    fine-tuning job and every --resume the same way."""
    source = tmp_path / "weights.bin"
    source.write_bytes(np.arange(1000, dtype=np.float32).tobytes())
    sha = artifacts.content_id(source)[0]
    cached = artifacts.pretrained_weights_file(source, sha)
    assert cached.read_bytes() == source.read_bytes()
    for damage in (b"", source.read_bytes()[:100], b"x" + source.read_bytes()[1:]):
        cached.write_bytes(damage)
        assert artifacts.pretrained_weights_file(source, sha) == cached and cached.read_bytes() == source.read_bytes()
