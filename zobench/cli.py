"""zobench: the command line. Exit 0 = all good, 1 = a job did not end ok, or zobench itself met
an error it did not expect, 2 = bad usage or configuration (one line on stderr, no traceback).

It only parses: each command's options and its call into the library are in zobench/commands/,
and here is what every command shares: the one-line answer to a user's error, and the one error
boundary, which turns anything unexpected into one line and a log file (unexpected)."""
from __future__ import annotations

import errno
import importlib.metadata
import os
import secrets
import stat
import sys
import time
import tomllib
import traceback
from pathlib import Path

from harness.errors import Interrupted, UserError, one_line
from harness.store_url import said, scrub

from .commands import COMMANDS
from .commands.options import Parser

# where an unexpected error's traceback goes, a file an error (as pip keeps its log)
LOGS = "~/.cache/zobench/logs"
# the packages whose frames say what zobench was doing, in the checkout they are in
OURS = ("zobench", "harness", "workloads", "reports", "testkit", "scripts")
CHECKOUT = Path(__file__).resolve().parent.parent


def build_parser() -> Parser:
    ap = Parser(prog="zobench", description=__doc__.split("\n\n")[0])
    ap.add_argument("--version", action="version", version=f"zobench {version()}")
    sub = ap.add_subparsers(dest="command", required=True, parser_class=Parser)
    for command in COMMANDS:
        command.add(sub)
    return ap


def main(argv=None) -> int:
    argv = sys.argv[1:] if argv is None else list(argv)
    command = next((a for a in argv if not a.startswith("-")), "")

    def call() -> int:
        parser = build_parser()
        if not argv:        # a bare `zobench`: what it takes, not an error about it
            parser.print_usage(sys.stderr)
            return 2
        args = parser.parse_args(argv)
        return args.main(args)
    return guarded("zobench", command, call)


def version() -> str:
    """zobench's version as its package metadata has it (pyproject.toml's), else the checkout's."""
    try:
        return importlib.metadata.version("zobench")
    except importlib.metadata.PackageNotFoundError:
        return tomllib.loads((CHECKOUT / "pyproject.toml").read_text())["project"]["version"]


def guarded(prog: str, command: str, call) -> int:
    """call() inside the one error boundary of every command line zobench has (zobench itself and
    the scripts in scripts/, prog their name): a user's error one line `PROG: error: ...` and exit
    2; anything unexpected one line naming where it happened, its traceback logged, and exit 1."""
    try:
        return call()
    except UserError as e:
        print(f"{prog}: error: {one_line(scrub(str(e)))}", file=sys.stderr)
        return 2
    except Interrupted as e:    # a signal stopped work that keeps nothing (a fetch): its line, 128 + the signal
        print(f"{prog}: {one_line(scrub(str(e)))}", file=sys.stderr)
        return 128 + e.signum
    except KeyboardInterrupt:   # `zobench run` handles its own (zobench/running.py); elsewhere nothing is left running
        print(f"{prog}: interrupted", file=sys.stderr)
        return 130
    except BrokenPipeError:     # `zobench results | head`: the reader has all it wanted
        os.dup2(os.open(os.devnull, os.O_WRONLY), sys.stdout.fileno())   # no second error at exit
        return 0
    except Exception as e:      # noqa: BLE001 (the boundary: every other error ends here, once)
        if type(e).__module__.split(".")[0] == "psycopg":   # the shared store's driver: a table dropped or changed by hand
            print(f"{prog}: error: the shared store: {type(e).__name__}: {said(e)}", file=sys.stderr)
            return 2
        print(unexpected(command, e, prog), file=sys.stderr)
        return 1


def runs_exit(prog: str, codes: list[int]) -> int:
    """The exit of a script that started zobench runs, from theirs: 0 when every run ended ok; 2
    (and a line saying so) when every one was refused as bad usage or configuration, so nothing
    ran; else 1, as zobench's own exit for a job that did not end ok."""
    if codes and all(c == 2 for c in codes):
        print(f"{prog}: error: every run it started was refused ({len(codes)}; each said why above)", file=sys.stderr)
        return 2
    return 0 if all(c == 0 for c in codes) else 1


def unexpected(command: str, e: BaseException, prog: str = "zobench") -> str:
    """The one line for an error zobench did not expect: the command, the function of ours it
    was in (what it was doing), the exception, scrubbed; the traceback, scrubbed too, in a log
    file the line names. Where the log cannot be written (a full disk), the line says so."""
    frames = [f for f in traceback.extract_tb(e.__traceback__) if _ours(f.filename)]
    where = f" in {frames[-1].name} ({_short(frames[-1].filename)}:{frames[-1].lineno})" if frames else ""
    line = f"{prog} {command or ''}".rstrip() + f": unexpected error{where}: {type(e).__name__}: {said(e)}"
    try:
        log = write_log(scrub(f"{prog} {' '.join(sys.argv[1:])}\n" + "".join(traceback.format_exception(e))))
        return f"{line}; the traceback is in {log}"
    except OSError as why:
        return f"{line}; its traceback could not be logged ({type(why).__name__}: {said(why)})"


def write_log(text: str) -> Path:
    """text in a new log file of LOGS: a folder only this user can write (made 0700; one that is
    a symlink, another's or writable by others is refused), a name nobody can guess (the time,
    the pid and random hex), opened O_CREAT | O_EXCL | O_NOFOLLOW, 0600. So a file or symlink
    planted where the log goes is never written through: the open fails instead."""
    logs = Path(LOGS).expanduser()
    logs.mkdir(mode=0o700, parents=True, exist_ok=True)
    st = os.lstat(logs)
    if not stat.S_ISDIR(st.st_mode) or st.st_uid != os.geteuid() or st.st_mode & 0o022:
        raise PermissionError(errno.EPERM, "not a folder only this user can write", str(logs))
    log = logs / f"zobench-{time.strftime('%Y%m%d-%H%M%S')}-{os.getpid()}-{secrets.token_hex(4)}.log"
    fd = os.open(log, os.O_WRONLY | os.O_CREAT | os.O_EXCL | os.O_NOFOLLOW, 0o600)
    with os.fdopen(fd, "w") as f:
        f.write(text)
    return log


def _ours(filename: str) -> bool:
    """Whether a frame is in zobench's own code (the checkout's packages, not the venv's)."""
    rel = _short(filename)
    return rel.split("/")[0] in OURS


def _short(filename: str) -> str:
    """A file's path in the checkout (harness/stores/store.py), or its own where it is elsewhere."""
    try:
        return Path(filename).resolve().relative_to(CHECKOUT).as_posix()
    except ValueError:
        return filename


if __name__ == "__main__":
    sys.exit(main())
