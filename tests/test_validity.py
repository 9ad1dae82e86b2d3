"""Every job says whether its timing is valid, on recorded formats (there is no Pi here): a
`vcgencmd` on the board's PATH printing the throttle bits from a state file the test changes
mid-job, and a sysfs tree of thermal zones and cpufreq policies ($ZOBENCH_SYSFS), as the energy
tests do for hwmon. Real runs on this machine: the launcher's sampler reads them while the
runner lives, and the harness judges the samples into the result's flags."""
import json
import os
import subprocess
import sys
from pathlib import Path

import pytest

from harness.stores import validity
from harness.stores.store import Store
from testkit.compare_runs import thermal_sample
from testkit.runners import REPO, TINY, TINY_ORT, held_python, until, zobench
from workloads import wait_policy

ONE_JOB = ["--method", "full-zo", *TINY_ORT]   # a Python runner, which held_python holds


def board(tmp: Path, temp_c: float = 45.0, khz: int = 1_000_000) -> dict:
    """A recorded Pi: vcgencmd, one thermal zone and four cpufreq policies, each the test can set."""
    sysfs, bin_ = tmp / "sys", tmp / "bin"
    zone = sysfs / "class" / "thermal" / "thermal_zone0"
    zone.mkdir(parents=True)
    (zone / "type").write_text("cpu-thermal\n")
    cpus = [sysfs / "devices" / "system" / "cpu" / f"cpu{i}" / "cpufreq" for i in range(4)]
    for c in cpus:
        c.mkdir(parents=True)
        (c / "cpuinfo_max_freq").write_text("1000000\n")
    bin_.mkdir()
    state = tmp / "throttled"
    (bin_ / "vcgencmd").write_text(f'#!/bin/sh\n[ "$1" = get_throttled ] && echo "throttled=$(cat {state})"\n')
    (bin_ / "vcgencmd").chmod(0o755)

    def set_(bits: int, temp: float, cur: int, cap: int = 1_000_000) -> None:
        state.write_text(f"{bits:#x}\n")
        (zone / "temp").write_text(f"{int(temp * 1000)}\n")
        for c in cpus:
            (c / "scaling_cur_freq").write_text(f"{cur}\n")
            (c / "scaling_max_freq").write_text(f"{cap}\n")

    set_(0x50000, temp_c, khz)         # under-voltage and throttling happened before this job: not its
    return {"set": set_, "env": {"ZOBENCH_SYSFS": str(sysfs), "PATH": f"{bin_}:{os.environ['PATH']}"}}


def inventory(tmp: Path, python: str = sys.executable, extra: str = "", runtime: str = "ort") -> Path:
    inv = tmp / "targets.toml"
    inv.write_text(f'[targets.pi]\ntransport = "local"\npython = "{python}"\nruntimes = ["{runtime}"]\nthreads = 1\n'
                   f'lease = "{tmp / "lease"}"\n{extra}')
    return inv


def run(tmp: Path, inv: Path, env: dict, *args) -> subprocess.CompletedProcess:
    return zobench("run", "--results", tmp / "res", "--no-report", "--inventory", inv, "--target", "pi", *args,
                   env=env, timeout=600)


def samples_of(results: Path) -> list[dict]:
    files = list(results.glob("runs/*/work/attempts/*/*/thermal.jsonl"))
    return [json.loads(line) for f in files for line in f.read_text().splitlines() if line.endswith("}")]


def test_a_job_during_which_the_board_throttles_is_flagged_and_a_calm_one_is_not(tmp_path):
    pi = board(tmp_path)
    p = run(tmp_path, inventory(tmp_path), pi["env"], *ONE_JOB)
    assert p.returncode == 0, p.stderr
    calm = Store(tmp_path / "res").results(Store(tmp_path / "res").latest())[0]["validity"]
    assert calm["flags"] == [] and calm["throttled"] == ["0x50000", "0x50000"] and calm["unavailable"] is None
    assert calm["temp_max_c"] == {"cpu-thermal": 45.0} and calm["clock"]["slowdown_explained"] == 0.0
    assert calm["samples"] >= 2

    # the runner waits for GO: the test makes the board hot and throttled while it waits, then cools it
    wrapper, log, go = held_python(tmp_path)
    env = pi["env"]
    proc = subprocess.Popen([sys.executable, "-m", "zobench", "run", "--results", str(tmp_path / "res2"), "--no-report",
                             "--inventory", str(inventory(tmp_path, str(wrapper))), "--target", "pi", *ONE_JOB],
                            cwd=REPO, stdout=subprocess.DEVNULL, stderr=subprocess.PIPE, text=True,
                            env={**os.environ, **env})
    until("the runner holds the board", log.is_file, proc)
    pi["set"](0x5000e, 82.5, 600_000, 600_000)      # soft limit and capping now, the clock at 600 MHz
    until("a sample of the hot board", lambda: any(s["throttled"] == 0x5000e for s in samples_of(tmp_path / "res2")), proc)
    pi["set"](0xe005a, 61.0, 1_000_000)             # cool again; what happened is in the "occurred" bits
    go.touch()
    _, err = proc.communicate(timeout=600)
    assert proc.returncode == 0, err
    (r,) = Store(tmp_path / "res2").results(Store(tmp_path / "res2").latest())
    v = r["validity"]
    assert v["flags"] == ["freq-capped", "throttled", "thermal-limit"]
    assert v["throttled"] == ["0x50000", "0xe005a"] and v["temp_max_c"] == {"cpu-thermal": 82.5}
    assert v["clock"] == {"max_khz": 1_000_000, "min_khz": 600_000, "slowdown_explained": pytest.approx(2 / 3, abs=1e-3)}
    assert validity.slowdown_explained(r["validity"]) == pytest.approx(2 / 3, abs=1e-3)
    shown = zobench("results", "--results", tmp_path / "res2")
    assert "ARM frequency capped, throttled, soft temperature limit" in shown.stdout


