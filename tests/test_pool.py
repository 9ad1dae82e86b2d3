"""A pool of interchangeable boards as one target, against real sshd boards on loopback: its jobs
spread over the members that are free, a member that differs left out, a member that dies
mid-job costing only that attempt (harness/execution/pool.py)."""
import json
import os
import platform
import signal
import subprocess
from pathlib import Path

import pytest

from harness.stores import measurements, schema
from harness.stores.store import Store
from testkit.runners import SHORT, cli, held_python, hooked_python, start, until, zobench
from testkit.sshd import board_toml

METHODS = ["--method", "full-bp", "--method", "full-zo", "--method", "elastic-zo:1"]
# a member that runs the C++ binary: the pool's scheduling is the same for every runtime, and a job
# of it starts no interpreter and imports no torch on the board (about 3 s of CPU a job less)
CPP = {"runtimes": ["cpp"], "arch": platform.machine()}


def inventory(farm, d: Path, pool: str, members: dict[str, dict], **terms) -> Path:
    key = farm["key"]
    text = "".join(board_toml(n, farm["boards"][n], key, d / n / "work", **extra) for n, extra in members.items())
    extra = "".join(f"{k} = {json.dumps(v)}\n" for k, v in terms.items())
    text += f"[targets.{pool}]\nmembers = {json.dumps(list(members))}\n{extra}"
    path = d / "inventory.toml"
    path.write_text(text)
    return path


def test_a_pool_spreads_its_jobs_over_its_members_and_its_results_are_one_targets(farm, tmp_path):
    """Three repeats of one job on two members: each board's first job waits until the other has
    started one, so both run jobs, and the key's repeats pool across them as one target's."""
    marks = {n: tmp_path / f"{n}.started" for n in ("board-a", "board-b")}
    hold = {n: f"touch {marks[n]}; i=0; while [ ! -e {marks[o]} ] && [ $i -lt 1200 ]; do sleep 0.1; i=$((i+1)); done"
            for n, o in (("board-a", "board-b"), ("board-b", "board-a"))}
    # on the C++ binary: no interpreter to start and no torch to import on the boards
    inv = inventory(farm, tmp_path, "lab", {n: {"python": str(hooked_python(tmp_path / f"{n}.py", hold[n])), **CPP}
                                            for n in hold})
    suite = tmp_path / "three.toml"
    suite.write_text('methods = ["full-zo"]\nruntimes = ["cpp"]\nprecisions = ["fp32"]\nrepeats = 3\n'
                     '[workload]\nmodel = "lenet5"\ndataset = "fashion-mnist"\n'
                     '[hyper]\nepochs = 1\ntrain_samples = 320\ntest_samples = 64\n')
    r = zobench("run", "--suite", suite, "--results", tmp_path / "r", "--inventory", inv, "--target", "lab",
                env=farm["env"])
    assert r.returncode == 0, r.stderr
    store = Store(tmp_path / "r")
    results = store.results(store.latest())
    assert len(results) == 3 and all(x["status"] == "ok" and schema.problems(x) == [] for x in results)
    assert {x["job"]["target"] for x in results} == {"lab"}
    assert {x["pool"]["member"] for x in results} == {"board-a", "board-b"}
    assert all(x["pool"]["attempts"] == [] for x in results)
    # one target for compare and history: one key, its three repeats pooled with no disagreement
    (m,) = measurements.from_results([(store.latest(), x) for x in results]).values()
    assert m.facts["target"] == "lab" and len(m.step_s) == 3 and m.disagreement == ""
    assert {p.stem for p in (store.runs / store.latest() / "probes").glob("*.json")} == {"board-a", "board-b"}
    # the report shows each member's jobs and its speed against its sibling on the same key
    md = next((store.runs / store.latest()).glob("**/report.md")).read_text()
    rows = [line for line in md.split("## Pool members", 1)[1].splitlines() if line.startswith("| lab ")]
    assert sorted(row.split("|")[2].strip() for row in rows) == ["board-a", "board-b"], md
    assert sum(int(row.split("|")[3]) for row in rows) == 3
    assert all("x over" in row.split("|")[5] for row in rows), rows


