#!/usr/bin/env python3
"""The set-up behind `make run`, `make test` and `make bench`, and the lock behind it.

  scripts/setup.py run|test|bench [--venv .venv] [--installer auto|uv|pip]
  scripts/setup.py lock      remake lock/ARCH.txt for every arch from pyproject.toml (`make lock`)
  scripts/setup.py check     exit 1, with a line per lock, where a lock does not match pyproject.toml

A set-up installs the system packages the level needs (scripts/ensure-deps.sh, with apt), fills the venv
from the lock (harness/envlock.py) with uv, and builds the C++ binaries the level runs. The three go on
side by side: apt is network and disk, uv mostly disk, the compiler CPU. uv is taken from PATH, else
installed once, pinned by lock/uv.txt, into zobench's cache with the system's pip. Where uv cannot be had,
pip installs the same lock. Both take packages from where pip is configured to (harness/pip_config.py),
so zobench names no index. The venv is complete once its stamp (workloads/envinfo.LOCK_STAMP) names the
lock's hash: an interrupted set-up is done again, from uv's cache, by the next one. A set-up whose lock
already fills the venv does nothing but the system check. Each step's seconds go into the stamp and onto
one line. This runs on the system's Python, before there is a venv: standard library only.
"""
from __future__ import annotations

import argparse
import os
import platform
import shutil
import signal
import subprocess
import sys
import tempfile
import threading
import time
from pathlib import Path

REPO = Path(__file__).resolve().parent.parent
if sys.version_info < (3, 11):
    sys.exit(f"zobench: set-up needs Python 3.11 or newer (the lock's); {sys.executable} is {platform.python_version()}")
sys.path.insert(0, str(REPO))

from harness import envlock, pip_config  # noqa: E402

LEVELS = ("run", "test", "bench")
UV_LOCK = envlock.LOCK_DIR / "uv.txt"
UV_HOME = Path(os.environ.get("XDG_CACHE_HOME") or Path.home() / ".cache") / "zobench" / "uv"


class SetupError(Exception):
    """A step failed; the message is the one line the user sees."""


class Stopped(Exception):
    """SIGINT or SIGTERM: the set-up ends with one line, and the next one takes it up."""

    def __init__(self, signum: int):
        self.signum = signum


def stop(signum, _frame):
    raise Stopped(signum)


def say(text: str) -> None:
    print(f"zobench: {text}", file=sys.stderr, flush=True)


def last_words(text: str) -> str:
    """A tool's error as one line: its `error:` line and the last cause it gives."""
    lines = [l.strip() for l in text.splitlines() if l.strip()]
    first = next((l for l in lines if l.lower().startswith("error")), lines[0] if lines else "no output")
    cause = next((l for l in reversed(lines) if l.lower().startswith("caused by")), "")
    return "; ".join(x for x in (first, cause) if x)


def run(argv: list, what: str, env: dict | None = None) -> str:
    p = subprocess.run([str(a) for a in argv], capture_output=True, text=True, env={**os.environ, **(env or {})})
    if p.returncode != 0:
        raise SetupError(f"{what}: {last_words(p.stderr + p.stdout)}")
    return p.stdout


def find_uv() -> Path | None:
    """uv from PATH, else the pinned one in zobench's cache, installed there with the system's pip where
    it is not yet (None: no uv can be had, and pip will do)."""
    on_path = shutil.which("uv")
    if on_path:
        return Path(on_path)
    if not UV_LOCK.is_file():
        return None
    home = UV_HOME / envlock.digest(UV_LOCK)[:12]
    uv = home / "bin" / "uv"
    if not uv.is_file():
        UV_HOME.mkdir(parents=True, exist_ok=True)
        tmp = Path(tempfile.mkdtemp(prefix=".installing-", dir=UV_HOME))
        try:
            run([sys.executable, "-m", "pip", "install", "--quiet", "--disable-pip-version-check", "--no-deps",
                 "--require-hashes", "--target", tmp, "-r", UV_LOCK], "installing uv")
            home.parent.mkdir(parents=True, exist_ok=True)
            tmp.replace(home)
        except (SetupError, OSError) as e:
            say(f"no uv ({e}); pip installs the lock instead")
            shutil.rmtree(tmp, ignore_errors=True)
            return None
    return uv


