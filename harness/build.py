"""Building zobench-train: tuned for this machine for local runs, static and portable
(cross-compiled where the arch differs) for boards, each in its own build/ folder."""
from __future__ import annotations

import platform
import subprocess
from pathlib import Path

from . import paths
from .errors import UserError

SOURCE = paths.REPO / "workloads" / "cpp"
NEEDS = "cmake, g++ and nlohmann-json3-dev (cross: g++-aarch64-linux-gnu)"


def variant(target) -> str:
    return "native" if target.transport == "local" else f"{target.arch}-static"


def build(target) -> Path:
    """Configure (once) and build the binary for a target; returns its path. Incremental.
    Targets of one variant share the binary, so the errors name the variant, not the target."""
    out = paths.REPO / "build" / variant(target)
    args = ["cmake", "-S", str(SOURCE), "-B", str(out), "-DCMAKE_BUILD_TYPE=Release"]
    if target.transport == "local":
        args.append("-DZOBENCH_NATIVE=ON")
    elif target.arch != platform.machine():
        toolchain = paths.TARGETS_DIR / "toolchains" / f"{target.arch}-linux-gnu.cmake"
        if not toolchain.is_file():
            raise UserError(f"no toolchain for arch {target.arch!r} ({toolchain} is missing)")
        args.append(f"-DCMAKE_TOOLCHAIN_FILE={toolchain}")
    else:
        args.append("-DZOBENCH_STATIC=ON")
    for step in (args, ["cmake", "--build", str(out), "-j", "2"]):
        try:
            p = subprocess.run(step, capture_output=True, text=True, timeout=900)
        except FileNotFoundError:
            raise UserError(f"building zobench-train needs {NEEDS}: {step[0]} not found") from None
        if p.returncode != 0:
            tail = [l for l in (p.stdout + p.stderr).splitlines() if "rror" in l][-3:] or \
                (p.stdout + p.stderr).splitlines()[-3:]
            raise UserError(f"building zobench-train ({variant(target)}) failed (needs {NEEDS}): " + " | ".join(tail))
    return out / "zobench-train"

