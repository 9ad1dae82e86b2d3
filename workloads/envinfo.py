"""Facts about the machine a result was measured on (stored with every result).

Runs on the board with only the standard library; `python -m workloads.envinfo`
prints them as JSON so the harness can probe a target with the same code.
"""
from __future__ import annotations

import importlib.metadata
import json
import os
import platform
import socket
from pathlib import Path


def _read(path: str) -> str:
    try:
        return Path(path).read_text().strip()
    except OSError:
        return ""


def cpu_model() -> str:
    for line in _read("/proc/cpuinfo").splitlines():
        key, _, value = line.partition(":")
        if key.strip() in ("model name", "Model", "Hardware"):
            return value.strip()
    return platform.processor() or platform.machine()


def versions(*packages: str) -> dict:
    out = {"python": platform.python_version()}
    for p in packages:
        try:
            out[p] = importlib.metadata.version(p)
        except importlib.metadata.PackageNotFoundError:
            out[p] = None
    return out


def facts(*packages: str) -> dict:
    return {
        "hostname": socket.gethostname(),
        "arch": platform.machine(),
        "cpu_model": cpu_model(),
        "cores": os.cpu_count() or 0,
        "governor": _read("/sys/devices/system/cpu/cpu0/cpufreq/scaling_governor") or "unknown",
        "kernel": platform.release(),
        "versions": versions(*packages),
        "binary_sha256": None,
        "harness_commit": "",
    }


if __name__ == "__main__":
    print(json.dumps(facts("numpy", "torch", "onnxruntime")))
