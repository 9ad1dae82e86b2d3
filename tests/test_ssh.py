"""Benchmarking boards over SSH, against real OpenSSH servers on loopback (tests/sshd.py)."""
import getpass
import json
import os
import platform
import pwd
import subprocess
import sys
import threading
import time
import uuid
from pathlib import Path

import pytest

from harness.stores import schema
from zobench.cli import main
from harness.stores.store import Store

from testkit.runners import SHORT, zobench
from testkit.sshd import board_toml, free_port, keygen

# a board that runs the C++ binary, for the tests of what every runtime's job goes through (a
# board's parallel runs, an unreachable one, a quoted workdir): no interpreter to start and no
# torch to import on the board, about 3 s of CPU a job less
CPP = {"runtimes": ["cpp"], "arch": platform.machine()}



@pytest.fixture(scope="module")
def inv(farm, tmp_path_factory):
    d = tmp_path_factory.mktemp("inv")
    b, key = farm["boards"], farm["key"]
    text = "".join(board_toml(n, b[n], key, d / n / "work") for n in ("board-a", "board-b", "board-c"))
    path = d / "inventory.toml"
    path.write_text(text)
    return {"path": path, "dir": d}


def run(inv_path, results, *args) -> int:
    return main(["run", "--results", str(results), "--inventory", str(inv_path), "--no-report", *SHORT, *args])


def ssh(farm, board, command: str) -> str:
    b = farm["boards"][board]
    return subprocess.run(["ssh", "-i", str(farm["key"]), "-p", str(b.port), "-o", "BatchMode=yes",
                           "-o", f"UserKnownHostsFile={farm['home'] / '.ssh' / 'known_hosts'}",
                           "127.0.0.1", command], capture_output=True, text=True, timeout=30).stdout


def test_ssh_run_gives_the_same_schema_as_local_plus_the_probe(inv, tmp_path):
    assert run(inv["path"], tmp_path, "--target", "board-a", "--method", "elastic-zo:1") == 0
    store = Store(tmp_path)
    (r,) = store.results(store.latest())
    assert r["status"] == "ok" and schema.problems(r) == []
    assert r["job"]["target"] == "board-a" and r["steps"] == 10
    assert r["env"]["probe"]["mem_total_bytes"] > 0 and r["env"]["probe"]["disk_free_bytes"] > 0
    # it really ran in the bundle deployed to the board's workdir, on the board's copy of the data
    assert "/work/bundles/" in r["job"]["workload"]["data_dir"]
    probe = json.loads((store.runs / store.latest() / "probes" / "board-a.json").read_text())
    assert probe["cores"] >= 1 and probe["versions"]["torch"]


def test_three_boards_run_in_parallel(farm, tmp_path):
    path = tmp_path / "inv.toml"
    path.write_text("".join(board_toml(n, farm["boards"][n], farm["key"], tmp_path / n, **CPP)
                            for n in ("board-a", "board-b", "board-c")))
    rc = run(path, tmp_path / "res", "--target", "board-a", "--target", "board-b", "--target", "board-c",
             "--method", "full-zo")
    assert rc == 0
    store = Store(tmp_path / "res")
    results = store.results(store.latest())
    assert sorted(r["job"]["target"] for r in results) == ["board-a", "board-b", "board-c"]
    assert all(r["status"] == "ok" for r in results)
    # the same job on three boards of the same machine: identical training
    assert len({r["model"]["weights_sha256"] for r in results}) == 1
    assert len(list((store.runs / store.latest() / "probes").glob("*.json"))) == 3


def test_hung_runner_times_out_and_leaves_no_process_on_the_board(farm, inv, tmp_path):
    rc = run(inv["path"], tmp_path, "--target", "board-a", "--method", "full-zo", "--set", "fault=hang",
             "--timeout", "8")
    assert rc == 1
    store = Store(tmp_path)
    (r,) = store.results(store.latest())
    assert r["status"] == "timeout" and "process group was killed" in r["error"]
    assert "fault" in ssh(farm, "board-a", "cat /proc/self/status >/dev/null; echo fault")  # the board answers
    left = ssh(farm, "board-a", "ps -eo pid,args")
    assert "workloads.torch_runner" not in left or store.latest() not in left
    assert not [l for l in left.splitlines() if "torch_runner" in l and "hang" in l]
    assert "jobs/" + store.latest() not in left


