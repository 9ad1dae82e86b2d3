"""The quantities zobench judges and tracks, defined once: the gate (compare.py) judges them
between two runs, history (history.py) along commits, and the shared store keeps one column of
each. Instructions per step, where a job counted them, are a count: judged by a threshold on
their own, one count a side (compare.counted_change), not by the test the times need. A
metric's sources are what it may be measured by, preferred first: peak memory is a GPU's own
allocation where the job had one (a cuda job's RSS is mostly CUDA's libraries), else the
process's RSS; the gate uses the first source both sides measured, history the first one a
result has (a series is one machine, so all its results have the same)."""
from __future__ import annotations

from dataclasses import dataclass
from typing import Callable

from harness.stores.schema import joules_per_step, step_seconds


def _memory(field: str) -> Callable[[dict], float | None]:
    return lambda r: (r.get("memory") or {}).get(field) or None


def instructions_per_step(r: dict) -> float | None:
    """A result's instructions per step (harness/planning/counting.py), None where none was counted."""
    rec = r.get("instructions")
    return rec.get("per_step") if isinstance(rec, dict) else None


@dataclass(frozen=True)
class Source:
    attr: str                               # its samples in a Measurement (measurements.py)
    what: str                               # shown beside a verdict ("device", "host RSS"; "" = the only one)
    read: Callable[[dict], float | None]    # its value in a result; None = not measured


@dataclass(frozen=True)
class Metric:
    name: str                  # its key in a verdict's metrics and a history point's samples
    title: str                 # its column in a table
    unit: str
    scale: float               # from the samples' unit (s, bytes, J) to `unit`
    loaded: bool               # a neighbour's CPU load (or throttling) moves it: not judged then
    column: str                # the shared store's results column history reads
    sources: tuple             # Source, preferred first
    counted: bool = False      # a count, deterministic: judged by a threshold alone, no test and no load
                               # (compare.judge_instructions; history.detect), never by judge()'s test

    def value(self, r: dict) -> float | None:
        """A result's value: its first source that measured one."""
        return next((v for s in self.sources if (v := s.read(r)) is not None), None)


METRICS = (Metric("step_time", "step time", "ms/step", 1e3, True, "step_seconds",
                  (Source("step_s", "", step_seconds),)),
           Metric("peak_memory", "peak memory", "MiB", 2 ** -20, False, "peak_bytes",
                  (Source("device_peak", "device", _memory("device_peak_bytes")),
                   Source("peak_rss", "host RSS", _memory("peak_rss_bytes")))),
           Metric("energy", "energy", "J/step", 1.0, True, "joules_per_step",
                  (Source("joules_per_step", "", joules_per_step),)),
           Metric("instructions", "instructions", "M/step", 1e-6, False, "instructions_per_step",
                  (Source("instructions", "", instructions_per_step),), counted=True))
BY_NAME = {m.name: m for m in METRICS}
LOADED_METRICS = frozenset(m.name for m in METRICS if m.loaded)
