"""A board from a lab's labgrid place: a real labgrid-coordinator and labgrid-exporter on
loopback, exporting a NetworkService for a testkit sshd board. A run reserves, locks, runs on and
releases the place; a second run waits in labgrid's queue for it; Ctrl-C releases it."""
import getpass
import json
import os
import platform
import signal
import subprocess
import sys
from pathlib import Path

import pytest

from harness.stores.store import Store
from testkit.runners import REPO, TINY_CPP, TINY_ORT, held_python, hooked_python, until, zobench
from testkit.sshd import free_port
from testkit.tools import require

ONE_JOB = ["--method", "full-zo", *TINY_ORT]     # a Python runner, which held_python holds
BIN = Path(sys.executable).parent


@pytest.fixture(scope="module")
def coordinator(farm, tmp_path_factory):
    """A coordinator and an exporter of board-a's sshd, the place pi-lab-1 (tagged
    board=pi-zero2) matching it, and pi-lab-2 and -3 (board-b's and board-c's, a pool's, tagged
    farm=pool): one lab for the file's tests, each of which leaves every place released."""
    pytest.importorskip("labgrid")
    require("sshd")
    tmp = tmp_path_factory.mktemp("lab")
    address = f"127.0.0.1:{free_port()}"
    (tmp / "coordinator").mkdir()
    coordinator = subprocess.Popen([BIN / "labgrid-coordinator", "--listen", address], cwd=tmp / "coordinator",
                                   stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
    (tmp / "exporter.yaml").write_text("".join(
        f"{group}:\n  NetworkService:\n    address: 127.0.0.1\n    username: {getpass.getuser()}\n"
        f"    port: {farm['boards'][board].port}\n"
        for group, board in (("pi-group", "board-a"), ("pool-b", "board-b"), ("pool-c", "board-c"))))
    exporter = None
    try:
        until("the coordinator answers", lambda: client(address, "places").returncode == 0, timeout=60)
        exporter = subprocess.Popen([BIN / "labgrid-exporter", "--coordinator", address, "--name", "exp",
                                     str(tmp / "exporter.yaml")], stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
        until("the exporter's resources", lambda: "exp/pool-c/NetworkService" in client(address, "resources").stdout,
              timeout=60)
        for place, group, tags in (("pi-lab-1", "pi-group", "board=pi-zero2"), ("pi-lab-2", "pool-b", "farm=pool"),
                                   ("pi-lab-3", "pool-c", "farm=pool")):
            for step in (["create"], ["add-match", f"exp/{group}/NetworkService"], ["set-tags", tags]):
                assert client(address, "-p", place, *step).returncode == 0
        yield address
    finally:
        for p in (exporter, coordinator):
            if p is not None:
                p.terminate()
                p.wait(30)


@pytest.fixture
def lab(coordinator, farm, tmp_path):
    """The lab and an inventory naming pi-lab-1 by place and by tags; every runner is held until GO."""
    wrapper, log, go = held_python(tmp_path)
    common = {"key": str(farm["key"]), "python": str(wrapper), "runtimes": ["ort"], "threads": 1}
    inv = tmp_path / "targets.toml"
    inv.write_text("".join(
        f"[targets.{name}]\nlabgrid = {{ coordinator = \"{coordinator}\", {where} }}\nworkdir = \"{tmp_path / name}\"\n"
        + "".join(f"{k} = {json.dumps(v)}\n" for k, v in common.items())
        for name, where in (("by-place", 'place = "pi-lab-1"'), ("by-tags", 'tags = { board = "pi-zero2" }'))))
    return {"address": coordinator, "inventory": inv, "log": log, "go": go, "env": farm["env"], "tmp": tmp_path,
            "key": farm["key"]}


def client(address: str, *args) -> subprocess.CompletedProcess:
    return subprocess.run([BIN / "labgrid-client", "-x", address, *args], capture_output=True, text=True, timeout=60)


def acquired(lab, place: str = "pi-lab-1") -> str:
    """Who holds the place now, as labgrid says it ("None" when no one)."""
    shown = client(lab["address"], "-p", place, "show").stdout
    return next(line.split(":", 1)[1].strip() for line in shown.splitlines() if line.strip().startswith("acquired:"))


def launch(lab, results: str, target: str, err: Path) -> subprocess.Popen:
    return subprocess.Popen([sys.executable, "-m", "zobench", "run", "--results", str(lab["tmp"] / results), "--no-report",
                             "--inventory", str(lab["inventory"]), "--target", target, *ONE_JOB], cwd=REPO,
                            stdout=subprocess.DEVNULL, stderr=open(err, "w"), text=True, env={**os.environ, **lab["env"]})


def test_a_run_reserves_locks_runs_on_and_releases_a_place_and_a_second_waits_in_the_queue(lab):
    tmp = lab["tmp"]
    first = launch(lab, "ra", "by-place", tmp / "a.err")
    until("the first run's runner is on the board", lab["log"].is_file, first)
    assert acquired(lab) != "None"                                  # locked for the first run
    second = launch(lab, "rb", "by-tags", tmp / "b.err")
    until("the second run waits in labgrid's queue",
          lambda: "waiting in labgrid's queue for a place tagged board=pi-zero2" in (tmp / "b.err").read_text(), second)
    lab["go"].touch()
    assert first.wait(300) == 0 and second.wait(300) == 0, (tmp / "a.err").read_text() + (tmp / "b.err").read_text()
    for results in ("ra", "rb"):
        store = Store(tmp / results)
        (r,) = store.results(store.latest())
        assert r["status"] == "ok" and r["env"]["probe"]["cores"] >= 1
    assert acquired(lab) == "None"                                  # released after each
    assert client(lab["address"], "reservations").stdout.strip() == ""   # and no reservation left waiting


def test_ctrl_c_releases_the_place(lab):
    tmp = lab["tmp"]
    run = launch(lab, "ra", "by-place", tmp / "a.err")
    until("the runner is on the board", lab["log"].is_file, run)
    assert acquired(lab) != "None"
    run.send_signal(signal.SIGINT)
    assert run.wait(120) == 130, (tmp / "a.err").read_text()
    assert acquired(lab) == "None" and "Traceback" not in (tmp / "a.err").read_text()
    lab["go"].touch()       # the runner is killed; nothing may wait on the file


def test_a_labgrid_target_with_neither_place_nor_tags_is_one_line(tmp_path):
    inv = tmp_path / "targets.toml"
    inv.write_text('[targets.lab]\nlabgrid = { coordinator = "127.0.0.1:1" }\n')
    p = zobench("targets", "list", "--inventory", inv)
    assert p.returncode == 2 and p.stderr.strip() == (
        f"zobench: error: {inv}: targets.lab.labgrid.place: expected a place or tags "
        "(a table like { board = \"pi-zero2\" }), one of them")


def test_a_labgrid_pool_takes_as_many_matching_places_as_it_has_members_and_releases_them(lab):
    """Two slots of a pool tagged farm=pool: the lab's coordinator hands out pi-lab-2 and pi-lab-3.
    Each slot's first job waits at a rendezvous for the other's, so both places run jobs (the
    loopback boards share this machine's files, hence no lease and the rendezvous by mkdir)."""
    tmp = lab["tmp"]
    meet = tmp / "meet"
    hook = hooked_python(tmp / "pool-python", f"if mkdir {meet}-1 2>/dev/null; then i=0; while [ ! -d {meet}-2 ] && "
                                              f"[ $i -lt 1200 ]; do sleep 0.1; i=$((i+1)); done; else mkdir -p {meet}-2; fi")
    with open(lab["inventory"], "a") as f:
        f.write(f'[targets.pool]\nlabgrid = {{ coordinator = "{lab["address"]}", tags = {{ farm = "pool" }} }}\n'
                f'members = 2\nworkdir = "{tmp / "pool"}"\nlease = false\nkey = "{lab["key"]}"\n'
                f'python = "{hook}"\nruntimes = ["cpp"]\narch = "{platform.machine()}"\nthreads = 1\n')
    # on the C++ binary: the places are what is tested, and its jobs import no torch on the boards
    p = zobench("run", "--results", tmp / "rp", "--no-report", "--inventory", lab["inventory"], "--target", "pool",
                *TINY_CPP, "--method", "full-zo", "--method", "full-bp", "--method", "elastic-zo:1", env=lab["env"],
                timeout=600)
    assert p.returncode == 0, p.stderr
    store = Store(tmp / "rp")
    results = store.results(store.latest())
    assert len(results) == 3 and all(r["status"] == "ok" and r["job"]["target"] == "pool" for r in results)
    assert {r["pool"]["member"] for r in results} == {"pi-lab-2", "pi-lab-3"}, p.stderr
    assert client(lab["address"], "reservations").stdout.strip() == ""
    assert acquired(lab, "pi-lab-2") == acquired(lab, "pi-lab-3") == "None"
