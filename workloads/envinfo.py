"""Facts about the machine a result was measured on (stored with every result).

Runs on the board with only the standard library; `python -m workloads.envinfo`
prints them as JSON so the harness can probe a target with the same code.
"""
from __future__ import annotations

import importlib.metadata
import json
import os
import platform
import shutil
import socket
import sys
from pathlib import Path


def _read(path: str) -> str:
    try:
        return Path(path).read_text().strip()
    except OSError:
        return ""


def cpu_model(cpuinfo: str) -> str:
    for line in cpuinfo.splitlines():
        key, _, value = line.partition(":")
        if key.strip() in ("model name", "Model", "Hardware"):
            return value.strip()
    return platform.processor() or platform.machine()


def cpu_facts(cpuinfo: str) -> dict:
    """What the host picks the binary's CPU from (harness/planning/cpu.py): the feature flags every
    processor has (x86 "flags", Arm "Features") and, on Arm, each kind of core as
    "implementer:part" ("0x41:0xd0b"; a big.LITTLE board has two). Empty where cpuinfo says none."""
    flags, parts = None, set()
    for block in cpuinfo.split("\n\n"):
        fields = {key.strip(): value.strip() for key, _, value in (l.partition(":") for l in block.splitlines())}
        listed = fields.get("flags", fields.get("Features"))
        if listed is not None:
            flags = set(listed.split()) if flags is None else flags & set(listed.split())
        if "CPU implementer" in fields and "CPU part" in fields:
            parts.add(f"{fields['CPU implementer']}:{fields['CPU part']}")
    return {"cpu_flags": sorted(flags or ()), "cpu_parts": sorted(parts)}


def versions(*packages: str) -> dict:
    out = {"python": platform.python_version()}
    for p in packages:
        try:
            out[p] = importlib.metadata.version(p)
        except importlib.metadata.PackageNotFoundError:
            out[p] = None
    return out


LOCK_STAMP = "zobench-lock.json"   # what scripts/setup.py writes into a venv it filled from the lock, last


def lock() -> str | None:
    """The sha256 of the lock file (lock/ARCH.txt) this Python's packages were installed from by
    zobench's set-up; None where the set-up did not make this environment (a board's own Python)."""
    try:
        digest = json.loads((Path(sys.prefix) / LOCK_STAMP).read_text()).get("lock")
    except (OSError, ValueError, AttributeError):
        return None
    return digest if isinstance(digest, str) else None


def facts(*packages: str, cpuinfo: str | None = None) -> dict:
    """The machine's identity every result carries; cpuinfo: /proc/cpuinfo's text, where the
    caller has read it already."""
    return {
        "hostname": socket.gethostname(),
        "arch": platform.machine(),
        "cpu_model": cpu_model(_read("/proc/cpuinfo") if cpuinfo is None else cpuinfo),
        "cores": os.cpu_count() or 0,
        "governor": _read("/sys/devices/system/cpu/cpu0/cpufreq/scaling_governor") or "unknown",
        "kernel": platform.release(),
        "versions": versions(*packages),
        "lock": lock(),
        "binary_sha256": None,
        "harness_commit": "",
    }


def _meminfo() -> dict:
    out = {}
    for line in _read("/proc/meminfo").splitlines():
        key, _, value = line.partition(":")
        if key in ("MemTotal", "MemAvailable"):
            out[key] = int(value.split()[0]) * 1024
    return out


def _command(*argv: str) -> str | None:
    """Output of a board-specific tool (vcgencmd, nvpmodel) where the board has it."""
    import subprocess

    if not shutil.which(argv[0]):
        return None
    try:
        p = subprocess.run(argv, capture_output=True, text=True, timeout=10)
        return (p.stdout or p.stderr).strip()
    except (OSError, subprocess.SubprocessError):
        return None


def probe(workdir: str = "~") -> dict:
    """facts() plus what matters before benchmarking a board: memory, clock, disk, throttling,
    and the CPU's features the host builds its binary for."""
    cpuinfo = _read("/proc/cpuinfo")
    out = facts("numpy", "torch", "onnxruntime", cpuinfo=cpuinfo)
    mem = _meminfo()
    cpufreq = "/sys/devices/system/cpu/cpu0/cpufreq/"
    where = Path(workdir).expanduser()
    while not where.exists() and where != where.parent:
        where = where.parent
    st = os.statvfs(where)
    out.update({
        "mem_total_bytes": mem.get("MemTotal"), "mem_available_bytes": mem.get("MemAvailable"),
        "cpu_cur_khz": int(_read(cpufreq + "scaling_cur_freq") or 0) or None,
        "cpu_max_khz": int(_read(cpufreq + "cpuinfo_max_freq") or 0) or None,
        "disk_free_bytes": st.f_bavail * st.f_frsize,
        "throttled": _command("vcgencmd", "get_throttled"),
        # a Jetson: its power mode, whether jetson_clocks pinned the clocks, and whether
        # tegrastats (the energy meter where its rails are not readable) is there
        "nvpmodel": _command("nvpmodel", "-q"),
        "jetson_clocks": _command("jetson_clocks", "--show"),
        "tegrastats": shutil.which("tegrastats"),
        **cpu_facts(cpuinfo),
    })
    return out


if __name__ == "__main__":
    # also runs as `python3 - WORKDIR < envinfo.py` on a board that has no bundle yet
    print(json.dumps(probe(sys.argv[1] if len(sys.argv) > 1 else "~")))
