"""Real OpenSSH servers on loopback for the tests: one per simulated board.

Each server has its own config, ed25519 host key and authorized client key,
and runs `sshd -D` on a free 127.0.0.1 port. Nothing is mocked: the harness
talks to them exactly as it would to a Pi over the network.
"""
from __future__ import annotations

import getpass
import json
import os
import signal
import socket
import subprocess
import sys
import time
from dataclasses import dataclass
from pathlib import Path

from .tools import which

SSHD = which("sshd") or "sshd"      # on PATH or in the sbin beside a bin there
# What every session's shell starts with (sshd_config's SetEnv). bash sources ~/.bashrc for a
# command sshd runs only where it is the first shell level, and this machine's ~/.bashrc is the
# developer's, not a board's: here pyenv's init, about 100 processes and 0.1 s of CPU and of wall
# time on every command the harness runs.
SESSION_ENV = "SHLVL=1"


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def keygen(path: Path) -> str:
    subprocess.run(["ssh-keygen", "-q", "-t", "ed25519", "-N", "", "-f", str(path)], check=True)
    return (path.with_suffix(".pub")).read_text().strip()


@dataclass
class Sshd:
    name: str
    dir: Path
    port: int
    host_pub: str
    proc: subprocess.Popen | None = None

    @property
    def known_hosts_line(self) -> str:
        key_type, key = self.host_pub.split()[:2]
        return f"[127.0.0.1]:{self.port} {key_type} {key}"

    def start(self) -> None:
        self.proc = subprocess.Popen([SSHD, "-D", "-e", "-f", str(self.dir / "sshd_config")],
                                     stdout=subprocess.DEVNULL, stderr=open(self.dir / "sshd.log", "a"))
        deadline = time.monotonic() + 10
        while time.monotonic() < deadline:
            try:
                socket.create_connection(("127.0.0.1", self.port), timeout=0.5).close()
                return
            except OSError:
                time.sleep(0.05)
        raise RuntimeError(f"sshd {self.name} did not start: {(self.dir / 'sshd.log').read_text()[-500:]}")

    def stop(self) -> None:
        """Stop the server and the sshd processes of its open sessions, like a board
        dropping off the network (the processes those sessions started live on)."""
        if not self.proc:
            return
        doomed = [self.proc.pid] + [p for p in _descendants(self.proc.pid) if _comm(p) == "sshd"]
        for pid in doomed:
            try:
                os.kill(pid, signal.SIGKILL)
            except ProcessLookupError:
                pass
        self.proc.wait(10)


def _comm(pid: int) -> str:
    try:
        return Path(f"/proc/{pid}/comm").read_text().strip()
    except OSError:
        return ""


def _descendants(root: int) -> list[int]:
    children: dict[int, list[int]] = {}
    for stat in Path("/proc").glob("[0-9]*/stat"):
        try:
            fields = stat.read_text().rsplit(")", 1)[1].split()
            children.setdefault(int(fields[1]), []).append(int(stat.parent.name))
        except (OSError, IndexError, ValueError):
            pass
    out, todo = [], [root]
    while todo:
        for c in children.get(todo.pop(), []):
            out.append(c)
            todo.append(c)
    return out


def make_farm(root: Path, names: list[str], no_sftp: tuple[str, ...] = (), session_env: str = "") -> tuple[list[Sshd], Path]:
    """Start one sshd per name; return them and the client's private key. The servers named in
    no_sftp have no `Subsystem sftp` line, like the sshd (or Dropbear) of a small embedded image;
    session_env ("NAME=value ...") is set in every session beside SESSION_ENV."""
    root.mkdir(parents=True, exist_ok=True)
    Path("/run/sshd").mkdir(exist_ok=True)     # sshd's privilege-separation directory
    client_pub = keygen(root / "client_key")
    farm = []
    for name in names:
        d = root / name
        d.mkdir()
        host_pub = keygen(d / "host_key")
        (d / "authorized_keys").write_text(client_pub + "\n")
        port = free_port()
        subsystem = "" if name in no_sftp else "Subsystem sftp internal-sftp\n"
        (d / "sshd_config").write_text(f"""\
Port {port}
ListenAddress 127.0.0.1
HostKey {d / 'host_key'}
PidFile {d / 'sshd.pid'}
AuthorizedKeysFile {d / 'authorized_keys'}
PasswordAuthentication no
KbdInteractiveAuthentication no
PubkeyAuthentication yes
PermitRootLogin yes
StrictModes no
UsePAM no
{subsystem}LogLevel ERROR
SetEnv {SESSION_ENV} {session_env}
""")
        s = Sshd(name, d, port, host_pub)
        s.start()
        farm.append(s)
    return farm, root / "client_key"


def client_home(home: Path, boards: list[Sshd]) -> Path:
    """Make home an isolated client HOME whose ~/.ssh/known_hosts knows the boards' host keys."""
    (home / ".ssh").mkdir(parents=True)
    (home / ".ssh" / "known_hosts").write_text("".join(b.known_hosts_line + "\n" for b in boards))
    return home


def board_toml(name: str, board, key, workdir, **extra) -> str:
    """An inventory entry for one board (names and values TOML-quoted)."""
    values = {"host": "127.0.0.1", "port": board.port, "user": getpass.getuser(), "key": str(key),
              "python": sys.executable, "workdir": str(workdir), "runtimes": ["torch"], "threads": 1, **extra}
    body = "\n".join(f"{k} = {json.dumps(v)}" for k, v in values.items())
    return f"[targets.{json.dumps(name)}]\n{body}\n"
