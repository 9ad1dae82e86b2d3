"""Runs for the regression gate: real ci runs of the same code, the same code again and a
slowed-down copy, taken in turn (what the compare tests and the compare benchmark measure),
and made-up runs whose samples, fingerprints and load a test chooses, written through the
real store so that `zobench compare` reads them as it reads any run."""
from __future__ import annotations

import dataclasses
from pathlib import Path

from harness.stores.schema import upgrade
from harness.stores.store import Store
from workloads.result import skeleton
from workloads.spec import JobSpec
from zobench import running
from zobench.cli import build_parser
from zobench.commands.run import request

# The sides of the compare tests and benchmark: the code as it is, the same code again, and the
# code with a 20% slowdown injected.
COMPARE_SIDES = (("base", []), ("same", []), ("slow", ["--set", "inject_slowdown=0.2"]))
# The ci suite's single-threaded cpp full-zo (five repeats) on 3200 samples: the compare
# tests' key, on a target of its own ("solo", one thread).
SOLO = ["--suite", "ci", "--runtime", "cpp", "--precision", "fp32", "--method", "full-zo", "--target", "solo",
        "--set", "train_samples=3200"]


def solo_inventory(root: Path) -> Path:
    inv = root / "inventory.toml"
    inv.write_text('[targets.solo]\nprofile = "local"\nthreads = 1\n')
    return inv


def run(store: Store, argv: list[str]) -> str:
    """A run as `zobench run --no-report ARGV` asks for it, by the library's running.run; its id."""
    log: list[str] = []
    req = dataclasses.replace(request(build_parser().parse_args(["run", *argv])), report=False)
    outcome = running.run(store, req, log.append)
    assert outcome.exit_code == 0, f"a run failed (results in {store.root}): {chr(10).join(log)[-2000:]}"
    return outcome.run_id


def interleaved_runs(root: Path, rounds: int, argv: list[str] | None = None) -> tuple[Path, dict[str, list[str]]]:
    """`rounds` rounds of one run per side of COMPARE_SIDES, taken in turn so that the machine's
    drift hits every side alike; each run is `zobench run ARGV` (default: SOLO on a one-thread
    target). Returns the results folder and each side's run ids."""
    if argv is None:
        argv = ["--inventory", str(solo_inventory(root)), *SOLO]
    store, ids = Store(root / "results"), {side: [] for side, _ in COMPARE_SIDES}
    for _ in range(rounds):
        for side, extra in COMPARE_SIDES:
            ids[side].append(run(store, [*argv, *extra]))
    return store.root, ids


def load_at(contention: float, wall: float = 1.0, cores: int = 2) -> dict:
    """A job's `load` record whose other work took `contention` of the machine's CPUs."""
    return {"wall_seconds": wall, "cores": cores, "loadavg_1m_start": 2 * contention * cores,
            "loadavg_1m_end": 2 * contention * cores, "cpu_seconds_other": contention * wall * cores,
            "steal_seconds": 0.0}


def made_up_result(step_ms: float, *, repeat: int = 0, method: str = "full-zo", threads: int = 2,
                   hyper: dict | None = None, kernel: str = "6.1.0", peak_mib: float = 20.0,
                   load: dict | None = None, lock: str | None = None, instructions: float | None = None,
                   build: str = "x86-64-v3") -> dict:
    """The result of an ok job of 50 steps at step_ms each, on a made-up two-core machine, as the
    store reads it (schema.upgrade: every record there); with `instructions` per step counted on
    `build`, all of them in its forward phase."""
    job_id = f"solo.cpp.{method}.fp32.r{repeat}"
    spec = JobSpec.from_dict({"job_id": job_id, "method": method, "runtime": "cpp", "threads": threads,
                              "target": "solo", "repeat": repeat, "harness_commit": "0123456789ab",
                              "hyper": {"epochs": 1, "train_samples": 1600, **(hyper or {})}}).to_dict()
    steps, seconds = 50, 50 * step_ms / 1e3
    env = {"hostname": "made-up", "arch": "x86_64", "cpu_model": "Made-up CPU", "cores": 2, "governor": "performance",
           "kernel": kernel, "versions": {"zobench-train": "1"}, "binary_sha256": "ab" * 32,
           "harness_commit": "0123456789ab", **({"lock": lock} if lock else {})}
    r = skeleton(spec, env, "ok")
    r["memory"].update(peak_rss_bytes=int(peak_mib * 2 ** 20))
    return upgrade({**r, "started_at": "2026-01-01T00:00:00+00:00", "wall_seconds": seconds + 0.2, "train_seconds": seconds,
            "steps": steps, "epochs": [{"epoch": 1, "seconds": seconds, "train_loss": 2.0, "test_loss": 2.0,
                                        "test_accuracy": 0.3, "joules": None}],
            "model": {"name": "lenet5", "params_total": 107786, "params_zo": 107786, "params_bp": 0,
                      "weights_sha256": "0" * 64},
            "energy": {**r["energy"], "unavailable": "a made-up result: no meter"},
            "cpu_seconds": seconds + 0.1, "load": load,
            "instructions": instructions and {"tool": "callgrind", "build": build, "threads": 1, "steps": 5,
                                              "per_step": instructions, "phases": {"forward": instructions},
                                              "step_totals": [instructions] * 5, "why": None}})


def thermal_sample(throttled: int | None, temp_c: float = 50.0, khz: int = 1_000_000, cap: int = 1_000_000) -> dict:
    """One sample in workloads/thermal.read()'s shape, of a made-up four-core board."""
    return {"t": 0.0, "zones": {"cpu-thermal": temp_c}, "clocks": [[khz, cap, 1_000_000]] * 4, "throttled": throttled}


def made_up_run(store: Store, results: list[dict], created_at: str = "2026-01-01T00:00:00+00:00",
                git: dict | None = None) -> str:
    """A run of the store holding exactly these results (of the commit and branch in `git`, as
    plan.git_facts gives them); its id."""
    run_id = store.new_run({"created_at": created_at, "suite": "made-up", **({"git": git} if git else {}),
                            "jobs": [{"job_id": r["job"]["job_id"], "target": r["job"]["target"], "timeout_s": 60,
                                      "spec": r["job"]} for r in results]})
    for r in results:
        store.add_result(run_id, r)
    return run_id
