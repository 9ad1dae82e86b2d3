"""How the runtimes' threads wait (docs/threads.md): the C++ binary's own team, and the pick the
launcher makes for the Python runners' pools. What is asserted here never depends on how fast
anything ran: the team splits the work without changing a result, says how it waited, and sleeps
where other work wants its cores."""
import os
import subprocess

import pytest

from harness.preparation.artifacts import raw_idx
from harness.stores.measurements import adaptive_team
from testkit.runners import ORT_RUNNER, RUNNER_ENV, busy_loops, job_spec, run_runner
from workloads import wait_policy
from workloads.models import POINTNET

NOTHING_SET = {"OMP_WAIT_POLICY": None, "GOMP_SPINCOUNT": None, "OMP_NUM_THREADS": None}


def cpp_run(native, data_dir, tmp, threads, precision="fp32", wait=None, steps=30, wrap=()):
    spec = job_spec("elastic-zo", 1, seed=5, steps=steps, threads=threads, data_dir=data_dir, precision=precision,
                    **({"zo_loss": "integer"} if precision == "int8" else {}))
    env = {**NOTHING_SET, **({"OMP_WAIT_POLICY": wait} if wait else {})}
    return run_runner(spec, tmp, [*wrap, native], check=True, env=env)


@pytest.mark.parametrize("precision", ["fp32", "int8"])
def test_the_team_never_changes_what_is_trained(native, data_dir, tmp_path, precision):
    """LeNet-5's loops give each output to one thread whatever the team, and INT8's partial sums
    are exact: one, two or three threads, sleeping, spinning or choosing, train the same weights
    bit for bit, and each result says how its team was made and waited."""
    runs = {(threads, wait): cpp_run(native, data_dir, tmp_path / f"{threads}-{wait}", threads, precision, wait)
            for threads, wait in ((1, None), (2, None), (3, None), (2, "PASSIVE"), (2, "ACTIVE"))}
    assert len({r["model"]["weights_sha256"] for r in runs.values()}) == 1
    assert len({tuple(x["loss"] for x in r["trace"]) for r in runs.values()}) == 1
    for (threads, wait), r in runs.items():
        t = r["env"]["threads"]
        assert t["team"] == threads and t["wait"] == (wait or "auto").lower()
    assert [adaptive_team(r["env"]) for r in runs.values()] == [True, True, True, False, False]
    passive, active = runs[2, "PASSIVE"]["env"]["threads"], runs[2, "ACTIVE"]["env"]["threads"]
    assert passive["spin_us"] == 0 and passive["spinning_share"] == 0.0 and passive["working"] == 2
    assert active["spin_us"] is None and active["spinning_share"] == 1.0 and active["working"] == 2


def test_a_team_larger_than_its_cpus_works_on_as_many_threads_as_it_has_cpus(native, data_dir, tmp_path):
    """Three threads confined to one CPU: a second thread at work would always wait for a
    descheduled sibling, so the caller works every slot of every loop alone. The slots are the
    three threads' shares, so what it trains is what three threads train, bit for bit: on
    PointNet too, whose weight gradient sums each thread's share of the rows apart."""
    cpu = ("taskset", "-c", str(min(os.sched_getaffinity(0))))
    crowded = cpp_run(native, data_dir, tmp_path / "crowded", 3, wrap=cpu)
    assert crowded["env"]["threads"]["team"] == 3 and crowded["env"]["threads"]["working"] == 1.0
    three = cpp_run(native, data_dir, tmp_path / "three", 3, wait="PASSIVE")
    assert three["env"]["threads"]["working"] == 3
    assert crowded["model"]["weights_sha256"] == three["model"]["weights_sha256"]
    runs, points = [], str(raw_idx("modelnet40-synthetic", "").dir)
    for name, wrap, wait in (("crowded", cpu, None), ("three", (), "PASSIVE")):
        spec = job_spec("full-bp", 0, seed=2, steps=2, threads=3, batch=8, data_dir=points, model=POINTNET,
                        dataset="modelnet40-synthetic", hyper={"points": 256})
        runs.append(run_runner(spec, tmp_path / f"pn-{name}", [*wrap, native], check=True,
                               env={**NOTHING_SET, **({"OMP_WAIT_POLICY": wait} if wait else {})}))
    assert runs[0]["model"]["weights_sha256"] == runs[1]["model"]["weights_sha256"]


