"""The SSH transport: the same run / exec / put / get as LocalTransport, over fabric.

Host keys are checked against ~/.ssh/known_hosts and zobench's own
~/.config/zobench/known_hosts. An unknown key is refused unless the target
says host_key = "accept-new"; then it is recorded in zobench's file, and a
later change of that key is refused like any mismatch. No password is ever
read or stored: keys come from the target's `key`, ssh-agent or ~/.ssh/config.

Files travel over SFTP, or, where the board's SSH server has no SFTP subsystem (Dropbear or
the sshd of a small embedded image, which refuse the session as `Channel closed.`), as a tar
stream over an exec channel: `tar -x` on the board fed from here for a put, `tar -c` read here
for a get. Which one is found once per connection (transfer()), and the probe reports it. A
transfer that fails says which board, put or get, which file and over what, in one line.

A job's command runs under the login shell sshd starts, which is the leader of
its own session and process group; the shell reports its pid first, so a
timeout or the run's Stop kills the whole group from a second channel of the same
connection.
"""
from __future__ import annotations

import io
import logging
import os
import posixpath
import select
import shlex
import shutil
import socket
import tarfile
import time
from pathlib import Path

import paramiko
from fabric import Config, Connection

from workloads.jsonfile import temp_name

from harness.boards.transport import KILLED, POLL_S, Deadline, Outcome, Stop, TransportError, deadline

# paramiko's transport thread logs a socket error at ERROR; with no handler anywhere Python's
# last-resort handler prints it to stderr, a second line beside the one-line error we raise
logging.getLogger("paramiko").addHandler(logging.NullHandler())

MARK = "@zobench"
GRACE_S = 3.0
PGID_WAIT_S = 10.0      # how long a kill waits for the shell's first line (its pgid)
MISSING = 3             # the exit status of a tar get whose file is not on the board
CHANNEL_ERRORS = (OSError, socket.timeout, paramiko.SSHException, EOFError)


def known_hosts_file() -> Path:
    return Path("~/.config/zobench/known_hosts").expanduser()


def fingerprint(key: paramiko.PKey) -> str:
    return f"{key.get_name()} {key.fingerprint}"


class HostKeyRefused(TransportError):
    pass


def _load_known_hosts(load, path: Path) -> None:
    """Read a known_hosts file with load(filename); a line paramiko cannot read is the file's
    error, with its line number, not a traceback (and no board is trusted on a file half read)."""
    if not path.is_file():
        return
    try:
        load(str(path))
    except paramiko.hostkeys.InvalidHostKey as e:
        lines = path.read_text(errors="replace").splitlines()
        n = next((i + 1 for i, line in enumerate(lines) if line.strip() == str(e.line).strip()), "?")
        raise HostKeyRefused(f"{path}: line {n}: not a known_hosts entry ({e.exc}); fix or remove it") from None
    except (OSError, UnicodeDecodeError) as e:
        raise HostKeyRefused(f"{path}: cannot read it: {e}") from None


class _Policy(paramiko.MissingHostKeyPolicy):
    """strict: refuse unknown keys; accept-new: record them, in zobench's own file."""

    def __init__(self, mode: str, record_to: Path):
        self.mode, self.record_to = mode, record_to

    def missing_host_key(self, client, hostname, key):
        if self.mode != "accept-new":
            raise HostKeyRefused(
                f"unknown host key for {hostname}: {fingerprint(key)}; refusing to connect. Check the fingerprint "
                f"on the board, then add it to ~/.ssh/known_hosts or set host_key = \"accept-new\"")
        self.record_to.parent.mkdir(parents=True, exist_ok=True)
        with open(self.record_to, "a") as f:
            f.write(f"{hostname} {key.get_name()} {key.get_base64()}\n")
        client.get_host_keys().add(hostname, key.get_name(), key)


