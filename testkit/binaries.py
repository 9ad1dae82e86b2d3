"""The C++ binaries the tests run, and `python -m testkit.binaries`, which builds them all.

The session fixtures ask for each binary when a test first needs it (harness/preparation/build.py:
incremental, one cmake a folder at a time across processes). On a fresh clone that is five
builds of about 18 s of one core each, while the test workers keep both cores busy. `make test`'s
set-up therefore builds them first, while pip fills the venv and leaves one core idle (a minute
of its time). This module imports no more than the build does (numpy, which the set-up installs
first), so it can start before pip is done.
"""
from __future__ import annotations

import json
import platform
import subprocess
import sys
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

from harness.errors import UserError
from harness.planning import cpu
from harness.planning.inventory import Target
from harness.preparation.build import build
from workloads.envinfo import cpu_facts

# per x86 CPU name: the FP32 kernels' vector ISA (conv and fc) and the INT8 kernels
X86_KERNELS = {
    "x86-64": ("sse2", "sse2-maddwd"),
    "x86-64-v2": ("sse4.2", "ssse3-maddubs"),
    "x86-64-v3": ("avx2-fma", "avx2-maddubs"),
    "x86-64-v4": ("avx512", "avx512-maddubs"),
    "x86-64-v4-vnni": ("avx512", "avx512-vnni"),
}
# the Arm CPUs whose builds run under qemu: with the dot product (-cpu max) and without (a Pi Zero 2's core)
ARM_CPUS = ("cortex-a53", "armv8.2-a+dotprod")


def native_binary(cpu_name: str = "") -> str:
    """The C++ binary built for this machine, or for one of its arch's CPU names (harness/planning/cpu.py:
    "x86-64-v3" is the AVX2 build, whose kernels this machine runs whatever else it has)."""
    return str(build(Target(name="local", transport="local", arch=platform.machine()), cpu_name))


def aarch64_binary(cpu_name: str = "cortex-a53") -> str:
    """The C++ binary cross-built for an Arm board (static aarch64; a Raspberry Pi Zero 2's
    runs here under qemu's cortex-a53)."""
    return str(build(Target(name="pi", transport="ssh", host="pi.invalid", arch="aarch64", runtimes=["cpp"]), cpu_name))


def x86_names_here() -> list[str]:
    """The x86 CPU names (harness/planning/cpu.py) this machine runs, read as a board's probe reads its
    CPU: the kernel paths the tests and benchmarks can build and run here."""
    if platform.machine() != "x86_64":
        return []
    return cpu.x86_names(set(cpu_facts(Path("/proc/cpuinfo").read_text())["cpu_flags"]))


def kernels(binary: str) -> dict:
    """The kernels a binary was built with (its results' env.kernels), asked without a run."""
    return json.loads(subprocess.run([binary, "--kernels"], capture_output=True, text=True, check=True).stdout)


def x86_binary(name: str, native: str) -> str:
    """A binary that runs x86 CPU name's kernels: the native one where it compiles the same (the
    same vector ISA, so the same source paths; the other tests need it anyway), else the name's
    own build."""
    have = kernels(native)
    return native if X86_KERNELS[name] == (have["conv"], have["int8"]) else native_binary(name)


def main() -> int:
    """Build every binary the tests run; one that cannot be built is named, and the tests that
    need it say why again."""
    def made(what: str, make) -> str | None:
        try:
            path = make()
        except UserError as e:
            print(f"testkit.binaries: {what}: {e}", file=sys.stderr)
            return None
        print(f"testkit.binaries: {what}: {path}", file=sys.stderr)
        return path

    def x86() -> None:
        native = made("native", native_binary)
        for name in x86_names_here() if native else ():
            made(name, lambda: x86_binary(name, native))

    def arm() -> None:
        for name in ARM_CPUS:
            made(f"aarch64 {name}", lambda: aarch64_binary(name))

    # two at a time: a build is one compiler process, and once pip is done both cores are free
    with ThreadPoolExecutor(2) as pool:
        for done in [pool.submit(x86), pool.submit(arm)]:
            done.result()
    return 0


if __name__ == "__main__":
    sys.exit(main())
