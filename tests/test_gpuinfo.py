"""The GPU facts readers on recorded values (CI has no GPU): NVML readings and tegrastats
lines as their documentation gives them, and null with the reason where nothing is there."""
import pytest

from harness.analysis import compare
from harness.stores.measurements import Measurement, fingerprint
from workloads import gpuinfo

# What NVML returns on an H100 SXM (nvidia-ml-py: bytes or str for strings, mW for power)
H100 = {"nvmlSystemGetDriverVersion": b"550.54.15", "nvmlDeviceGetClockInfo": {"NVML_CLOCK_SM": 1980,
        "NVML_CLOCK_MEM": 2619}, "nvmlDeviceGetMaxClockInfo": {"NVML_CLOCK_SM": 1980, "NVML_CLOCK_MEM": 2619},
        "nvmlDeviceGetEnforcedPowerLimit": 700000, "nvmlDeviceGetPersistenceMode": 1}


def recorded(values: dict, missing: set = frozenset()):
    def read(function, takes):
        if function in missing:
            raise RuntimeError("Not Supported")
        v = values[function]
        return v[takes] if isinstance(v, dict) else v
    return read


def test_nvml_readings_become_facts_with_units():
    unavailable = {}
    f = gpuinfo.nvml_facts(recorded(H100), unavailable)
    assert f == {"driver": "550.54.15", "sm_clock_mhz": 1980, "sm_clock_max_mhz": 1980, "mem_clock_mhz": 2619,
                 "mem_clock_max_mhz": 2619, "power_limit_w": 700.0, "persistence": True}
    assert unavailable == {}


def test_a_reading_nvml_cannot_give_is_null_with_its_reason():
    unavailable = {}
    f = gpuinfo.nvml_facts(recorded(H100, {"nvmlDeviceGetEnforcedPowerLimit"}), unavailable)
    assert f["power_limit_w"] is None and f["driver"] == "550.54.15"
    assert unavailable == {"power_limit_w": "nvmlDeviceGetEnforcedPowerLimit: Not Supported"}


def test_a_cpu_job_has_no_gpu_and_a_machine_without_cuda_says_why():
    torch = pytest.importorskip("torch")
    assert gpuinfo.facts("cpu") is None
    if torch.cuda.is_available():
        pytest.skip("this machine has CUDA")
    assert gpuinfo.facts("cuda") == {"unavailable": {"gpu": f"CUDA not available: torch {torch.__version__}"}}


# JetPack 6 on an Orin Nano (tegrastats' documented fields; rails are the board's INA3221 channels)
ORIN = ("11-23-2026 10:00:00 RAM 2448/7620MB (lfb 2x4MB) SWAP 0/3810MB (cached 0MB) "
        "CPU [3%@1510,1%@1510,0%@1510,2%@1510,0%@729,0%@729] EMC_FREQ 0%@2133 GR3D_FREQ 47%@[624] "
        "NVENC off NVDEC off cpu@48.5C soc2@47.1C VDD_IN 5021mW/4987mW VDD_CPU_GPU_CV 1203mW/1150mW "
        "VDD_SOC 1440mW/1432mW")
# JetPack 5 prints the GPU clock without brackets
XAVIER = "RAM 3000/7772MB (lfb 8x4MB) GR3D_FREQ 0%@1109 VDD_IN 3721mW/3721mW"


def test_tegrastats_lines_give_memory_gpu_load_and_power_rails():
    t = gpuinfo.parse_tegrastats(ORIN)
    assert (t["ram_used_bytes"], t["ram_total_bytes"]) == (2448 << 20, 7620 << 20)
    assert (t["gpu_load_pct"], t["gpu_clock_mhz"]) == (47, 624)
    assert t["rails_mw"] == {"VDD_IN": {"now": 5021, "avg": 4987}, "VDD_CPU_GPU_CV": {"now": 1203, "avg": 1150},
                             "VDD_SOC": {"now": 1440, "avg": 1432}}
    x = gpuinfo.parse_tegrastats(XAVIER)
    assert (x["gpu_load_pct"], x["gpu_clock_mhz"], x["rails_mw"]["VDD_IN"]["avg"]) == (0, 1109, 3721)
    assert gpuinfo.parse_tegrastats("not tegrastats") == {"rails_mw": {}}


def test_another_gpu_or_driver_is_a_changed_fingerprint_but_its_clocks_of_the_moment_are_not():
    base = {"cpu_model": "x", "cores": 16, "governor": "performance", "kernel": "6.8", "versions": {}}
    gpu = {"name": "NVIDIA H100 80GB HBM3", "capability": "9.0", "memory_total_bytes": 85 << 30, "cuda": "12.4",
           "cudnn": 90100, **gpuinfo.nvml_facts(recorded(H100), {})}

    def m(g):
        return Measurement("k", {}, [1.0], [1.0], [], fingerprint({**base, "gpu": g}), "", "")
    assert compare.fingerprint_changes(m(gpu), m({**gpu, "sm_clock_mhz": 1410})) == []
    assert compare.fingerprint_changes(m(gpu), m({**gpu, "driver": "560.28.03"})) == ["gpu"]
    assert compare.fingerprint_changes(m(None), m(None)) == []


def test_the_probe_records_a_jetsons_power_mode_clocks_and_tegrastats(tmp_path, monkeypatch):
    """On a Jetson (its tools stood in for by scripts printing what JetPack's print): nvpmodel's
    mode, jetson_clocks' state and where tegrastats is; None on a board without them."""
    from workloads import envinfo

    tools = {"nvpmodel": "NV Power Mode: 15W\n0", "jetson_clocks": "SOC family:tegra234  Machine:NVIDIA Jetson Orin Nano\n"
             "cpu0: Online=1 Governor=schedutil MinFreq=729600 MaxFreq=1510400 CurrentFreq=1510400", "tegrastats": ""}
    for name, text in tools.items():
        (tmp_path / name).write_text(f"#!/bin/sh\ncat <<'X'\n{text}\nX\n")
        (tmp_path / name).chmod(0o755)
    monkeypatch.setenv("PATH", f"{tmp_path}:/usr/bin:/bin")
    p = envinfo.probe()
    assert p["nvpmodel"] == "NV Power Mode: 15W\n0"
    assert p["jetson_clocks"].startswith("SOC family:tegra234") and "MaxFreq=1510400" in p["jetson_clocks"]
    assert p["tegrastats"] == str(tmp_path / "tegrastats")
