"""The energy meters on recorded readings: tegrastats lines, INA3221 hwmon files, NVML's and
RAPL's counters, and null with the reason where a board has none."""
import time

import pytest

from workloads import energy
from workloads.loop import TrainState
from workloads.runner import energy_record

# tegrastats on a Jetson Orin Nano (JetPack 6), one interval's line
ORIN = ("11-23-2026 06:12:25 RAM 2448/7620MB (lfb 2x4MB) SWAP 0/3810MB (cached 0MB) CPU [1%@729,0%@729,0%@729,"
        "0%@729,0%@729,0%@729] EMC_FREQ 0%@2133 GR3D_FREQ 0%@[305] NVDEC off VIC off OFA off APE 200 "
        "cpu@46.343C gpu@45.468C tj@46.343C VDD_IN 4769mW/4769mW VDD_CPU_GPU_CV 481mW/481mW VDD_SOC 1441mW/1441mW")
# a board whose rails have other names: the sum of them
OTHER = "RAM 1024/3964MB CPU [5%@1479] GR3D_FREQ 12%@921 POM_5V_GPU 1200mW/1100mW POM_5V_CPU 800mW/700mW"


def test_tegrastats_power_is_vdd_in_else_the_sum_of_the_rails():
    assert energy.tegrastats_watts(ORIN) == pytest.approx(4.769)
    assert energy.tegrastats_watts(OTHER) == pytest.approx(2.0)
    assert energy.tegrastats_watts("RAM 1024/3964MB CPU [5%@1479]") is None
    assert energy.tegrastats_watts("") is None


def hwmon(root, channels, name="ina3221"):
    d = root / "hwmon3"
    d.mkdir(parents=True)
    (d / "name").write_text(name + "\n")
    for n, (label, mv, ma) in enumerate(channels, 1):
        (d / f"in{n}_label").write_text(label + "\n")
        (d / f"in{n}_input").write_text(f"{mv}\n")
        (d / f"curr{n}_input").write_text(f"{ma}\n")
    return d


def test_ina3221_reads_vdd_in_or_else_sums_the_channels(tmp_path):
    hwmon(tmp_path / "a", [("VDD_IN", 5000, 1200), ("VDD_CPU_GPU_CV", 5000, 300), ("VDD_SOC", 5000, 250)])
    assert energy.ina3221_watts(str(tmp_path / "a"))() == pytest.approx(6.0)
    d = hwmon(tmp_path / "b", [("CPU", 5000, 100), ("GPU", 5000, 300)])
    read = energy.ina3221_watts(str(tmp_path / "b"))
    assert read() == pytest.approx(2.0)
    (d / "curr2_input").write_text("500\n")        # read live, each time
    assert read() == pytest.approx(3.0)
    hwmon(tmp_path / "c", [("VDD_IN", 5000, 1000)], name="nct7802")
    with pytest.raises(FileNotFoundError, match="no ina3221 channel"):
        energy.ina3221_watts(str(tmp_path / "c"))


class Fake:
    """A counter that steps by `step` joules every `period` seconds of a fake clock, which
    advances by `tick` seconds at every reading."""

    def __init__(self, period=0.25, step=50.0, tick=0.01):
        self.now, self.period, self.step, self.tick = 0.0, period, step, tick

    def clock(self):
        return self.now

    def read(self):
        self.now += self.tick
        return self.step * int(self.now / self.period)


def test_a_counter_meter_measures_between_two_steps_of_the_counter():
    """NVML's counter steps every ~250 ms: the meter starts just after a step, ends just after
    the next one past the loop, and gives the loop its share of that window's energy."""
    f = Fake()
    m = energy.CounterMeter("nvml", f.read, clock=f.clock)
    m.begin()                           # waits for the step at 0.25 s
    f.now += 0.6                        # the loop: 0.6 s
    j = m.end(0.6)                      # waits for the step at 1.0 s: 3 steps of 50 J in 0.75 s
    assert j == pytest.approx(150.0 * 0.6 / 0.75)


def test_a_counter_that_never_steps_gives_zero_after_its_wait():
    f = Fake(period=1e9)
    m = energy.CounterMeter("nvml", f.read, clock=f.clock, wait_s=0.05)
    m.begin()
    assert m.end(0.01) == 0.0


def test_rapl_adds_the_steps_of_its_counter_across_a_wrap(tmp_path):
    zone = tmp_path / "intel-rapl:0"
    zone.mkdir()
    (zone / "max_energy_range_uj").write_text("1000000\n")
    (zone / "energy_uj").write_text("999000\n")
    read = energy.rapl_joules(str(tmp_path))
    (zone / "energy_uj").write_text("2000\n")     # wrapped: 1000 + 1 + 2000 uJ later
    assert read() == pytest.approx(3001e-6)
    (zone / "energy_uj").write_text("502000\n")
    assert read() == pytest.approx(503001e-6)


def test_integrating_power_samples():
    assert energy.integrate([], 1.0) is None
    assert energy.integrate([(0.0, 4.0)], 2.0) == 8.0
    # 2 W then 4 W, linearly: 3 W on average, over a 10 s loop
    assert energy.integrate([(0.0, 2.0), (1.0, 3.0), (2.0, 4.0)], 10.0) == pytest.approx(30.0)


def test_a_sampled_meter_integrates_a_real_thread_s_readings():
    m = energy.SampledMeter("ina3221", lambda: 3.0, period=0.001)
    m.begin()
    time.sleep(0.05)
    assert m.end(2.0) == pytest.approx(6.0)
    m.close()
    assert not m._thread.is_alive()


def test_no_meter_gives_nulls_with_every_reason(tmp_path):
    m = energy.meter("cpu")
    if m.source is not None:
        pytest.skip(f"this machine has a {m.source} meter")
    assert m.unavailable.startswith("no power meter: ") and "ina3221" in m.unavailable and "RAPL" in m.unavailable
    state = TrainState(steps=10, train_seconds=1.0, epochs=[{}], joules=None)
    assert energy_record(m, state) == {"source": None, "joules": None, "joules_per_step": None,
                                       "avg_power_w": None, "unavailable": m.unavailable}


def test_an_energy_record_from_a_reading():
    f = Fake()
    m = energy.CounterMeter("nvml", f.read, clock=f.clock)
    state = TrainState(steps=100, train_seconds=2.0, epochs=[{}, {}], joules=50.0)
    assert energy_record(m, state) == {"source": "nvml", "joules": 50.0, "joules_per_step": 0.5,
                                       "avg_power_w": 25.0, "unavailable": None}
