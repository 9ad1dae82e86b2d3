"""Energy of the timed training loop, where the board can measure it.

A J/step figure is only worth printing beside ms/step if it is the energy of exactly the
timed steps, so every meter measures one interval, begin() to end(seconds), around an
epoch's timed loop (eval excluded), and says where its number came from (`source`) or why
there is none (`unavailable`). Two kinds of meter exist on the boards we target:

- counters of energy since boot: NVML's total-energy counter on NVIDIA GPUs (Volta and
  later), RAPL's package counter on x86. NVML's advances in steps (about every 250 ms seen
  on an H100), which would make a short loop's energy all rounding, so begin() and end()
  wait for the counter to step: the counter is then exact at both ends of a window that
  holds the loop, and the loop gets the window's energy scaled by the loop's share of it.
- power readings, integrated over time by a sampling thread: a Jetson's INA3221 rails
  (hwmon in*_input mV x curr*_input mA), or `tegrastats` where the rails are not readable.
"""
from __future__ import annotations

import subprocess
import threading
import time
from pathlib import Path

from . import gpuinfo
from .gpuinfo import parse_tegrastats

TICK_WAIT_S = 0.6        # the longest wait for a counter to step; longer than NVML's period
SAMPLE_S = 0.02          # the power readers' sampling period
TEGRASTATS_MS = 100      # tegrastats' own interval, when it is the reader


class Unavailable:
    """No meter: every figure null, with the reason."""
    source = None

    def __init__(self, reason: str):
        self.unavailable = reason

    def begin(self) -> None:
        pass

    def end(self, seconds: float) -> float | None:
        return None

    def close(self) -> None:
        pass


class CounterMeter:
    """A counter of joules since some origin, read by read(); None when it cannot be read."""
    unavailable = None

    def __init__(self, source: str, read, clock=time.perf_counter, wait_s: float = TICK_WAIT_S):
        self.source, self.read, self.clock, self.wait_s = source, read, clock, wait_s
        self._start = None

    def _tick(self) -> tuple[float, float]:
        """(joules, time) just after the counter steps, or now if it does not within wait_s."""
        first, t0 = self.read(), self.clock()
        while True:
            value, now = self.read(), self.clock()
            if value != first or now - t0 > self.wait_s:
                return value, now

    def begin(self) -> None:
        self._start = self._tick()

    def end(self, seconds: float) -> float | None:
        """The loop's joules: the window's energy times the loop's share of the window."""
        (e0, t0), (e1, t1) = self._start, self._tick()
        window = t1 - t0
        return (e1 - e0) * min(1.0, seconds / window) if window > 0 else None

    def close(self) -> None:
        pass


class SampledMeter:
    """Power in watts from read(), sampled every period by a thread and integrated."""
    unavailable = None

    def __init__(self, source: str, read, period: float = SAMPLE_S, clock=time.perf_counter, on_close=None):
        self.source, self.read, self.period, self.clock = source, read, period, clock
        self.samples: list[tuple[float, float]] = []
        self._lock, self._stop = threading.Lock(), threading.Event()
        self._on_close = on_close
        self._thread = threading.Thread(target=self._run, daemon=True)
        self._thread.start()

    def _run(self) -> None:
        while not self._stop.wait(self.period):
            watts = self.read()
            if watts is not None:
                with self._lock:
                    self.samples.append((self.clock(), watts))

    def begin(self) -> None:
        with self._lock:
            self.samples = []

    def end(self, seconds: float) -> float | None:
        with self._lock:
            samples = list(self.samples)
        return integrate(samples, seconds)

    def close(self) -> None:
        self._stop.set()
        if self._on_close:     # a reader blocked on its process's output returns when it ends
            self._on_close()
        self._thread.join(timeout=1)


def integrate(samples: list[tuple[float, float]], seconds: float) -> float | None:
    """Joules over `seconds` from (time, watts) samples: the trapezoids' mean power times the
    loop's time (the samples need not cover its ends exactly); None without a sample."""
    if not samples:
        return None
    if len(samples) == 1:
        return samples[0][1] * seconds
    area = sum((t1 - t0) * (w0 + w1) / 2 for (t0, w0), (t1, w1) in zip(samples, samples[1:]))
    return area / (samples[-1][0] - samples[0][0]) * seconds


