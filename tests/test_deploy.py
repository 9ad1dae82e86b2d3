"""Deploying a bundle to a board (harness/preparation/deploy.py), against real OpenSSH servers on loopback
(testkit/sshd.py): the board's workdir is a folder of this machine, so the tests look at it
directly."""
import os
import shlex
import shutil
import threading
from contextlib import closing
from pathlib import Path

import pytest

from harness.planning import inventory
from harness.preparation.artifacts import content_id
from harness.preparation.bundle import bundle_files
from harness.preparation.deploy import deploy
from harness.boards.ssh import SshTransport
from harness.boards.transport import TransportError

from testkit.sshd import board_toml

DATA = "data/fashion-mnist/fashion-mnist/train-images-idx3-ubyte"


# board-b sends files over SFTP; board-e's sshd has none, so they go as a tar stream (issue 61)
BOARDS = {"board-b": "sftp", "board-e": "tar"}


def transports(farm, tmp_path, names: list[str], board: str = "board-b") -> list[SshTransport]:
    """A connected transport per target; the targets are all `board`, with one workdir."""
    inv = tmp_path / "inventory.toml"
    inv.write_text("".join(board_toml(n, farm["boards"][board], farm["key"], tmp_path / "work") for n in names))
    out = [SshTransport(t) for t in inventory.resolve(names, inv)]
    for t in out:
        t.connect()
        assert t.transfer() == BOARDS[board]
    return out


@pytest.fixture(params=sorted(BOARDS))
def board(farm, tmp_path, request):
    (t,) = transports(farm, tmp_path, ["b"], request.param)
    with closing(t):
        yield t


def small_bundle(folder: Path) -> dict[str, Path]:
    """Six files of random bytes, laid out as a bundle is (code, data, weights, graph, binary)."""
    sizes = {"workloads/a.py": 3_000, "workloads/b.py": 5_000, DATA: 400_000, "init/lenet5-seed0.f32": 430_000,
             "onnx/lenet5-front4.onnx": 20_000, "bin/zobench-train": 900_000}
    files = {}
    for rel, size in sizes.items():
        files[rel] = folder / rel
        files[rel].parent.mkdir(parents=True, exist_ok=True)
        files[rel].write_bytes(os.urandom(size))
    return files


def assert_complete(bundle: str, files: dict[str, Path]) -> None:
    """The bundle holds exactly these files, byte for byte, and is marked complete."""
    root = Path(bundle)
    assert sorted(str(p.relative_to(root)) for p in root.rglob("*") if p.is_file()) == sorted([*files, ".complete"])
    for rel, src in files.items():
        assert (root / rel).read_bytes() == src.read_bytes(), rel
    assert os.access(root / "bin" / "zobench-train", os.X_OK)


def leftovers(work: Path) -> list[Path]:
    """Part files and assembly folders: what a deploy must never leave behind."""
    return [p for p in work.rglob("*") if ".part-" in p.name]


def test_deploy_sends_only_what_changed_and_never_uses_a_half_sent_bundle(board, tmp_path):
    workdir = str(tmp_path / "deploy work")
    files = bundle_files({("fashion-mnist", "", 0.0, 0, 0)})
    first = deploy(board, workdir, files)
    sent_first = board.bytes_sent
    assert sent_first == sum(p.stat().st_size for p in files.values())   # every distinct file once
    board.bytes_sent = 0
    assert deploy(board, workdir, files) == first
    assert board.bytes_sent == 0                                             # the second deploy sends nothing
    changed = tmp_path / "zrng_changed.py"
    changed.write_text(files["workloads/zrng.py"].read_text() + "\n# changed\n")
    second = deploy(board, workdir, {**files, "workloads/zrng.py": changed})
    assert second != first and board.bytes_sent == changed.stat().st_size    # only the changed file crossed
    # a half-assembled bundle (no .complete) is not taken as deployed: it is rebuilt
    board.exec(f"rm {shlex.quote(second + '/.complete')} {shlex.quote(second + '/workloads/loop.py')}")
    board.bytes_sent = 0
    assert deploy(board, workdir, {**files, "workloads/zrng.py": changed}) == second
    assert Path(second, "workloads", "loop.py").is_file() and Path(second, ".complete").is_file()
    assert board.bytes_sent == 0                                             # its objects were all there
    assert leftovers(Path(workdir)) == []


