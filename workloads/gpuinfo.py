"""Facts about the GPU a torch job runs on, for every result's `env` and compare's fingerprint.

A result measured on another GPU, driver or CUDA must never be compared as if it were the
same machine, so the identity of the device goes into the fingerprint (FINGERPRINT) and its
state at the time (current clocks) into the facts only. NVML, through nvidia-ml-py, gives what
torch does not (driver, clocks, power limit, persistence mode); it is imported only where
installed, and every fact it cannot give is null with the reason under "unavailable". A Jetson
has no NVML: its `tegrastats` lines are parsed instead (parse_tegrastats).
"""
from __future__ import annotations

import functools
import re

# what identifies the device: a change of any of these makes two results not comparable
FINGERPRINT = ("name", "capability", "memory_total_bytes", "driver", "cuda", "cudnn", "sm_clock_max_mhz",
               "mem_clock_max_mhz", "power_limit_w")
# NVML's readings: fact -> (function, what it takes: "system" nothing, "device" the device's
# handle, else the handle and that NVML constant), and the conversion of its value
NVML = {
    "driver": ("nvmlSystemGetDriverVersion", "system", str),
    "sm_clock_mhz": ("nvmlDeviceGetClockInfo", "NVML_CLOCK_SM", int),
    "sm_clock_max_mhz": ("nvmlDeviceGetMaxClockInfo", "NVML_CLOCK_SM", int),
    "mem_clock_mhz": ("nvmlDeviceGetClockInfo", "NVML_CLOCK_MEM", int),
    "mem_clock_max_mhz": ("nvmlDeviceGetMaxClockInfo", "NVML_CLOCK_MEM", int),
    "power_limit_w": ("nvmlDeviceGetEnforcedPowerLimit", "device", lambda mw: mw / 1000),
    "persistence": ("nvmlDeviceGetPersistenceMode", "device", bool),
}


def facts(device: str) -> dict | None:
    """The GPU's facts for a job on `device`; None for a CPU job."""
    if not device.startswith("cuda"):
        return None
    import torch

    if not torch.cuda.is_available():
        return {"unavailable": {"gpu": f"CUDA not available: torch {torch.__version__}"}}
    gpu = gpu_index(device)
    p = torch.cuda.get_device_properties(gpu)
    out = {"name": p.name, "capability": f"{p.major}.{p.minor}", "memory_total_bytes": p.total_memory,
           "cuda": torch.version.cuda, "cudnn": torch.backends.cudnn.version(), "unavailable": {}}
    out.update(nvml_facts(_nvml_reader(gpu), out["unavailable"]))
    return out


def nvml_facts(read, unavailable: dict) -> dict:
    """The NVML facts through read(function, takes), each converted; a reading that fails is
    null, with its reason put in `unavailable`."""
    out = {}
    for fact, (function, takes, convert) in NVML.items():
        try:
            value = read(function, takes)
            out[fact] = convert(value.decode() if isinstance(value, bytes) else value)
        except Exception as e:  # NVML raises its own error per unsupported query
            out[fact] = None
            unavailable[fact] = f"{function}: {e}"
    return out


def gpu_index(device: str) -> int:
    """The GPU a "cuda" or "cuda:N" device names."""
    import torch
    return torch.device(device).index or 0


@functools.lru_cache(maxsize=None)
def nvml_handle(index: int):
    """NVML, initialized once a process, and its handle of GPU `index`: the facts, the energy
    meter and the memory read at the end of a job share it. Raises where NVML is not."""
    import pynvml

    pynvml.nvmlInit()
    return pynvml, pynvml.nvmlDeviceGetHandleByIndex(index)


def _nvml_reader(index: int):
    """read(function, takes) over nvidia-ml-py for device `index`, or one that says why not."""
    try:
        pynvml, handle = nvml_handle(index)
    except Exception as e:  # not installed, or no NVML driver library (a Jetson)
        reason = f"NVML: {e}"

        def unavailable(function, takes):
            raise RuntimeError(reason)
        return unavailable

    def read(function, takes):
        f = getattr(pynvml, function)
        return f() if takes == "system" else f(handle) if takes == "device" else f(handle, getattr(pynvml, takes))
    return read


def used_bytes(index: int) -> int | None:
    """NVML's "used" memory of GPU `index` (what nvidia-smi shows); None where NVML is not."""
    try:
        return int(_nvml_reader(index)("nvmlDeviceGetMemoryInfo", "device").used)
    except Exception:  # no NVML (a Jetson, or nvidia-ml-py not installed): unknown
        return None


def reset_peak(device: str) -> None:
    """A cuda job's memory peaks from here on: training's, not warm-up's transient ones (what
    warm-up left allocated, a CUDA graph's pool, still counts)."""
    if device.startswith("cuda"):
        import torch
        torch.cuda.reset_peak_memory_stats(device)


def device_memory(device: str) -> dict:
    """A cuda job's device memory: torch's peaks (allocated by tensors; reserved by the caching
    allocator) and NVML's "used", the whole process's, context included (what nvidia-smi and
    the MeZO paper report), read when training ends. Empty for a CPU job."""
    if not device.startswith("cuda"):
        return {}
    import torch
    return {"device_peak_bytes": torch.cuda.max_memory_allocated(device),
            "device_reserved_peak_bytes": torch.cuda.max_memory_reserved(device),
            "device_used_bytes": used_bytes(gpu_index(device))}


def fingerprint(gpu: dict | None) -> dict | None:
    return None if gpu is None else {k: gpu.get(k) for k in FINGERPRINT}


TEGRA_RAIL = re.compile(r"\b([A-Z][A-Z0-9_]*) (\d+)mW/(\d+)mW")


def parse_tegrastats(line: str) -> dict:
    """One `tegrastats` line: RAM used/total, the GPU's load and clock, and each power rail's
    current and average draw (mW), as JetPack 5/6 print them."""
    out: dict = {"rails_mw": {}}
    if m := re.search(r"\bRAM (\d+)/(\d+)MB", line):
        out["ram_used_bytes"], out["ram_total_bytes"] = (int(x) << 20 for x in m.groups())
    if m := re.search(r"\bGR3D_FREQ (\d+)%(?:@\[?(\d+)\]?)?", line):
        out["gpu_load_pct"] = int(m.group(1))
        out["gpu_clock_mhz"] = int(m.group(2)) if m.group(2) else None
    for name, now, avg in TEGRA_RAIL.findall(line):
        out["rails_mw"][name] = {"now": int(now), "avg": int(avg)}
    return out
