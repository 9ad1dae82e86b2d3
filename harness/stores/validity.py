"""Whether a job's timing is valid: the board's throttle state, temperatures and clocks while it
ran (workloads/thermal.py's samples), judged into the result's `validity` record and its flags.

A Pi that hit its soft temperature limit during repeat 3 ran repeat 3 at a capped clock: its
step time is the board's, not the code's. The flags say so wherever the time is shown, and
`zobench compare` and `history` treat a flagged repeat as they treat a loaded one
(docs/results.md, "Validity"; docs/compare.md).
"""
from __future__ import annotations

import math

# vcgencmd get_throttled: bit i is "now", bit i + 16 "has occurred since boot"
THROTTLE_BITS = {0: "under-voltage", 1: "freq-capped", 2: "throttled", 3: "thermal-limit"}
SINCE_BOOT = 16
FLAGS = tuple(THROTTLE_BITS.values())
TITLES = {"under-voltage": "under-voltage", "freq-capped": "ARM frequency capped", "throttled": "throttled",
          "thermal-limit": "soft temperature limit"}


def decode(bits: int | None) -> dict | None:
    """The named bits of a get_throttled value: those set now, and those set since boot."""
    if bits is None:
        return None
    return {"now": [n for i, n in THROTTLE_BITS.items() if bits >> i & 1],
            "since_boot": [n for i, n in THROTTLE_BITS.items() if bits >> (i + SINCE_BOOT) & 1]}


def _mean(xs):
    xs = [x for x in xs if isinstance(x, (int, float)) and x > 0]
    return sum(xs) / len(xs) if xs else None


def judge(samples: list[dict], cooldown: dict | None = None) -> dict:
    """The validity record of a job from its samples (the first taken as its runner started,
    the last as it ended): its flags, and what they were judged from."""
    flags, unavailable = [], {}
    bits = [s.get("throttled") for s in samples if isinstance(s.get("throttled"), int)]
    if bits:
        now = {n for b in bits for n in decode(b)["now"]}
        # an "occurred" bit that turned on between the first and the last sample: it happened during the job
        began = set(decode(bits[-1])["since_boot"]) - set(decode(bits[0])["since_boot"])
        flags += [n for n in FLAGS if n in now | began]
    else:
        unavailable["throttle"] = "no vcgencmd on this board" if samples else "no samples"
    clocks = [s["clocks"] for s in samples if s.get("clocks")]
    clock = None
    if clocks:
        # the cooling device lowers a policy's maximum: below the start's during the job is a cap
        first_caps = [c[1] for c in clocks[0]]
        capped = any(c[1] is not None and cap is not None and c[1] < cap
                     for cs in clocks for c, cap in zip(cs, first_caps))
        flags = [n for n in FLAGS if n in flags or (capped and n == "freq-capped")]
        top = _mean(first_caps) or _mean(c[2] for c in clocks[0])
        low = min((m for m in (_mean(c[0] for c in cs) for cs in clocks) if m), default=None)
        clock = {"max_khz": top, "min_khz": low,
                 "slowdown_explained": round(top / low - 1, 4) if top and low and top > low else 0.0}
    else:
        unavailable["clock"] = "no cpufreq on this board" if samples else "no samples"
    zones = {}
    for s in samples:
        for z, t in (s.get("zones") or {}).items():
            if isinstance(t, (int, float)) and math.isfinite(t):
                zones[z] = max(zones.get(z, t), t)
    if not zones:
        unavailable["temperature"] = "no thermal zones on this board" if samples else "no samples"
    return {"flags": flags, "samples": len(samples), "throttled": [f"{bits[0]:#x}", f"{bits[-1]:#x}"] if bits else None,
            "temp_max_c": zones or None, "clock": clock, "cooldown": cooldown, "unavailable": unavailable or None}


def flags_of(result: dict) -> list[str]:
    v = result.get("validity")
    return list(v.get("flags") or []) if isinstance(v, dict) else []


def slowdown_explained(record: dict | None) -> float:
    """How much slower a job whose validity record is flagged may have run for its flags: its
    clock's measured reduction, or without one every slowdown (inf); 0 for one without flags."""
    if not isinstance(record, dict) or not record.get("flags"):
        return 0.0
    x = (record.get("clock") or {}).get("slowdown_explained")
    return x if isinstance(x, (int, float)) and not isinstance(x, bool) and 0 <= x < math.inf else math.inf


def shown(flags: list[str]) -> str:
    """"throttled (soft temperature limit)" as a verdict's note and a table's cell say it."""
    return ", ".join(TITLES[f] if f in TITLES else f for f in flags)
