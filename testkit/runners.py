"""The runners and the C++ binary as processes, and the specs they take: what the tests and
the benchmarks run training with."""
from __future__ import annotations

import contextlib
import io
import json
import os
import subprocess
import sys
import tempfile
import time
from collections.abc import Sequence
from pathlib import Path

import numpy as np

from harness.execution.job import omp_env
from harness.preparation.artifacts import raw_idx
from workloads import datasets, vocab, wait_policy
from workloads.models import LENET5, Model

from . import warm
from .binaries import qemu

REPO = Path(__file__).resolve().parent.parent


def script(file: str):
    """scripts/<file> as a module: the scripts are no package, and a test calls their functions."""
    import importlib.util
    spec = importlib.util.spec_from_file_location(Path(file).stem.replace("-", "_"), REPO / "scripts" / file)
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


def zobench(*args, env=None, timeout=600) -> subprocess.CompletedProcess:
    """The CLI as a user runs it: a separate process, output captured."""
    return python("-m", "zobench", *args, env=env, timeout=timeout)


def python(*args, cwd: Path = REPO, env=None, timeout=600) -> subprocess.CompletedProcess:
    """`python -m MODULE ...` or `python SCRIPT ...` as a user runs it: a process of its own,
    output captured; forked from a server that has imported the libraries it uses
    (testkit/warm.py "cli") where one is free for its environment, else a fresh interpreter."""
    argv = [sys.executable, *map(str, args)]
    env = {**os.environ, **(env or {})}
    module, path, rest = (argv[2], None, argv[3:]) if argv[1] == "-m" else ("", Path(argv[1]), argv[2:])
    with tempfile.TemporaryDirectory(prefix="zobench-cli-") as tmp:
        out, err = Path(tmp) / "stdout", Path(tmp) / "stderr"
        rc = warm.run(module, rest, cwd, env, out, err, timeout=timeout, kind="cli", path=path)
        if rc is not None:
            return subprocess.CompletedProcess(argv, rc, out.read_text(), err.read_text())
    return subprocess.run(argv, cwd=cwd, capture_output=True, text=True, timeout=timeout, env=env)


def in_process(*args) -> subprocess.CompletedProcess:
    """The CLI's main() in this process, its output captured as zobench() captures it: for the
    many refusals, quick reads and gates, which need no interpreter of their own (a process
    spends about a second of CPU importing zobench and scipy before it reads an argument)."""
    from zobench.cli import main

    out, err = io.StringIO(), io.StringIO()
    with contextlib.redirect_stdout(out), contextlib.redirect_stderr(err):
        try:
            rc = main([str(a) for a in args])
        except SystemExit as e:     # how argparse ends a bad command line, in the real CLI too
            rc = e.code
    return subprocess.CompletedProcess(args, rc, out.getvalue(), err.getvalue())


def cli(capsys, *args) -> subprocess.CompletedProcess:
    """in_process, after what the test printed so far is taken out of pytest's capture."""
    capsys.readouterr()
    return in_process(*args)


def start(*args, env=None, stdout=subprocess.PIPE, stderr=subprocess.PIPE) -> subprocess.Popen:
    """The CLI as a user runs it, as a process a test can signal (its output piped, or where the
    test says: a file another process reads as it is written)."""
    return subprocess.Popen([sys.executable, "-m", "zobench", *map(str, args)], cwd=REPO, text=True,
                            stdout=stdout, stderr=stderr, env={**os.environ, **(env or {})})


# A run of a few seconds: one epoch of 320 samples in FP32, on the runtimes a test names.
SHORT = ["--precision", "fp32", "--set", "epochs=1", "--set", "train_samples=320", "--set", "test_samples=64"]
TINY = ["--runtime", "torch", *SHORT]
# The same on the C++ binary, for tests of the harness's plumbing that every runtime goes
# through: no interpreter to start and no torch to import, about 2 s of CPU a job less.
TINY_CPP = ["--runtime", "cpp", *SHORT]
# The same on ONNX Runtime, for plumbing tests that need a Python runner (a target's `python`
# that holds or watches it, held_python): numpy and onnxruntime load in a quarter of torch's
# CPU (0.5 against 1.75 s a job, 2-core AMD EPYC).
TINY_ORT = ["--runtime", "ort", *SHORT]


@contextlib.contextmanager
def busy_loops(n: int):
    """n processes that keep a core each busy for the block: a loaded CI runner (the benchmarks
    of the gate and of OpenMP's wait policies measure beside them)."""
    hogs = [subprocess.Popen(["sh", "-c", "while :; do :; done"]) for _ in range(n)]
    try:
        yield
    finally:
        for h in hogs:
            h.kill()
            h.wait()


