"""`zobench publish`: the shared store, or a results folder, as a static website of overviews,
histories, comparisons and machines (harness/analysis/site.py, docs/dashboard.md)."""
from __future__ import annotations

import contextlib
import functools
import http.server
import sys
from pathlib import Path

from rich.console import Console
from rich.progress import BarColumn, MofNCompleteColumn, Progress, TextColumn, TimeElapsedColumn, TimeRemainingColumn

from workloads.spec import Bounds

from harness.analysis.compare import THRESHOLD
from harness import paths
from harness.errors import UserError
from harness.stores import pgstore
from harness.stores.store import Store, results_dir

from . import options


def add(sub) -> None:
    p = sub.add_parser("publish", help="write the shared store (or a results folder) as a static website: "
                                       "overview, each key's history, compare views, machines, run reports")
    options.add_store(p, "publish this shared store")
    p.add_argument("--results", type=results_dir, metavar="DIR",
                   help="publish this results folder instead of a shared store")
    p.add_argument("--out", type=Path, required=True, metavar="DIR", help="the site's folder (written in place)")
    p.add_argument("--threshold", type=options.number(float, Bounds(0, 1000.0)), default=100 * THRESHOLD, metavar="PCT",
                   help="smallest relative change that counts, in percent (default 5, as compare and history)")
    options.add_estimator(p)
    p.add_argument("--reports", type=options.number(int, Bounds(0, 100000)), default=10, metavar="N",
                   help="the report of each of the last N runs (default 10; kept from an earlier publish)")
    p.add_argument("--compare-last", type=options.number(int, Bounds(0, 100000)), default=20, metavar="N",
                   help="compare views of each branch's last N consecutive commits, besides every change "
                        "point's (default 20)")
    p.add_argument("--serve", action="store_true", help="then serve the site on localhost until interrupted")
    p.add_argument("--port", type=options.number(int, Bounds(0, 65535)), default=8000,
                   help="--serve's port (default 8000; 0: any free one)")
    p.set_defaults(main=main)


def main(args) -> int:
    from harness.analysis import site

    url = None if args.results else pgstore.url_from(args.store)
    out = args.out.resolve()

    def publish(source) -> dict:
        with bars() as track:
            return site.publish(source, out, args.threshold / 100, args.estimator, args.reports, args.compare_last,
                                options.say, track)

    try:
        if url:
            with pgstore.SharedStore(url) as shared:
                wrote = publish(site.SharedSource(shared))
        else:
            store = Store(args.results or results_dir(paths.DEFAULT_RESULTS))
            if not store.run_ids():
                raise UserError(f"publish: no run in {store.root} (and no --store, $ZOBENCH_STORE or config's store)")
            wrote = publish(site.FolderSource(store))
    except OSError as e:
        raise UserError(f"publish --out {args.out}: cannot write {e.filename or ''}: {e.strerror or e}") from None
    print(f"site: {out / 'index.html'} ({wrote['keys']} keys, {wrote['series']} series, {wrote['compares']} "
          f"compare views, {wrote['reports']} run reports; the overview loads "
          f"{wrote['overview_bytes'] / 1024:.0f} KiB)", flush=True)
    if args.serve:
        serve(out, args.port)
    return 0


@contextlib.contextmanager
def bars():
    """track(items, what): a progress bar with its ETA over each long loop, on a terminal."""
    console = Console(stderr=True)
    with Progress(TextColumn("{task.description}"), BarColumn(), MofNCompleteColumn(), TimeElapsedColumn(),
                  TextColumn("ETA"), TimeRemainingColumn(), console=console, transient=True,
                  disable=not console.is_terminal) as progress:
        yield lambda items, what: progress.track(items, total=len(items), description=what)


def server(folder: Path, port: int) -> http.server.ThreadingHTTPServer:
    """An HTTP server of the site on 127.0.0.1 (the pages fetch their data, which browsers refuse
    from file://); port 0: any free one. UserError where the port is taken or not ours to bind."""
    try:
        return Server(("127.0.0.1", port), functools.partial(SiteFiles, directory=str(folder.resolve())))
    except OSError as e:
        raise UserError(f"publish --serve --port {port}: cannot listen on 127.0.0.1:{port} ({e.strerror or e}); "
                        "give another port with --port, or --port 0 for any free one") from None


def serve(folder: Path, port: int) -> None:
    with server(folder, port) as httpd:
        print(f"serving http://127.0.0.1:{httpd.server_address[1]}/ (Ctrl-C stops)", file=sys.stderr, flush=True)
        try:
            httpd.serve_forever()
        except KeyboardInterrupt:
            pass


class Server(http.server.ThreadingHTTPServer):
    def handle_error(self, request, client_address) -> None:
        """A request that fails (a client gone mid-answer) ends that request, with no traceback."""


class SiteFiles(http.server.SimpleHTTPRequestHandler):
    """The site's files and nothing else: a path that leaves the site's folder (a symlink out of
    it, a ../) or names a folder without an index.html is not found, and a path the file system
    cannot take (a NUL byte) is a bad request; no folder is ever listed."""

    def send_head(self):
        try:
            path = Path(self.translate_path(self.path))
            real, root = path.resolve(), Path(self.directory)
            if not real.is_relative_to(root) or (real.is_dir() and not (real / "index.html").is_file()):
                self.send_error(http.HTTPStatus.NOT_FOUND, "File not found")
                return None
            return super().send_head()
        except (ValueError, OSError):      # an embedded NUL byte, a name too long
            self.send_error(http.HTTPStatus.BAD_REQUEST, "Bad path")
            return None

    def list_directory(self, path):
        self.send_error(http.HTTPStatus.NOT_FOUND, "File not found")
        return None

    def log_message(self, *args) -> None:   # a line per request would bury the address
        pass
