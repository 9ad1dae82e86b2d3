"""The CPU a zobench-train binary is built for: a name that results and build folders carry,
and the compiler flags it stands for.

A benchmark of a board must run the instructions the board has (an int8 dot product, AVX2's
256-bit integer ops), or it times the wrong code. x86 boards get their ISA level
(x86-64-v2/v3/v4, plus AVX-512 VNNI where the CPU has it), aarch64 boards their core's
-mcpu; "native" is this machine's own -march=native build, for local runs only.
"""
from __future__ import annotations

from dataclasses import dataclass

from harness.errors import UserError

# x86-64 micro-architecture levels (the psABI's), and v4 with AVX-512 VNNI on top; and v3 without
# its FMA, which no probe chooses: the build instructions are counted with (harness/planning/counting.py)
X86 = {
    "x86-64": ["-march=x86-64"],
    "x86-64-v2": ["-march=x86-64-v2"],
    "x86-64-v3": ["-march=x86-64-v3"],
    "x86-64-v4": ["-march=x86-64-v4"],
    "x86-64-v4-vnni": ["-march=x86-64-v4", "-mavx512vnni"],
    "x86-64-v3-nofma": ["-march=x86-64-v3", "-mno-fma"],
}
# Arm cores gcc tunes for (-mcpu=NAME), and the two architecture baselines for cores it does not know
ARM_CORES = ("cortex-a35", "cortex-a53", "cortex-a55", "cortex-a57", "cortex-a72", "cortex-a73", "cortex-a75",
             "cortex-a76", "cortex-a77", "cortex-a78", "cortex-a78ae", "cortex-a78c", "cortex-x1", "cortex-a510",
             "cortex-a710", "cortex-x2", "neoverse-n1", "neoverse-n2", "neoverse-v1")
# gcc's big.LITTLE pairs (-mcpu=BIG.LITTLE): code both clusters' cores run, tuned for both
BIG_LITTLE = ("cortex-a57.cortex-a53", "cortex-a72.cortex-a53", "cortex-a73.cortex-a35", "cortex-a73.cortex-a53",
              "cortex-a75.cortex-a55", "cortex-a76.cortex-a55")
AARCH64 = {"armv8-a": ["-march=armv8-a"], "armv8.2-a+dotprod": ["-march=armv8.2-a+dotprod"],
           **{core: [f"-mcpu={core}"] for core in ARM_CORES + BIG_LITTLE}}
NAMES = {"x86_64": X86, "aarch64": AARCH64}
NATIVE = "native"
# what a board gets when nothing says more: every CPU of the arch runs it
BASELINE = {"x86_64": "x86-64", "aarch64": "armv8-a"}


def flags(arch: str, cpu: str) -> list[str]:
    """The compiler flags of a CPU name; KeyError for a name the arch does not have."""
    if cpu == NATIVE:
        return ["-march=native"]
    return list(NAMES[arch][cpu])

# the /proc/cpuinfo flags each x86 level adds to the one before (the psABI's lists, in the
# kernel's spelling: abm is LZCNT, lahf_lm is LAHF-SAHF)
X86_LEVEL_FLAGS = {
    "x86-64-v2": {"cx16", "lahf_lm", "popcnt", "sse4_1", "sse4_2", "ssse3"},
    "x86-64-v3": {"avx", "avx2", "bmi1", "bmi2", "f16c", "fma", "abm", "movbe", "xsave"},
    "x86-64-v4": {"avx512f", "avx512bw", "avx512cd", "avx512dq", "avx512vl"},
    "x86-64-v4-vnni": {"avx512_vnni"},
}


def x86_names(flags: set[str]) -> list[str]:
    """The x86 CPU names a CPU with these /proc/cpuinfo flags runs, the baseline first and
    its best last."""
    out = ["x86-64"]
    for name, need in X86_LEVEL_FLAGS.items():
        if not need <= flags:
            break
        out.append(name)
    return out


# Arm Ltd.'s cores by their MIDR part number, as /proc/cpuinfo shows it ("CPU implementer" 0x41,
# "CPU part"); the numbers are the cores' Technical Reference Manuals'
ARM_LTD = "0x41"
ARM_PARTS = {"0xd03": "cortex-a53", "0xd04": "cortex-a35", "0xd05": "cortex-a55", "0xd07": "cortex-a57",
             "0xd08": "cortex-a72", "0xd09": "cortex-a73", "0xd0a": "cortex-a75", "0xd0b": "cortex-a76",
             "0xd0c": "neoverse-n1", "0xd0d": "cortex-a77", "0xd40": "neoverse-v1", "0xd41": "cortex-a78",
             "0xd42": "cortex-a78ae", "0xd44": "cortex-x1", "0xd46": "cortex-a510", "0xd47": "cortex-a710",
             "0xd48": "cortex-x2", "0xd49": "neoverse-n2", "0xd4b": "cortex-a78c"}
# what -march=armv8.2-a+dotprod lets the compiler emit beyond armv8-a, in the kernel's Features
# names: CRC32, LSE atomics and RDM (all mandatory from v8.1) and the int8 dot product
DOTPROD_FEATURES = {"crc32", "atomics", "asimdrdm", "asimddp"}
NO_FACTS = "the probe read no CPU facts (an older probe, or /proc/cpuinfo unreadable)"


@dataclass(frozen=True)
class Choice:
    """The CPU a target's binary is built for, and why (results and `zobench build` say it)."""
    cpu: str
    why: str


def problem(arch: str, cpu: str) -> str:
    """Why cpu is not a name a binary for arch can be built for ("" when it is)."""
    if arch not in NAMES:
        return f"a pinned cpu needs the target's arch, one of {', '.join(NAMES)}; got arch {arch!r}"
    if cpu not in NAMES[arch]:
        return f"expected one of {', '.join(NAMES[arch])} for {arch}, got {cpu!r}"
    return ""


def choose(arch: str, facts: dict, pinned: str = "") -> Choice:
    """The CPU a board's binary is built for: the pinned name, else the best its probe's facts
    (workloads/envinfo.py cpu_facts) allow. x86: the highest ISA level its flags reach. Arm: its
    core's -mcpu; a big.LITTLE board gcc's pair of its two cores; other mixes and cores not in
    ARM_PARTS the architecture the Features all cores share reach. Without facts,
    the arch's baseline, which every CPU of the arch runs."""
    if pinned:
        why = problem(arch, pinned)
        if why:
            raise UserError(f"cpu: {why}")
        return Choice(pinned, "pinned by the target's cpu key")
    flags, parts = set(facts.get("cpu_flags") or ()), facts.get("cpu_parts") or []
    if not flags and not parts:
        return Choice(BASELINE[arch], NO_FACTS)
    if arch == "x86_64":
        return Choice(x86_names(flags)[-1], "probed: the highest level its flags reach")
    probed = f"probed: CPU part{'s' * (len(parts) > 1)} {', '.join(parts) or 'not shown'}"
    cores = sorted({ARM_PARTS.get(part) if implementer == ARM_LTD else None
                    for implementer, _, part in (p.partition(":") for p in parts)}, key=str)
    if len(cores) == 1 and cores[0]:
        return Choice(cores[0], probed)
    pair = next((p for p in BIG_LITTLE if sorted(p.split(".")) == cores), "")
    if pair:
        return Choice(pair, f"{probed} (big.LITTLE)")
    if DOTPROD_FEATURES <= flags:
        return Choice("armv8.2-a+dotprod", f"{probed}: mixed or unknown cores whose Features have the dot product")
    return Choice("armv8-a", f"{probed}: mixed or unknown cores without the dot product")