def processes_mentioning(text: str) -> list[str]:
    """The pids whose command line contains text: how a test sees that no runner was left behind."""
    hits = []
    for cmdline in Path("/proc").glob("[0-9]*/cmdline"):
        try:
            if text in cmdline.read_bytes().replace(b"\0", b" ").decode(errors="replace"):
                hits.append(cmdline.parent.name)
        except OSError:
            pass
    return hits


# the runners a test starts itself wait as a target's "passive" makes them: the test workers load
# the machine on purpose, and a pool that spins beside them (libgomp's own default) can be tenfold
# slower; the harness's "auto" would pick the same on a machine this busy (workloads/wait_policy.py)
RUNNER_ENV = omp_env("passive")
TORCH_RUNNER = (sys.executable, "-m", "workloads.torch_runner")
ORT_RUNNER = (sys.executable, "-m", "workloads.ort_runner")
# what a benchmark clears before it sets a policy's variables
WAIT_VARIABLES = {"OMP_WAIT_POLICY": None, "GOMP_SPINCOUNT": None, "OMP_NUM_THREADS": None}


def policy_env(command, policy: str = vocab.OMP_WAIT_POLICY) -> dict:
    """The variables (over run_runner's) that a target's wait policy starts a runner with, as the
    harness and its launcher set them: for "auto" (the default) and a Python runner, picked from
    the machine's load measured now (workloads/wait_policy.py); the C++ binary's team decides
    for itself. What the benchmarks time a runtime's default with."""
    python = tuple(command) in (TORCH_RUNNER, ORT_RUNNER) if not isinstance(command, (str, Path)) else False
    if policy == "auto" and python:
        return {**WAIT_VARIABLES, **wait_policy.environment(wait_policy.pick(wait_policy.other_share()))}
    return {**WAIT_VARIABLES, **omp_env(policy)}
QEMU_A53 = qemu("cortex-a53")      # put before an aarch64 binary's path


def run_runner(spec: dict, tmp: Path, command: str | Path | Sequence[str | Path] = TORCH_RUNNER,
               check: bool = False, env: dict | None = None) -> dict:
    """Write spec to tmp/spec.json, run a runner on it and return its result.json.

    command is what comes before --spec/--out: a Python runner (TORCH_RUNNER, ORT_RUNNER),
    the C++ binary's path, or a wrapper and the binary ([*QEMU_A53, path]).
    check: fail unless the result's status is ok (for callers that only want its numbers).
    env: variables over the harness's (RUNNER_ENV), as a target's settings give them (None: unset)."""
    tmp.mkdir(parents=True, exist_ok=True)
    (tmp / "spec.json").write_text(json.dumps(spec))
    out = tmp / "result.json"
    out.unlink(missing_ok=True)
    argv = [command] if isinstance(command, (str, Path)) else [*command]
    args = ["--spec", str(tmp / "spec.json"), "--out", str(out)]
    env = {k: v for k, v in {**os.environ, **RUNNER_ENV, **(env or {})}.items() if v is not None}
    python = tuple(argv) in (TORCH_RUNNER, ORT_RUNNER)
    rc = warm.run(argv[2], args, REPO, env, tmp / "runner.out", tmp / "runner.err", timeout=600) if python else None
    if rc is not None:
        stderr = (tmp / "runner.err").read_text(errors="replace")
    else:
        p = subprocess.run([*argv, *args], cwd=REPO, env=env, capture_output=True, text=True, errors="replace",
                           timeout=600)
        rc, stderr = p.returncode, p.stderr
    if not out.is_file():
        raise RuntimeError(f"{' '.join(map(str, argv))} wrote no result (exit {rc}): {stderr[-2000:]}")
    result = json.loads(out.read_text())
    if check:
        assert result["status"] == "ok", result["error"]
    return result


def job_spec(method: str, k: int, *, seed: int, steps: int, batch: int = 32, test_samples: int = 256,
             threads: int = 2, data_dir: str | None = None, hyper: dict | None = None, model: Model = LENET5,
             dataset: str = "fashion-mnist", **fields) -> dict:
    """A runner's spec: one epoch of `steps` batches from `seed`, each step traced, then a test
    pass; the data set from data_dir when given (the C++ binary needs one), else the runner's
    own. The model's description goes in the spec, as the plan puts it. hyper adds to or
    overrides those hyperparameters; fields are the spec's other keys."""
    spec = {"job_id": "test", "method": method, "bp_layers": k, "seed": seed, "threads": threads,
            "hyper": {"epochs": 1, "batch_size": batch, "train_samples": batch * steps,
                      "test_samples": test_samples, "trace_steps": steps, **(hyper or {})}, **fields}
    spec["workload"] = {"model": model.name, "dataset": dataset, "architecture": model.to_dict(),
                        **({"data_dir": data_dir} if data_dir is not None else {})}
    return spec


