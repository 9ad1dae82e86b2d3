"""What zobench needs from the system besides its venv: the one list of tools, where each is
looked for and the Debian package that provides it.

scripts/ensure-deps.sh runs this file (system python, standard library only, before the venv
has anything in it): `make run` asks for the "run" tools, `make test` for all of them; it
installs the packages of the missing ones with apt where it can and otherwise prints
message(). The test fixtures call require() so that on a machine without apt a test that
needs a missing tool is skipped with the tool's name and the command that sets it up.
"""
from __future__ import annotations

import os
import sys
from dataclasses import dataclass
from pathlib import Path

RUN, TEST, BENCH = "run", "test", "bench"   # each `make` target needs its tools and those before it
LEVELS = (RUN, TEST, BENCH)


@dataclass(frozen=True)
class Tool:
    name: str          # a command looked up on PATH, or what `path` holds
    package: str       # the Debian package that provides it
    level: str         # RUN or TEST
    paths: tuple[str, ...] = ()    # for a tool that is no command: any of these files
    hint: str = ""     # how to provide it by hand, where that is not obvious
    skippable: bool = True     # False: nearly every test needs it, so `make test` stops without it

    def found(self) -> bool:
        if self.paths:
            return any(Path(p).expanduser().is_file() for p in self.paths)
        return which(self.name) is not None


def _fmnist_files() -> tuple[str, ...]:
    """Where the runners look for Fashion-MNIST (workloads/datasets.py: $ZOBENCH_DATA, then the
    Debian package's folder), as the training images' possible paths."""
    dirs = [Path(os.environ["ZOBENCH_DATA"]) / "fashion-mnist"] if os.environ.get("ZOBENCH_DATA") else []
    dirs.append(Path("/usr/share/datasets/fashion-mnist"))
    return tuple(str(d / f"train-images-idx3-ubyte{s}") for d in dirs for s in ("", ".gz"))


TOOLS = (
    Tool("Fashion-MNIST", "dataset-fashion-mnist", RUN, _fmnist_files(),
         "or the four IDX files in $ZOBENCH_DATA/fashion-mnist", skippable=False),
    # the text data sets' corpus (harness/preparation/text.py): a topic file of the package's own
    Tool("fortunes", "fortunes", RUN, ("/usr/share/games/fortunes/cookie",)),
    Tool("cmake", "cmake", RUN),
    Tool("g++", "g++", RUN),
    Tool("nlohmann/json.hpp", "nlohmann-json3-dev", RUN, ("/usr/include/nlohmann/json.hpp",)),
    Tool("sshd", "openssh-server", TEST),
    Tool("ssh", "openssh-client", TEST),
    Tool("ssh-keygen", "openssh-client", TEST),
    Tool("aarch64-linux-gnu-g++", "g++-aarch64-linux-gnu", TEST),
    Tool("qemu-aarch64", "qemu-user", TEST),
    # the shared results store's server, started per test session (testkit/postgres.py); Debian keeps
    # its programs off PATH, under the major version
    Tool("initdb", "postgresql", TEST, tuple(f"/usr/lib/postgresql/{v}/bin/initdb" for v in range(13, 20))),
    # the dashboard's pages in a real browser (tests/test_dashboard.py), headless, driven by Selenium
    Tool("chromium", "chromium", TEST),
    Tool("chromedriver", "chromium-driver", TEST),
    # instructions per step counted under callgrind (harness/execution/instructions.py); its
    # valgrind/callgrind.h, which the binary's phase dumps are built with, comes in the same package
    Tool("valgrind", "valgrind", TEST),
    # the Cortex-A53's cycle estimate from its pipeline model (benchmarks/a53_estimate.py)
    Tool("llvm-mca", "llvm", BENCH),
)
BY_NAME = {t.name: t for t in TOOLS}


def which(command: str) -> str | None:
    """command's path on PATH, where each .../bin directory also stands for its .../sbin:
    sshd lives in /usr/sbin, which a user's PATH leaves out."""
    for d in filter(None, os.environ.get("PATH", "").split(os.pathsep)):
        d = d.rstrip("/")
        for folder in (d, d[:-3] + "sbin") if d.endswith("/bin") else (d,):
            path = os.path.join(folder, command)
            if os.path.isfile(path) and os.access(path, os.X_OK):
                return path
    return None


def missing(level: str) -> list[Tool]:
    """The tools `make <level>` needs that are not here."""
    return [t for t in TOOLS if LEVELS.index(t.level) <= LEVELS.index(level) and not t.found()]


def message(tools: list[Tool]) -> str:
    """One line naming the missing tools and the packages that provide them."""
    packages = " ".join(dict.fromkeys(t.package for t in tools))
    hints = "".join(f"; {t.name}: {t.hint}" for t in tools if t.hint)
    return f"missing {', '.join(t.name for t in tools)} (sudo apt-get install {packages}{hints})"


def require(*names: str) -> None:
    """Skip the calling test or fixture unless every named tool is here."""
    absent = [BY_NAME[n] for n in names if not BY_NAME[n].found()]
    if absent:
        import pytest
        pytest.skip(f"{message(absent)}; `make test` installs them where apt is usable")


def main(argv: list[str]) -> int:
    """`tools.py packages LEVEL`: the packages of the missing tools, one per line.
    `tools.py check LEVEL`: exit 0 when nothing is missing; otherwise message() on stderr, and
    exit 1 when `make LEVEL` cannot go on: `make run` without any tool, `make test` without one
    its tests cannot skip (the tests that need the others are skipped)."""
    what, level = argv
    absent = missing(level)
    if what == "packages":
        for package in dict.fromkeys(t.package for t in absent):
            print(package)
        return 0
    if not absent:
        return 0
    stop = level == RUN or not all(t.skippable for t in absent)
    print(f"zobench: {message(absent)}" + ("" if stop else "; the tests that need them are skipped"),
          file=sys.stderr)
    return 1 if stop else 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
