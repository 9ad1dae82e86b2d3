"""Run records (harness/stores/records.py) of a real run: the same records always make the same
bytes, they read back as the runs they came from, and a records file damaged in any way, or of a
newer version, is one error naming its file and line, through scripts/reproduce.py too."""
import gzip
import json

from pathlib import Path

import pytest

from harness.errors import UserError
from harness.planning.runs import spec_sha256
from harness.stores import records
from harness.stores.store import Store
from testkit.runners import REPO, TINY_CPP, python
from zobench.cli import main as zobench

REPRODUCE = [REPO / "scripts" / "reproduce.py"]


@pytest.fixture(scope="module")
def run(tmp_path_factory, native):
    """A real run of four short jobs on the C++ binary: its store, id and records."""
    root = tmp_path_factory.mktemp("results")
    assert zobench(["run", "--results", str(root), "--no-report", *TINY_CPP]) == 0
    store = Store(root)
    run_id = store.latest()
    return store, run_id, records.of_runs(store, [run_id])


def lines_of(path) -> list[str]:
    return gzip.decompress(path.read_bytes()).decode().splitlines()


def test_the_same_records_make_the_same_bytes_in_any_order(run, tmp_path):
    _, _, recs = run
    a, b, c = tmp_path / "a.jsonl.gz", tmp_path / "b.jsonl.gz", tmp_path / "c.jsonl.gz"
    records.write(a, recs)
    records.write(b, recs[::-1])
    records.write(c, records.read(a))
    assert a.read_bytes() == b.read_bytes() == c.read_bytes()
    assert a.read_bytes()[4:8] == b"\0\0\0\0"        # gzip's time stamp: none
    assert lines_of(a) == sorted(lines_of(a), key=lambda x: (json.loads(x)["run_id"], json.loads(x)["job_id"]))
    assert len(lines_of(a)) == 4 and a.stat().st_size < 4 * 2000


def test_records_read_back_as_the_run_they_came_from(run, tmp_path):
    """Written back as a results folder: each result holds the run's epochs, status, spec hash and
    judgement, and the plan its suite and command line; a record's cell is its job's."""
    store, run_id, recs = run
    path = tmp_path / "r.jsonl.gz"
    records.write(path, recs)
    back, ids = records.store(records.read(path), tmp_path / "back")
    assert ids == [run_id]
    plan, mine = store.run_plan(run_id), {r["job"]["job_id"]: r for r in store.results(run_id)}
    assert {k: back.run_plan(run_id)[k] for k in ("suite", "argv", "git")} == {k: plan[k] for k in ("suite", "argv", "git")}
    for r in back.results(run_id):
        theirs = mine[r["job"]["job_id"]]
        for k in ("status", "spec_sha256", "convergence", "start_eval", "model", "steps", "wall_seconds"):
            assert r[k] == theirs[k], k
        assert r["memory"]["peak_rss_bytes"] == theirs["memory"]["peak_rss_bytes"] > 0
        assert r["timed_loop_load"] == (theirs.get("timed_loop_load") or theirs["load"])
        # every epoch but its phases (an unmeasured energy reads back null, as an older result's does)
        assert r["epochs"] == [{"joules": None, **{k: v for k, v in e.items() if k != "phases"}} for e in theirs["epochs"]]
        # the job as planned (the spec its hash is of), not as this machine filled it in (its paths)
        assert spec_sha256(r["job"]) == theirs["spec_sha256"] and r["job"]["workload"]["data_dir"] == ""
    rec = recs[0]
    assert rec["cell"]["runtime"] == "cpp" and rec["cell"]["harness_commit"] == rec["job"]["harness_commit"]
    assert "rotate" not in rec["cell"]      # a drift only where one is set


def test_a_version_1_record_reads_as_one_that_measured_no_memory_and_no_load(run, tmp_path):
    """Records keep a job's peak memory and the load its steps were timed under (version 2); a file
    written before (version 1, as docs/reproduction's first records) reads back with both unknown,
    never as zero, and the rest as it was."""
    _, _, recs = run
    assert all(r["memory"]["peak_rss_bytes"] > 0 and r["load"]["cores"] >= 1 for r in recs)
    old = [{**{k: v for k, v in r.items() if k not in ("memory", "load")}, "schema": 1} for r in recs]
    path = tmp_path / "v1.jsonl.gz"
    path.write_bytes(gzip.compress("".join(records.line(r) + "\n" for r in old).encode(), mtime=0))
    back = sorted(records.read(path), key=records.key)
    assert [(r["schema"], r["memory"], r["load"]) for r in back] == [(records.VERSION, None, None)] * len(recs)
    assert [{k: v for k, v in r.items() if k not in ("schema", "memory", "load")} for r in back] == \
        [{k: v for k, v in r.items() if k != "schema"} for r in sorted(old, key=records.key)]
    store, _ = records.store(back, tmp_path / "back")
    assert all(r["memory"]["peak_rss_bytes"] == 0 and r["timed_loop_load"] is None for r in store.results(recs[0]["run_id"]))