@pytest.mark.skipif(len(os.sched_getaffinity(0)) < 2, reason="needs two CPUs")
def test_the_team_stops_spinning_beside_work_on_its_cores(native, data_dir, tmp_path):
    """A team of two on two CPUs, each with a busy loop pinned beside it: the kernel makes the
    team's threads wait for their CPUs, the team sees it in their schedstat run delay and in the
    tasks runnable beside it, and most of its loops run on the caller alone with the other
    thread asleep (a spinning team would wait whole time slices for a descheduled sibling). On
    a machine loaded by other work too this only holds more."""
    cpus = sorted(os.sched_getaffinity(0))[:2]
    pin = ("taskset", "-c", ",".join(map(str, cpus)))
    hogs = [subprocess.Popen(["taskset", "-c", str(c), "sh", "-c", "while :; do :; done"]) for c in cpus]
    try:
        r = cpp_run(native, data_dir, tmp_path, 2, steps=150, wrap=pin)
    finally:
        for h in hogs:
            h.kill()
            h.wait()
    t = r["env"]["threads"]
    assert t["wait"] == "auto" and t["spin_us"] > 0
    assert t["spinning_share"] < 0.5 and t["working"] < 1.5


def test_the_pick_follows_the_load_it_was_given():
    assert wait_policy.pick(0.0) == "spin" and wait_policy.pick(wait_policy.LOADED / 2) == "spin"
    assert wait_policy.pick(wait_policy.LOADED) == "passive" and wait_policy.pick(1.0) == "passive"
    assert wait_policy.pick(None) == "passive"      # unknown: the side that cannot collapse
    assert wait_policy.environment("spin") == {"GOMP_SPINCOUNT": wait_policy.SPIN}
    assert wait_policy.environment("passive") == {"OMP_WAIT_POLICY": "PASSIVE"}
    assert wait_policy.libgomp_wait({"OMP_WAIT_POLICY": "passive"}) == "passive"
    assert wait_policy.libgomp_wait({"GOMP_SPINCOUNT": "10000"}) == "spin 10000"
    assert wait_policy.libgomp_wait({}) == "default"
    assert not wait_policy.spinning({"OMP_WAIT_POLICY": "Passive"}) and wait_policy.spinning({})


def test_other_work_on_every_core_is_measured_as_load():
    """Busy loops on every core take the machine's CPU from under the launcher's sample: the share
    it measures is past the line that makes the pick passive (its own CPU is not counted)."""
    with busy_loops(os.cpu_count() or 1):
        share = wait_policy.other_share(0.3)
    assert share is not None and share >= wait_policy.LOADED
    assert wait_policy.pick(share) == "passive"


@pytest.mark.parametrize("env, wait", [(RUNNER_ENV, "passive"), (NOTHING_SET, "spin")])
def test_onnx_runtime_spins_unless_told_to_sleep(data_dir, tmp_path, env, wait):
    """ONNX Runtime reads no OpenMP variable: its runner maps OMP_WAIT_POLICY onto the session's
    spinning, so a target's policy (and auto's pick) reaches its pool too."""
    from harness.preparation.artifacts import onnx_graph
    from workloads.models import LENET5
    spec = job_spec("full-zo", 0, seed=1, steps=3, threads=2, data_dir=data_dir,
                    onnx_model=str(onnx_graph(LENET5, "full-zo", 0)))
    r = run_runner(spec, tmp_path, ORT_RUNNER, check=True, env=env)
    assert r["env"]["threads"] == {"team": 2, "wait": wait}