def test_a_member_that_differs_from_its_siblings_is_left_out_with_the_field_named(farm, tmp_path):
    # board-c's interpreter is the system's, without the venv's packages: its runtime versions differ
    inv = inventory(farm, tmp_path, "lab", {"board-a": CPP, "board-b": CPP,
                                            "board-c": {"python": "/usr/bin/python3", **CPP}})
    r = zobench("run", "--results", tmp_path / "r", "--inventory", inv, "--no-report", "--target", "lab",
                "--runtime", "cpp", *SHORT, *METHODS, env=farm["env"])
    assert r.returncode == 0, r.stderr
    left = [line for line in r.stderr.splitlines() if "left out" in line]
    assert len(left) == 1 and "member board-c left out of this run: versions" in left[0], r.stderr
    store = Store(tmp_path / "r")
    results = store.results(store.latest())
    assert len(results) == 3 and all(x["status"] == "ok" for x in results)
    assert {x["pool"]["member"] for x in results} <= {"board-a", "board-b"}


def test_a_member_lost_mid_job_costs_only_that_attempt_and_is_dropped(farm, tmp_path):
    """board-c's first job hangs until its sshd is killed under it (a board dropping off the
    network); board-a runs nothing until the run has said board-c is dropped, so the lost job
    must come to it, and board-c, with jobs still waiting, fails to come back (its second failure)
    however fast board-a's jobs are."""
    hung, err = tmp_path / "hung.pid", tmp_path / "run.stderr"
    inv = inventory(farm, tmp_path, "lab", {
        "board-c": {"python": str(hooked_python(tmp_path / "c.py", f"echo $$ > {hung}; while :; do sleep 1; done")),
                    **CPP},
        "board-a": {"python": str(hooked_python(tmp_path / "a.py", f"while ! grep -q 'member board-c dropped' {err}; "
                                                                   "do sleep 0.1; done")),
                    **CPP}},
        attempts=2)
    board_c = farm["boards"]["board-c"]
    with open(err, "w") as stderr:      # the run's lines as it says them, for board-a's hook to read
        proc = start("run", "--results", tmp_path / "r", "--inventory", inv, "--no-report", "--target", "lab",
                     "--runtime", "cpp", *SHORT, *METHODS, env={**farm["env"], "PYTHONUNBUFFERED": "1"},
                     stdout=subprocess.DEVNULL, stderr=stderr)
        try:
            until("board-c's job started", lambda: hung.is_file() and hung.read_text().strip(), proc, err)
            board_c.stop()
            proc.wait(600)
        finally:
            proc.kill()
            board_c.start()
            if hung.is_file() and hung.read_text().strip():
                try:
                    os.kill(int(hung.read_text()), signal.SIGKILL)
                except ProcessLookupError:
                    pass
    r = subprocess.CompletedProcess(proc.args, proc.returncode, "", err.read_text())
    assert r.returncode == 0, r.stderr
    store = Store(tmp_path / "r")
    results = store.results(store.latest())
    assert len(results) == 3 and all(x["status"] == "ok" for x in results), [x["error"] for x in results]
    assert {x["pool"]["member"] for x in results} == {"board-a"}
    retried = [x for x in results if x["pool"]["attempts"]]
    assert len(retried) == 1
    (tried,) = retried[0]["pool"]["attempts"]
    assert tried["member"] == "board-c" and tried["status"] == "lost" and tried["error"]
    dropped = [line for line in r.stderr.splitlines() if "dropped" in line]
    assert len(dropped) == 1 and "member board-c dropped for the rest of this run after 2 failures" in dropped[0]
    # zobench results names each job's member, and the attempt lost before
    shown = zobench("results", "--results", tmp_path / "r").stdout
    assert "member" in shown and shown.count("board-a") == 3 and "(1 lost before)" in shown, shown