def test_a_copy_that_fails_half_way_completes_nothing_and_the_next_deploy_finishes(board, tmp_path):
    files, work = small_bundle(tmp_path / "src"), tmp_path / "work"
    ids = {rel: content_id(p) for rel, p in files.items()}
    # a directory where the fourth file's object belongs: neither ln nor cp can place it, and the
    # files after it can (an `ln || cp && ...` chain went on and marked the bundle complete)
    middle = list(files)[3]
    blocker = work / "objects" / ids[middle][0]
    (blocker / "in the way").mkdir(parents=True)
    with pytest.raises(TransportError) as e:
        deploy(board, str(work), files)
    assert str(e.value).startswith(f"{board.where}: cannot assemble the bundle in {work}: {middle}: cp: ")
    assert "directory" in str(e.value)
    assert list((work / "bundles").iterdir()) == []       # no bundle, and no half-assembled folder
    for rel, (digest, _) in ids.items():                  # what was sent arrived whole and stays
        assert rel == middle or (work / "objects" / digest).read_bytes() == files[rel].read_bytes()
    shutil.rmtree(blocker)
    board.bytes_sent = 0
    bundle = deploy(board, str(work), files)
    assert board.bytes_sent == files[middle].stat().st_size
    assert_complete(bundle, files)
    assert leftovers(work) == []


def test_an_object_damaged_on_the_board_is_refused_removed_and_sent_again(board, tmp_path):
    files, work = small_bundle(tmp_path / "src"), tmp_path / "work"
    first = deploy(board, str(work), files)
    digest, size = content_id(files[DATA])
    damaged = work / "objects" / digest
    damaged.unlink()                                      # a new inode: the first bundle keeps its link
    damaged.write_bytes(files[DATA].read_bytes()[:1000])
    code = tmp_path / "a.py"
    code.write_text("changed = True\n")
    changed = {**files, "workloads/a.py": code}           # a new bundle that reuses the damaged object
    with pytest.raises(TransportError) as e:
        deploy(board, str(work), changed)
    assert str(e.value) == (f"{board.where}: cannot assemble the bundle in {work}: {DATA}: 1000 bytes on the "
                            f"target instead of {size}; its damaged copy there is removed, deploy again")
    assert not damaged.exists()
    assert [p.name for p in (work / "bundles").iterdir()] == [Path(first).name]
    assert_complete(first, files)
    board.bytes_sent = 0
    second = deploy(board, str(work), changed)
    assert board.bytes_sent == size                       # only the removed object crossed again
    assert_complete(second, changed)
    assert leftovers(work) == []


@pytest.mark.parametrize("name", sorted(BOARDS))
def test_targets_on_one_board_and_workdir_deploying_at_once_all_get_the_whole_bundle(farm, tmp_path, name):
    """Four targets naming one board and workdir, deploying one bundle at the same moment, three
    times: they send the same objects and assemble the same bundle side by side."""
    ts = transports(farm, tmp_path, ["b1", "b2", "b3", "b4"], name)
    work = tmp_path / "work"
    try:
        for round in range(3):
            files = small_bundle(tmp_path / f"src{round}")
            start, got, errors = threading.Barrier(len(ts)), [], []

            def go(t):
                start.wait()
                try:
                    got.append(deploy(t, str(work), files))
                except Exception as e:      # noqa: BLE001 -- any failure is this test's finding
                    errors.append(f"{type(e).__name__}: {e}")

            threads = [threading.Thread(target=go, args=(t,)) for t in ts]
            for th in threads:
                th.start()
            for th in threads:
                th.join()
            assert errors == [] and len(got) == len(ts) and len(set(got)) == 1
            assert_complete(got[0], files)
    finally:
        for t in ts:
            t.close()
    assert len(list((work / "bundles").iterdir())) == 3
    assert leftovers(work) == []