def test_the_throttle_bits_are_decoded_and_judged_from_the_samples():
    assert validity.decode(0x50005) == {"now": ["under-voltage", "throttled"],
                                        "since_boot": ["under-voltage", "throttled"]}
    assert validity.decode(None) is None
    # "occurred" bits already set when the job started are not the job's; one set during it is
    assert validity.judge([thermal_sample(0x50000), thermal_sample(0x50000)])["flags"] == []
    assert validity.judge([thermal_sample(0x50000), thermal_sample(0xd0000)])["flags"] == ["thermal-limit"]
    assert validity.judge([thermal_sample(0x0), thermal_sample(0x1), thermal_sample(0x0)])["flags"] == ["under-voltage"]
    # the cooling device lowering a policy's maximum during the job is a cap, with no vcgencmd too
    capped = validity.judge([thermal_sample(None), thermal_sample(None, khz=700_000, cap=700_000)])
    assert capped["flags"] == ["freq-capped"] and capped["unavailable"] == {"throttle": "no vcgencmd on this board"}
    assert capped["clock"]["slowdown_explained"] == pytest.approx(1 / 0.7 - 1, abs=1e-3)
    bare = validity.judge([{"t": 0, "zones": {}, "clocks": [], "throttled": None}])
    assert bare["flags"] == [] and set(bare["unavailable"]) == {"throttle", "clock", "temperature"}
    assert validity.slowdown_explained({"flags": ["throttled"], "clock": None}) == float("inf")


def test_a_cooldown_waits_untimed_until_the_board_is_cool_and_records_it(tmp_path):
    pi = board(tmp_path, temp_c=70.0)
    inv = inventory(tmp_path, extra="cooldown = { below_c = 60, max_wait_s = 2 }\n")
    p = run(tmp_path, inv, pi["env"], *ONE_JOB)
    assert p.returncode == 0, p.stderr
    assert "cooling pi: 70.0 C, waiting until it is below 60.0 C" in p.stderr
    (r,) = Store(tmp_path / "res").results(Store(tmp_path / "res").latest())
    cool = r["validity"]["cooldown"]
    assert cool["reached"] is False and cool["start_c"] == cool["end_c"] == 70.0 and cool["waited_s"] >= 2
    # the wait came before the launch line, where the job's own time starts
    log = next((tmp_path / "res").glob("runs/*/work/*/stdout.log")).read_text().splitlines()
    assert [json.loads(line)["event"] for line in log[:3]] == ["cooldown-wait", "cooldown", "launch"]

    pi["set"](0x0, 40.0, 1_000_000)
    p = run(tmp_path, inv, pi["env"], *ONE_JOB)
    (r,) = Store(tmp_path / "res").results(Store(tmp_path / "res").latest())
    assert p.returncode == 0 and "cooling" not in p.stderr
    assert r["validity"]["cooldown"]["reached"] is True and r["validity"]["cooldown"]["start_c"] == 40.0


def test_a_cooldown_is_checked_where_it_is_read(tmp_path):
    inv = inventory(tmp_path, extra="cooldown = { below_c = 60 }\n")
    p = zobench("targets", "list", "--inventory", inv)
    assert p.returncode == 2 and p.stderr.strip() == (
        f"zobench: error: {inv}: targets.pi.cooldown.max_wait_s: missing; expected a number")


@pytest.mark.parametrize("policy, seen", [("passive", "PASSIVE unset"), ("active", "ACTIVE unset"),
                                          ("default", "unset unset"), (None, None)])
def test_the_runner_gets_the_targets_openmp_wait_policy_and_the_result_records_it(tmp_path, policy, seen):
    """OpenMP's spinning barriers wait for descheduled threads beside other work (25x slower at
    two threads beside a busy loop, benchmarks/omp_contention.py), and sleeping ones cost a quiet
    machine a wake-up a loop: every runner is started with the target's policy, and the result
    keeps it. Under "auto" (the default) the launcher picks from the load it measured, and the
    runner's environment, its env.threads and that load agree (which one it picks depends on
    what else this machine is running)."""
    spy = tmp_path / "python"
    spy.write_text(f'#!/bin/sh\n[ "$1 $2" = "-m workloads.torch_runner" ] && '
                   f'echo "${{OMP_WAIT_POLICY:-unset}} ${{GOMP_SPINCOUNT:-unset}}" > {tmp_path / "seen"}\n'
                   f'exec {sys.executable} "$@"\n')
    spy.chmod(0o755)
    inv = inventory(tmp_path, str(spy), f'omp_wait_policy = "{policy}"\n' if policy else "", runtime="torch")
    p = run(tmp_path, inv, {}, "--method", "full-zo", *TINY)
    assert p.returncode == 0, p.stderr
    (r,) = Store(tmp_path / "res").results(Store(tmp_path / "res").latest())
    threads = r["env"]["threads"]
    assert r["env"]["omp_wait_policy"] == (policy or "auto")
    if policy:
        assert (tmp_path / "seen").read_text().strip() == seen
        assert "picked" not in threads and threads["wait"] == policy
        return
    share, picked = threads["other_share"], threads["picked"]
    assert picked == ("spin" if share < wait_policy.LOADED else "passive")
    assert (tmp_path / "seen").read_text().strip() == \
        ("unset " + wait_policy.SPIN if picked == "spin" else "PASSIVE unset")
    assert threads["wait"] == ("spin " + wait_policy.SPIN if picked == "spin" else "passive")
