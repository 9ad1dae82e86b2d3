"""A real PostgreSQL server for the tests of the shared store: Debian's `postgresql` programs,
`initdb` and `pg_ctl` in a temporary folder, on a free loopback port, stopped at the end.

PostgreSQL refuses to run as root, so as root the server runs as the `postgres` user the
package made (runuser), in a folder that user owns; the clients connect over TCP as the
cluster's superuser `zobench`, trusted on loopback: a throwaway server for one test session.
"""
from __future__ import annotations

import os
import pwd
import shutil
import subprocess
import tempfile
from pathlib import Path

from .sshd import free_port
from .tools import BY_NAME


class Postgres:
    def __init__(self):
        initdb = next(p for p in BY_NAME["initdb"].paths if Path(p).is_file())
        self.bin = Path(initdb).parent
        self.dir = Path(tempfile.mkdtemp(prefix="zobench-pg-"))
        self.port = free_port()
        self.as_user = []
        if os.geteuid() == 0:
            pg = pwd.getpwnam("postgres")
            os.chown(self.dir, pg.pw_uid, pg.pw_gid)
            self.as_user = ["runuser", "-u", "postgres", "--"]
        self._run("initdb", "-D", str(self.dir / "data"), "-U", "zobench", "--auth=trust", "-E", "UTF8", "--no-sync")
        self._run("pg_ctl", "-D", str(self.dir / "data"), "-l", str(self.dir / "log"), "-w", "-o",
                  f"-p {self.port} -k {self.dir} -c listen_addresses=127.0.0.1 -c fsync=off "
                  "-c synchronous_commit=off -c full_page_writes=off", "start")
        self.databases = 0

    def _run(self, program: str, *args: str) -> None:
        r = subprocess.run([*self.as_user, str(self.bin / program), *args], capture_output=True, text=True,
                           cwd=self.dir, timeout=120)
        if r.returncode != 0:
            log = (self.dir / "log").read_text() if (self.dir / "log").is_file() else ""
            raise RuntimeError(f"{program} failed: {r.stderr.strip()} {log[-2000:]}")

    def url(self, db: str = "postgres") -> str:
        return f"postgresql://zobench@127.0.0.1:{self.port}/{db}"

    def new_database(self) -> str:
        """A fresh, empty database on the server: one per test, so no test sees another's runs."""
        import psycopg

        self.databases += 1
        name = f"t{self.databases}"
        with psycopg.connect(self.url(), autocommit=True) as c:
            c.execute(f"CREATE DATABASE {name}")
        return self.url(name)

    def stop(self) -> None:
        try:
            self._run("pg_ctl", "-D", str(self.dir / "data"), "-m", "immediate", "stop")
        finally:
            shutil.rmtree(self.dir, ignore_errors=True)
