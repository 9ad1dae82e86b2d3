"""The torch runner as a process: its contract (spec in, result out), determinism, data, failures."""
import ast
import gzip
import hashlib
import json
import math
import os
import subprocess
import sys
from pathlib import Path

import numpy as np
import pytest

from harness import envlock
from harness.stores import schema
from workloads import datasets
from workloads.models import LENET5

from testkit import warm
from testkit.runners import REPO, RUNNER_ENV, TORCH_RUNNER, job_spec, run_runner

def spec(method="elastic-zo", bp_layers=1, seed=0, **hyper):
    """Ten batches (320 samples), untraced unless hyper says."""
    return job_spec(method, bp_layers, seed=seed, steps=10, test_samples=100, threads=1,
                    hyper={"trace_steps": 0, **hyper})


def test_lenet5_matches_the_papers_parameter_counts():
    assert LENET5.params_total == 107_786
    assert LENET5.params_total - LENET5.split("elastic-zo", 1) == 850        # 0.8 %
    assert LENET5.params_total - LENET5.split("elastic-zo", 2) == 11_014     # 10.2 %
    assert round(100 * 850 / 107_786, 1) == 0.8 and round(100 * 11_014 / 107_786, 1) == 10.2
    assert LENET5.split("full-zo", 0) == 107_786 and LENET5.split("full-bp", 0) == 0


def test_same_seed_same_trajectory_other_seed_another(tmp_path):
    a = run_runner(spec(trace_steps=10), tmp_path / "a")
    b = run_runner(spec(trace_steps=10), tmp_path / "b")
    c = run_runner(spec(seed=1, trace_steps=10), tmp_path / "c")
    assert a["status"] == b["status"] == c["status"] == "ok"
    assert len(a["trace"]) == 10
    assert a["trace"] == b["trace"]
    assert a["model"]["weights_sha256"] == b["model"]["weights_sha256"]
    assert a["trace"][0]["loss_plus"] != c["trace"][0]["loss_plus"]
    assert a["model"]["weights_sha256"] != c["model"]["weights_sha256"]


def test_result_follows_schema_and_phases_tile_training_time(tmp_path):
    r = run_runner(spec(method="full-zo", bp_layers=0), tmp_path)
    assert schema.problems(r) == []
    assert r["steps"] == 320 // 32
    train = sum(p["seconds"] for name, p in r["phases"].items() if name != "eval")
    assert train == pytest.approx(r["train_seconds"], rel=0.02)
    assert r["phases"]["eval"]["calls"] == 1 and r["phases"]["eval"]["seconds"] > 0
    assert r["memory"]["peak_rss_bytes"] >= r["memory"]["baseline_rss_bytes"] > 0
    assert r["env"]["cores"] >= 1 and r["env"]["versions"]["torch"]
    # the lock the venv was filled from (scripts/setup.py's stamp), beside the versions; none where no set-up made it
    made = envlock.stamp(Path(sys.prefix))
    assert r["env"]["lock"] == (envlock.digest(envlock.path()) if made else None), made
    # the machine's load over the timed loop alone: its window is the loop's, its CPUs this machine's
    loop = r["timed_loop_load"]
    assert loop["wall_seconds"] == pytest.approx(r["train_seconds"], abs=1e-6)
    assert loop["cores"] == os.sysconf("SC_NPROCESSORS_ONLN") and loop["cpu_seconds_other"] >= 0


def test_initial_weights_file_is_the_starting_point(tmp_path):
    w = LENET5.init_weights(42)
    path = tmp_path / "init.bin"
    w.astype("<f4").tofile(path)
    r = run_runner({**spec("full-bp", 0, lr_bp=0.0), "init_weights": str(path)}, tmp_path / "run")
    assert r["status"] == "ok"
    # SGD with a zero rate leaves every bit as it was: the final weights are the file's
    assert r["model"]["weights_sha256"] == hashlib.sha256(path.read_bytes()).hexdigest()
    path.write_bytes(path.read_bytes()[:-4])
    r = run_runner({**spec(), "init_weights": str(path)}, tmp_path / "short")
    assert r["status"] == "failed" and "107785 float32 values, expected 107786" in r["error"]


