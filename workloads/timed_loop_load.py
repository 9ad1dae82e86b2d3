"""How much of the CPU other work took while the steps were timed.

The harness samples the machine's counters around the whole runner (harness/stores/machine_load.py):
its start, data loading, warm-up and evaluation included. A job of 200 short steps spends most of
that window outside its timed loop, much of it on one thread, so the share other work took of
it is not the share the steps lost. The runner therefore reads the same counters (the machine's
busy and steal time in /proc/stat, its own CPU time from getrusage) just before and just after
each epoch's timed loop, and the result's `timed_loop_load` has the fields machine_load's `load`
has, over those loops only: the window of the step time it excuses (docs/compare.md). The C++
binary does the same (workloads/cpp/train.cpp, TimedLoopLoad).
"""
from __future__ import annotations

import os
import resource

# the fields of /proc/stat's cpu lines: user nice system irq softirq are busy (guest time is inside
# user; idle and iowait are not), steal is the hypervisor's (machine_load.py reads them here too)
BUSY_FIELDS = (0, 1, 2, 5, 6)
STEAL_FIELD = 7


def cpu_counters(text: str, hz: int) -> tuple[float, float | None, int] | None:
    """(busy seconds, steal seconds or None, online CPUs) from /proc/stat's text; None when it
    is not what Linux prints."""
    lines = text.split("\n")
    try:
        cpu = [int(x) for x in lines[0].split()[1:]]
    except ValueError:
        return None
    cores = sum(line.startswith("cpu") and line[3:4].isdigit() for line in lines)
    if not lines[0].startswith("cpu ") or len(cpu) < 4 or hz <= 0 or not cores:
        return None
    return (sum(cpu[i] for i in BUSY_FIELDS if i < len(cpu)) / hz,
            cpu[STEAL_FIELD] / hz if len(cpu) > STEAL_FIELD else None, cores)


def own_cpu_seconds() -> float:
    """The runner's CPU time: every thread, and the launcher before its exec."""
    ru = resource.getrusage(resource.RUSAGE_SELF)
    return ru.ru_utime + ru.ru_stime


def _read() -> tuple[tuple[float, float | None, int] | None, float]:
    try:
        with open("/proc/stat") as f:
            counters = cpu_counters(f.read(), os.sysconf("SC_CLK_TCK"))
    except (OSError, ValueError):
        counters = None
    return counters, own_cpu_seconds()


class TimedLoopLoad:
    """Summed over the timed loops: their wall clock, the machine's busy and steal time, and the
    runner's own CPU time. record() is None where the machine has no /proc/stat."""

    def __init__(self):
        self.wall = self.busy = self.own = 0.0
        self.steal: float | None = 0.0
        self.cores = 0
        self.known = True
        self._start = None

    def begin(self) -> None:
        self._start = _read()

    def end(self, seconds: float) -> None:
        (before, own0), (after, own1) = self._start, _read()
        if before is None or after is None:
            self.known = False
            return
        self.wall += seconds
        self.busy += after[0] - before[0]
        self.own += own1 - own0
        self.steal = None if self.steal is None or before[1] is None or after[1] is None \
            else self.steal + after[1] - before[1]
        self.cores = after[2]

    def record(self) -> dict | None:
        if not self.known or not self.cores or self.wall <= 0:
            return None
        # the kernel counts in ticks (10 ms), getrusage in microseconds: clamp the rounding
        return {"wall_seconds": round(self.wall, 6), "cores": self.cores,
                "cpu_seconds_other": round(max(0.0, self.busy - self.own), 3),
                "steal_seconds": None if self.steal is None else round(self.steal, 3)}