def test_sshd_stopped_mid_job_is_lost_others_kept_and_resume_completes(farm, inv, tmp_path):
    board = farm["boards"]["board-b"]
    stopped = threading.Event()

    def stop_when_second_job_trains():
        deadline = time.monotonic() + 120
        while time.monotonic() < deadline:
            logs = list(tmp_path.glob("runs/*/work/*full-zo*/stdout.log"))
            if logs and '"start"' in logs[0].read_text():
                board.stop()
                stopped.set()
                return
            time.sleep(0.2)

    watcher = threading.Thread(target=stop_when_second_job_trains)
    watcher.start()
    rc = run(inv["path"], tmp_path, "--target", "board-b", "--method", "full-bp", "--method", "full-zo",
             "--set", "epochs=50")     # long enough for the watcher to stop the board mid-job
    watcher.join()
    assert stopped.is_set() and rc == 1
    store = Store(tmp_path)
    run_id = store.latest()
    r = {x["job"]["method"]: x for x in store.results(run_id)}
    assert r["full-bp"]["status"] == "ok"
    assert r["full-zo"]["status"] == "lost" and "lost" in r["full-zo"]["error"]
    board.start()
    bp_before = (store.runs / run_id / "board-b.torch.full-bp.fp32.r0.json").read_bytes()
    assert main(["run", "--results", str(tmp_path), "--inventory", str(inv["path"]), "--no-report",
                 "--resume", run_id]) == 0
    r = {x["job"]["method"]: x for x in store.results(run_id)}
    assert r["full-zo"]["status"] == "ok" and r["full-zo"]["steps"] == 50 * 10
    assert (store.runs / run_id / "board-b.torch.full-bp.fp32.r0.json").read_bytes() == bp_before


def test_low_mem_limit_is_reported_as_oom(farm, inv, tmp_path):
    path = tmp_path / "inv.toml"
    path.write_text(board_toml("small-board", farm["boards"]["board-c"], farm["key"], tmp_path / "w",
                               mem_limit="120M"))
    assert run(path, tmp_path / "res", "--target", "small-board", "--method", "full-zo") == 1
    store = Store(tmp_path / "res")
    (r,) = store.results(store.latest())
    assert r["status"] == "oom", r["error"]


def test_unknown_host_key_is_refused_naming_host_and_fingerprint(farm, tmp_path):
    b = farm["boards"]["board-d"]
    path = tmp_path / "inv.toml"
    path.write_text(board_toml("d", b, farm["key"], tmp_path / "w"))
    p = subprocess.run(["ssh-keygen", "-lf", str(b.dir / "host_key.pub")], capture_output=True, text=True)
    fp = p.stdout.split()[1]                                     # SHA256:...
    out = zobench("targets", "probe", "d", "--inventory", path, env=farm["env"])
    assert out.returncode == 1
    assert "unknown host key for [127.0.0.1]:" + str(b.port) in out.stderr and fp in out.stderr
    assert "Traceback" not in out.stderr and len(out.stderr.strip().splitlines()) == 1


def test_accept_new_records_the_key_and_then_refuses_a_changed_one(farm, tmp_path):
    b = farm["boards"]["board-d"]
    path = tmp_path / "inv.toml"
    path.write_text(board_toml("d", b, farm["key"], tmp_path / "w", host_key="accept-new"))
    record = farm["home"] / ".config" / "zobench" / "known_hosts"
    ok = zobench("targets", "probe", "d", "--inventory", path, "--json", env=farm["env"])
    assert ok.returncode == 0, ok.stderr
    assert json.loads(ok.stdout)["cores"] >= 1
    assert b.host_pub.split()[1] in record.read_text()
    # the board is reinstalled: new host key, same address
    b.stop()
    (b.dir / "host_key").unlink()
    (b.dir / "host_key.pub").unlink()
    b.host_pub = keygen(b.dir / "host_key")
    b.start()
    bad = zobench("targets", "probe", "d", "--inventory", path, env=farm["env"])
    assert bad.returncode == 1 and "CHANGED" in bad.stderr and "refusing" in bad.stderr


