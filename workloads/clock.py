"""Phase timing that tiles the training loop.

Each lap() charges the time since the previous lap to one phase, so the phases
cover the loop without gaps and sum to train_seconds up to the few
microseconds spent outside laps. Loop overhead between steps lands in `data`,
the phase that starts every step.

On a GPU the work is asynchronous: timing it on the host would need a
synchronisation per phase, which serializes the host and the device and costs
more than a small phase itself. EventClock records a CUDA event per lap instead
(inside a CUDA graph too) and reads them all at the end of the step, after one
synchronisation.
"""
from __future__ import annotations

import time

from .vocab import PHASES


class PhaseClock:
    def __init__(self):
        self.seconds = dict.fromkeys(PHASES, 0.0)
        self.calls = dict.fromkeys(PHASES, 0)
        self._last = None

    def start(self) -> None:
        self._last = time.perf_counter()

    def lap(self, phase: str, call: bool = True) -> None:
        """Charge the time since the last lap to phase; call=False adds to its last call."""
        now = time.perf_counter()
        self._charge(phase, now - self._last, call)
        self._last = now

    def step_end(self) -> None:
        """Where an asynchronous clock waits for its laps and reads them: once a step, after the
        next batch is loaded (the loading overlaps the step), and after a loop or an eval."""

    def drain(self) -> None:
        """Where every lap taken so far must be read: the end of an epoch's loop and of its
        evaluation (an asynchronous clock reads its last steps there)."""
        self.step_end()

    def replayed(self, laps: list) -> None:
        """The laps a CUDA graph replay has recorded again: only EventClock's are events."""

    def _charge(self, phase: str, seconds: float, call: bool) -> None:
        self.seconds[phase] += seconds
        self.calls[phase] += call

    def snapshot(self) -> dict:
        return {p: (self.seconds[p], self.calls[p]) for p in PHASES}

    def since(self, snap: dict) -> dict:
        """Per-phase seconds and calls since snapshot(), in the result format."""
        return {p: {"seconds": self.seconds[p] - snap[p][0], "calls": self.calls[p] - snap[p][1]}
                for p in PHASES}

    def as_result(self) -> dict:
        return {p: {"seconds": self.seconds[p], "calls": self.calls[p]} for p in PHASES}


class NullClock:
    """What warm-up steps are timed with: nothing."""

    def lap(self, phase: str, call: bool = True) -> None:
        pass

    def step_end(self) -> None:
        pass

    def drain(self) -> None:
        pass

    def replayed(self, laps: list) -> None:
        pass


def cuda_event():
    """A timing event that may be recorded while a CUDA graph is captured: it becomes a node
    of the graph, recorded again at every replay (external=True)."""
    import torch

    return torch.cuda.Event(enable_timing=True, external=True)


class EventClock(PhaseClock):
    """Phases timed on the GPU's own clock: lap() records an event on the stream, and
    step_end() closes the step's laps and charges each phase of the step LAG steps before the
    device time between its event and the one before, once that step's last event is reached.
    The host so waits for the step before the one it has just queued, never for that one: the
    device always has a step queued while the host reads the clock and prepares the next. The
    gaps where the device waited for the host are charged to the phase that ends them, so the
    laps still tile the loop. drain() reads every step still open (an epoch's end)."""
    LAG = 1

    def __init__(self, factory=None):
        """factory: makes the events (tests give a stand-in; cuda_event by default)."""
        super().__init__()
        self._factory = factory or cuda_event
        self._pending = []    # (phase, event, call) recorded since the last step_end
        self._closed = []     # per step closed but not read: (its mark, its laps, its end)
        self._free = []       # own events already read, to record again
        self._graph = set()   # ids of the events a CUDA graph owns: never recorded from here
        self._mark = None     # the event the next phase starts from

    def _event(self):
        ev = self._free.pop() if self._free else self._factory()
        ev.record()
        return ev

    def _recycle(self, events) -> None:
        self._free.extend(ev for ev in events if ev is not None and id(ev) not in self._graph)

    def start(self) -> None:
        self.drain()
        self._recycle([ev for _, ev, _ in self._pending] + [self._mark])
        self._pending = []
        self._mark = self._event()

    def lap(self, phase: str, call: bool = True) -> None:
        self._pending.append((phase, self._event(), call))

    def replayed(self, laps: list) -> None:
        """The (phase, event) laps a CUDA graph replay has just recorded again."""
        self._graph.update(id(ev) for _, ev in laps)
        self._pending.extend((phase, ev, True) for phase, ev in laps)

    def step_end(self) -> None:
        self._close()
        while len(self._closed) > self.LAG:
            self._read(*self._closed.pop(0))

    def drain(self) -> None:
        self._close()
        while self._closed:
            self._read(*self._closed.pop(0))

    def _close(self) -> None:
        if not self._pending:
            return
        end = self._event()      # the next step's phases start here
        self._closed.append((self._mark, self._pending, end))
        self._pending, self._mark = [], end

    def _read(self, mark, laps, end) -> None:
        end.synchronize()
        # every event's time from the same mark, so that rounding does not add up over a step's
        # laps; the last phase runs to `end`, so the host's time between them is charged too
        before, last = 0.0, len(laps) - 1
        for n, (phase, ev, call) in enumerate(laps):
            at = mark.elapsed_time(end if n == last else ev)
            self._charge(phase, (at - before) / 1e3, call)
            before = at
        self._recycle([ev for _, ev, _ in laps] + [mark])
