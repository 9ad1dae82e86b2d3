"""Building zobench-train: tuned for this machine for local runs, static and portable
(cross-compiled where the arch differs) for boards, each in its own build/ folder."""
from __future__ import annotations

import hashlib
import json
import os
import platform
import re
import shutil
import subprocess
from pathlib import Path

from . import paths
from .errors import UserError
from .inventory import ARCHES

SOURCE = paths.REPO / "workloads" / "cpp"
NEEDS = "cmake, g++ and nlohmann-json3-dev (cross: g++-aarch64-linux-gnu)"


def variant(target) -> str:
    """The build folder's name. The arch becomes part of paths (the folder, the toolchain file),
    so only a known one is taken, whoever made the target."""
    if target.transport == "local":
        return "native"
    if target.arch not in ARCHES:
        raise UserError(f"target {target.name}: arch: expected one of {', '.join(ARCHES)}, got {target.arch!r}")
    return f"{target.arch}-static"


def build(target) -> Path:
    """Configure (once) and build the binary for a target; returns its path. Incremental: cmake
    rebuilds what a source change touches. Targets of one variant share the binary, so the
    errors name the variant, not the target."""
    name = variant(target)      # first: it refuses an arch that would name a path outside build/
    options, toolchain = ["-DCMAKE_BUILD_TYPE=Release"], None
    if target.transport == "local":
        options.append("-DZOBENCH_NATIVE=ON")
    elif target.arch != platform.machine():
        toolchain = paths.TARGETS_DIR / "toolchains" / f"{target.arch}-linux-gnu.cmake"
        if not toolchain.is_file():
            raise UserError(f"no toolchain for arch {target.arch!r} ({toolchain} is missing)")
        options.append(f"-DCMAKE_TOOLCHAIN_FILE={toolchain}")
    else:
        options.append("-DZOBENCH_STATIC=ON")
    out = paths.REPO / "build" / f"{name}-{configuration(options, toolchain)}"
    for step in (["cmake", "-S", str(SOURCE), "-B", str(out), *options], ["cmake", "--build", str(out), "-j", "2"]):
        try:
            p = subprocess.run(step, capture_output=True, text=True, timeout=900)
        except FileNotFoundError:
            raise UserError(f"building zobench-train needs {NEEDS}: {step[0]} not found") from None
        if p.returncode != 0:
            tail = [l for l in (p.stdout + p.stderr).splitlines() if "rror" in l][-3:] or \
                (p.stdout + p.stderr).splitlines()[-3:]
            raise UserError(f"building zobench-train ({name}) failed (needs {NEEDS}): " + " | ".join(tail))
    return out / "zobench-train"


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