@pytest.mark.parametrize("pool, why", [
    ("members = []", "targets.lab.members: an empty pool"),
    ('members = ["board-a", "nope"]', "targets.lab.members: unknown target 'nope'"),
    ('members = ["board-a", "board-a"]', "targets.lab.members: 'board-a' is named twice"),
    ('members = ["board-a", "board-b"]\nattempts = 0', "targets.lab.attempts: expected"),
    ('members = 2', "targets.lab.members: a number of members is a labgrid pool"),
])
def test_a_pool_the_inventory_gets_wrong_is_one_line(capsys, farm, tmp_path, pool, why):
    key = farm["key"]
    text = "".join(board_toml(n, farm["boards"][n], key, tmp_path / n) for n in ("board-a", "board-b"))
    inv = tmp_path / "inv.toml"
    inv.write_text(text + f"[targets.lab]\n{pool}\n")
    r = cli(capsys, "run", "--inventory", inv, "--target", "lab", "--results", tmp_path / "r", *SHORT)
    assert r.returncode == 2 and r.stderr.count("\n") == 1 and why in r.stderr, r.stderr
    assert "Traceback" not in r.stderr


def test_members_that_disagree_on_what_a_job_reads_of_its_target_are_refused(capsys, farm, tmp_path):
    key = farm["key"]
    text = board_toml("board-a", farm["boards"]["board-a"], key, tmp_path / "a") + \
        board_toml("board-b", farm["boards"]["board-b"], key, tmp_path / "b", threads=2)
    inv = tmp_path / "inv.toml"
    inv.write_text(text + '[targets.lab]\nmembers = ["board-a", "board-b"]\n')
    r = cli(capsys, "run", "--inventory", inv, "--target", "lab", "--results", tmp_path / "r", *SHORT)
    assert r.returncode == 2 and "'board-b' has threads = 2 but 'board-a' has 1" in r.stderr, r.stderr


def test_two_runs_on_one_pool_share_its_members_through_the_leases_and_neither_waits_forever(farm, tmp_path):
    """Run A's two jobs hold both members' leases until GO; run B, started then, waits on them, and
    once A ends takes the members in turn: every job of both runs ends ok, none busy."""
    python, log, go = held_python(tmp_path)
    inv = inventory(farm, tmp_path, "lab", {n: {"python": str(python)} for n in ("board-a", "board-b")})
    run = ["run", "--inventory", inv, "--target", "lab", "--no-report", "--runtime", "torch", *SHORT]
    a = start(*run, "--results", tmp_path / "ra", "--method", "full-zo", "--method", "full-bp", env=farm["env"])
    until("both of run A's jobs hold a member", lambda: log.is_file() and log.read_text().count("start") == 2, a)
    b = start(*run, "--results", tmp_path / "rb", "--method", "elastic-zo:1", "--method", "elastic-zo:2",
              env=farm["env"])
    err = []
    until("run B waits for a member's lease", lambda: "leased by run" in (err.append(b.stderr.readline()) or
                                                                          "".join(err)), b)
    go.touch()
    assert a.wait(600) == 0 and b.wait(600) == 0, a.stderr.read() + b.stderr.read()
    for results in ("ra", "rb"):
        store = Store(tmp_path / results)
        got = store.results(store.latest())
        assert len(got) == 2 and all(x["status"] == "ok" for x in got), [x["error"] for x in got]


def test_ctrl_c_on_a_pool_keeps_what_ended_and_resume_finishes_the_rest(farm, tmp_path):
    python, log, go = held_python(tmp_path)
    inv = inventory(farm, tmp_path, "lab", {n: {"python": str(python)} for n in ("board-a", "board-b")})
    p = start("run", "--inventory", inv, "--target", "lab", "--no-report", "--runtime", "torch", *SHORT, *METHODS,
              "--results", tmp_path / "r", env=farm["env"])
    until("two jobs run", lambda: log.is_file() and log.read_text().count("start") == 2, p)
    p.send_signal(signal.SIGINT)
    assert p.wait(120) == 130
    assert "Traceback" not in p.stderr.read()
    store = Store(tmp_path / "r")
    run_id = store.latest()
    assert sorted(x["status"] for x in store.results(run_id)) == ["interrupted", "interrupted"]
    go.touch()
    r = zobench("run", "--resume", run_id, "--results", tmp_path / "r", "--inventory", inv, "--no-report",
                env=farm["env"])
    assert r.returncode == 0, r.stderr
    got = store.results(run_id)
    assert len(got) == 3 and all(x["status"] == "ok" and x["pool"]["member"] in ("board-a", "board-b") for x in got)


