"""The C++ binaries the tests run, and `python -m testkit.binaries`, which builds them all.

The session fixtures ask for each binary when a test first needs it (harness/preparation/build.py:
incremental, one cmake a folder at a time across processes). On a fresh clone that is six
builds on this machine (its own; x86-64 and x86-64-v3, whose kernel paths are tested, v3 being
also what a board's job here builds; x86-64-v3-nofma, which instructions are counted with; two
Arm ones) of about a minute of CPU each (55 s for x86-64-v3-nofma), which would compete with
the test workers for both cores. The set-up (scripts/setup.py) therefore builds them while it
fills the venv: this module imports only the standard library and the harness's build, so the
system's Python runs it before the venv has anything in it. `make run`'s set-up builds this
machine's binary alone (`--native`).
"""
from __future__ import annotations

import platform
import subprocess
import sys
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

from harness.errors import UserError
from harness.planning import cpu
from harness.planning.counting import counted_build
from harness.planning.inventory import Target
from harness.preparation.build import SOURCE, build
from workloads.envinfo import cpu_facts

from testkit.tools import require

# the Arm CPUs whose builds run under qemu: with the dot product (-cpu max) and without (a Pi Zero 2's core)
ARM_CPUS = ("cortex-a53", "armv8.2-a+dotprod")
# the x86 levels whose kernel paths make test checks (SSE2's and AVX2's); the others', -m slow
KERNEL_PATHS_TESTED = ("x86-64", "x86-64-v3")


def native_binary(cpu_name: str = "") -> str:
    """The C++ binary built for this machine, or for one of its arch's CPU names (harness/planning/cpu.py:
    "x86-64-v3" is the AVX2 build, whose kernels this machine runs whatever else it has)."""
    return str(build(Target(name="local", transport="local", arch=platform.machine()), cpu_name))


def aarch64_binary(cpu_name: str = "cortex-a53") -> str:
    """The C++ binary cross-built for an Arm board (static aarch64; a Raspberry Pi Zero 2's
    runs here under qemu's cortex-a53)."""
    return str(build(Target(name="pi", transport="ssh", host="pi.invalid", arch="aarch64", runtimes=["cpp"]), cpu_name))


def qemu(cpu_name: str) -> tuple[str, ...]:
    """What runs an aarch64 binary built for an Arm CPU name here: qemu as that core (a Pi Zero 2's
    cortex-a53), or with every extension it emulates, the dot product among them (-cpu max)."""
    return ("qemu-aarch64", "-cpu", "cortex-a53" if cpu_name == "cortex-a53" else "max")


def check_program(source: Path, arch: str, name: str, exe: Path, generated: Path) -> list[str]:
    """A check program of tests/cpp built for one kernel path as the binary's build names it (an x86
    level this machine runs; an Arm core, static, run under qemu: -cpu cortex-a53 or max), with the
    build's generated headers from `generated`: the command that runs it."""
    arm = arch == "aarch64"
    require(*(("aarch64-linux-gnu-g++", "qemu-aarch64") if arm else ("g++",)))
    subprocess.run(["aarch64-linux-gnu-g++" if arm else "g++", "-O3", "-std=c++17", "-fopenmp-simd", "-pthread",
                    *cpu.flags(arch, name), *(["-static"] if arm else []), f"-I{SOURCE}",
                    f"-I{generated}", str(source), "-o", str(exe)], check=True, capture_output=True, timeout=300)
    return [*(qemu(name) if arm else ()), str(exe)]


def x86_names_here() -> list[str]:
    """The x86 CPU names (harness/planning/cpu.py) this machine runs, read as a board's probe reads its
    CPU: the kernel paths the tests and benchmarks can build and run here."""
    if platform.machine() != "x86_64":
        return []
    return cpu.x86_names(set(cpu_facts(Path("/proc/cpuinfo").read_text())["cpu_flags"]))


def x86_builds_tested() -> list[str]:
    """The x86 CPU names make test builds beside the native one, of those this machine runs: the
    kernel paths' tests' (KERNEL_PATHS_TESTED; the other levels' run with -m slow), a board's
    job here (the best level) and the build its instructions are counted with."""
    names = x86_names_here()
    if not names:
        return []
    wanted = [n for n in names if n in KERNEL_PATHS_TESTED] + [names[-1], counted_build("x86_64", names[-1])]
    return list(dict.fromkeys(wanted))


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
        builds += [*[(name, lambda name=name: native_binary(name)) for name in x86_builds_tested()],
                   *[(f"aarch64 {name}", lambda name=name: aarch64_binary(name)) for name in ARM_CPUS]]
    # two at a time: a build is one compiler process, and once pip is done both cores are free
    with ThreadPoolExecutor(2) as pool:
        list(pool.map(lambda b: made(*b), builds))
    return 0


if __name__ == "__main__":
    sys.exit(main())
