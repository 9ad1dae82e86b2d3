"""Fixtures: the IDX data folder, the native and aarch64 binaries, one real quick run of the
four methods reused by the tests that read results, and the sshd farm. The helpers they use
live in testkit/, which the benchmarks share."""
from __future__ import annotations

import os
from pathlib import Path

import pytest
from hypothesis import settings

from zobench.cli import main
from harness.stores.store import Store
from testkit.binaries import aarch64_binary, native_binary
from testkit.runners import idx_data_dir
from testkit.tools import require


# The files that take longest in make test (each test's start and end on its worker, summed per file, after
# make test's set-up; 2026-12-06 on a quiet 2-core AMD EPYC VM, 1,105 worker-seconds in all, 6:34 of pytest),
# longest first: every file of 8 s or more. make test hands out whole files in this order (--dist loadfile
# --no-loadscope-reorder): a long file started last would run alone at the end (test_lock.py's 28 s, when it
# was not listed). The others run after these, as they are collected.
LONGEST_FIRST = ("test_ssh.py", "test_shared_store.py", "test_labgrid.py", "test_pool.py", "test_finetune.py",
                 "test_report_transformers.py", "test_faults.py", "test_report.py", "test_lease.py",
                 "test_memory_model.py", "test_compare.py", "test_int8.py", "test_zo_optimizers.py",
                 "test_tune_shared.py", "test_gpu_scale.py", "test_lock.py", "test_cpp.py", "test_signals.py",
                 "test_validity.py", "test_wheel_data.py", "test_reproduction.py", "test_ort_transformer.py",
                 "test_dashboard.py", "test_fit.py", "test_equal_memory.py", "test_half.py", "test_training.py",
                 "test_ort.py", "test_runner.py", "test_tune.py", "test_deploy.py", "test_guards.py", "test_caches.py",
                 "test_ssh_nosftp.py", "test_zrng.py", "test_models.py", "test_kernel_paths.py")


# Hypothesis's examples are drawn the same way every run (derandomize): a fuzz test in make test
# never fails one CI run in ten on an example it happened to draw. Exploring with fresh draws:
# HYPOTHESIS_PROFILE=explore pytest tests/test_guards.py (and raise max_examples there).
settings.register_profile("ci", derandomize=True, deadline=None)
settings.register_profile("explore", deadline=None)
settings.load_profile(os.environ.get("HYPOTHESIS_PROFILE", "ci"))


def pytest_collection_modifyitems(items):
    rank = {name: i for i, name in enumerate(LONGEST_FIRST)}
    items.sort(key=lambda item: rank.get(item.path.name, len(rank)))


OWN_LEASE = None
if os.environ.get("PYTEST_XDIST_WORKER"):
    # make test runs a worker per core and one more: a runner's OpenMP (torch, the C++ binary)
    # spinning on two threads beside the other workers' slowed some tests tenfold. One thread
    # each; a test that sets its own thread count (spec.threads) still gets it, and the runners
    # a test starts itself sleep at their barriers as the harness's do (testkit/runners.py
    # RUNNER_ENV).
    os.environ.setdefault("OMP_NUM_THREADS", "1")
    # Two workers on one machine are the point here: each leases this machine on its own
    # (harness/boards/lease.py), or every local job of one would wait for the other's. The
    # session's id is in the name too: two make tests at once on one runner (two clones, a CI
    # job beside a developer's) would share gw0's lease, and a job of one would wait out the other's.
    if "ZOBENCH_LOCAL_LEASE" not in os.environ:
        OWN_LEASE = Path(f"/tmp/zobench-test-{os.getuid()}/lease-{os.environ['PYTEST_XDIST_TESTRUNUID'][:12]}"
                         f"-{os.environ['PYTEST_XDIST_WORKER']}")
        os.environ["ZOBENCH_LOCAL_LEASE"] = str(OWN_LEASE)


def pytest_unconfigure(config):
    if OWN_LEASE:
        OWN_LEASE.unlink(missing_ok=True)


@pytest.fixture(scope="session")
def data_dir():
    return idx_data_dir()


@pytest.fixture(scope="session")
def native():
    require("cmake", "g++", "nlohmann/json.hpp")
    return native_binary()


@pytest.fixture(scope="session")
def aarch64():
    require("cmake", "aarch64-linux-gnu-g++", "nlohmann/json.hpp", "qemu-aarch64")
    return aarch64_binary()


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
def server():
    """A real PostgreSQL server (testkit/postgres.py), one for the session: each test takes a
    database of its own (server.new_database())."""
    require("initdb")
    from testkit.postgres import Postgres

    pg = Postgres()
    yield pg
    pg.stop()


@pytest.fixture(scope="session")
def farm(tmp_path_factory):
    """Five real sshd 'boards' on loopback, a client key, and an isolated HOME whose
    ~/.ssh/known_hosts knows their host keys but board-d's (env: that HOME, for
    zobench(..., env=)). board-d is for the host-key tests; board-e's sshd has no SFTP
    subsystem, as on a small embedded image (tests/test_ssh_nosftp.py)."""
    require("sshd", "ssh", "ssh-keygen")
    from testkit.sshd import client_home, make_farm

    root = tmp_path_factory.mktemp("farm")
    boards, key = make_farm(root / "sshd", ["board-a", "board-b", "board-c", "board-d", "board-e"],
                            no_sftp=("board-e",))
    home = client_home(root / "home", [b for b in boards if b.name != "board-d"])
    # its zobench cache is the session's, one for all the workers, as two runs of one user share theirs:
    # what a run prepares (a data set turned, a subset, the token files, an ONNX export) is made once, not
    # once a worker (Fashion-MNIST turned by 30 degrees: 2 s of CPU each time). artifacts.write_once
    # makes each file under a name of its own and renames it into place, so two workers never clash.
    base = tmp_path_factory.getbasetemp()
    shared = (base.parent if os.environ.get("PYTEST_XDIST_WORKER") else base) / "controller-cache"
    shared.mkdir(exist_ok=True)
    (home / ".cache").mkdir()
    (home / ".cache" / "zobench").symlink_to(shared)
    with pytest.MonkeyPatch.context() as mp:
        mp.setenv("HOME", str(home))
        yield {"boards": {b.name: b for b in boards}, "key": key, "home": home, "root": root,
               "env": {"HOME": str(home)}}
    for b in boards:
        b.stop()

