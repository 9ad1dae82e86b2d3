"""Building zobench-train: tuned for this machine for local runs, static and built for the
board's own CPU (harness/planning/cpu.py; cross-compiled where the arch differs) for boards, each
variant in its own build/ folder."""
from __future__ import annotations

import fcntl
import hashlib
import json
import os
import platform
import re
import shutil
import subprocess
import sys
import time
from pathlib import Path

from harness.planning import cpu as cpus
from harness import paths
from harness.errors import UserError
from harness.planning.inventory import ARCHES
from harness.boards.transport import POLL_S, kill_group

SOURCE = paths.REPO / "workloads" / "cpp"
NEEDS = "cmake, g++ and nlohmann-json3-dev (cross: g++-aarch64-linux-gnu)"
BUILD_TIMEOUT_S = 900
# Valgrind's header, for the phase dumps an instruction count reads (harness/execution/instructions.py):
# whether it is here is one of the build's options, so a binary built before `make test`'s set-up
# installed valgrind is built again, with them, once it has (cmake would not notice the header)
CALLGRIND_H = Path("/usr/include/valgrind/callgrind.h")


def build_name(target, cpu: str = "") -> str:
    """The build folder's name: the arch and the CPU (resolve_cpu). Both become parts of paths
    (the folder, the toolchain file), so only known names are taken, whoever made the target."""
    cpu = resolve_cpu(target, cpu)
    return cpu if cpu == cpus.NATIVE else f"{target.arch}-{cpu}"


def resolve_cpu(target, cpu: str = "") -> str:
    """The CPU name a build is for: `cpu`, else native for this machine and the arch's baseline
    for a board; refused unless the arch has it."""
    if target.transport == "local" and cpu in ("", cpus.NATIVE):
        return cpus.NATIVE
    check_arch(target)
    cpu = cpu or cpus.BASELINE[target.arch]
    if why := cpus.problem(target.arch, cpu):
        raise UserError(f"target {target.name}: cpu: {why}")
    return cpu


def check_arch(target) -> None:
    """A board's arch names its build folder and toolchain file: only a known one is taken."""
    if target.arch not in ARCHES:
        raise UserError(f"target {target.name}: arch: expected one of {', '.join(ARCHES)}, got {target.arch!r}")


def cpu_choice(target, facts: dict | None = None) -> cpus.Choice | None:
    """The CPU a target's binary is built for: its pin; this machine's own for a local target;
    else the one its probe's facts name (None before there are facts: a board's binary is
    built for the board, not for the arch's lowest common CPU)."""
    if target.cpu:
        return cpus.choose(target.arch, {}, target.cpu)
    if target.transport == "local":
        return cpus.Choice(cpus.NATIVE, "this machine's own CPU (-march=native)")
    check_arch(target)
    return None if facts is None else cpus.choose(target.arch, facts)


class BuildStopped(UserError):
    """The run was stopped (a signal) while the binary built: the compiler was killed."""


def build(target, cpu: str = "", stop=None) -> Path:
    """Configure (once) and build the binary for a target's CPU; returns its path. Incremental:
    cmake rebuilds what a source change touches. Targets of one variant share the binary, so
    the errors name the variant, not the target. A run's Stop (stop) kills the compiler."""
    cpu = resolve_cpu(target, cpu)      # first: it refuses names that would make a path outside build/
    name = build_name(target, cpu)
    options = ["-DCMAKE_BUILD_TYPE=Release", "-DZOBENCH_CPU_FLAGS=" + " ".join(cpus.flags(target.arch, cpu)),
               f"-DZOBENCH_CALLGRIND={'ON' if CALLGRIND_H.is_file() else 'OFF'}"]
    toolchain = None
    if cpu == cpus.NATIVE:
        pass                            # this machine's: linked against its own libraries
    elif target.arch != platform.machine():
        toolchain = paths.TARGETS_DIR / "toolchains" / f"{target.arch}-linux-gnu.cmake"
        if not toolchain.is_file():
            raise UserError(f"no toolchain for arch {target.arch!r} ({toolchain} is missing)")
        options.append(f"-DCMAKE_TOOLCHAIN_FILE={toolchain}")
    else:                               # a board's: one file that runs with nothing installed
        options.append("-DZOBENCH_STATIC=ON")
    out = paths.REPO / "build" / f"{name}-{configuration(options, toolchain)}"
    out.mkdir(parents=True, exist_ok=True)
    # one cmake at a time a folder, across processes: two zobench runs (or test workers) on one
    # host that need the same binary build it once, the second waiting for the first
    with open(out / ".zobench-build.lock", "w") as lock:
        fcntl.flock(lock, fcntl.LOCK_EX)
        _cmake(out, options, name, stop)
    return out / "zobench-train"


