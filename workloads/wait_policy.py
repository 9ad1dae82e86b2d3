"""How the Python runners' thread pools wait between parallel loops, chosen per job from the load.

torch's OpenMP pool (libgomp) and ONNX Runtime's pool fix their waiting when they start: libgomp
reads OMP_WAIT_POLICY and GOMP_SPINCOUNT once, ONNX Runtime its session's allow_spinning. No one
setting serves both a quiet machine and a loaded one (docs/threads.md):
- sleeping at once (OMP_WAIT_POLICY=PASSIVE, allow_spinning 0) wakes an idle core for every
  parallel loop, which on a quiet VM or board made torch's LeNet-5 steps 1.3-2.7x slower;
- spinning is fastest on a quiet machine, and beside other work a thread spins for a sibling the
  kernel has descheduled: libgomp's own default spun 30-60x slower beside one busy loop.

So under a target's `omp_wait_policy = "auto"` (the default) the launcher measures, just before
it starts a Python runner (after the lease and any cooldown), how much of the machine's CPU
other work takes over SAMPLE_S, and picks: a bounded spin (SPIN: libgomp's spin count, about a
third of a millisecond, and ONNX Runtime's spinning) where the machine is quiet; passive where
other work takes at least LOADED of it. The launch line and the result's `env.threads` say what
it picked and from what load. Load that comes later is in the result's timed-loop load, which
the gate weighs (docs/compare.md). The C++ binary needs none of this: its own thread team
(workloads/cpp/team.hpp) watches the load while it runs.
"""
from __future__ import annotations

import os
import time

from workloads.timed_loop_load import cpu_counters, own_cpu_seconds

SAMPLE_S = 0.1          # how long the launcher watches the machine before it picks
LOADED = 0.125          # other work's share of the machine's CPU that makes the pick passive
SPIN = "10000"          # GOMP_SPINCOUNT where it spins: libgomp's default is 30 times longer


def _busy() -> tuple[float, int] | None:
    """(the machine's busy CPU seconds, online CPUs) now; None where /proc/stat is not Linux's."""
    try:
        with open("/proc/stat") as f:
            counters = cpu_counters(f.read(), os.sysconf("SC_CLK_TCK"))
    except (OSError, ValueError):
        return None
    return None if counters is None else (counters[0] + (counters[1] or 0.0), counters[2])


def other_share(seconds: float = SAMPLE_S) -> float | None:
    """The share of the machine's CPU (0..1) that work other than this process took over the
    next `seconds`; None where it cannot be read."""
    before, own0, t0 = _busy(), own_cpu_seconds(), time.monotonic()
    time.sleep(seconds)
    after, own1, t1 = _busy(), own_cpu_seconds(), time.monotonic()
    if before is None or after is None or t1 <= t0:
        return None
    return max(0.0, min(1.0, (after[0] - before[0] - (own1 - own0)) / ((t1 - t0) * after[1])))


def pick(share: float | None) -> str:
    """"spin" or "passive" for the other work's share measured (unknown: passive, the safe side)."""
    return "spin" if share is not None and share < LOADED else "passive"


def environment(picked: str) -> dict:
    """The variables a Python runner starts with for a pick: libgomp reads them, and the ONNX
    Runtime runner maps OMP_WAIT_POLICY onto its session's spinning (spinning())."""
    return {"GOMP_SPINCOUNT": SPIN} if picked == "spin" else {"OMP_WAIT_POLICY": "PASSIVE"}


def libgomp_wait(env=os.environ) -> str:
    """How libgomp's threads wait under the environment it started with, as env.threads says it:
    OMP_WAIT_POLICY's "passive" or "active", "spin N" for a GOMP_SPINCOUNT, else "default"."""
    policy = env.get("OMP_WAIT_POLICY", "").lower()
    if policy in ("passive", "active"):
        return policy
    return f"spin {env['GOMP_SPINCOUNT']}" if env.get("GOMP_SPINCOUNT") else "default"


def spinning(env=os.environ) -> bool:
    """Whether a pool should spin under the environment it was started with: not where
    OMP_WAIT_POLICY is PASSIVE (a target's "passive", or auto's pick on a loaded machine)."""
    return env.get("OMP_WAIT_POLICY", "").upper() != "PASSIVE"
