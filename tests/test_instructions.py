"""Instructions per step (issue 60): counted after the timed job under Valgrind's callgrind, by real
runs of the C++ binary, deterministic to the instruction; and a slowdown made of real work
(inject_work) that the count sees. The gate's judging of them is tests/test_compare.py's."""
from __future__ import annotations

import json
import os
import platform
from pathlib import Path
from types import SimpleNamespace

import pytest

from harness.boards.transport import LocalTransport
from harness.execution import instructions
from harness.planning import counting, cpu
from harness.preparation.bundle import Site
from harness.stores import measurements, schema
from harness.stores.store import Store
from testkit.compare_runs import made_up_result, run
from testkit.runners import REPO, job_spec, run_runner, zobench
from testkit.tools import require

# the smallest job whose step is the real one: LeNet-5 Full ZO at batch 8, one thread
TINY = ["--suite", "quick", "--runtime", "cpp", "--method", "full-zo", "--precision", "fp32", "--target", "solo",
        "--set", "epochs=1", "--set", "batch_size=8", "--set", "train_samples=64", "--set", "test_samples=16",
        "--instructions"]


@pytest.fixture(scope="module")
def counted(tmp_path_factory, native):
    """Three runs of one tiny job with --instructions: A, the same again, and with inject_work=0.2."""
    require("valgrind")
    root = tmp_path_factory.mktemp("instructions")
    inv = root / "inventory.toml"
    inv.write_text('[targets.solo]\nprofile = "local"\nthreads = 1\n')
    store = Store(root / "results")
    argv = ["--inventory", str(inv), *TINY]
    ids = {side: run(store, [*argv, *extra]) for side, extra in
           (("a", []), ("again", []), ("work", ["--set", "inject_work=0.2"]))}
    results = {side: store.results(run_id)[0] for side, run_id in ids.items()}
    return {"root": root / "results", "ids": ids, "results": results}


def test_the_count_is_the_same_to_the_instruction_run_to_run_and_its_phases_sum_to_the_step(counted):
    a, again = (counted["results"][s]["instructions"] for s in ("a", "again"))
    assert a["why"] is None and a["per_step"] > 1e6
    assert a == again, "the same binary and input must count the same, phase by phase and step by step"
    assert a["steps"] == len(a["step_totals"]) == counting.COUNT_STEPS
    assert sum(a["phases"].values()) == pytest.approx(a["per_step"], rel=1e-12)
    assert set(a["phases"]) <= set(counting.PHASES) and {"forward", "zo_perturb", "zo_update"} <= set(a["phases"])
    here = counted["results"]["a"]["env"]["build_cpu"]
    assert a["build"] == (counting.COUNT_BUILD if platform.machine() == "x86_64" else here)
    assert a["threads"] == 1 and a["tool"] == "callgrind"


def test_inject_work_adds_its_fraction_of_the_steps_instructions_and_stays_out_of_the_key(counted):
    a, work = counted["results"]["a"], counted["results"]["work"]
    grown = work["instructions"]["per_step"] / a["instructions"]["per_step"] - 1
    assert 0.15 <= grown <= 0.25, f"inject_work=0.2 added {100 * grown:.1f}% instructions"
    assert measurements.job_key(a["job"])[0] == measurements.job_key(work["job"])[0]
    assert measurements.test_only(work["job"]["hyper"]) == ["inject_work"]
    # real work on a restored state: the training is the one without it, to the bit
    assert work["model"]["weights_sha256"] == a["model"]["weights_sha256"]


def test_the_gate_judges_the_counts_of_one_repeat_a_side(counted):
    ids = counted["ids"]
    p = zobench("compare", "--results", counted["root"], ids["a"], ids["work"], "--format", "json")
    v = json.loads(p.stdout)["verdicts"][0]
    assert p.returncode == 1 and v["status"] == "regressed" and v["instructions"]["status"] == "regressed", p.stderr
    p = zobench("compare", "--results", counted["root"], ids["a"], ids["again"], "--format", "json")
    v = json.loads(p.stdout)["verdicts"][0]
    assert v["instructions"]["status"] == "unchanged" and v["instructions"]["change"] == 0.0
    assert p.returncode == 3 and v["status"] == "too few repeats", "one timed repeat a side judges no time"


def test_the_report_shows_instructions_per_step_and_their_phases(counted, tmp_path):
    p = zobench("report", "--results", counted["root"], "--run", counted["ids"]["a"], "--out", tmp_path / "r")
    assert p.returncode == 0, p.stderr
    md = (tmp_path / "r" / "report.md").read_text()
    assert "M instr/step" in md and "instructions by phase" in md and "forward" in md


def site_here(tmp_path: Path, count_binary: str = "/nonexistent") -> Site:
    return Site(LocalTransport(), str(REPO), str(tmp_path / "jobs"), str(tmp_path), count_binary=count_binary,
                count_build=counting.COUNT_BUILD)


