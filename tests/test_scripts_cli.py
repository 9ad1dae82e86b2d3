"""scripts/calibrate_table2.py and scripts/reproduce.py are commands too: their bad values are
one line and exit 2 (zobench's parser, option types and error boundary), a step's name never
makes a file outside --results, and a step whose every zobench run was refused exits 2 with a
line saying so, its records and doc left as they were. Each a process, as a user runs it."""
import subprocess

import pytest

from testkit.runners import REPO, python


def script(name: str, *args, cwd=REPO) -> subprocess.CompletedProcess:
    return python(REPO / "scripts" / name, *args, cwd=cwd, timeout=300)


def one_line(p: subprocess.CompletedProcess, prog: str, *needles: str) -> str:
    assert p.returncode == 2 and "Traceback" not in p.stderr, p.stderr
    (line,) = p.stderr.strip().splitlines()
    assert line.startswith(f"{prog}: error: ") and f"{prog}: error: {prog}:" not in line, line
    for n in needles:
        assert n in line, line
    return line


@pytest.mark.parametrize("args,needles", [
    (["angles", "--grid", "5:1:0"], ["--grid", "expected a value > 0"]),
    (["angles", "--grid", "90:-90:5"], ["--grid", "first <= last"]),
    (["angles", "--grid", "30:30:5"], ["--grid", "2 values or more"]),
    (["angles", "--grid", "0:90"], ["--grid", "first:last:step"]),
    (["angles", "--grid", "0:nan:5"], ["--grid", "finite"]),
    (["cells", "--angles", "30", "--subset", "64"], ["--angles", "2 different values"]),
    (["cells", "--angles", "30,30", "--subset", "64"], ["--angles", "2 different values"]),
    (["cells", "--angles", "30,45", "--subset", "64", "--seeds", "abc"], ["--seeds", "expected an integer, got 'abc'"]),
    (["cells", "--angles", "30,45", "--subset", "-1"], ["--subset", "expected a value >= 0"]),
    (["cells", "--angles", "30,45", "--subset", "64", "--precisions", "fp16"], ["--precisions", "'fp16'"]),
    (["subset", "--angles", "30,45", "--sizes", "250,x"], ["--sizes", "'x'"]),
    (["cells", "--angles", "30,45", "--subset", "64", "--name", "../../evil"], ["--name", "'../../evil'"]),
    (["cells", "--angles", "30,45", "--subset", "64", "--name", "a/b"], ["--name"]),
    (["show"], ["calibration.json: no such file"]),
    ([], ["required: step"]),
])
def test_calibrate_table2_refuses_a_bad_value_in_one_line(tmp_path, args, needles):
    one_line(script("calibrate_table2.py", *args, "--results", tmp_path / "res"), "calibrate_table2.py", *needles)
    assert not (tmp_path / "res" / "runs").exists() and not (tmp_path / "evil").exists()


@pytest.mark.parametrize("args,needles", [
    (["run", "--seeds", "abc"], ["--seeds", "expected an integer, got 'abc'"]),
    (["run", "--seeds", "1,,2"], ["--seeds", "expected an integer, got ''"]),
    (["run", "--seeds", "-1"], ["--seeds", "expected a value >= 0"]),
    (["doc", "nonexistent-run"], ["unknown run 'nonexistent-run'"]),
    (["records"], ["reproduce.json: no such file"]),
    (["doc", "--seeds", "1"], ["--seeds is run's option, not doc's"]),
    (["doc", "--nonsense"], ["unrecognized arguments: --nonsense"]),
])
def test_reproduce_refuses_a_bad_value_in_one_line(tmp_path, args, needles):
    one_line(script("reproduce.py", *args, "--results", tmp_path), "reproduce.py", *needles)


def test_a_calibration_whose_every_run_is_refused_exits_2_and_no_name_leaves_results(tmp_path):
    """Every zobench run of the cells step refused (a method no suite has): exit 2, the last line
    says so, no run is recorded; the suite files are made under --results alone."""
    p = script("calibrate_table2.py", "cells", "--angles", "30,45", "--subset", "64", "--seeds", "0,1",
               "--precisions", "fp32", "--method", "nonsense", "--name", "round.2", "--results", tmp_path / "res")
    assert p.returncode == 2 and "Traceback" not in p.stderr, p.stderr
    assert p.stderr.strip().splitlines()[-1] == ("calibrate_table2.py: error: every run it started was refused "
                                                 "(2; each said why above)")
    assert not (tmp_path / "res" / "calibration.json").exists()
    assert sorted(f.name for f in tmp_path.rglob("*.toml")) == ["round.2-fp32-s0.toml", "round.2-fp32-s1.toml"]
    assert all(f.parent == tmp_path / "res" / "suites" for f in tmp_path.rglob("*.toml"))


def test_the_calibrations_suite_file_stays_in_its_folder(tmp_path):
    """suite_file itself, called with a name that climbs out (as another caller might): refused."""
    from harness.errors import UserError
    from testkit.runners import script as module
    with pytest.raises(UserError, match="not elsewhere"):
        module("calibrate_table2.py").suite_file(tmp_path / "a" / "suites", "../../evil", [30.0, 45.0], 64, 0)
    assert list(tmp_path.rglob("*")) == []


def test_a_reproduction_whose_every_run_is_refused_exits_2_and_keeps_its_records(tmp_path):
    """`reproduce.py run` whose zobench runs are all refused: exit 2 with a line saying so, and
    the records file, the doc and results/reproduce.json untouched (none is written)."""
    records, doc = tmp_path / "records.jsonl.gz", tmp_path / "doc.md"
    p = script("reproduce.py", "run", "--method", "nonsense", "--suite", "paper-fmnist", "--seeds", "0",
               "--results", tmp_path / "res", "--records", records, "--doc", doc)
    assert p.returncode == 2 and "Traceback" not in p.stderr, p.stderr
    assert p.stderr.strip().splitlines()[-1].startswith("reproduce.py: error: every run it started was refused")
    assert not records.exists() and not doc.exists() and not (tmp_path / "res" / "reproduce.json").exists()