# ---- the readers ------------------------------------------------------------------------

def nvml_joules(index: int):
    """read() -> joules of NVML's total-energy counter (mJ) of GPU `index`."""
    pynvml, handle = gpuinfo.nvml_handle(index)
    pynvml.nvmlDeviceGetTotalEnergyConsumption(handle)    # raises where the GPU has no counter
    return lambda: pynvml.nvmlDeviceGetTotalEnergyConsumption(handle) / 1e3


def rapl_joules(root: str = "/sys/class/powercap"):
    """read() -> joules of the first RAPL package counter (energy_uj, wrapping at
    max_energy_range_uj: each read adds the step since the last one)."""
    zone = Path(root) / "intel-rapl:0"
    counter, wrap = zone / "energy_uj", int((zone / "max_energy_range_uj").read_text())
    last, total = int(counter.read_text()), 0

    def read():
        nonlocal last, total
        now = int(counter.read_text())
        total += (now - last) % (wrap + 1)
        last = now
        return total / 1e6
    return read


def ina3221_watts(root: str = "/sys/class/hwmon"):
    """read() -> watts from INA3221 hwmon channels (in*_input mV x curr*_input mA): the rail
    labelled VDD_IN (the whole module's input, on a Jetson Orin) if there is one, else the sum
    of all channels."""
    channels = []
    for hwmon in sorted(Path(root).glob("hwmon*")):
        name = hwmon / "name"
        if not name.is_file() or name.read_text().strip() != "ina3221":
            continue
        for volts in sorted(hwmon.glob("in*_input")):
            n = volts.name[2:-len("_input")]
            amps, label = hwmon / f"curr{n}_input", hwmon / f"in{n}_label"
            if amps.is_file():
                channels.append((label.read_text().strip() if label.is_file() else f"in{n}", volts, amps))
    if not channels:
        raise FileNotFoundError(f"no ina3221 channel under {root}")
    total_in = [c for c in channels if c[0] == "VDD_IN"]
    use = total_in or channels

    def read():
        return sum(int(v.read_text()) * int(a.read_text()) for _, v, a in use) / 1e6
    read()
    return read


def tegrastats_watts(line: str) -> float | None:
    """Watts in one tegrastats line: VDD_IN's current draw, else the sum of the rails'."""
    rails = parse_tegrastats(line)["rails_mw"]
    if not rails:
        return None
    return (rails["VDD_IN"]["now"] if "VDD_IN" in rails else sum(r["now"] for r in rails.values())) / 1e3


def _tegrastats_meter() -> SampledMeter:
    """tegrastats' lines, read as it prints them; FileNotFoundError where it is not installed."""
    p = subprocess.Popen(["tegrastats", "--interval", str(TEGRASTATS_MS)], stdout=subprocess.PIPE,
                         stderr=subprocess.DEVNULL, text=True)
    return SampledMeter("tegrastats", lambda: tegrastats_watts(p.stdout.readline()), period=0,
                        on_close=p.kill)


def meter(device: str):
    """The best meter this board has for a job on `device`, else Unavailable with every
    reason: NVML for a cuda job; a Jetson's rails, or tegrastats; RAPL for a CPU job."""
    reasons = []
    candidates = []
    if device.startswith("cuda"):
        candidates.append(("NVML", lambda: CounterMeter("nvml", nvml_joules(gpuinfo.gpu_index(device)))))
    candidates += [("ina3221", lambda: SampledMeter("ina3221", ina3221_watts())),
                   ("tegrastats", _tegrastats_meter)]
    if not device.startswith("cuda"):
        candidates.append(("RAPL", lambda: CounterMeter("rapl", rapl_joules(), wait_s=0.01)))
    for name, make in candidates:
        try:
            return make()
        except Exception as e:  # a missing module, file, permission or NVML error: the next one
            reasons.append(f"{name}: {e}")
    return Unavailable("no power meter: " + "; ".join(reasons))