def test_wrong_key_gives_a_clear_authentication_error(farm, tmp_path):
    other = tmp_path / "other_key"
    keygen(other)
    path = tmp_path / "inv.toml"
    path.write_text(board_toml("a", farm["boards"]["board-a"], other, tmp_path / "w"))
    out = zobench("targets", "probe", "a", "--inventory", path, env=farm["env"])
    assert out.returncode == 1 and "authentication failed for" in out.stderr and str(other) in out.stderr
    assert "Traceback" not in out.stderr


def test_unreachable_board_fails_its_jobs_with_the_reason_and_others_run(farm, tmp_path):
    path = tmp_path / "inv.toml"
    dead = type("B", (), {"port": free_port()})()
    path.write_text(board_toml("board-c", farm["boards"]["board-c"], farm["key"], tmp_path / "c", **CPP)
                    + board_toml("gone", dead, farm["key"], tmp_path / "w", **CPP))
    assert run(path, tmp_path / "res", "--target", "gone", "--target", "board-c", "--method", "full-zo") == 1
    store = Store(tmp_path / "res")
    r = {x["job"]["target"]: x for x in store.results(store.latest())}
    assert r["board-c"]["status"] == "ok"
    assert r["gone"]["status"] == "failed" and "cannot reach" in r["gone"]["error"]


def test_workdirs_with_shell_metacharacters_inject_nothing(farm, tmp_path):
    """Board names are refused unless plain (tests/test_cli_errors.py); a workdir is a free
    path, so it must reach the board's shell quoted."""
    marker = Path(f"/tmp/zobench-injected-{uuid.uuid4().hex}")
    workdir = tmp_path / f"zo bench $(touch {marker}); `touch {marker}` & | <> 'q' \"d\""
    path = tmp_path / "inv.toml"
    path.write_text(board_toml("plain-board", farm["boards"]["board-c"], farm["key"], workdir, **CPP))
    assert run(path, tmp_path / "res", "--target", "plain-board", "--method", "full-zo") == 0
    store = Store(tmp_path / "res")
    (r,) = store.results(store.latest())
    assert r["status"] == "ok"
    assert (workdir / "bundles").is_dir()                       # the literal folder name was used
    assert not marker.exists()


def test_an_ssh_config_alias_is_a_host(farm, tmp_path):
    b = farm["boards"]["board-c"]
    config = farm["home"] / ".ssh" / "config"
    config.write_text(f"Host labpi\n  HostName 127.0.0.1\n  Port {b.port}\n  User {getpass.getuser()}\n"
                      f"  IdentityFile {farm['key']}\n")
    try:
        path = tmp_path / "inv.toml"
        path.write_text(f'[targets.pi]\nhost = "labpi"\npython = {json.dumps(sys.executable)}\n'
                        f'workdir = {json.dumps(str(tmp_path / "w"))}\n')
        out = zobench("targets", "probe", "pi", "--inventory", path, "--json", env=farm["env"])
        assert out.returncode == 0, out.stderr
        assert json.loads(out.stdout)["disk_free_bytes"] > 0
    finally:
        config.unlink()


def test_an_ort_job_runs_on_the_board_from_the_deployed_graph(farm, tmp_path):
    inv = tmp_path / "inventory.toml"
    inv.write_text(board_toml("board-c", farm["boards"]["board-c"], farm["key"], tmp_path / "work", runtimes=["ort"]))
    assert run(inv, tmp_path / "results", "--target", "board-c", "--method", "elastic-zo:1") == 0
    store = Store(tmp_path / "results")
    (r,) = store.results(store.latest())
    assert r["status"] == "ok" and r["job"]["runtime"] == "ort" and r["steps"] == 10
    graph = r["job"]["onnx_model"]
    assert "/work/bundles/" in graph and "/onnx/lenet5-front4-" in graph


def test_a_malformed_known_hosts_line_is_named_not_a_traceback(farm, tmp_path):
    home = tmp_path / "home"
    (home / ".ssh").mkdir(parents=True)
    good = (farm["home"] / ".ssh" / "known_hosts").read_text()
    (home / ".ssh" / "known_hosts").write_text(good + "pi.lan ssh-ed25519 AAAA!!notbase64\n")
    path = tmp_path / "inv.toml"
    path.write_text(board_toml("a", farm["boards"]["board-a"], farm["key"], tmp_path / "w"))
    out = zobench("targets", "probe", "a", "--inventory", path, env={"HOME": str(home)})
    n = len(good.splitlines()) + 1
    assert out.returncode == 1 and "Traceback" not in out.stderr and len(out.stderr.strip().splitlines()) == 1
    assert f"{home / '.ssh' / 'known_hosts'}: line {n}: not a known_hosts entry (" in out.stderr


