"""The one interface between the controller and a target: run / put / get.

Every code path above it is the same for this machine and a board over SSH;
only the transport differs. run() streams stdout lines to a callback, enforces
a timeout by killing the whole process group, and reports how the command ended.
"""
from __future__ import annotations

import os
import shutil
import signal
import subprocess
import threading
from dataclasses import dataclass
from pathlib import Path


@dataclass
class Outcome:
    returncode: int | None      # negative: killed by that signal (POSIX convention)
    timed_out: bool = False
    stderr_tail: str = ""


class LocalTransport:
    """Runs commands as subprocesses of the controller, each in its own session."""

    def __init__(self, env: dict | None = None):
        self.env = {**os.environ, "PYTHONUNBUFFERED": "1", **(env or {})}

    def run(self, argv: list[str], *, cwd: Path, timeout: float, on_line=None,
            stdout_path: Path | None = None, stderr_path: Path | None = None) -> Outcome:
        out_f = open(stdout_path, "w") if stdout_path else None
        err_f = open(stderr_path, "w+") if stderr_path else subprocess.DEVNULL
        try:
            proc = subprocess.Popen(argv, cwd=cwd, env=self.env, stdin=subprocess.DEVNULL,
                                    stdout=subprocess.PIPE, stderr=err_f, text=True,
                                    start_new_session=True)
            reader = threading.Thread(target=_pump, args=(proc.stdout, on_line, out_f), daemon=True)
            reader.start()
            timed_out = False
            try:
                proc.wait(timeout=timeout)
            except subprocess.TimeoutExpired:
                timed_out = True
                _kill_group(proc)
            reader.join(timeout=5)
            tail = ""
            if stderr_path:
                err_f.seek(0)
                tail = err_f.read()[-2000:]
            return Outcome(proc.returncode, timed_out, tail)
        finally:
            if out_f:
                out_f.close()
            if stderr_path:
                err_f.close()

    def put(self, local: Path, remote: Path) -> None:
        shutil.copyfile(local, remote)

    def get(self, remote: Path, local: Path) -> None:
        shutil.copyfile(remote, local)


def _pump(stream, on_line, copy_to) -> None:
    for line in stream:
        if copy_to:
            copy_to.write(line)
        if on_line:
            on_line(line)


def _kill_group(proc: subprocess.Popen, grace: float = 3.0) -> None:
    """SIGTERM the process group, give it `grace` seconds, then SIGKILL whatever is left of it."""
    for sig in (signal.SIGTERM, signal.SIGKILL):
        try:
            os.killpg(proc.pid, sig)
        except ProcessLookupError:
            return
        try:
            proc.wait(timeout=grace)
        except subprocess.TimeoutExpired:
            pass
