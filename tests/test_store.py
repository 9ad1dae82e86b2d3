"""The store through the CLI, on real files: a corrupt result is named once, left out and run
again by --resume; a bad --results or run id is one line and exit 2 with nothing written; every
JSON file and line zobench writes is strict JSON, a diverged loss null with its reason."""
from __future__ import annotations

import json
import os
import shutil
import subprocess
from pathlib import Path

import pytest

from zobench.cli import main
from harness.stores.store import Store
from workloads import jsonfile
from testkit.runners import TINY_CPP, TORCH_RUNNER, cli, job_spec, python, run_runner, zobench

# Two jobs of the binary: lr_zo=1e30 makes full-zo diverge (its losses NaN) and leaves full-bp (lr_bp) alone.
TINY = [*TINY_CPP, "--method", "full-bp", "--method", "full-zo", "--set", "lr_zo=1e30"]
BP, ZO = "local.cpp.full-bp.fp32.r0", "local.cpp.full-zo.fp32.r0"


def strict(text: str):
    """json.loads that refuses NaN and Infinity, as every JSON reader but Python's does."""
    def refuse(name):
        raise ValueError(f"{name} is not JSON")
    return json.loads(text, parse_constant=refuse)


@pytest.fixture(scope="module")
def made(tmp_path_factory) -> Path:
    root = tmp_path_factory.mktemp("store") / "results"
    assert main(["run", "--results", str(root), "--no-report", *TINY]) == 0
    return root


@pytest.fixture
def run(made, tmp_path):
    """A copy of the module's run, for a test to break: (results folder, run id, run folder)."""
    root = tmp_path / "results"
    shutil.copytree(made, root)
    run_id = Store(root).latest()
    return root, run_id, root / "runs" / run_id


def one_line_error(p: subprocess.CompletedProcess, *needles: str) -> None:
    assert p.returncode == 2, p.stderr
    assert p.stderr.count("\n") == 1 and p.stderr.startswith("zobench: error: "), p.stderr
    for n in needles:
        assert n in p.stderr, p.stderr


def compared(p: subprocess.CompletedProcess) -> bool:
    """compare of a run with itself judged every key (0), or could not judge (3: a key noisy, the
    jobs ran beside other work, or too few repeats to judge): either way it read the store."""
    return p.returncode == 0 or (p.returncode == 3 and ("noisy" in p.stderr or "too few repeats" in p.stderr))


def warnings(stderr: str) -> list[str]:
    assert "Traceback" not in stderr, stderr
    return [line for line in stderr.splitlines() if line.startswith("zobench: warning:")]


COMMANDS = {
    "results": lambda root, run_id: ["results", "--results", root, "--run", run_id, "--format", "json"],
    "export": lambda root, run_id: ["export", "--results", root, "--run", run_id, "--format", "csv"],
    "compare": lambda root, run_id: ["compare", "--results", root, run_id, run_id],
    "report": lambda root, run_id: ["report", "--results", root, "--run", run_id, "--out", root.parent / "report"],
}


