"""How busy the target was with other work while a job ran.

A shared machine's noise only adds time, so `zobench compare` must be able to tell a side
that got slower beside other work ("noisy") from one whose own code got slower
("regressed"). The job records the target's CPU counters just before and just after its
runner, read through the transport like everything else, so a board over SSH records the
board's load and this machine its own. Only Linux's /proc is read; a target without it
records no load, and compare then judges that side on its samples alone. The runner reads the
same counters around its timed loops (`timed_loop_load`), and a step time is judged by that
(of_steps): the job's window holds its start, data and evaluation too.

The job's result gets `load` (docs/compare.md):
- wall_seconds: target uptime between the two samples; cores: online CPUs;
- loadavg_1m_start / loadavg_1m_end: the kernel's 1-minute load average (the job included);
- cpu_seconds_other: CPU time the machine spent busy minus the runner's own (its
  `cpu_seconds`), i.e. other processes' CPU time; null when the runner reported none;
- steal_seconds: time the hypervisor gave this machine's CPUs to other guests; null where
  the kernel reports no steal.
"""
from __future__ import annotations

import math
from dataclasses import dataclass

from workloads.timed_loop_load import cpu_counters

# The share of the CPU a job wanted that other work may take before its time says more about the
# machine than the code (compare.py's rule for a side whose other side's load is unknown, history's
# for leaving a result's time out, the load flag's mark).
LOADED = 0.25
# One round trip: uptime, load average, the aggregate and per-CPU lines of /proc/stat, USER_HZ.
PROBE = "cat /proc/uptime /proc/loadavg && grep '^cpu' /proc/stat && (getconf CLK_TCK 2>/dev/null || echo 100)"


@dataclass
class Sample:
    uptime: float
    loadavg_1m: float
    busy_seconds: float
    steal_seconds: float | None
    cores: int


def parse(text: str) -> Sample | None:
    """A Sample from PROBE's output; None when it is not what Linux prints."""
    lines = text.split("\n")
    try:
        uptime, loadavg = float(lines[0].split()[0]), float(lines[1].split()[0])
        hz = int(next(l for l in reversed(lines) if l.strip()))
    except (IndexError, ValueError, StopIteration):
        return None
    counters = cpu_counters("\n".join(lines[2:]), hz)
    return None if counters is None else Sample(uptime, loadavg, *counters)


def sample(transport) -> Sample | None:
    rc, out, _ = transport.exec(PROBE, timeout=30)
    return parse(out) if rc == 0 else None


def during(before: Sample | None, after: Sample | None, job_cpu_seconds) -> dict | None:
    """The `load` of a job from the samples around its runner and the runner's own CPU time."""
    if before is None or after is None or after.uptime <= before.uptime:
        return None
    busy = after.busy_seconds - before.busy_seconds
    steal = None if before.steal_seconds is None or after.steal_seconds is None else \
        round(after.steal_seconds - before.steal_seconds, 3)
    # the kernel counts in ticks (10 ms), the runner's rusage in microseconds: clamp the rounding
    other = None if not isinstance(job_cpu_seconds, (int, float)) else round(max(0.0, busy - job_cpu_seconds), 3)
    return {"wall_seconds": round(after.uptime - before.uptime, 3), "cores": after.cores,
            "loadavg_1m_start": before.loadavg_1m, "loadavg_1m_end": after.loadavg_1m,
            "cpu_seconds_other": other, "steal_seconds": steal}


def of_steps(result: dict) -> dict | None:
    """The load a result's step times were taken under: its runner's, over the timed loops
    alone (`timed_loop_load`, workloads/timed_loop_load.py), where it measured one; the job's
    otherwise (a result from an older zobench, or a machine without /proc/stat)."""
    return result.get("timed_loop_load") or result.get("load")


def contention(load) -> float | None:
    """The share of the machine's CPU capacity that went to work other than the job (other
    processes, and other guests through steal) while it ran: 0 on an idle machine, 0.5 when
    other work kept one of two cores busy. None when the load is unknown."""
    if not isinstance(load, dict):
        return None
    other, steal, wall, cores = (load.get(k) for k in ("cpu_seconds_other", "steal_seconds", "wall_seconds", "cores"))
    numbers = [x for x in (other, wall, cores) if isinstance(x, (int, float)) and not isinstance(x, bool)
               and math.isfinite(x)]
    if len(numbers) < 3 or wall <= 0 or cores <= 0:
        return None
    if not isinstance(steal, (int, float)) or isinstance(steal, bool) or not math.isfinite(steal):
        steal = 0.0
    return (other + steal) / (wall * cores)


def starved(load, threads: int) -> float | None:
    """The share of the CPU time a job wanted that other work took (contention counts all of
    the machine): other work first fills the cores the job leaves idle (cores - threads), and
    only the rest comes out of the job's. threads 0 = every core."""
    c = contention(load)
    if c is None:
        return None
    cores, want = load["cores"], wanted(load, threads)
    return max(0.0, c * cores - (cores - want)) / want


def wanted(load: dict, threads: int) -> int:
    """The cores a job of `threads` threads wants on the machine of a known load (0 = every core)."""
    return min(threads or load["cores"], load["cores"])


def lost_share(result: dict) -> float | None:
    """The share of the CPU a result's job wanted that other work took while its steps were timed
    (starved over of_steps): what its load flag shows. None where its load is unknown."""
    return starved(of_steps(result), result["job"]["threads"])


def flag(share: float | None) -> str:
    """A number's load flag, shown beside it wherever a step time is (results, history): the
    share of the CPU other work took, marked ⚠ past LOADED, where the number measured the machine
    as much as the code; "" where the load is unknown."""
    if share is None:
        return ""
    return f"{'⚠ ' if share > LOADED else ''}{100 * share:.0f}% other"
