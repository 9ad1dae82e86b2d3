"""Boards whose SSH server has no SFTP subsystem (Dropbear, the sshd of a small embedded image;
issue 61, item 15): files travel as a tar stream over an exec channel instead. Against real
OpenSSH servers on loopback (testkit/sshd.py), board-e's with no `Subsystem sftp` line."""
import getpass
import json
import platform
import re
from contextlib import closing
from pathlib import Path

import pytest

from harness.boards.ssh import SshTransport
from harness.boards.transport import TransportError
from harness.planning import inventory
from harness.stores.store import Store
from zobench.cli import main

from testkit.runners import SHORT, in_process, zobench
from testkit.sshd import board_toml

KINDS = {"board-e": "tar", "board-a": "sftp"}


def transport(farm, tmp_path, board: str) -> SshTransport:
    inv = tmp_path / "inventory.toml"
    inv.write_text(board_toml(board, farm["boards"][board], farm["key"], tmp_path / "work"))
    (target,) = inventory.resolve([board], inv)
    t = SshTransport(target)
    t.connect()
    return t


def test_the_sshd_of_board_e_really_has_no_sftp(farm):
    """The premise: a plain SFTP session to board-e is refused (as `Channel closed.`)."""
    import paramiko

    b = farm["boards"]["board-e"]
    assert "Subsystem" not in (b.dir / "sshd_config").read_text()
    client = paramiko.SSHClient()
    client.set_missing_host_key_policy(paramiko.AutoAddPolicy())
    client.connect("127.0.0.1", port=b.port, username=getpass.getuser(), key_filename=str(farm["key"]),
                   look_for_keys=False, allow_agent=False)
    try:
        with pytest.raises(paramiko.SSHException):
            client.open_sftp()
    finally:
        client.close()


def test_a_cpp_job_runs_end_to_end_on_a_board_without_sftp(farm, native, tmp_path):
    inv = tmp_path / "inventory.toml"
    inv.write_text(board_toml("board-e", farm["boards"]["board-e"], farm["key"], tmp_path / "work",
                              runtimes=["cpp"], arch=platform.machine()))
    assert main(["run", "--results", str(tmp_path / "results"), "--inventory", str(inv), "--target", "board-e",
                 "--method", "full-zo", "--no-report", *SHORT]) == 0
    store = Store(tmp_path / "results")
    (r,) = store.results(store.latest())
    assert r["status"] == "ok", r["error"]
    assert r["job"]["runtime"] == "cpp" and r["steps"] == 10
    assert r["env"]["probe"]["transfer"] == "tar"
    probe = json.loads((store.runs / store.latest() / "probes" / "board-e.json").read_text())
    assert probe["transfer"] == "tar"
    # the bundle arrived whole on the board, its binary executable, and nothing half-sent is left
    (bundle,) = (tmp_path / "work" / "bundles").iterdir()
    assert (bundle / ".complete").is_file() and (bundle / "bin" / "zobench-train").stat().st_mode & 0o111
    assert not [p for p in (tmp_path / "work").rglob("*") if ".part-" in p.name]


@pytest.mark.parametrize("board", sorted(KINDS))
def test_probe_reports_the_transfer_the_board_supports(farm, tmp_path, board):
    path = tmp_path / "inv.toml"
    path.write_text(board_toml(board, farm["boards"][board], farm["key"], tmp_path / "w"))
    out = zobench("targets", "probe", board, "--inventory", path, "--json", env=farm["env"])
    assert out.returncode == 0, out.stderr
    assert json.loads(out.stdout)["transfer"] == KINDS[board]
    text = in_process("targets", "probe", board, "--inventory", path)
    assert re.search(rf"^transfer +{KINDS[board]}$", text.stdout, re.M), text.stdout


def test_this_machine_reports_a_local_transfer():
    out = in_process("targets", "probe", "local", "--json")
    assert out.returncode == 0, out.stderr
    assert json.loads(out.stdout)["transfer"] == "local"