def test_missing_dataset_fails_with_how_to_get_it(tmp_path, monkeypatch):
    monkeypatch.setenv("ZOBENCH_DATA", str(tmp_path))
    monkeypatch.setenv("HOME", str(tmp_path))     # nor the MNIST the host may have fetched into its cache
    r = run_runner({**spec(), "workload": {"dataset": "mnist"}}, tmp_path / "run")
    assert r["status"] == "failed"
    assert "train-images-idx3-ubyte" in r["error"] and "ZOBENCH_DATA" in r["error"]
    assert schema.problems(r) == []


def test_failed_allocation_is_reported_as_oom(tmp_path):
    r = run_runner(spec(fault="oom"), tmp_path)
    assert r["status"] == "oom" and r["error"].startswith("MemoryError")
    assert r["steps"] == 1          # what was done before the failure is kept


def _idx(array: np.ndarray) -> bytes:
    header = bytes([0, 0, 8, array.ndim]) + b"".join(d.to_bytes(4, "big") for d in array.shape)
    return header + array.astype(np.uint8).tobytes()


def test_idx_reader_raw_and_gzip_and_corrupt(tmp_path):
    a = np.arange(2 * 3 * 4, dtype=np.uint8).reshape(2, 3, 4)
    (tmp_path / "raw").write_bytes(_idx(a))
    (tmp_path / "z.gz").write_bytes(gzip.compress(_idx(a)))
    assert np.array_equal(datasets.read_idx(tmp_path / "raw"), a)
    assert np.array_equal(datasets.read_idx(tmp_path / "z.gz"), a)
    assert np.array_equal(datasets.read_idx(tmp_path / "z.gz", limit=1), a[:1])   # inflated that far only
    (tmp_path / "short").write_bytes(_idx(a)[:-1])
    with pytest.raises(datasets.DatasetError, match="holds 23 bytes"):
        datasets.read_idx(tmp_path / "short")
    # a gzip file short of what its header says, read whole or in part: its trailer's size gives it away
    (tmp_path / "short.gz").write_bytes(gzip.compress(_idx(a)[:-1]))
    for limit in (0, 1, 2):
        with pytest.raises(datasets.DatasetError, match="holds 23 bytes"):
            datasets.read_idx(tmp_path / "short.gz", limit=limit)
    (tmp_path / "bad").write_bytes(b"\x00\x00\x0d\x01" + bytes(8))
    with pytest.raises(datasets.DatasetError, match="not an unsigned-byte IDX"):
        datasets.read_idx(tmp_path / "bad")


def test_fashion_mnist_and_digits_load_and_normalise():
    train = datasets.load("fashion-mnist", "train")
    assert len(train) == 60_000 and len(datasets.load("fashion-mnist", "test")) == 10_000
    x, y = train.batch(np.arange(60_000))
    assert abs(float(x.mean())) < 0.01 and abs(float(x.std()) - 1) < 0.01
    assert set(np.unique(y)) == set(range(10))
    d = datasets.load("digits", "train")
    xd, yd = d.batch(np.arange(len(d)))
    assert xd.shape == (1437, 1, 28, 28) and set(np.unique(yd)) == set(range(10))
    assert len(datasets.load("digits", "test")) == 1797 - 1437
    assert math.isclose(float(xd.std()), 1.0, abs_tol=0.05)


