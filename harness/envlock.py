"""The lock: every Python package zobench's venv holds, at an exact version with its hashes. There is one
file per host arch (lock/ARCH.txt) and it covers the run, test and bench sets alike. Two lab machines
set up months apart then run the same numpy, onnxruntime and optuna, and a result names the lock its
packages came from (env.lock, workloads/envinfo.py).

The files are in pip's requirements format with `--hash` options, so uv and pip both install from them
(scripts/setup.py). `make lock` writes them with uv, one resolution per arch for the lock's Python and
glibc (manylinux) baseline. Their header records the requirements they were made from (pyproject.toml's
dependencies, its extras, its build backend, and pip), which is how the set-up and the tests tell that a
lock no longer matches pyproject.toml. Standard library only: the set-up reads this module with the
system's Python, before there is a venv.
"""
from __future__ import annotations

import hashlib
import json
import platform
import re
import tomllib
from pathlib import Path

REPO = Path(__file__).resolve().parent.parent
LOCK_DIR = REPO / "lock"
ARCHES = ("x86_64", "aarch64")
GLIBC = "manylinux_2_34"          # the oldest glibc a locked wheel may need (Debian 12 has 2.36, Ubuntu 22.04 2.35)
INPUT = "# input: "
# pip itself: the fetch of a data set's wheel reads pip's settings through the venv's pip (harness/pip_config.py)
ALSO = ("pip",)


class LockError(Exception):
    """The lock and pyproject.toml disagree, or the lock cannot be read; the message is one line and says
    how to fix it."""


def path(arch: str | None = None) -> Path:
    return LOCK_DIR / f"{arch or platform.machine()}.txt"


def python_version(pyproject: Path = REPO / "pyproject.toml") -> str:
    """The Python the lock resolves for: requires-python's lower bound."""
    spec = tomllib.loads(pyproject.read_text())["project"]["requires-python"]
    m = re.fullmatch(r"\s*>=\s*(\d+\.\d+)\s*", spec)
    if not m:
        raise LockError(f"{pyproject}: requires-python: expected '>=X.Y', got {spec!r}")
    return m[1]


def inputs(pyproject: Path = REPO / "pyproject.toml") -> list[str]:
    """What the lock must satisfy: the project's dependencies, every extra's, the build backend's (the
    project is installed without build isolation, from the venv's own setuptools), and ALSO."""
    doc = tomllib.loads(pyproject.read_text())
    project = doc["project"]
    wanted = [*project.get("dependencies", []), *(r for extra in project.get("optional-dependencies", {}).values()
                                                   for r in extra), *doc["build-system"]["requires"], *ALSO]
    return sorted(dict.fromkeys(" ".join(r.split()) for r in wanted), key=str.lower)


def beside_the_project() -> list[str]:
    """What the lock holds that the project's own requirements do not name: its build backend and ALSO."""
    return [*tomllib.loads((REPO / "pyproject.toml").read_text())["build-system"]["requires"], *ALSO]


def name(requirement: str) -> str:
    """A requirement's project name, normalized as PEP 503 does."""
    m = re.match(r"\s*([A-Za-z0-9][A-Za-z0-9._-]*)", requirement)
    return re.sub(r"[-_.]+", "-", m[1]).lower() if m else requirement


def recorded(text: str) -> list[str]:
    return [line[len(INPUT):].strip() for line in text.splitlines() if line.startswith(INPUT)]


def mismatch(lock: Path, pyproject: Path = REPO / "pyproject.toml") -> str | None:
    """Why the lock does not match pyproject.toml, in one line that names the package; None where it does."""
    if not lock.is_file():
        return (f"no lock for this machine's arch ({lock.name[:-4]}): {lock} is missing; "
                f"`make lock` makes one for {', '.join(ARCHES)}")
    made_for = {name(r): r for r in recorded(lock.read_text())}
    if not made_for:
        return f"{lock} records no inputs: not a lock `make lock` wrote; run `make lock`"
    wanted = {name(r): r for r in inputs(pyproject)}
    for package in sorted(made_for.keys() | wanted.keys()):
        was, now = made_for.get(package), wanted.get(package)
        if was != now:
            what = (f"pyproject.toml asks for {now!r}, the lock was made for {was!r}" if was and now else
                    f"pyproject.toml asks for {now!r}, which the lock was not made for" if now else
                    f"the lock was made for {was!r}, which pyproject.toml no longer asks for")
            return f"{lock.relative_to(lock.parent.parent)} does not match pyproject.toml: {package}: {what}; run `make lock`"
    return None


def digest(lock: Path) -> str:
    return hashlib.sha256(lock.read_bytes()).hexdigest()


def header(arch: str, python: str, uv_version: str, pyproject: Path = REPO / "pyproject.toml") -> str:
    return "".join([
        f"# zobench's lock for {arch} hosts, Python {python}, glibc baseline {GLIBC}: every package of the run,\n",
        "# test and bench sets, exact, with its hashes. Written by `make lock` (scripts/setup.py lock) with\n",
        f"# uv {uv_version}; do not edit. Its inputs (pyproject.toml's requirements), which the set-up checks:\n",
        *(f"{INPUT}{r}\n" for r in inputs(pyproject))])


def stamp(venv: Path) -> dict:
    """What the set-up wrote into the venv when it was complete ({} where it never was)."""
    from workloads.envinfo import LOCK_STAMP
    try:
        out = json.loads((venv / LOCK_STAMP).read_text())
    except (OSError, ValueError):
        return {}
    return out if isinstance(out, dict) else {}


def write_stamp(venv: Path, record: dict) -> None:
    from workloads.envinfo import LOCK_STAMP
    tmp = venv / f".{LOCK_STAMP}.tmp"
    tmp.write_text(json.dumps(record, indent=1) + "\n")
    tmp.replace(venv / LOCK_STAMP)

