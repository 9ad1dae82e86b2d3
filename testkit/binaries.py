"""The C++ binaries the tests run, and `python -m testkit.binaries`, which builds them all.

The session fixtures ask for each binary when a test first needs it (harness/preparation/build.py:
incremental, one cmake a folder at a time across processes). On a fresh clone that is six
builds (this machine's, each x86 CPU name it runs, which a board's job on it builds too, and two
Arm ones) of about 18 s of one core each, while the test workers keep both cores busy. The set-up
(scripts/setup.py) therefore builds them while it fills the venv: this module imports only the
standard library and the harness's build, so the system's Python runs it before the venv has
anything in it. `make run`'s set-up builds this machine's binary alone (`--native`).
"""
from __future__ import annotations

import platform
import sys
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

from harness.errors import UserError
from harness.planning import cpu
from harness.planning.inventory import Target
from harness.preparation.build import build
from workloads.envinfo import cpu_facts

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


def main(argv: list[str] | None = None) -> int:
    """Build every binary the tests run (`--native`: this machine's own, which a local run's C++ jobs
    run: `make run`'s set-up); one that cannot be built is named, and the tests that need it say
    why again."""
    def made(what: str, make) -> str | None:
        try:
            path = make()
        except UserError as e:
            print(f"testkit.binaries: {what}: {e}", file=sys.stderr)
            return None
        print(f"testkit.binaries: {what}: {path}", file=sys.stderr)
        return path

    builds = [("native", native_binary)]
    if "--native" not in (sys.argv[1:] if argv is None else argv):
        # each x86 CPU name this machine runs: the kernel paths' tests, and a board's job here
        builds += [*[(name, lambda name=name: native_binary(name)) for name in x86_names_here()],
                   *[(f"aarch64 {name}", lambda name=name: aarch64_binary(name)) for name in ARM_CPUS]]
    # two at a time: a build is one compiler process, and once pip is done both cores are free
    with ThreadPoolExecutor(2) as pool:
        list(pool.map(lambda b: made(*b), builds))
    return 0


if __name__ == "__main__":
    sys.exit(main())