def _cmake(out: Path, options: list[str], name: str, stop=None) -> None:
    # A folder is configured once (until its cache and build files are there: a configure that was
    # stopped runs again): its name keys all a configure is given (build()), and `cmake --build`
    # configures again by itself where CMakeLists.txt has changed; configuring on every run cost
    # 0.07 s of CPU each time. Gaussian z's table is written by the interpreter this one
    # runs on (a venv's python is a link to it, so the set-up's build and a run's name the same file
    # and neither rebuilds), not by whichever python3 PATH finds first (a pyenv shim: 0.07 s more).
    python = os.path.realpath(sys.executable)
    configure = ["cmake", "-S", str(SOURCE), "-B", str(out), *options, f"-DPython3_EXECUTABLE={python}"]
    generated = (out / "CMakeCache.txt").is_file() and any((out / f).is_file() for f in ("Makefile", "build.ninja"))
    for step in ([] if generated else [configure]) + [["cmake", "--build", str(out), "-j", "2"]]:
        try:     # in a session of its own: a stop kills make and every compiler it started
            p = subprocess.Popen(step, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True,
                                 start_new_session=True)
        except FileNotFoundError:
            raise UserError(f"building zobench-train needs {NEEDS}: {step[0]} not found") from None
        deadline = time.monotonic() + BUILD_TIMEOUT_S
        try:
            while True:
                try:
                    said, _ = p.communicate(timeout=POLL_S)
                    break
                except subprocess.TimeoutExpired:
                    if stop is not None and stop.is_set():
                        raise BuildStopped(f"building zobench-train ({name}) stopped: {stop.reason}") from None
                    if time.monotonic() > deadline:
                        raise UserError(f"building zobench-train ({name}) took over {BUILD_TIMEOUT_S:g} s") from None
        except BaseException:   # stopped, timed out, or Ctrl-C outside a run: no compiler is left behind
            kill_group(p)
            raise
        if p.returncode != 0:
            lines = said.splitlines()     # the compiler's first errors, not make's last words
            tail = [l for l in lines if "error:" in l][:3] or [l for l in lines if "rror" in l][-3:] or lines[-3:]
            raise UserError(f"building zobench-train ({name}) failed (needs {NEEDS}): " + " | ".join(tail))


def configuration(options: list[str], toolchain: Path | None) -> str:
    """A key of what a build is made with that cmake does not track once a folder is
    configured: the options, the toolchain file's text, which compiler and its version, the
    flags in the environment. It names the build folder, so changing any of them builds
    afresh instead of reusing objects made with the old ones."""
    text = toolchain.read_text() if toolchain else ""
    named = re.search(r"set\(\s*CMAKE_CXX_COMPILER\s+(\S+?)\s*\)", text)
    cxx = shutil.which(named.group(1) if named else os.environ.get("CXX") or "c++")
    version = subprocess.run([cxx, "--version"], capture_output=True, text=True, timeout=60).stdout if cxx else ""
    facts = [options, text, cxx and os.path.realpath(cxx), version,
             {k: os.environ.get(k, "") for k in ("CXX", "CXXFLAGS", "LDFLAGS")}]
    return hashlib.sha256(json.dumps(facts).encode()).hexdigest()[:12]
