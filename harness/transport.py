"""The one interface between the controller and a target: exec / run / put / get.

Every code path above it (probe, deploy, job execution) is the same for this
machine and for a board over SSH (harness/ssh.py); only the transport differs.
run() streams stdout lines to a callback, enforces a timeout by killing the
job's whole process group, and reports how the command ended.
"""
from __future__ import annotations

import os
import shutil
import signal
import subprocess
import threading
from dataclasses import dataclass
from pathlib import Path


class TransportError(Exception):
    """The target could not be reached or a transfer failed; the message says which and why."""


@dataclass
class Outcome:
    returncode: int | None      # negative: killed by that signal (POSIX convention)
    timed_out: bool = False
    stderr_tail: str = ""
    lost: bool = False          # the connection to the target went away mid-job
    error: str = ""


class LocalTransport:
    """This machine: commands are subprocesses of the controller, each in its own session."""

    where = "this machine"
    bytes_sent = 0

    def connect(self) -> None:
        pass

    def close(self) -> None:
        pass

    def path(self, p: str) -> str:
        return os.path.expanduser(p)

    def exec(self, command: str, timeout: float = 60, stdin: str | None = None) -> tuple[int, str, str]:
        p = subprocess.run(["sh", "-c", command], input=stdin, capture_output=True, text=True, timeout=timeout)
        return p.returncode, p.stdout, p.stderr

    def run(self, argv: list[str], *, cwd: str, timeout: float, on_line=None, env: dict | None = None,
            stdout_path: Path | None = None, stderr_path: Path | None = None) -> Outcome:
        out_f = open(stdout_path, "w") if stdout_path else None
        err_f = open(stderr_path, "w+") if stderr_path else subprocess.DEVNULL
        try:
            proc = subprocess.Popen(argv, cwd=cwd, env={**os.environ, "PYTHONUNBUFFERED": "1", **(env or {})},
                                    stdin=subprocess.DEVNULL, stdout=subprocess.PIPE, stderr=err_f, text=True,
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

    # put/get take the same timeout as SshTransport's; local file copies need none
    def put_bytes(self, data: bytes, remote: str, timeout: float = 600) -> None:
        tmp = f"{remote}.part-{os.getpid()}"
        Path(tmp).write_bytes(data)
        os.replace(tmp, remote)

    def put(self, local: Path, remote: str, timeout: float = 600) -> None:
        tmp = f"{remote}.part-{os.getpid()}"
        shutil.copyfile(local, tmp)     # streamed, not read into memory
        os.replace(tmp, remote)

    def get(self, remote: str, local: Path, timeout: float = 600) -> bool:
        if not os.path.exists(remote):
            return False
        if os.path.abspath(remote) != os.path.abspath(local):
            shutil.copyfile(remote, local)
        return True


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
