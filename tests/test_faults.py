"""Jobs that hang, crash or get lost are recorded with their reason; the run keeps the rest,
and --resume finishes only what did not end ok."""
import json
from pathlib import Path

from harness.cli import main
from harness.store import Store

TINY = ["--runtime", "torch", "--precision", "fp32", "--set", "epochs=1", "--set", "train_samples=320", "--set", "test_samples=64"]


def results(root: Path, run_id: str) -> dict:
    return {r["job"]["method"]: r for r in Store(root).results(run_id)}


def processes_mentioning(text: str) -> list[str]:
    hits = []
    for cmdline in Path("/proc").glob("[0-9]*/cmdline"):
        try:
            if text in cmdline.read_bytes().replace(b"\0", b" ").decode(errors="replace"):
                hits.append(cmdline.parent.name)
        except OSError:
            pass
    return hits


def test_hung_runner_times_out_is_killed_and_others_are_kept(tmp_path):
    rc = main(["run", "--results", str(tmp_path), "--no-report", "--method", "full-bp", "--method", "full-zo",
               "--set", "fault=hang@full-zo", "--timeout", "25", *TINY])
    assert rc == 1
    store = Store(tmp_path)
    run_id = store.latest()
    r = results(tmp_path, run_id)
    assert r["full-bp"]["status"] == "ok"
    assert r["full-zo"]["status"] == "timeout"
    assert "25 s timeout" in r["full-zo"]["error"] and "killed" in r["full-zo"]["error"]
    assert r["full-zo"]["steps"] >= 0
    assert processes_mentioning(str(store.runs / run_id)) == []     # nothing of the runner is left
    rows = store.query("SELECT job_id, status FROM results WHERE run_id = ?", (run_id,))
    assert sorted(row["status"] for row in rows) == ["ok", "timeout"]


def test_crashed_runner_is_failed_with_the_signal_and_others_are_kept(tmp_path):
    rc = main(["run", "--results", str(tmp_path), "--no-report", "--method", "full-bp", "--method", "full-zo",
               "--set", "fault=crash@full-bp", *TINY])
    assert rc == 1
    r = results(tmp_path, Store(tmp_path).latest())
    assert r["full-bp"]["status"] == "failed" and "SIGABRT" in r["full-bp"]["error"]
    assert r["full-zo"]["status"] == "ok" and r["full-zo"]["steps"] == 10


def test_resume_reruns_only_the_jobs_that_did_not_end_ok(tmp_path):
    assert main(["run", "--results", str(tmp_path), "--no-report", "--method", "full-bp",
                 "--method", "elastic-zo:1", *TINY]) == 0
    store = Store(tmp_path)
    run_id = store.latest()
    bp_file = store.runs / run_id / "local.torch.full-bp.fp32.r0.json"
    ez_file = store.runs / run_id / "local.torch.elastic-zo-k1.fp32.r0.json"
    lost = json.loads(ez_file.read_text())
    lost.update(status="lost", error="connection lost mid-job")
    ez_file.write_text(json.dumps(lost))
    store.reindex()
    bp_before = bp_file.read_bytes()

    assert main(["run", "--results", str(tmp_path), "--no-report", "--resume", run_id]) == 0
    assert bp_file.read_bytes() == bp_before                   # the ok job was not run again
    redone = json.loads(ez_file.read_text())
    assert redone["status"] == "ok" and redone["error"] is None
    assert redone["model"]["weights_sha256"] == lost["model"]["weights_sha256"]   # same job, same result
    assert store.run_ids() == [run_id]                        # no new run was made


def test_index_is_rebuilt_from_the_raw_files(tmp_path):
    assert main(["run", "--results", str(tmp_path), "--no-report", "--method", "full-zo", *TINY]) == 0
    store = Store(tmp_path)
    before = [dict(r) for r in store.query("SELECT * FROM results")]
    store.db_path.unlink()
    assert store.reindex() == 1
    assert [dict(r) for r in store.query("SELECT * FROM results")] == before
    assert before[0]["steps"] == 10 and before[0]["status"] == "ok"
    assert before[0]["step_seconds"] == before[0]["train_seconds"] / 10