def test_a_workdir_that_is_the_boards_root_is_refused(farm, tmp_path):
    """Literally (the inventory's error) or once ~ is expanded on the board (its jobs fail,
    and nothing is written to /)."""
    path = tmp_path / "inv.toml"
    path.write_text(board_toml("a", farm["boards"]["board-a"], farm["key"], "/tmp/.."))
    out = zobench("run", "--inventory", path, "--target", "a", "--results", tmp_path / "res", *SHORT, env=farm["env"])
    assert out.returncode == 2 and out.stderr.strip() == (
        f"zobench: error: {path}: targets.a.workdir: expected a folder of zobench's own, like \"~/zobench\", not the root /")
    up = "/".join([".."] * (len(Path(pwd.getpwuid(os.getuid()).pw_dir).parts) - 1))      # ~/.. up to /
    path.write_text(board_toml("a", farm["boards"]["board-a"], farm["key"], f"~/{up}"))
    before = set(Path("/").iterdir())
    assert run(path, tmp_path / "res", "--target", "a", "--method", "full-zo") == 1
    store = Store(tmp_path / "res")
    (r,) = store.results(store.latest())
    assert r["status"] == "failed" and f"targets.a.workdir '~/{up}' is / there; give zobench a folder of its own" in r["error"]
    assert set(Path("/").iterdir()) == before
    # a workdir that is a symlink to / (issue 47): resolved on the board, and refused the same way
    (tmp_path / "to-root").symlink_to("/")
    path.write_text(board_toml("a", farm["boards"]["board-a"], farm["key"], str(tmp_path / "to-root")))
    assert run(path, tmp_path / "res", "--target", "a", "--method", "full-zo") == 1
    (r,) = store.results(store.latest())
    assert r["status"] == "failed" and "resolves to / there, a system folder; give zobench a folder of its own" in r["error"]
    assert set(Path("/").iterdir()) == before


# the server reads the client's first bytes and then resets (paramiko mostly sees an EOF), or
# resets with them unread while the handshake is under way (paramiko's reading thread sees the
# reset and logs it, which once printed a second line): which one a run sees was a race under load
@pytest.mark.parametrize("reads", [True, False], ids=["reads-then-resets", "resets-mid-handshake"])
def test_a_server_that_resets_after_its_banner_is_one_line(tmp_path, reads):
    """Issue 47: a port that answers with an SSH banner and then resets the connection (a dying
    sshd, a port forwarder): probe says so in one line, exit 1, with no paramiko traceback or log."""
    import re
    import socket
    import struct

    server = socket.create_server(("127.0.0.1", 0))

    def banner_then_reset():
        while True:
            try:
                c, _ = server.accept()
            except OSError:
                return
            c.sendall(b"SSH-2.0-OpenSSH_9.2p1\r\n")
            if reads:
                c.recv(100)
            else:
                time.sleep(0.2)     # the client's banner and key exchange arrive, unread: the close is a reset
            c.setsockopt(socket.SOL_SOCKET, socket.SO_LINGER, struct.pack("ii", 1, 0))    # close with a reset
            c.close()

    threading.Thread(target=banner_then_reset, daemon=True).start()
    port = server.getsockname()[1]
    inv = tmp_path / "inv.toml"
    inv.write_text(f'[targets.reset]\nhost = "127.0.0.1"\nport = {port}\nuser = "nobody"\n'
                   'arch = "x86_64"\nhost_key = "accept-new"\n')
    try:
        r = zobench("targets", "probe", "reset", "--inventory", inv, env={"HOME": str(tmp_path)})
    finally:
        server.close()
    assert r.returncode == 1 and "Traceback" not in r.stderr, r.stderr
    (line,) = r.stderr.strip().splitlines()
    assert re.fullmatch(re.escape(f"zobench: reset: cannot reach nobody@127.0.0.1:{port}: the server closed the "
                                  "connection during the SSH handshake (") +
                        r"(EOFError|\[Errno 104\] Connection reset by peer)\)", line), line