@pytest.mark.parametrize("command", COMMANDS)
def test_a_truncated_result_is_named_once_and_left_out_like_a_missing_one(command, run, tmp_path):
    root, run_id, folder = run
    text = (folder / f"{BP}.json").read_text()
    (folder / f"{BP}.json").write_text(text[:len(text) // 2])
    p = zobench(*COMMANDS[command](root, run_id))
    (line,) = warnings(p.stderr)
    assert f"{folder / BP}.json is corrupt (not valid JSON: " in line
    assert line.endswith(f"`zobench run --resume {run_id} --results {root}` re-runs it")
    assert (folder / f"{BP}.json").read_text() == text[:len(text) // 2]    # left for --resume, not deleted

    if command == "report":
        assert p.returncode == 0
        md = (root.parent / "report" / "report.md").read_text()
        assert "| Full ZO |" in md and "| Full BP |" not in md
        return
    # the command exits and answers as it does when that job has no result at all
    (missing := tmp_path / "missing").mkdir()
    shutil.copytree(root, missing / "results")
    (missing / "results" / "runs" / run_id / f"{BP}.json").unlink()
    q = zobench(*COMMANDS[command](missing / "results", run_id))
    assert warnings(q.stderr) == [] and (p.returncode, p.stdout) == (q.returncode, q.stdout)
    assert "full-zo" in p.stdout and "full-bp" not in p.stdout
    assert command != "results" or p.returncode == 1        # a job with no valid result did not end ok


def test_resume_runs_a_corrupt_result_again_and_keeps_the_others(run):
    root, run_id, folder = run
    (folder / f"{ZO}.json").write_text('{"schema": 1, "job": ')
    zo_before = (folder / f"{ZO}.json").read_text()
    bp_before = (folder / f"{BP}.json").read_bytes()
    p = zobench("run", "--results", root, "--no-report", "--resume", run_id)
    assert p.returncode == 0, p.stderr
    (line,) = warnings(p.stderr)
    assert f"{folder / ZO}.json is corrupt" in line
    assert f"resuming run {run_id}: 1 of 2 jobs to run" in p.stderr
    redone = strict((folder / f"{ZO}.json").read_text())
    assert (folder / f"{ZO}.json").read_text() != zo_before and redone["status"] == "ok" and redone["steps"] == 10
    assert (folder / f"{BP}.json").read_bytes() == bp_before
    assert Store(root).run_ids() == [run_id]
    assert sorted(p.name for p in root.iterdir()) == ["runs"]      # the files are the only copy: no index


def test_a_result_that_does_not_validate_is_corrupt_with_what_is_wrong(run):
    root, run_id, folder = run
    (folder / f"{BP}.json").write_text((folder / f"{ZO}.json").read_text())     # another job's result
    r = strict((folder / f"{ZO}.json").read_text())
    del r["steps"]
    (folder / f"{ZO}.json").write_text(json.dumps(r))
    p = zobench("results", "--results", root, "--run", run_id)
    assert p.returncode == 1
    bp, zo = warnings(p.stderr)
    assert f"{BP}.json is corrupt (it holds the result of job '{ZO}')" in bp
    assert f"{ZO}.json is corrupt (missing steps)" in zo
    assert BP not in p.stdout and ZO not in p.stdout


def test_a_corrupt_or_missing_plan_is_one_line_naming_it(run, capsys):
    root, run_id, folder = run
    plan = folder / "run.json"
    saved = plan.read_text()
    plan.write_text(saved[:100])
    one_line_error(cli(capsys, "results", "--results", root, "--run", run_id), f"{plan} is corrupt (not valid JSON: ")
    plan.write_text(json.dumps({"jobs": [{"job_id": "../../x", "target": "local", "timeout_s": 1, "spec": {}}]}))
    one_line_error(cli(capsys, "run", "--results", root, "--resume", run_id), f"{plan} is corrupt (jobs[0].job_id '../../x'")
    good = json.loads(saved)
    good["jobs"][0]["timeout_s"] = "abc"       # an edited deadline: refused before anything runs
    plan.write_text(json.dumps(good))
    one_line_error(cli(capsys, "run", "--results", root, "--resume", run_id),
                   f"{plan} is corrupt (jobs[0].timeout_s 'abc' is not a number of seconds (a value > 0 and <= 2592000))")
    plan.unlink()
    one_line_error(cli(capsys, "report", "--results", root, "--run", run_id), f"{plan} is missing")
    assert not (folder / "report").exists()


def test_resume_of_a_run_whose_jobs_all_ended_ok_has_nothing_to_do(run, capsys):
    root, run_id, folder = run
    before = {p: p.read_bytes() for p in folder.glob("*.json")}
    p = cli(capsys, "run", "--results", root, "--resume", run_id)
    assert p.returncode == 0 and p.stderr == f"run {run_id}: nothing to resume: all 2 jobs ended ok\n"
    assert {p: p.read_bytes() for p in folder.glob("*.json")} == before and not (folder / "report").exists()


STORE_COMMANDS = [["run", *TINY], ["results"], ["report"], ["export", "--format", "csv"], ["compare", "a", "b"],
                  ["build", "--target", "local"], ["targets", "list"]]


@pytest.mark.parametrize("under", [False, True], ids=["a file", "a path under a file"])
@pytest.mark.parametrize("argv", STORE_COMMANDS, ids=lambda argv: argv[0])
def test_results_that_is_not_a_directory_is_one_line(argv, under, tmp_path, capsys):
    file = tmp_path / "results"
    file.write_text("not a folder\n")
    where = file / "sub" if under else file
    one_line_error(cli(capsys, argv[0], "--results", where, *argv[1:]),
                   f"results directory {where}" + (f": {file}" if under else "") + " is not a directory")
    assert sorted(tmp_path.iterdir()) == [file] and file.read_text() == "not a folder\n"


@pytest.fixture
def read_only(run, tmp_path):
    """The run's copy, one result missing (for --resume to have work), as a read-only folder:
    a read-only bind mount as root (who ignores permission bits), else the permission bits."""
    root, run_id, folder = run
    (folder / f"{ZO}.json").unlink()
    if os.geteuid() != 0:
        for d in [root, *(p for p in root.rglob("*") if p.is_dir())]:
            d.chmod(0o555)
        yield run
        for d in [root, *(p for p in root.rglob("*") if p.is_dir())]:
            d.chmod(0o755)
        return
    ro = tmp_path / "ro"
    ro.mkdir()
    if subprocess.run(["mount", "--bind", root, ro], capture_output=True).returncode != 0:
        pytest.skip("running as root without permission to mount: no way to make a read-only folder here")
    try:
        if subprocess.run(["mount", "-o", "remount,bind,ro", ro], capture_output=True).returncode != 0:
            pytest.skip("running as root without permission to remount read-only")
        yield ro, run_id, ro / "runs" / run_id
    finally:
        subprocess.run(["umount", ro], check=True)


def test_a_read_only_store_is_read_and_refused_for_writing_in_one_line(read_only, capsys):
    root, run_id, folder = read_only
    listing = sorted(map(str, root.rglob("*")))
    p = cli(capsys, "results", "--results", root, "--run", run_id, "--format", "json")
    assert p.returncode == 1 and [r["job_id"] for r in strict(p.stdout)] == [BP]
    assert f"1 of 2 jobs have no result yet; zobench run --resume {run_id} --results {root} runs them" in p.stderr
    assert cli(capsys, "export", "--results", root, "--run", run_id, "--format", "csv").returncode == 0
    assert compared(cli(capsys, "compare", "--results", root, run_id, run_id))
    one_line_error(cli(capsys, "run", "--results", root, "--no-report", *TINY), f"cannot write to {root / 'runs'}: ")
    one_line_error(cli(capsys, "run", "--results", root, "--resume", run_id), f"cannot write to {folder}: ")
    one_line_error(cli(capsys, "report", "--results", root, "--run", run_id), f"report: cannot write {folder / 'report'}: ")
    assert sorted(map(str, root.rglob("*"))) == listing


def test_what_is_not_finite_is_null_with_its_place_however_it_was_written():
    """jsonfile reads bare constants and a literal too large for a double as null, each named
    under "nonfinite", and writes them so; a finite document reads and writes as json's own."""
    text = '{"a": NaN, "b": [1.5, -Infinity, 2e400], "c": {"d": -1E999, "e": "2e400"}, "f": 1e-300}'
    got = jsonfile.loads(text)
    assert got == {"a": None, "b": [1.5, None, None], "c": {"d": None, "e": "2e400"}, "f": 1e-300,
                   "nonfinite": ["a: nan", "b[1]: -inf", "b[2]: inf", "c.d: -inf"]}
    assert jsonfile.loads(jsonfile.dumps({"x": float("nan"), "y": [float("inf"), 2]})) == \
        {"x": None, "y": [None, 2], "nonfinite": ["x: nan", "y[0]: inf"]}
    finite = {"loss": [2.5, 1e-300, 1.7976931348623157e308], "sha256": "3e4567", "n": 10 ** 400}
    assert jsonfile.loads(jsonfile.dumps(finite)) == finite and jsonfile.dumps(finite) == json.dumps(finite, indent=1)
    assert jsonfile.loads('[{"a": NaN}, {"b": 1}]') == [{"a": None, "nonfinite": ["a: nan"]}, {"b": 1}]


def test_a_diverged_loss_is_null_with_its_reason_in_strict_json(made, run):
    root, run_id, folder = run
    zo = strict((made / "runs" / run_id / f"{ZO}.json").read_text())
    assert zo["status"] == "ok" and zo["epochs"][0]["train_loss"] is None
    assert {"epochs[0].train_loss: nan", "epochs[0].test_loss: nan"} <= set(zo["nonfinite"])
    assert strict((made / "runs" / run_id / f"{BP}.json").read_text())["nonfinite"] == []
    for path in (made / "runs" / run_id).rglob("*.json"):     # run.json, probes, results, specs
        strict(path.read_text())
    events = [strict(line) for line in (made / "runs" / run_id / "work" / ZO / "stdout.log").read_text().splitlines()]
    (epoch,) = [e for e in events if e["event"] == "epoch"]
    assert epoch["train_loss"] is None and "train_loss: nan" in epoch["nonfinite"]

    # a result an older zobench wrote with bare NaN reads as the same null and reason
    old = json.loads((folder / f"{BP}.json").read_text())
    old["epochs"][0]["train_loss"] = float("nan")
    (folder / f"{BP}.json").write_text(json.dumps(old))
    p = zobench("results", "--results", root, "--run", run_id, "--format", "json")
    assert p.returncode == 0 and warnings(p.stderr) == []
    rows = {r["job_id"]: r for r in strict(p.stdout)}
    assert rows[BP]["train_loss"] is None and rows[BP]["nonfinite"] == "epochs[0].train_loss: nan"
    assert rows[ZO]["nonfinite"] == "epochs[0].test_loss: nan; epochs[0].train_loss: nan"
    for argv in (["export", "--results", root, "--run", run_id, "--format", "pytest-benchmark"],
                 ["compare", "--results", root, run_id, run_id, "--format", "json"],
                 ["memory", "--batch", "32", "--json"]):
        p = zobench(*argv)
        assert p.returncode == 0 or (argv[0] == "compare" and compared(p)), p.stderr
        strict(p.stdout)


def test_the_cpp_binary_names_a_diverged_loss_as_the_python_runners_do(native, data_dir, tmp_path):
    spec = job_spec("full-zo", 0, seed=3, steps=4, data_dir=data_dir, test_samples=64, hyper={"lr_zo": 1e30})
    texts = {}
    for name, command in (("torch", TORCH_RUNNER), ("cpp", native)):
        run_runner(spec, tmp_path / name, command)
        texts[name] = (tmp_path / name / "result.json").read_text()
    torch, cpp = strict(texts["torch"]), strict(texts["cpp"])
    assert cpp["status"] == torch["status"] == "ok" and cpp["epochs"][0]["train_loss"] is None
    assert "trace[1].loss: nan" in cpp["nonfinite"] and cpp["nonfinite"] == torch["nonfinite"]


@pytest.mark.parametrize("bad", ["../../outside", "x/../../../outside", "20250101-120000-ab12/../../../outside",
                                 "ABSOLUTE"])
def test_a_run_id_that_is_not_one_never_reaches_the_filesystem(bad, run, tmp_path, capsys):
    """RESULTS/runs/<bad> would name tmp_path/outside, a copy of the run: refused, never read
    or written."""
    root, run_id, folder = run
    shutil.copytree(folder, tmp_path / "outside")
    bad = str(tmp_path / "outside") if bad == "ABSOLUTE" else bad
    for argv in (["results", "--run", bad], ["export", "--format", "csv", "--run", bad],
                 ["report", "--run", bad], ["run", "--resume", bad]):
        one_line_error(cli(capsys, argv[0], "--results", root, *argv[1:]), f"unknown run {bad!r}: a run id looks like ")
    p = cli(capsys, "compare", "--results", root, bad, run_id)
    assert p.returncode == 2 and f"unknown run {bad!r}" in p.stderr and "Traceback" not in p.stderr
    assert not (tmp_path / "outside" / "report").exists()


def as_version_1(r: dict) -> dict:
    """r as a zobench before result versions wrote it: schema 1, without the records added since
    (warm-up, energy, start_eval, load, lease, validity, convergence, the spec's hash, an empty
    nonfinite, the GPU's memory figures, an epoch's joules) and without spec fields added since
    (zo_loss, optimizer, warmup). spec_sha256 came with schema 2: a version 1 result has none (one
    kept beside a job record without those fields would be a record edited after its run)."""
    old = {k: v for k, v in r.items() if k not in ("warmup", "energy", "start_eval", "load", "lease", "validity",
                                                    "convergence", "spec_sha256") and not (k == "nonfinite" and not v)}
    job = {k: v for k, v in r["job"].items() if k not in ("zo_loss", "eval_start", "init_sha256")}
    job["hyper"] = {k: v for k, v in job["hyper"].items() if k not in ("optimizer", "warmup_steps", "adam_beta1")}
    job["workload"] = {k: v for k, v in job["workload"].items() if k not in ("rotate", "validation")}
    return {**old, "schema": 1, "job": job, "memory": {k: v for k, v in r["memory"].items() if not k.startswith("device_")},
            "epochs": [{k: v for k, v in e.items() if k != "joules"} for e in r["epochs"]]}


def test_a_version_1_result_reads_as_this_versions_shape_under_its_old_key(run, capsys):
    """Every reader sees one shape: a result written before the records and spec fields added
    since is read with them (null where not measured, the spec's defaults), under the job key it
    always had, and the commands that read it give the same rows."""
    from harness.stores import measurements, schema
    root, run_id, folder = run
    store = Store(root)
    before = {r["job"]["job_id"]: r for r in store.results(run_id)}
    rows = cli(capsys, "results", "--results", root, "--run", run_id, "--format", "json").stdout
    for job_id, r in before.items():
        (folder / f"{job_id}.json").write_text(json.dumps(as_version_1(r)))
    after = {r["job"]["job_id"]: r for r in store.results(run_id)}
    assert set(after) == set(before)
    for job_id, r in after.items():
        assert r["schema"] == schema.VERSION and schema.problems(r) == []
        assert set(r) >= set(before[job_id]) and r["job"] == before[job_id]["job"]
        assert r["energy"]["unavailable"] == schema.NO_ENERGY and r["warmup"] is None and r["validity"] is None
        assert r["convergence"] == before[job_id]["convergence"]        # judged from the same epochs
        assert measurements.job_key(r["job"]) == measurements.job_key(before[job_id]["job"])
    assert cli(capsys, "results", "--results", root, "--run", run_id, "--format", "json").stdout == rows


def test_a_result_of_a_newer_version_is_refused_naming_the_upgrade(run):
    root, run_id, folder = run
    f = folder / f"{BP}.json"
    f.write_text(json.dumps({**json.loads(f.read_text()), "schema": 99}))
    from harness.stores import schema
    assert "schema 99 is not one this zobench reads (1 to 2): upgrade zobench" in schema.problems(json.loads(f.read_text()))
    assert [r["job"]["job_id"] for r in Store(root).results(run_id)] == [ZO]


def test_a_run_started_in_another_folder_keeps_its_results_there(tmp_path):
    """The default results folder (./results) is where the user is, also for the C++ binary, which
    the local transport starts in a work folder of its own."""
    p = python("-m", "zobench", "run", "--suite", "quick", "--method", "full-zo", "--runtime", "cpp", "--precision",
               "fp32", "--set", "epochs=1", "--set", "train_samples=320", "--set", "test_samples=64", "--no-report",
               cwd=tmp_path, timeout=300)
    assert p.returncode == 0, p.stdout + p.stderr
    (result,) = (tmp_path / "results" / "runs").glob("*/work/local.cpp.full-zo.fp32.r0/result.json")
    assert json.loads(result.read_text())["status"] == "ok"


def test_latest_is_the_run_begun_last_even_within_one_second(tmp_path):
    """Two runs begun in one second (a refused run ends in less) differ only in their random
    suffix: latest is the one whose plan was written last, not the larger suffix."""
    store = Store(tmp_path)
    for i, run_id in enumerate(("20260101-120000-ffff", "20260101-120000-0000")):
        (store.runs / run_id).mkdir(parents=True)
        (store.runs / run_id / "run.json").write_text("{}")
        os.utime(store.runs / run_id / "run.json", ns=(10**18 + i, 10**18 + i))
    assert store.latest() == "20260101-120000-0000"
    (store.runs / "20260101-120001-aaaa").mkdir()
    (store.runs / "20260101-120001-aaaa" / "run.json").write_text("{}")
    os.utime(store.runs / "20260101-120001-aaaa" / "run.json", ns=(1, 1))     # a later second wins whatever its mtime
    assert store.latest() == "20260101-120001-aaaa"