class SshTransport:
    def __init__(self, target, connect_timeout: float = 15.0, stop: Stop | None = None):
        self.target = target
        self.stop = stop or Stop()
        self.connect_timeout = connect_timeout
        self.bytes_sent = 0
        self.conn: Connection | None = None
        self._sftp = None
        self._transfer: str | None = None       # "sftp" or "tar", once found for this connection
        self.home = ""

    @property
    def where(self) -> str:
        t = self.target
        return f"{t.user + '@' if t.user else ''}{t.host}{':' + str(t.port) if t.port else ''}"

    # -- connection -----------------------------------------------------------
    def connect(self) -> None:
        if self.conn is not None and self.conn.is_connected:
            return
        t = self.target
        kwargs = {"banner_timeout": self.connect_timeout, "auth_timeout": self.connect_timeout}
        if t.key:
            kwargs["key_filename"] = [str(Path(t.key).expanduser())]
        conn = Connection(t.host, user=t.user or None, port=t.port or None, config=Config(),
                          connect_timeout=self.connect_timeout, connect_kwargs=kwargs)
        client = conn.client
        record = known_hosts_file()
        _load_known_hosts(client.load_system_host_keys, Path("~/.ssh/known_hosts").expanduser())
        _load_known_hosts(client.get_host_keys().load, record)
        client.set_missing_host_key_policy(_Policy(t.host_key, record))
        try:
            conn.open()
        except paramiko.BadHostKeyException as e:
            raise HostKeyRefused(f"host key of {self.where} has CHANGED: got {fingerprint(e.key)}, expected "
                                 f"{fingerprint(e.expected_key)}; refusing to connect (possible "
                                 "man-in-the-middle, or the board was reinstalled)") from None
        except paramiko.AuthenticationException as e:
            raise TransportError(f"authentication failed for {self.where}: {e}"
                                 + (f" (key {t.key})" if t.key else "")) from None
        except (OSError, socket.timeout, paramiko.SSHException, EOFError) as e:
            raise TransportError(f"cannot reach {self.where}: {_why(e)}") from None
        conn.transport.set_keepalive(5)
        self.conn, self._sftp, self._transfer = conn, None, None
        self.home = self.exec("printf %s \"$HOME\"", timeout=30)[1]

    def close(self) -> None:
        if self.conn is not None:
            self.conn.close()
        self.conn, self._sftp, self._transfer = None, None, None

    def path(self, p: str) -> str:
        """A remote path with ~ expanded (quoting would stop the shell from expanding it)."""
        if p == "~" or p.startswith("~/"):
            return self.home + p[1:]
        return p

    # -- the interface --------------------------------------------------------
    def exec(self, command: str, timeout: float = 60, stdin: str | None = None) -> tuple[int, str, str]:
        """Run a short shell command; (exit status, stdout, stderr)."""
        chan = self._channel()
        chan.settimeout(timeout)
        try:
            chan.exec_command(command)
            if stdin is not None:
                chan.sendall(stdin.encode())
                chan.shutdown_write()
            out, err = chan.makefile("rb").read(), chan.makefile_stderr("rb").read()
            return chan.recv_exit_status(), out.decode(errors="replace"), err.decode(errors="replace")
        except (socket.timeout, OSError, paramiko.SSHException, EOFError) as e:
            raise TransportError(f"{self.where}: `{command[:60]}` failed: {e or type(e).__name__}") from None
        finally:
            chan.close()

    def run(self, argv: list[str], *, cwd: str, timeout: float | Deadline, on_line=None, env: dict | None = None,
            stdout_path: Path | None = None, stderr_path: Path | None = None) -> Outcome:
        """Run a job's command, streaming stdout lines; kill its process group on timeout or Stop."""
        if self.stop.is_set():
            return Outcome(None, interrupted=True, error=f"{self.stop.reason} before its runner started")
        envs = " ".join(f"{k}={shlex.quote(v)}" for k, v in (env or {}).items())
        cmd = (f"echo {MARK} pgid $$; cd {shlex.quote(cwd)} && {'env ' + envs + ' ' if envs else ''}"
               f"{shlex.join(argv)}; echo {MARK} exit $?")
        chan = self._channel()
        chan.exec_command(cmd)
        pgid, rc, buf, err_tail = None, None, b"", b""
        out_f = open(stdout_path, "w", buffering=1) if stdout_path else None   # line by line: live progress
        err_f = open(stderr_path, "wb") if stderr_path else None
        ends, ending = deadline(timeout), None
        try:
            while True:
                if ending is None and (self.stop.is_set() or ends.passed()):
                    ending = time.monotonic()
                # the group is known once the shell's first line is in: wait for it (briefly), or nothing is killed
                if ending is not None and (pgid is not None or time.monotonic() > ending + PGID_WAIT_S):
                    tail = err_tail.decode(errors="replace")
                    if pgid is None:
                        return Outcome(None, lost=True, stderr_tail=tail, error=f"{self.where}: the job's shell "
                                       "never reported its process group; the runner may still run")
                    try:
                        self._kill_group(pgid)
                    except TransportError as e:
                        return Outcome(None, lost=True, stderr_tail=tail, error=f"{e}; the runner may still run")
                    if self.stop.is_set():
                        return Outcome(None, stderr_tail=tail, interrupted=True, error=f"{self.stop.reason}; {KILLED}")
                    return Outcome(None, timed_out=True, stderr_tail=tail)
                select.select([chan], [], [], POLL_S)
                while chan.recv_stderr_ready():
                    data = chan.recv_stderr(65536)
                    err_tail = (err_tail + data)[-2000:]
                    if err_f:
                        err_f.write(data)
                if chan.recv_ready():
                    data = chan.recv(65536)
                    buf += data
                    *lines, buf = buf.split(b"\n")
                    for raw in lines:
                        line = raw.decode(errors="replace")
                        if line.startswith(MARK):
                            word, value = line.split()[1:3]
                            pgid, rc = (int(value), rc) if word == "pgid" else (pgid, int(value))
                            continue
                        if out_f:
                            out_f.write(line + "\n")
                        if on_line:
                            on_line(line)
                    continue
                if chan.exit_status_ready() and not chan.recv_ready() and not chan.recv_stderr_ready():
                    break
                if not self.conn.transport.is_active():
                    return Outcome(None, lost=True, stderr_tail=err_tail.decode(errors="replace"),
                                   error=f"connection to {self.where} lost mid-job")
            if rc is None:   # the shell itself died: the session went away with it
                return Outcome(None, lost=True, stderr_tail=err_tail.decode(errors="replace"),
                               error=f"connection to {self.where} lost mid-job: the session ended without an exit status")
            # a shell reports "killed by signal N" as 128+N
            return Outcome(-(rc - 128) if rc > 128 else rc, stderr_tail=err_tail.decode(errors="replace"))
        except (OSError, paramiko.SSHException, EOFError) as e:
            return Outcome(None, lost=True, error=f"connection to {self.where} lost mid-job: {e}")
        finally:
            chan.close()
            for f in (out_f, err_f):
                if f:
                    f.close()

    def transfer(self) -> str:
        """How files reach this board: "sftp", or "tar" (a tar stream over an exec channel) where
        its SSH server refuses an SFTP session. Found once per connection."""
        if self._transfer is None:
            self.connect()
            try:
                self._sftp = self.conn.sftp()
                self._transfer = "sftp"
            except (paramiko.SSHException, OSError, EOFError) as e:
                if not self.conn.transport.is_active():
                    self.close()
                    raise TransportError(f"connection to {self.where} lost: {_reason(e)}") from None
                rc, _, _ = self.exec("command -v tar >/dev/null", timeout=30)
                if rc != 0:
                    raise TransportError(f"{self.target.name} ({self.where}): no way to send files: its SSH server "
                                         f"has no SFTP ({_reason(e)}) and the board has no tar") from None
                self._transfer = "tar"
        return self._transfer

    def put_bytes(self, data: bytes, remote: str, timeout: float = 600) -> None:
        """Write a remote file atomically (temp name, then rename); counts the bytes sent."""
        folder, name = posixpath.split(remote)
        self._send(folder, {name: data}, timeout)

    def put(self, local: Path, remote: str, timeout: float = 600) -> None:
        """put_bytes of a local file, streamed from disk (a data set is tens of MB)."""
        folder, name = posixpath.split(remote)
        self._send(folder, {name: local}, timeout)

    def put_many(self, folder: str, files: dict[str, Path], timeout: float = 600) -> None:
        """put of each local file to folder/name: over tar in one stream, so one channel (each
        costs a login shell on the board) however many files a deploy sends."""
        if files:
            self._send(folder, files, timeout)

    def get(self, remote: str, local: Path, timeout: float = 600) -> bool:
        """Fetch a remote file; False if it does not exist. The local file appears only
        when complete (paramiko's get() would leave an empty one behind on a miss)."""
        kind = self.transfer()
        tmp = Path(temp_name(local))
        try:
            if kind == "sftp":
                try:
                    self._sftp_client(timeout).get(remote, str(tmp))
                except FileNotFoundError:
                    return False
                except CHANNEL_ERRORS as e:
                    raise self._failed(f"get {remote} to {local}", kind, _reason(e)) from None
            elif not self._get_tar(remote, tmp, timeout, f"get {remote} to {local}"):
                return False
            os.replace(tmp, local)
            return True
        finally:
            tmp.unlink(missing_ok=True)

    # -- helpers ----------------------------------------------------------------
    def _failed(self, step: str, kind: str, why: str) -> TransportError:
        """A transfer's error: the board (its name and address), the step and the board's reason, in one line."""
        return TransportError(" ".join(f"{self.target.name} ({self.where}): {step} over {kind} failed: {why}".split()))

    def _send(self, folder: str, files: dict[str, "bytes | Path"], timeout: float) -> None:
        """Each of files (name -> its bytes or local file) to folder/name, written under a temp name and
        renamed once whole; counts the bytes sent."""
        kind = self.transfer()
        if kind == "tar":
            self._put_tar(folder, files, timeout)
            return
        for name, src in files.items():
            remote = posixpath.join(folder, name)
            sftp, tmp = self._sftp_client(timeout), temp_name(remote)
            with _source(src) as f:
                try:
                    size = sftp.putfo(f, tmp).st_size
                    sftp.posix_rename(tmp, remote)
                except CHANNEL_ERRORS as e:
                    try:    # a transfer cut off (disk full, timeout) leaves no part file on the board
                        sftp.remove(tmp)
                    except CHANNEL_ERRORS:
                        pass
                    raise self._failed(f"put {_what(src)} to {remote}", kind, _reason(e)) from None
            self.bytes_sent += size

    def _put_tar(self, folder: str, files: dict[str, "bytes | Path"], timeout: float) -> None:
        """The files as one tar stream, unpacked by the board's tar in folder under temp names,
        each renamed to its own once all are in; on a failure no part file is left there."""
        q = shlex.quote
        tmps = {name: temp_name(name) for name in files}
        renames = " && ".join(f"mv -f {q(tmp)} {q(name)}" for name, tmp in tmps.items())
        command = (f"cd {q(folder or '.')} || exit 1; {{ tar -x -f - && {renames}; }} || "
                   f"{{ rm -f {' '.join(q(t) for t in tmps.values())}; exit 1; }}")

        def failed(why: str, err: str = "") -> TransportError:
            # the file the board's tar named, else the only one, else how many
            named = sorted((err.find(tmp), name) for name, tmp in tmps.items() if tmp in err)
            name = named[0][1] if named else next(iter(files)) if len(files) == 1 else None
            step = (f"put {_what(files[name])} to {posixpath.join(folder, name)}" if name else
                    f"put {len(files)} files ({_what(next(iter(files.values())))}, ...) to {folder}")
            return self._failed(step, "tar", why)

        chan = self._channel()
        chan.settimeout(timeout)
        size, cut = 0, ""
        try:
            try:
                chan.exec_command(command)
            except CHANNEL_ERRORS as e:
                raise failed(_reason(e)) from None
            try:
                with tarfile.open(fileobj=_Sender(chan), mode="w|", format=tarfile.GNU_FORMAT) as tar:
                    for name, src in files.items():
                        with _source(src) as f:
                            info = tarfile.TarInfo(tmps[name])
                            info.size = len(src) if isinstance(src, bytes) else os.fstat(f.fileno()).st_size
                            info.mode, info.mtime, info.type = 0o644, int(time.time()), tarfile.REGTYPE
                            info.uid = info.gid = 0     # the board's tar makes it its user's (root's own as root)
                            info.uname = info.gname = ""
                            tar.addfile(info, f)
                            size += info.size
                chan.shutdown_write()
            except _Cut as c:
                cut = c.why
            except CHANNEL_ERRORS as e:
                cut = _reason(e)
            if cut and not chan.exit_status_ready():
                raise failed(cut)
            try:        # stderr first: it has the channel's timeout, the exit status has none
                err = chan.makefile_stderr("rb").read().decode(errors="replace")
                rc = chan.recv_exit_status()
            except CHANNEL_ERRORS as e:
                raise failed(_reason(e)) from None
        finally:
            chan.close()
        if rc != 0 or cut:          # the board's reason, where its tar or shell gave one: its line on the file
            lines = [line.strip() for line in err.splitlines() if line.strip()]
            why = next((line for line in lines if any(t in line for t in tmps.values())), lines[0] if lines else "")
            for name, tmp in tmps.items():
                why = why.replace(tmp, name)
            raise failed(why[-300:] or cut or f"exit status {rc}", err)
        self.bytes_sent += size

    def _get_tar(self, remote: str, tmp: Path, timeout: float, step: str) -> bool:
        """remote as the board's tar sends it (symlinks followed) into tmp; False if it does not exist."""
        q = shlex.quote
        folder, name = posixpath.split(remote)
        chan = self._channel()
        chan.settimeout(timeout)
        problem = ""
        try:
            chan.exec_command(f"[ -e {q(remote)} ] || exit {MISSING}; tar -c -h -f - -C {q(folder or '.')} "
                              f"{q('./' + name)}")
            out = chan.makefile("rb")
            try:
                with tarfile.open(fileobj=out, mode="r|") as tar:
                    member = tar.next()
                    if member is None or not member.isfile():
                        problem = "not a file" if member is not None else "the board's tar sent nothing"
                    else:
                        with open(tmp, "wb") as dst:
                            shutil.copyfileobj(tar.extractfile(member), dst)
            except tarfile.TarError as e:
                problem = f"not a tar stream ({e})"
            while out.read(65536):       # the rest (padding, or a folder's other members)
                pass
            err = chan.makefile_stderr("rb").read().decode(errors="replace")
            rc = chan.recv_exit_status()
        except CHANNEL_ERRORS as e:
            raise self._failed(step, "tar", _reason(e)) from None
        finally:
            chan.close()
        if rc == MISSING and not err.strip():
            return False
        if rc != 0 or problem:
            raise self._failed(step, "tar", _last(err) or problem or f"exit status {rc}")
        return True

    def _channel(self):
        self.connect()
        try:
            return self.conn.transport.open_session(timeout=self.connect_timeout)
        except (paramiko.SSHException, OSError, EOFError) as e:
            self.close()
            raise TransportError(f"connection to {self.where} lost: {e}") from None

    def _sftp_client(self, timeout: float):
        """The SFTP session (transfer() opened it), with `timeout` seconds for each of its reads and writes."""
        self._sftp.get_channel().settimeout(timeout)
        return self._sftp

    def _kill_group(self, pgid: int) -> None:
        g = shlex.quote(f"-{pgid}")
        self.exec(f"kill -TERM -- {g} 2>/dev/null; for i in $(seq {int(GRACE_S * 10)}); do "
                  f"kill -0 -- {g} 2>/dev/null || exit 0; sleep 0.1; done; kill -KILL -- {g} 2>/dev/null; exit 0",
                  timeout=GRACE_S + 30)