def test_a_runner_forked_from_the_warm_server_runs_as_a_fresh_interpreter_does(tmp_path):
    """testkit/warm.py forks the tests' runners from a process that imported torch once: the
    same steps, weights and facts as `python -m workloads.torch_runner` started afresh. A call
    that sets a variable read at import gets no fork the first time (nor a server's imports);
    one that sets only what torch reads later, and puts in os.environ itself, does."""
    spec = job_spec("elastic-zo", 1, seed=3, steps=5, test_samples=32)
    (tmp_path / "warm").mkdir()
    (tmp_path / "warm" / "spec.json").write_text(json.dumps(spec))
    env = {**os.environ, **RUNNER_ENV}
    args = ["--spec", str(tmp_path / "warm" / "spec.json"), "--out", str(tmp_path / "warm" / "r.json")]

    def forked(env, run_args=args):
        return warm.run("workloads.torch_runner", run_args, REPO, env, tmp_path / "o", tmp_path / "e", timeout=120)

    # another server's environment, or none: this one is kept from its second call on
    assert forked(env, []) in (None, 2) and forked(env) == 0
    (tmp_path / "fresh").mkdir()
    (tmp_path / "fresh" / "spec.json").write_text(json.dumps(spec))
    subprocess.run([*TORCH_RUNNER, "--spec", tmp_path / "fresh" / "spec.json", "--out", tmp_path / "fresh" / "r.json"],
                   cwd=REPO, env=env, check=True, capture_output=True)
    warm_result, fresh = (json.loads((tmp_path / d / "r.json").read_text()) for d in ("warm", "fresh"))
    assert warm_result["status"] == fresh["status"] == "ok"
    assert warm_result["trace"] == fresh["trace"] and warm_result["model"] == fresh["model"]
    assert warm_result["env"]["versions"] == fresh["env"]["versions"]
    assert forked({**env, "MKL_NUM_THREADS": "3"}) is None
    # inductor's cache folder, which torch puts in os.environ when it first compiles, is read
    # then, not at import: a test process that compiled still forks (argparse's exit 2: no --spec)
    assert forked({**env, "TORCHINDUCTOR_CACHE_DIR": str(tmp_path / "inductor")}, []) == 2


# what a module that reads the process it runs in calls or reads: its environment, user, folders,
# clock, pid, randomness, arguments and streams
PROCESS_READS = {"environ", "getenv", "expanduser", "home", "getuser", "getcwd", "cwd", "gethostname", "getpid",
                 "cpu_count", "time", "monotonic", "perf_counter", "now", "token_hex", "urandom", "random", "uuid4",
                 "default_rng", "argv", "stdin", "stdout", "stderr", "isatty", "signal", "register", "Thread"}


def read_as_it_loads(source: str) -> list[str]:
    """What a module reads of its process while it is imported: its statements outside function
    bodies (class bodies, decorators and default values run at import too); a function or the
    os.environ mapping itself only referred to is not a read, nor an `if __name__` block."""
    found, stack = [], list(ast.parse(source).body)
    while stack:
        node = stack.pop()
        if isinstance(node, (ast.FunctionDef, ast.AsyncFunctionDef, ast.Lambda)):
            stack += [*getattr(node, "decorator_list", ()), *node.args.defaults, *filter(None, node.args.kw_defaults)]
            continue
        if isinstance(node, ast.If) and "__name__" in ast.unparse(node.test):
            continue
        if isinstance(node, ast.Call):
            if set(ast.unparse(node.func).split(".")) & PROCESS_READS:
                found.append(ast.unparse(node))
        elif isinstance(node, ast.Subscript) and ast.unparse(node.value).endswith("environ"):
            found.append(ast.unparse(node))
        stack += ast.iter_child_nodes(node)
    return found


def test_the_cli_server_forks_what_a_fresh_interpreter_would_load_the_same():
    """testkit/warm.py's "cli" server imports zobench's own modules before it forks: sound only while
    none of them reads its process as it loads (the caller's HOME, variables and pid are the fork's
    only once it runs), which every module of the four packages is checked for here."""
    assert read_as_it_loads("import os\nX = os.environ.get('A')\nclass C:\n    d = os.environ['B']\n"
                            "def f(e=os.environ, t=time.time()):\n    return os.getpid()\n") == \
        ["time.time()", "os.environ['B']", "os.environ.get('A')"]
    assert "zobench.cli" in warm.KINDS["cli"][0]
    found = {f"{p.relative_to(REPO)}: {r}" for pkg in ("harness", "zobench", "workloads", "reports")
             for p in sorted((REPO / pkg).rglob("*.py")) for r in read_as_it_loads(p.read_text())}
    assert found == set()