def uv_version(uv: Path) -> str:
    return run([uv, "--version"], "uv --version").strip()


def usable(python: Path) -> bool:
    """A venv's python that runs as a venv's: a set-up interrupted while the venv was made can
    leave bin/python (a link to the system's) before pyvenv.cfg, and that one runs as the system's
    Python, whose packages an install would then list, or change."""
    return python.exists() and subprocess.run(
        [python, "-c", "import sys; sys.exit(sys.prefix == sys.base_prefix)"], capture_output=True).returncode == 0


def half_made(venv: Path) -> bool:
    """A venv whose making was interrupted: its python linked to this one, no pyvenv.cfg yet."""
    python = venv / "bin" / "python"
    return python.is_symlink() and os.path.realpath(python) == os.path.realpath(sys.executable)


class Installer:
    """uv, or pip where uv cannot be had: the venv, the lock into it, the project (editable) over it."""

    def __init__(self, uv: Path | None, venv: Path):
        self.uv, self.venv, self.python = uv, venv, venv / "bin" / "python"
        config = pip_config.settings(sys.executable)
        self.options, self.env = pip_config.uv_options(config)
        self.env["UV_PYTHON_DOWNLOADS"] = "never"       # the system's Python, never one uv would fetch
        self.name = " ".join(uv_version(uv).split()[:2]) if uv else "pip"

    def make_venv(self) -> None:
        if usable(self.python):
            if not self.uv and subprocess.run([self.python, "-m", "pip", "--version"], capture_output=True).returncode:
                run([self.python, "-m", "ensurepip", "--default-pip"], "putting pip into the venv")   # uv made it
            return
        if self.venv.exists() and not (self.venv / "pyvenv.cfg").is_file() and not half_made(self.venv):
            raise SetupError(f"{self.venv} exists and is not a venv; move it away or pass another --venv")
        shutil.rmtree(self.venv, ignore_errors=True)      # a venv an interrupted set-up left broken
        if self.uv:
            run([self.uv, "venv", "--quiet", "--python", sys.executable, self.venv], "making the venv", self.env)
        else:
            run([sys.executable, "-m", "venv", self.venv], "making the venv")

    def install_argv(self, lock: Path) -> list:
        """What puts the lock into the venv: uv makes the venv exactly the lock (it fetches everything
        before it changes anything, so a failed fetch leaves the venv as it was)."""
        if self.uv:
            argv = [self.uv, "pip", "sync", "--quiet", "--python", self.python, "--require-hashes",
                    *self.options, lock]
        else:
            argv = [self.python, "-m", "pip", "install", "--quiet", "--disable-pip-version-check", "--require-hashes",
                    "--no-deps", "-r", lock]
        return argv

    def install_project(self) -> None:
        """zobench itself, editable, with the venv's own (locked) setuptools: no build environment to fetch."""
        argv = ([self.uv, "pip", "install", "--quiet", "--python", self.python, *self.options] if self.uv else
                [self.python, "-m", "pip", "install", "--quiet", "--disable-pip-version-check"])
        run([*argv, "--no-deps", "--no-build-isolation", "-e", REPO], "installing zobench into the venv", self.env)


class Step:
    """A command started now, beside the others, whose own seconds are known once it ends."""

    def __init__(self, argv: list, quiet: bool = True, **kw):
        self.started, self.ended = time.monotonic(), None
        self.p = subprocess.Popen([str(a) for a in argv], text=True, **(
            {"stdout": subprocess.PIPE, "stderr": subprocess.STDOUT} if quiet else {}), **kw)
        self.said = ""
        self._thread = threading.Thread(target=self._wait, daemon=True)
        self._thread.start()

    def _wait(self) -> None:
        self.said = self.p.communicate()[0] or ""
        self.ended = time.monotonic()

    def wait(self) -> int:
        self._thread.join()
        return self.p.returncode

    @property
    def seconds(self) -> float:
        return (self.ended or time.monotonic()) - self.started