def test_a_target_without_valgrind_or_a_job_not_of_the_binary_records_why_not(tmp_path, monkeypatch):
    job = SimpleNamespace(job_id="j", spec={"runtime": "cpp"})
    target = SimpleNamespace(name="bare")
    shell_only = tmp_path / "bin"      # a PATH that has a shell and no valgrind, as a bare board's
    shell_only.mkdir()
    os.symlink("/bin/sh", shell_only / "sh")
    with monkeypatch.context() as m:
        m.setenv("PATH", str(shell_only))
        rec = instructions.count(job, target, site_here(tmp_path))
    assert rec["per_step"] is None and rec["why"].startswith("no valgrind on bare")
    rec = instructions.count(SimpleNamespace(job_id="j", spec={"runtime": "torch"}), target, site_here(tmp_path))
    assert rec["why"].startswith("runtime torch: only the C++ binary's")
    rec = instructions.count(job, target, Site(LocalTransport(), str(REPO), str(tmp_path), str(tmp_path),
                                               count_build=counting.COUNT_BUILD, count_error="the build failed"))
    assert rec["why"] == "the build failed"
    # the reason reaches the gate's note
    r = made_up_result(10.0)
    r["instructions"] = counting.not_counted("no valgrind on bare (install it there: Debian's valgrind package)")
    assert not schema.problems(r)
    m = measurements.from_results([("x", r)])
    assert next(iter(m.values())).uncounted.startswith("no valgrind on bare")


def test_a_result_without_instructions_is_upgraded_to_null_and_a_bad_record_is_refused():
    r = made_up_result(10.0)
    old = {k: v for k, v in r.items() if k != "instructions"}
    assert schema.upgrade(old)["instructions"] is None
    for bad, said in (({"per_step": -1, "phases": {}}, "per_step"), ({"per_step": None}, "say why"),
                      ({"per_step": 5.0, "phases": {"forward": "x"}}, "phases"), ([], "null or a table")):
        assert any(said in p for p in schema.problems({**r, "instructions": bad})), bad


def test_the_count_build_is_one_valgrind_runs_at_speed():
    """Builds with AVX-512 (SIGILL under Valgrind) or FMA (a helper call per lane) are counted on
    v3 without FMA; those with neither, as timed; the native build as its CPU's flags say."""
    for timed in ("native", "x86-64-v3", "x86-64-v4", "x86-64-v4-vnni"):
        assert counting.counted_build("x86_64", timed) == "x86-64-v3-nofma"
    for timed in ("x86-64", "x86-64-v2", "x86-64-v3-nofma"):
        assert counting.counted_build("x86_64", timed) == timed
    assert counting.counted_build("aarch64", "cortex-a53") == "cortex-a53"
    assert cpu.flags("x86_64", counting.COUNT_BUILD) == ["-march=x86-64-v3", "-mno-fma"]
    # this machine's native build, by its flags: v2 and v3's flag sets as the kernel spells them
    v2 = {"sse2", *cpu.X86_LEVEL_FLAGS["x86-64-v2"]}
    v3 = v2 | cpu.X86_LEVEL_FLAGS["x86-64-v3"]
    assert counting.counted_build("x86_64", "native", v3) == "x86-64-v3-nofma"
    assert counting.counted_build("x86_64", "native", v3 | {"avx512f"}) == "x86-64-v3-nofma"
    assert counting.counted_build("x86_64", "native", v2 | {"avx"}) == "native"          # a Sandy Bridge: neither
    assert counting.counted_build("x86_64", "native", v2 | {"avx", "fma"}) == "x86-64-v2"   # a Piledriver: FMA, no AVX2
    assert counting.counted_build("x86_64", "native", {"sse2", "fma"}) == "x86-64"
    assert counting.counted_build("x86_64", "native", ()) == "x86-64-v3-nofma"           # flags unknown
    assert counting.counted_build("x86_64", "x86-64-v3", v2) == "x86-64-v3-nofma"         # flags judge native alone
    assert counting.COUNT_BUILD not in cpu.x86_names(set().union(*cpu.X86_LEVEL_FLAGS.values())), \
        "no probe chooses the count's build for a timed job"


def test_inject_work_leaves_the_binarys_training_as_it_was(native, data_dir, tmp_path):
    """The extra steps start from a copy of the state and put it back: the losses and final
    weights are those of the run without them, only the work grew."""
    spec = job_spec("elastic-zo", 1, seed=4, steps=6, batch=8, test_samples=16, threads=1, data_dir=data_dir)
    plain = run_runner(spec, tmp_path / "plain", native, check=True)
    more = run_runner({**spec, "hyper": {**spec["hyper"], "inject_work": 1.0}}, tmp_path / "more", native, check=True)
    assert [t["loss"] for t in more["trace"]] == [t["loss"] for t in plain["trace"]]
    assert more["model"]["weights_sha256"] == plain["model"]["weights_sha256"]
    assert more["phases"]["forward"]["calls"] == 2 * plain["phases"]["forward"]["calls"]


def test_inject_work_leaves_a_python_runners_training_as_it_was(data_dir, tmp_path):
    spec = job_spec("full-zo", 0, seed=4, steps=4, batch=8, test_samples=16, threads=1)
    plain = run_runner(spec, tmp_path / "plain", check=True)
    more = run_runner({**spec, "hyper": {**spec["hyper"], "inject_work": 0.5}}, tmp_path / "more", check=True)
    assert [t["loss"] for t in more["trace"]] == [t["loss"] for t in plain["trace"]]
    assert more["phases"]["forward"]["calls"] == plain["phases"]["forward"]["calls"] * 3 // 2