def small_mnist(tmp: Path, monkeypatch, train: int, test: int, seed: int, mark=lambda prefix, images: None) -> Path:
    """A small MNIST of random pixels and labels in $ZOBENCH_DATA/mnist under tmp, and a cache of
    its own (artifacts.root follows HOME); mark(prefix, images) may draw on a split's images
    before they are written. Its folder."""
    monkeypatch.setenv("HOME", str(tmp / "home"))
    monkeypatch.setenv("ZOBENCH_DATA", str(tmp / "data"))
    folder = tmp / "data" / "mnist"
    folder.mkdir(parents=True)
    rng = np.random.default_rng(seed)
    for prefix, n in (("train", train), ("t10k", test)):
        images = rng.integers(0, 256, (n, 28, 28), dtype=np.uint8)
        mark(prefix, images)
        datasets.write_idx(folder / f"{prefix}-images-idx3-ubyte", images, 0x08)
        datasets.write_idx(folder / f"{prefix}-labels-idx1-ubyte", rng.integers(0, 10, n, dtype=np.uint8), 0x08)
    return folder


# an index where nothing listens (the discard port): a fetch from it fails at once
NO_INDEX = "http://127.0.0.1:9/simple"


def no_mnist(home: Path) -> dict:
    """Variables under which no MNIST is found or fetched: a HOME whose cache holds none, pip's
    configuration files out of reach, and an index that does not answer (harness/wheel_data.py)."""
    return {"HOME": str(home), "PIP_CONFIG_FILE": "/dev/null", "PIP_INDEX_URL": NO_INDEX}


def idx_data_dir() -> str:
    """The folder of Fashion-MNIST as raw IDX files, the C++ binary's data_dir."""
    return str(raw_idx("fashion-mnist", "").dir)


def held_python(tmp: Path) -> tuple[Path, Path, Path]:
    """A `python` for a target whose runners (torch's and ONNX Runtime's) log "start"/"end" with
    the time to LOG and wait for GO before they run; the launcher and everything else run at
    once. (wrapper, LOG, GO)"""
    log, go, wrapper = tmp / "runners.log", tmp / "go", tmp / "python"
    wrapper.write_text(f"""#!/bin/sh
case "$1 $2" in
  "-m workloads.torch_runner"|"-m workloads.ort_runner")
    echo "start $(date +%s.%N) $*" >> {log}
    i=0; while [ ! -e {go} ] && [ $i -lt 6000 ]; do sleep 0.05; i=$((i + 1)); done   # 5 minutes at most
    {sys.executable} "$@"; rc=$?
    echo "end $(date +%s.%N) $*" >> {log}
    exit $rc;;
  *) exec {sys.executable} "$@";;
esac
""")
    wrapper.chmod(0o755)
    return wrapper, log, go


def hooked_python(path: Path, before_launch: str) -> Path:
    """A board's `python` that runs the shell lines before_launch ahead of each job's launcher, and
    is the real interpreter for everything else (the probe, deploy's checks): a board whose jobs
    a test holds until it has seen what it waits for, with no sleep in the test."""
    path.write_text(f"#!/bin/sh\nif [ \"$1 $2\" = \"-m workloads.launch\" ]; then\n{before_launch}\nfi\n"
                    f"exec {sys.executable} \"$@\"\n")
    path.chmod(0o755)
    return path


def until(what: str, check, proc: subprocess.Popen | None = None, log: Path | None = None, timeout: float = 300):
    """check()'s first true value, polled until `timeout` (a process that ends first fails the test)."""
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        got = check()
        if got:
            return got
        assert proc is None or proc.poll() is None, f"it ended before {what}: {log.read_text() if log else ''}"
        time.sleep(0.05)
    raise AssertionError(f"never: {what}")


def checked(workload, hyper: dict, suite_path: str = "suite.toml") -> None:
    """A workload and its hyperparameters through what `zobench run` checks before any job
    starts: the plan's checks and, for a point or text set, preparation's, which makes the set
    first (harness/planning/plan.py check_data, check_made). A UserError names what is wrong."""
    import dataclasses
    from types import SimpleNamespace

    from harness.planning import plan, runs
    from harness.planning.inventory import Target
    from harness.preparation.bundle import prepare
    from workloads.spec import Hyper, JobSpec

    plan.check_data(SimpleNamespace(path=suite_path), workload, Hyper(**hyper), {})
    model = workload.resolve()
    if datasets.is_text(workload.dataset):
        model = model.with_classes(datasets.topics(workload.dataset))
    w = {**dataclasses.asdict(workload), "architecture": model.to_dict()}
    spec = JobSpec.from_dict({"job_id": "j", "method": "full-zo", "workload": w, "hyper": hyper}).to_dict()
    prepare([runs.Job("j", "local", 60.0, spec)], {"local": Target(name="local", transport="local")})