# What each level's commands import, imported once at set-up with bytecode written: uv writes none, and
# where PYTHONDONTWRITEBYTECODE is set every torch job would compile torch's modules again (seconds each).
# torch._dynamo is what a job's first activation checkpoint imports (822 modules, sympy's among them:
# 7.2 s of CPU a job uncompiled, 2.0 s compiled, on a 2-core AMD EPYC): the tests' and benchmarks'
# transformer jobs checkpoint, make run's quick suite never does. The tests' processes also read meshes
# (trimesh, with networkx and scipy: 0.5 s of CPU a process uncompiled), load scikit-learn's digits (0.5 s)
# and open Optuna studies in PostgreSQL (SQLAlchemy, Alembic and Mako: 0.5 s).
WARM = {"run": ("zobench.cli", "zobench.running", "workloads.torch_runner", "workloads.ort_runner", "reports.report")}
WARM["test"] = WARM["bench"] = (*WARM["run"], "torch._dynamo", "pytest", "xdist", "xdist.dsession", "xdist.remote",
                                "hypothesis", "selenium.webdriver", "labgrid", "labgrid.remote.client", "transformers",
                                "psycopg", "optuna", "optuna.storages._rdb.models", "alembic.command", "mako.template",
                                "sqlalchemy.dialects.postgresql.psycopg", "trimesh", "sklearn.datasets")
WARM_CODE = ("import importlib, sys\nsys.dont_write_bytecode = False\n"
             "for m in sys.argv[1:]:\n    importlib.import_module(m)\n")
# and make test's collection: each xdist worker imports every test file, and pytest caches its rewrite of their
# asserts beside them (tests/__pycache__) only where bytecode is written; without that cache each of the three
# workers rewrote 194 modules, 7.4 s of CPU a worker, before its first test
COLLECT_CODE = "import pytest\nsys.exit(pytest.main(['--collect-only', '-qq', '-p', 'no:cacheprovider']))\n"


def setup(level: str, venv: Path, installer: str) -> int:
    lock = envlock.path()
    if why := envlock.mismatch(lock):
        raise SetupError(why)
    digest, times, started = envlock.digest(lock), {}, time.monotonic()
    apt = Step(["bash", REPO / "scripts" / "ensure-deps.sh", level], quiet=False,
               env={**os.environ, "PYTHON": sys.executable})
    was = envlock.stamp(venv)
    if was.get("lock") == digest and usable(venv / "bin" / "python"):
        return apt.wait()
    step = time.monotonic()
    uv = find_uv() if installer in ("auto", "uv") else None
    if installer == "uv" and uv is None:
        raise SetupError("--installer uv: no uv on PATH and none could be installed")
    times["uv"] = time.monotonic() - step
    inst = Installer(uv, venv)
    step = time.monotonic()
    inst.make_venv()
    times["venv"] = time.monotonic() - step
    filling = Step(inst.install_argv(lock), env={**os.environ, **inst.env})
    apt_rc = apt.wait()
    times["system packages"] = apt.seconds
    # the build needs the compilers apt installs, and nothing from the venv
    build = Step([sys.executable, "-m", "testkit.binaries", *(["--native"] if level == "run" else [])], cwd=REPO)
    try:
        if filling.wait() != 0:
            problem = f"{inst.name} could not install {lock.relative_to(REPO)}: {last_words(filling.said)}"
            if was.get("lock"):
                say(f"{problem}; {venv} is left as it was (the environment of lock {was['lock'][:12]}), "
                    "and the rest goes on with it")
                return apt_rc
            raise SetupError(problem)
        inst.install_project()
        times["install"] = time.monotonic() - filling.started
        warm = Step([inst.python, "-c", WARM_CODE + (COLLECT_CODE if level == "test" else ""), *WARM[level]], cwd=REPO)
        if warm.wait() != 0:
            say(f"importing what `make {level}` runs failed in the new venv: {last_words(warm.said)}")
        times["bytecode"] = warm.seconds
    finally:
        build.wait()
        times["C++ build"] = build.seconds
    for line in build.said.splitlines():
        if not line.rstrip().endswith("zobench-train"):       # a build that failed: the tests that need it skip
            say(line)
    times = {k: round(v, 1) for k, v in times.items()}
    envlock.write_stamp(venv, {"lock": digest, "file": str(lock.relative_to(REPO)), "installer": inst.name,
                               "python": platform.python_version(), "seconds": times})
    say(f"set-up in {time.monotonic() - started:.1f} s with {inst.name}: " +
        ", ".join(f"{k} {v:g} s" for k, v in times.items()))
    return apt_rc