def test_a_simulated_farm_where_a_quarter_of_the_members_die_mid_job_loses_no_job_and_runs_none_twice(monkeypatch):
    """The real scheduler over 16 stand-in boards (benchmarks/pool_scale.py): four lose their first
    job halfway and then cannot be reached (tried again at once, so each is dropped while work is
    left); every job ends ok, once."""
    from benchmarks.pool_scale import simulate
    from harness.execution import pool

    monkeypatch.setattr(pool, "RETRY_S", 0.0)
    r = simulate(16, 3, 0.05, dying=0.25)
    assert r["jobs"] == 48 and r["ok"] == 48 and r["missing"] == 0 and r["twice"] == 0
    assert r["lost_attempts"] == 4 and r["dropped"] == 4


def test_tune_on_a_pool_runs_as_many_trials_at_once_as_it_has_members(farm, tmp_path):
    """A grid of four on two members: each member's first trial waits until the other's has
    started (so two ran at once), every point runs once, and each trial's job names its member."""
    marks = {n: tmp_path / f"{n}.started" for n in ("board-a", "board-b")}
    hold = {n: f"touch {marks[n]}; i=0; while [ ! -e {marks[o]} ] && [ $i -lt 1200 ]; do sleep 0.1; i=$((i+1)); done"
            for n, o in (("board-a", "board-b"), ("board-b", "board-a"))}
    inv = inventory(farm, tmp_path, "lab", {n: {"python": str(hooked_python(tmp_path / f"{n}.py", hold[n])), **CPP}
                                            for n in hold})
    r = zobench("tune", "--no-report", "--suite", "quick", "--method", "full-zo", "--runtime", "cpp", "--sampler", "grid",
                "--grid-points", "4", "--trials", "4", "--pruner", "none", "--epochs", "1", "--validation", "200",
                "--set", "train_samples=320", "--set", "test_samples=100", "--results", tmp_path / "r",
                "--inventory", inv, "--target", "lab", env=farm["env"])
    assert r.returncode == 0, r.stderr
    store = Store(tmp_path / "r")
    run_id = store.latest()
    study = store.run_plan(run_id)["tune"]
    assert len(study["trials"]) == 4 and all(t["state"] == "complete" for t in study["trials"])
    assert len({t["values"]["lr_zo"] for t in study["trials"]}) == 4
    results = store.results(run_id)
    assert {x["pool"]["member"] for x in results} == {"board-a", "board-b"}
    assert {x["job"]["target"] for x in results} == {"lab"}
    best = max(study["trials"], key=lambda t: t["score"])
    assert study["best"]["values"] == best["values"]


def test_a_pool_whose_members_all_differ_runs_nothing_and_says_so_once(farm, tmp_path):
    inv = inventory(farm, tmp_path, "lab", {"board-a": {}, "board-b": {"python": "/usr/bin/python3"}})
    r = zobench("run", "--results", tmp_path / "r", "--inventory", inv, "--no-report", "--target", "lab",
                "--runtime", "torch", *SHORT, "--method", "full-zo", env=farm["env"])
    assert r.returncode == 1
    said = [line for line in r.stderr.splitlines() if line.startswith("pool lab:")]
    assert len(said) == 1 and "no two of its members agree" in said[0] and "differ in versions" in said[0], r.stderr
    store = Store(tmp_path / "r")
    (x,) = store.results(store.latest())
    assert x["status"] == "failed" and "no two of its members agree" in x["error"]


def test_the_docs_pool_figures_are_their_committed_records_tables():
    """docs/targets.md's measured tables are what benchmarks/pool_scale.py renders from the record
    it wrote (docs/targets/pool_scale.json): no number there without its record."""
    from benchmarks.pool_scale import markdown

    repo = Path(__file__).resolve().parent.parent
    record = json.loads((repo / "docs" / "targets" / "pool_scale.json").read_text())
    doc = (repo / "docs" / "targets.md").read_text()
    shown = doc.split("<!-- pool_scale: begin -->\n", 1)[1].split("<!-- pool_scale: end -->", 1)[0]
    assert shown == markdown(record)
    assert record["farm"] and record["real"]
