"""Shared fixtures: one real quick run of the four methods, reused by the tests that read results."""
from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest

from harness.cli import main
from harness.store import Store

REPO = Path(__file__).resolve().parent.parent
FMNIST = Path("/usr/share/datasets/fashion-mnist")


def zobench(*args, env=None, timeout=600) -> subprocess.CompletedProcess:
    """The CLI as a user runs it: a separate process, output captured."""
    return subprocess.run([sys.executable, "-m", "harness.cli", *map(str, args)], cwd=REPO,
                          capture_output=True, text=True, timeout=timeout,
                          env={**os.environ, **(env or {})})


def run_runner(spec: dict, tmp: Path, module: str = "workloads.torch_runner") -> dict:
    """Run a runner on spec and return its result.json."""
    tmp.mkdir(parents=True, exist_ok=True)
    (tmp / "spec.json").write_text(json.dumps(spec))
    subprocess.run([sys.executable, "-m", module, "--spec", tmp / "spec.json", "--out", tmp / "result.json"],
                   cwd=REPO, capture_output=True, text=True, timeout=600)
    return json.loads((tmp / "result.json").read_text())


@pytest.fixture(scope="session")
def quick_run(tmp_path_factory):
    """The quick suite's four methods, shortened: 3 epochs on 2000 Fashion-MNIST samples."""
    root = tmp_path_factory.mktemp("results")
    rc = main(["run", "--results", str(root), "--no-report", "--set", "epochs=3",
               "--set", "train_samples=2000", "--set", "test_samples=500"])
    store = Store(root)
    run_id = store.latest()
    results = {r["job"]["job_id"].split(".")[2]: r for r in store.results(run_id)}
    return {"rc": rc, "store": store, "run_id": run_id, "results": results}
