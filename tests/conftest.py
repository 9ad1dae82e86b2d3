"""Shared fixtures and helpers: the CLI and the runners as processes, job specs, the C++
binaries and their data, interleaved runs for compare, the sshd farm, and one real quick run
of the four methods reused by the tests that read results. The benchmarks import the helpers
too (benchmarks/*.py put tests/ on sys.path)."""
from __future__ import annotations

import contextlib
import io
import json
import os
import subprocess
import sys
from collections.abc import Sequence
from pathlib import Path

import pytest

from harness.build import build
from harness.cli import main
from harness.deploy import raw_idx, raw_idx_root
from harness.inventory import Target
from harness.store import Store

REPO = Path(__file__).resolve().parent.parent
FMNIST = Path("/usr/share/datasets/fashion-mnist")


def zobench(*args, env=None, timeout=600) -> subprocess.CompletedProcess:
    """The CLI as a user runs it: a separate process, output captured."""
    return subprocess.run([sys.executable, "-m", "harness.cli", *map(str, args)], cwd=REPO,
                          capture_output=True, text=True, timeout=timeout,
                          env={**os.environ, **(env or {})})


TORCH_RUNNER = (sys.executable, "-m", "workloads.torch_runner")
ORT_RUNNER = (sys.executable, "-m", "workloads.ort_runner")
QEMU_A53 = ("qemu-aarch64", "-cpu", "cortex-a53")      # put before an aarch64 binary's path


def run_runner(spec: dict, tmp: Path, command: str | Path | Sequence[str | Path] = TORCH_RUNNER,
               check: bool = False) -> dict:
    """Write spec to tmp/spec.json, run a runner on it and return its result.json.

    command is what comes before --spec/--out: a Python runner (TORCH_RUNNER, ORT_RUNNER),
    the C++ binary's path, or a wrapper and the binary ([*QEMU_A53, path]).
    check: fail unless the result's status is ok (for callers that only want its numbers)."""
    tmp.mkdir(parents=True, exist_ok=True)
    (tmp / "spec.json").write_text(json.dumps(spec))
    out = tmp / "result.json"
    out.unlink(missing_ok=True)
    argv = [command] if isinstance(command, (str, Path)) else [*command]
    p = subprocess.run([*argv, "--spec", tmp / "spec.json", "--out", out], cwd=REPO,
                       capture_output=True, text=True, errors="replace", timeout=600)
    if not out.is_file():
        raise RuntimeError(f"{' '.join(map(str, argv))} wrote no result (exit {p.returncode}): {p.stderr[-2000:]}")
    result = json.loads(out.read_text())
    if check:
        assert result["status"] == "ok", result["error"]
    return result


def job_spec(method: str, k: int, *, seed: int, steps: int, batch: int = 32, test_samples: int = 256,
             threads: int = 2, data_dir: str | None = None, hyper: dict | None = None, **fields) -> dict:
    """A runner's spec: one epoch of `steps` batches from `seed`, each step traced, then a test
    pass; Fashion-MNIST from data_dir when given (the C++ binary needs one), else the runner's
    own. hyper adds to or overrides those hyperparameters; fields are the spec's other keys."""
    spec = {"job_id": "test", "method": method, "bp_layers": k, "seed": seed, "threads": threads,
            "hyper": {"epochs": 1, "batch_size": batch, "train_samples": batch * steps,
                      "test_samples": test_samples, "trace_steps": steps, **(hyper or {})}, **fields}
    if data_dir is not None:
        spec["workload"] = {"dataset": "fashion-mnist", "data_dir": data_dir}
    return spec


def idx_data_dir() -> str:
    """The folder of Fashion-MNIST as raw IDX files, the C++ binary's data_dir."""
    raw_idx("fashion-mnist", "")
    return str(raw_idx_root())


def native_binary() -> str:
    """The C++ binary built for this machine."""
    return str(build(Target(name="local", transport="local")))


def aarch64_binary() -> str:
    """The C++ binary cross-built for a Raspberry Pi (static aarch64; runs here under QEMU_A53)."""
    return str(build(Target(name="pi", transport="ssh", host="pi.invalid", arch="aarch64", runtimes=["cpp"])))


@pytest.fixture(scope="session")
def data_dir():
    return idx_data_dir()


@pytest.fixture(scope="session")
def native():
    return native_binary()


@pytest.fixture(scope="session")
def aarch64():
    return aarch64_binary()


# The sides of the compare tests and benchmark: the code as it is, the same code again, and the
# code with a 20% slowdown injected.
COMPARE_SIDES = (("base", []), ("same", []), ("slow", ["--set", "inject_slowdown=0.2"]))


def interleaved_runs(root: Path, rounds: int) -> tuple[Path, dict[str, list[str]]]:
    """`rounds` rounds of one run per side of COMPARE_SIDES, taken in turn so that the machine's
    drift hits every side alike; each run is the ci suite's single-threaded cpp full-zo (five
    repeats) on 3200 samples. Returns the results folder and each side's run ids."""
    inv = root / "inventory.toml"
    inv.write_text('[targets.solo]\nprofile = "local"\nthreads = 1\n')
    store, ids = Store(root / "results"), {side: [] for side, _ in COMPARE_SIDES}
    for _ in range(rounds):
        for side, extra in COMPARE_SIDES:
            log = io.StringIO()
            with contextlib.redirect_stderr(log):
                rc = main(["run", "--results", str(store.root), "--inventory", str(inv), "--no-report",
                           "--suite", "ci", "--runtime", "cpp", "--precision", "fp32", "--method", "full-zo",
                           "--target", "solo", "--set", "train_samples=3200", *extra])
            assert rc == 0, f"a {side} run failed (results in {store.root}): {log.getvalue()[-2000:]}"
            ids[side].append(store.latest())
    return store.root, ids


@pytest.fixture(scope="session")
def quick_run(tmp_path_factory):
    """The quick suite's four methods, shortened: 3 epochs on 2000 Fashion-MNIST samples."""
    root = tmp_path_factory.mktemp("results")
    rc = main(["run", "--results", str(root), "--no-report", "--runtime", "torch", "--precision", "fp32", "--set", "epochs=3",
               "--set", "train_samples=2000", "--set", "test_samples=500"])
    store = Store(root)
    run_id = store.latest()
    results = {r["job"]["job_id"].split(".")[2]: r for r in store.results(run_id)}
    return {"rc": rc, "store": store, "run_id": run_id, "results": results}


@pytest.fixture(scope="session")
def farm(tmp_path_factory):
    """Four real sshd 'boards' on loopback, a client key, and an isolated HOME whose
    ~/.ssh/known_hosts knows their host keys (env: that HOME, for zobench(..., env=)).
    board-d is for the host-key tests."""
    from sshd import client_home, make_farm

    root = tmp_path_factory.mktemp("farm")
    boards, key = make_farm(root / "sshd", ["board-a", "board-b", "board-c", "board-d"])
    home = client_home(root / "home", boards[:3])
    with pytest.MonkeyPatch.context() as mp:
        mp.setenv("HOME", str(home))
        yield {"boards": {b.name: b for b in boards}, "key": key, "home": home, "root": root,
               "env": {"HOME": str(home)}}
    for b in boards:
        b.stop()

