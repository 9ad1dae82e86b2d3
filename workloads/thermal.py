"""The board's throttle state, temperatures and CPU clocks, read on the board while a job runs.

A Pi Zero 2 under sustained load reaches its soft temperature limit and caps its clock; a
Jetson does the same. A repeat that ran throttled is slower for a reason that is not the code,
so the launcher (workloads/launch.py) starts a sampler beside the runner that records these
every SAMPLE_S seconds, and once more when the runner ends ("final"), as JSON lines in the job's folder;
the harness judges them (harness/stores/validity.py). Reading files and one `vcgencmd` call is cheap
enough for a Pi: the sampler sleeps between samples and is not in the job's memory cgroup.

What a board cannot read is missing from a sample (no thermal zones in a VM, no `vcgencmd`
off a Pi); the harness says so instead of calling the job valid. $ZOBENCH_SYSFS stands in for
/sys (the tests' recorded trees, as the energy tests' hwmon).
"""
from __future__ import annotations

import json
import os
import subprocess
import sys
import time
from pathlib import Path

SAMPLE_S = 2.0          # between samples while the runner lives
PARENT_POLL_S = 0.1     # how soon the last sample follows the runner's end


def _int(path: Path) -> int | None:
    try:
        return int(path.read_text().split()[0])
    except (OSError, ValueError, IndexError):
        return None


def _throttled() -> int | None:
    """vcgencmd get_throttled's bits ("throttled=0x50005"), or None where there is no vcgencmd."""
    try:
        out = subprocess.run(["vcgencmd", "get_throttled"], capture_output=True, text=True, timeout=5).stdout
        return int(out.strip().split("=", 1)[1], 16)
    except (OSError, subprocess.SubprocessError, ValueError, IndexError):
        return None


def read(sysfs: str | None = None) -> dict:
    """One sample: monotonic time, each thermal zone's temperature (degrees C, by its type), each
    CPU's current clock and its policy's and hardware's maximum (kHz), and the throttle bits."""
    root = Path(sysfs or os.environ.get("ZOBENCH_SYSFS") or "/sys")
    zones = {}
    for z in sorted((root / "class" / "thermal").glob("thermal_zone*")):
        milli = _int(z / "temp")
        if milli is not None:
            kind = (z / "type").read_text().strip() if (z / "type").is_file() else z.name
            zones[kind if kind not in zones else f"{kind}:{z.name}"] = milli / 1000
    clocks = []
    for c in sorted((root / "devices" / "system" / "cpu").glob("cpu[0-9]*/cpufreq")):
        cur, cap, hw = (_int(c / f) for f in ("scaling_cur_freq", "scaling_max_freq", "cpuinfo_max_freq"))
        if cur is not None:
            clocks.append([cur, cap, hw])
    return {"t": round(time.monotonic(), 3), "zones": zones, "clocks": clocks, "throttled": _throttled()}


def hottest(sample: dict) -> float | None:
    return max(sample["zones"].values(), default=None)


def cool_down(below_c: float, max_wait_s: float, on_wait=None) -> dict:
    """Wait until every thermal zone is below `below_c`, at most `max_wait_s` seconds (on_wait
    is told the temperature once, if it must): the cooldown record (what it waited, the
    temperature it started at, whether it got there)."""
    start = time.monotonic()
    first = hottest(read())
    now = first
    if on_wait and now is not None and now >= below_c:
        on_wait(now)
    while now is not None and now >= below_c and time.monotonic() - start < max_wait_s:
        time.sleep(1.0)
        now = hottest(read())
    return {"below_c": below_c, "max_wait_s": max_wait_s, "waited_s": round(time.monotonic() - start, 3),
            "start_c": first, "end_c": now, "reached": None if now is None else now < below_c}


def start_sampler(path: str) -> None:
    """Fork a sampler writing read()'s lines to `path` until its parent (the launcher, which
    becomes the runner by exec) ends, then one last line. It stays in the runner's process
    group, so a killed job takes it along; its stdio is /dev/null, so a pipe the harness reads
    ends with the runner; and it closes every other descriptor (the lease is the runner's)."""
    parent, first = os.getpid(), read()     # the first before the runner starts, whatever the sampler's pace
    if os.fork():
        return
    try:
        null = os.open(os.devnull, os.O_RDWR)
        for fd in (0, 1, 2):
            os.dup2(null, fd)
        os.closerange(3, os.sysconf("SC_OPEN_MAX"))
        with open(path, "a", buffering=1) as out:
            out.write(json.dumps(first) + "\n")
            next_at = time.monotonic() + SAMPLE_S
            while os.getppid() == parent:
                if time.monotonic() >= next_at:
                    out.write(json.dumps(read()) + "\n")
                    next_at = time.monotonic() + SAMPLE_S
                time.sleep(PARENT_POLL_S)
            out.write(json.dumps({**read(), "final": True}) + "\n")
    finally:
        os._exit(0)


if __name__ == "__main__":
    print(json.dumps(read(sys.argv[1] if len(sys.argv) > 1 else None)))
