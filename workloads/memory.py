"""Resident-set measurements of the runner process itself.

The peak is Linux's VmHWM. It is reset (clear_refs 5) after the data set and
the runtime are loaded, so peak_rss_bytes is the peak while training, and
baseline_rss_bytes is what was resident before training began.
"""
from __future__ import annotations

import resource
from pathlib import Path


def _status_kib(field: str) -> int | None:
    try:
        for line in Path("/proc/self/status").read_text().splitlines():
            if line.startswith(field + ":"):
                return int(line.split()[1])
    except OSError:
        pass
    return None


def rss_bytes() -> int:
    kib = _status_kib("VmRSS")
    return kib * 1024 if kib is not None else peak_rss_bytes()


def peak_rss_bytes() -> int:
    kib = _status_kib("VmHWM")
    if kib is None:
        kib = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss
    return kib * 1024


def reset_peak() -> bool:
    """Reset VmHWM to the current RSS; False where the kernel does not allow it."""
    try:
        Path("/proc/self/clear_refs").write_text("5")
        return True
    except OSError:
        return False