def make_lock() -> int:
    """Every arch's lock, resolved anew by uv for the lock's Python, from where pip takes packages."""
    uv = find_uv()
    if uv is None:
        raise SetupError("`make lock` needs uv: none on PATH and none could be installed")
    options, env = pip_config.uv_options(pip_config.settings(sys.executable))
    version, python = uv_version(uv).split()[1], envlock.python_version()
    for arch in envlock.ARCHES:
        with tempfile.NamedTemporaryFile("w", suffix=".txt", dir=envlock.LOCK_DIR, delete=False) as out:
            pass
        try:
            p = subprocess.run([str(uv), "pip", "compile", "--quiet", str(REPO / "pyproject.toml"), "-", "--all-extras",
                                "--generate-hashes", "--no-header", "--python-platform", f"{arch}-{envlock.GLIBC}",
                                "--python-version", python, *options, "-o", out.name],
                               input="".join(f"{r}\n" for r in envlock.beside_the_project()),
                               capture_output=True, text=True, env={**os.environ, **env})
            if p.returncode != 0:
                raise SetupError(f"resolving the lock for {arch}: {last_words(p.stderr)}")
            body = Path(out.name).read_text()
            Path(out.name).write_text(envlock.header(arch, python, version) + body)
            Path(out.name).replace(envlock.path(arch))
        finally:
            Path(out.name).unlink(missing_ok=True)
        say(f"wrote {envlock.path(arch).relative_to(REPO)}")
    p = subprocess.run([str(uv), "pip", "compile", "--quiet", "-", "--universal", "--generate-hashes", "--no-header",
                        *options, "-o", str(UV_LOCK)], input=f"uv=={version}\n",
                       capture_output=True, text=True, env={**os.environ, **env})
    if p.returncode != 0:
        raise SetupError(f"pinning uv: {last_words(p.stderr)}")
    say(f"wrote {UV_LOCK.relative_to(REPO)}")
    return 0


def check() -> int:
    problems = [why for arch in envlock.ARCHES if (why := envlock.mismatch(envlock.path(arch)))]
    for why in problems:
        say(why)
    return 1 if problems else 0


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="scripts/setup.py", description=__doc__.split("\n\n")[0])
    parser.add_argument("what", choices=[*LEVELS, "lock", "check"])
    parser.add_argument("--venv", type=Path, default=REPO / ".venv", help="the venv to fill (default: .venv)")
    parser.add_argument("--installer", choices=("auto", "uv", "pip"), default=os.environ.get("ZOBENCH_INSTALLER", "auto"),
                        help="auto: uv where it can be had, else pip (default; also ZOBENCH_INSTALLER)")
    a = parser.parse_args(argv)
    for signum in (signal.SIGINT, signal.SIGTERM):
        if signal.getsignal(signum) is not signal.SIG_IGN:     # as a shell leaves them for a job in the background
            signal.signal(signum, stop)
    try:
        if a.what == "lock":
            return make_lock()
        if a.what == "check":
            return check()
        return setup(a.what, a.venv.absolute(), a.installer)
    except (SetupError, envlock.LockError) as e:
        say(f"set-up: {e}")
        return 1
    except Stopped as e:
        say(f"set-up interrupted by {signal.Signals(e.signum).name}; the next `make run` or `make test` takes it up again")
        return 128 + e.signum


if __name__ == "__main__":
    sys.exit(main())
