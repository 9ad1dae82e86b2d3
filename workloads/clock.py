"""Phase timing that tiles the training loop.

Each lap() charges the time since the previous lap to one phase, so the phases
cover the loop without gaps and sum to train_seconds up to the few
microseconds spent outside laps. Loop overhead between steps lands in `data`,
the phase that starts every step.
"""
from __future__ import annotations

import time

from .vocab import PHASES


class PhaseClock:
    def __init__(self, sync=None):
        self.sync = sync or (lambda: None)   # e.g. torch.cuda.synchronize
        self.seconds = dict.fromkeys(PHASES, 0.0)
        self.calls = dict.fromkeys(PHASES, 0)
        self._last = None

    def start(self) -> None:
        self.sync()
        self._last = time.perf_counter()

    def lap(self, phase: str) -> None:
        self.sync()
        now = time.perf_counter()
        self.seconds[phase] += now - self._last
        self.calls[phase] += 1
        self._last = now

    def snapshot(self) -> dict:
        return {p: (self.seconds[p], self.calls[p]) for p in PHASES}

    def since(self, snap: dict) -> dict:
        """Per-phase seconds and calls since snapshot(), in the result format."""
        return {p: {"seconds": self.seconds[p] - snap[p][0], "calls": self.calls[p] - snap[p][1]}
                for p in PHASES}

    def as_result(self) -> dict:
        return {p: {"seconds": self.seconds[p], "calls": self.calls[p]} for p in PHASES}
