"""The one interface between the controller and a target: exec / run / put / get (and transfer:
how put and get move files there).

Every code path above it (probe, deploy, job execution) is the same for this
machine and for a board over SSH (harness/boards/ssh.py); only the transport differs.
run() streams stdout lines to a callback, enforces a timeout by killing the
job's whole process group (a Deadline its caller may restart), and reports how the command
ended. A run-wide Stop
(set by `zobench run`'s SIGINT/SIGTERM handler) makes every run() in progress kill
its job's process group the same way and return Outcome(interrupted=True).
"""
from __future__ import annotations

import os
import shutil
import signal
import subprocess
import threading
import time
from dataclasses import dataclass
from pathlib import Path

from workloads.jsonfile import temp_name


POLL_S = 0.2       # how often a waiting run() looks at its timeout and at the run's Stop


class TransportError(Exception):
    """The target could not be reached or a transfer failed; the message says which and why."""


class Stop:
    """A run-wide request to stop, made once (from a signal handler, so it only sets a field):
    every transport's run() in progress sees it within POLL_S, kills its job's process group
    and returns Outcome(interrupted=True, error=reason + what it killed)."""

    def __init__(self):
        self.reason = ""

    def request(self, reason: str) -> None:
        if not self.reason:
            self.reason = reason

    def is_set(self) -> bool:
        return bool(self.reason)


class Deadline:
    """A run()'s timeout, which its caller may restart from a line of the command's output: a
    job's own time starts when its runner holds the board's lease, not while it waits for it."""

    def __init__(self, seconds: float):
        self.restart(seconds)

    def restart(self, seconds: float) -> None:
        self.at = time.monotonic() + seconds

    def passed(self) -> bool:
        return time.monotonic() > self.at


def deadline(timeout: "float | Deadline") -> Deadline:
    return timeout if isinstance(timeout, Deadline) else Deadline(timeout)


@dataclass
class Outcome:
    returncode: int | None      # negative: killed by that signal (POSIX convention)
    timed_out: bool = False
    stderr_tail: str = ""
    lost: bool = False          # the connection to the target went away mid-job
    error: str = ""
    interrupted: bool = False   # the run's Stop killed it (error says why)


KILLED = "the runner's process group was killed"


class LocalTransport:
    """This machine: commands are subprocesses of the controller, each in its own session."""

    where = "this machine"
    bytes_sent = 0

    def __init__(self, stop: Stop | None = None):
        self.stop = stop or Stop()

    def connect(self) -> None:
        pass

    def close(self) -> None:
        pass

    def path(self, p: str) -> str:
        return os.path.expanduser(p)

    def transfer(self) -> str:
        """How files reach the target (SshTransport: "sftp" or "tar"): here they are copied."""
        return "local"

    def exec(self, command: str, timeout: float = 60, stdin: str | None = None) -> tuple[int, str, str]:
        """Run a short shell command in its own session; past `timeout` its whole process group is
        killed and a TransportError says so (as over SSH), so a hung probe ends only its board."""
        proc = subprocess.Popen(["sh", "-c", command], stdin=subprocess.DEVNULL if stdin is None else subprocess.PIPE,
                                stdout=subprocess.PIPE, stderr=subprocess.PIPE, start_new_session=True)
        try:
            out, err = proc.communicate(None if stdin is None else stdin.encode(), timeout=timeout)
        except BaseException as e:      # a timeout, or Ctrl-C outside `zobench run`: leave nothing running
            kill_group(proc)
            if isinstance(e, subprocess.TimeoutExpired):
                raise TransportError(f"{self.where}: `{command[:60]}` did not end within {timeout:g} s; "
                                     "its process group was killed") from None
            raise
        return proc.returncode, out.decode(errors="replace"), err.decode(errors="replace")

    def run(self, argv: list[str], *, cwd: str, timeout: float | Deadline, on_line=None, env: dict | None = None,
            stdout_path: Path | None = None, stderr_path: Path | None = None) -> Outcome:
        if self.stop.is_set():
            return Outcome(None, interrupted=True, error=f"{self.stop.reason} before its runner started")
        out_f = open(stdout_path, "w", buffering=1) if stdout_path else None   # line by line: live progress
        err_f = open(stderr_path, "w+") if stderr_path else subprocess.DEVNULL
        try:
            proc = subprocess.Popen(argv, cwd=cwd, env={**os.environ, "PYTHONUNBUFFERED": "1", **(env or {})},
                                    stdin=subprocess.DEVNULL, stdout=subprocess.PIPE, stderr=err_f, text=True,
                                    start_new_session=True)
            reader = threading.Thread(target=_pump, args=(proc.stdout, on_line, out_f), daemon=True)
            reader.start()
            ends, timed_out, interrupted = deadline(timeout), False, False
            while proc.poll() is None:
                timed_out = ends.passed()
                interrupted = self.stop.is_set()
                if timed_out or interrupted:
                    kill_group(proc)
                    break
                try:
                    proc.wait(timeout=POLL_S)
                except subprocess.TimeoutExpired:
                    pass
            reader.join(timeout=5)
            tail = ""
            if stderr_path:
                err_f.seek(0)
                tail = err_f.read()[-2000:]
            return Outcome(proc.returncode, timed_out and not interrupted, tail, interrupted=interrupted,
                           error=f"{self.stop.reason}; {KILLED}" if interrupted else "")
        finally:
            if out_f:
                out_f.close()
            if stderr_path:
                err_f.close()

    # put/get take the same timeout as SshTransport's; local file copies need none
    def put_bytes(self, data: bytes, remote: str, timeout: float = 600) -> None:
        self._write(remote, lambda tmp: Path(tmp).write_bytes(data))

    def put(self, local: Path, remote: str, timeout: float = 600) -> None:
        self._write(remote, lambda tmp: shutil.copyfile(local, tmp))     # streamed, not read into memory

    def put_many(self, folder: str, files: dict[str, Path], timeout: float = 600) -> None:
        for name, local in files.items():
            self.put(local, os.path.join(folder, name), timeout)

    def _write(self, remote: str, write) -> None:
        """write(tmp), then rename it to remote; a failed write leaves no part file behind."""
        tmp = temp_name(remote)
        try:
            write(tmp)
            os.replace(tmp, remote)
        finally:
            if os.path.exists(tmp):
                os.unlink(tmp)

    def get(self, remote: str, local: Path, timeout: float = 600) -> bool:
        if not os.path.exists(remote):
            return False
        if os.path.abspath(remote) != os.path.abspath(local):
            shutil.copyfile(remote, local)
        return True


def _pump(stream, on_line, copy_to) -> None:
    for line in stream:
        if copy_to:
            try:
                copy_to.write(line)
            except OSError:     # the log's disk is full: the job's events still count
                copy_to = None
        if on_line:
            on_line(line)


def kill_group(proc: subprocess.Popen, grace: float = 3.0) -> None:
    """SIGTERM the process group, give it `grace` seconds, then SIGKILL whatever is left of it
    (the leader may be gone while others of its group live on: the group is what is waited for)."""
    for sig in (signal.SIGTERM, signal.SIGKILL):
        try:
            os.killpg(proc.pid, sig)
        except ProcessLookupError:
            break
        until = time.monotonic() + grace
        while time.monotonic() < until and _group_alive(proc):
            time.sleep(0.05)
    proc.wait()


def _group_alive(proc: subprocess.Popen) -> bool:
    proc.poll()     # reaps the leader, so a dead one does not count as alive
    try:
        os.killpg(proc.pid, 0)
        return True
    except ProcessLookupError:
        return False