def test_records_of_a_run_added_again_replace_its_own(run, tmp_path):
    """reproduce.py records RUN --add: another run's records are kept beside, and the same run's
    replaced whole (never twice in the file)."""
    from testkit.runners import script

    store, run_id, recs = run
    path = tmp_path / "r.jsonl.gz"
    other = [{**r, "run_id": "20250101-120000-ab12"} for r in recs]
    records.write(path, other)
    for _ in range(2):
        assert script("reproduce.py").main(["records", run_id, "--add", "--results", str(store.root),
                                            "--records", str(path)]) == 0
        assert sorted(records.read(path), key=records.key) == sorted(other + recs, key=records.key)


def damaged(recs: list[dict], how: str) -> bytes:
    """A records file of recs with its second record damaged as `how` says."""
    lines = [records.line(r) for r in sorted(recs, key=records.key)]
    second = json.loads(lines[1])
    if how == "garbled":
        lines[1] = lines[1][:40]
    elif how == "newer":
        lines[1] = records.line({**second, "schema": records.VERSION + 1, "something": "new"})
    elif how == "edited job":
        second["job"]["hyper"]["lr_zo"] *= 2
        lines[1] = records.line(second)
    elif how == "edited cell":
        lines[1] = records.line({**second, "cell": {**second["cell"], "seed": 7}})
    elif how == "missing epochs":
        lines[1] = records.line({k: v for k, v in second.items() if k != "epochs"})
    elif how == "twice":
        lines[1] = lines[0]
    elif how == "not finite":
        lines[1] = lines[1].replace('"train_loss":', '"train_loss":NaN,"x":', 1)
    data = gzip.compress(("\n".join(lines) + "\n").encode(), mtime=0)
    return data[:len(data) // 2] if how == "truncated" else data


@pytest.mark.parametrize("how, said", [
    ("garbled", "line 2: damaged: not a JSON record"),
    ("newer", f"line 2: a record of version {records.VERSION + 1}, newer than this zobench reads ({records.VERSION}): "
              "upgrade zobench"),
    ("edited job", "line 2: damaged: its job is not the spec it ran by (spec_sha256 differs)"),
    ("edited cell", "line 2: damaged: its cell is not its job's"),
    ("missing epochs", "line 2: damaged: missing epochs"),
    ("twice", "line 2: damaged: run "),
    ("not finite", "line 2: damaged: not a JSON record (NaN is no number a record holds)"),
    ("truncated", ": damaged: not a whole gzip file"),
])
def test_a_damaged_or_newer_records_file_is_one_error_naming_its_file_and_line(run, tmp_path, how, said):
    path = tmp_path / "records.jsonl.gz"
    path.write_bytes(damaged(run[2], how))
    with pytest.raises(UserError) as e:
        records.read(path)
    assert str(e.value).startswith(str(path)) and said in str(e.value)
    # through the script: one line, exit 2, the doc left as it was
    doc = tmp_path / "reproduction.md"
    doc.write_text((REPO / "docs" / "reproduction.md").read_text())
    p = python(*REPRODUCE, "doc", "--records", str(path), "--doc", str(doc), cwd=Path.cwd())
    assert p.returncode == 2 and p.stderr.startswith(f"reproduce.py: error: {path}") and said in p.stderr
    assert len(p.stderr.strip().splitlines()) == 1 and doc.read_text() == (REPO / "docs" / "reproduction.md").read_text()


@pytest.mark.parametrize("args, said", [
    (["doc", "--target", "pi"], "--target is run's option, not doc's"),
    (["run", "20250101-120000-ab12"], "run takes no run ids"),
    (["run", "--seeds", "0,x"], "argument --seeds: expected an integer, got 'x'"),
    (["doc", "--add"], "--add takes runs"),
    (["doc", "--store", "postgresql://x@y/z"], "--store takes runs"),
    (["records", "not-a-run"], "unknown run 'not-a-run'"),
    (["run", "--store", "postgresql://nobody@127.0.0.1:1/zobench"], "127.0.0.1"),
    (["run", "--store", "mysql://x"], "expected a PostgreSQL URL"),
])
def test_the_scripts_bad_input_is_one_line_and_exit_2_with_nothing_run(tmp_path, args, said):
    p = python(*REPRODUCE, *args, "--results", str(tmp_path / "r"), "--records", str(tmp_path / "x.gz"), cwd=Path.cwd(),
               timeout=60)
    assert p.returncode == 2 and said in p.stderr, p.stderr
    assert p.stderr.strip().splitlines()[-1].startswith("reproduce.py: error:")
    assert not (tmp_path / "r").exists() and not (tmp_path / "x.gz").exists()