class _Cut(Exception):
    """The channel a tar stream was being sent on failed (not this machine's file)."""

    def __init__(self, why: str):
        super().__init__(why)
        self.why = why


class _Sender:
    """A channel as the file a streamed tarfile writes to."""

    def __init__(self, chan):
        self.chan = chan

    def write(self, data: bytes) -> int:
        try:
            self.chan.sendall(data)
        except CHANNEL_ERRORS as e:
            raise _Cut(_reason(e)) from None
        return len(data)


def _source(src: "bytes | Path"):
    return io.BytesIO(src) if isinstance(src, bytes) else open(src, "rb")


def _what(src: "bytes | Path") -> str:
    return f"{len(src)} bytes" if isinstance(src, bytes) else str(src)


def _last(text: str) -> str:
    """The last line a board's command wrote (its reason), or ""."""
    lines = [line.strip() for line in text.splitlines() if line.strip()]
    return lines[-1][-300:] if lines else ""


def _why(e: BaseException) -> str:
    """A connection error in words: its message, and for a server that drops the connection
    mid-handshake (paramiko's EOFError, with no message, or a reset) what happened."""
    text = str(e).strip()
    if isinstance(e, (EOFError, ConnectionResetError)):     # which of the two is a race with the server's close
        return f"the server closed the connection during the SSH handshake ({text or type(e).__name__})"
    return text or type(e).__name__


def _reason(e: BaseException) -> str:
    """A failed transfer's channel error in words, on one line."""
    return " ".join(str(e).split()) or ("timed out" if isinstance(e, socket.timeout) else type(e).__name__)