@pytest.mark.parametrize("board", sorted(KINDS))
def test_put_and_get_round_trip_without_leftovers(farm, tmp_path, board):
    with closing(transport(farm, tmp_path, board)) as t:
        assert t.transfer() == KINDS[board]
        there = tmp_path / "on the board $(x) 'q'"
        there.mkdir()
        src = tmp_path / "src.bin"
        src.write_bytes(bytes(range(256)) * 4001)
        t.put(src, str(there / "a file.bin"))
        t.put_bytes(b'{"x": 1}', str(there / "spec.json"))
        assert (there / "a file.bin").read_bytes() == src.read_bytes()
        assert (there / "spec.json").read_bytes() == b'{"x": 1}'
        assert t.bytes_sent == src.stat().st_size + 8
        back = tmp_path / "back.bin"
        assert t.get(str(there / "a file.bin"), back) and back.read_bytes() == src.read_bytes()
        assert not t.get(str(there / "missing.json"), tmp_path / "missing.json")
        assert not (tmp_path / "missing.json").exists()
        assert sorted(p.name for p in there.iterdir()) == ["a file.bin", "spec.json"]
        assert sorted(p.name for p in tmp_path.iterdir() if ".part-" in p.name) == []


@pytest.mark.parametrize("board", sorted(KINDS))
def test_a_failing_transfer_names_the_step_in_one_line(farm, tmp_path, board):
    """Which board, put or get, which file, over what, and the board's reason; one line."""
    with closing(transport(farm, tmp_path, board)) as t:
        (tmp_path / "not-a-folder").write_text("")
        src = tmp_path / "weights.bin"
        src.write_bytes(b"w" * 1000)
        remote = str(tmp_path / "not-a-folder" / "weights.bin")
        with pytest.raises(TransportError) as put:
            t.put(src, remote)
        (folder := tmp_path / "a folder").mkdir()
        with pytest.raises(TransportError) as get:
            t.get(str(folder), tmp_path / "got.json")
    port = farm["boards"][board].port
    for e, step in ((put, f"put {src} to {remote}"), (get, f"get {folder} to {tmp_path / 'got.json'}")):
        text = str(e.value)
        assert "\n" not in text and text.startswith(f"{board} (") and f":{port}): " in text, text
        assert f": {step} over {KINDS[board]} failed: " in text, text
        assert text.split(" failed: ", 1)[1].strip(), text        # and why
    assert not (tmp_path / "got.json").exists()
    assert not [p for p in tmp_path.rglob("*") if ".part-" in p.name]


def test_a_deploy_whose_put_fails_fails_the_jobs_naming_the_file(farm, tmp_path):
    """A real run: the board's objects/ is a folder nothing can be written to (/proc, even by
    root), so the first object sent fails; each job's error is that put, named, in one line."""
    work = tmp_path / "work"
    work.mkdir()
    (work / "objects").symlink_to("/proc")
    inv = tmp_path / "inventory.toml"
    inv.write_text(board_toml("board-e", farm["boards"]["board-e"], farm["key"], work))
    out = zobench("run", "--results", tmp_path / "results", "--inventory", inv, "--target", "board-e",
                  "--method", "full-zo", "--runtime", "torch", "--no-report", *SHORT, env=farm["env"])
    assert out.returncode == 1 and "Traceback" not in out.stderr, out.stderr
    store = Store(tmp_path / "results")
    (r,) = store.results(store.latest())
    assert r["status"] == "failed"
    assert re.fullmatch(rf"board-e \(\S+:{farm['boards']['board-e'].port}\): put /\S+ to {work}/objects/[0-9a-f]{{64}} "
                        r"over tar failed: .+", r["error"]), r["error"]


def test_a_board_with_neither_sftp_nor_tar_fails_its_probe_in_one_line(tmp_path):
    """Nothing could be deployed to it: the probe says so, rather than passing the board."""
    from testkit.sshd import client_home, make_farm

    # its sessions find no tar (nor anything else) on their PATH
    (b,), key = make_farm(tmp_path / "sshd", ["bare"], no_sftp=("bare",), session_env="PATH=/nonexistent")
    try:
        home = client_home(tmp_path / "home", [b])
        path = tmp_path / "inv.toml"
        path.write_text(board_toml("bare", b, key, tmp_path / "w"))
        out = zobench("targets", "probe", "bare", "--inventory", path, env={"HOME": str(home)})
    finally:
        b.stop()
    assert out.returncode == 1 and "Traceback" not in out.stderr, out.stderr
    assert out.stderr.strip() == (f"zobench: bare: bare (root@127.0.0.1:{b.port}): no way to send files: its SSH "
                                  "server has no SFTP (Channel closed.) and the board has no tar".replace(
                                      "root", getpass.getuser()))
