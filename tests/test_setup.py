"""Setting up a machine: scripts/ensure-deps.sh and the fixtures on one without apt, where a
missing tool is named once and the tests that need it are skipped, never errors. PATH is cut
down to a folder of links to the tools a case keeps, so nothing is uninstalled."""
import os
import subprocess
import sys
import xml.etree.ElementTree as ET

from testkit import tools
from testkit.runners import REPO


def tool_dir(tmp_path, keep):
    """A folder of links to `keep` (found the way testkit/tools.py finds them), PATH for a
    machine that has only those. Named so that no sbin beside it is searched."""
    d = tmp_path / "tools"
    d.mkdir()
    for name in keep:
        path = tools.which(name)
        assert path, f"{name} is not on this machine (make test installs it)"
        (d / name).symlink_to(path)
    return d


def ensure(level, path):
    return subprocess.run([REPO / "scripts" / "ensure-deps.sh", level], capture_output=True, text=True,
                          env={**os.environ, "PATH": str(path), "PYTHON": sys.executable}, timeout=60)


def test_without_apt_make_test_names_the_missing_tools_once_and_goes_on(tmp_path):
    p = ensure("test", tool_dir(tmp_path, ["bash", "dirname", "cmake", "g++", "ssh", "ssh-keygen"]))
    assert p.returncode == 0
    assert p.stderr == ("zobench: missing sshd, aarch64-linux-gnu-g++, qemu-aarch64, chromium, chromedriver, valgrind "
                        "(sudo apt-get install openssh-server g++-aarch64-linux-gnu qemu-user chromium chromium-driver "
                        "valgrind); the tests that need them are skipped\n")


def test_without_apt_make_run_stops_on_a_missing_build_tool(tmp_path):
    p = ensure("run", tool_dir(tmp_path, ["bash", "dirname", "g++"]))
    assert p.returncode == 1
    assert p.stderr == "zobench: missing cmake (sudo apt-get install cmake)\n"


def test_with_everything_there_make_run_says_nothing(tmp_path):
    p = ensure("run", tool_dir(tmp_path, ["bash", "dirname", "cmake", "g++"]))
    assert (p.returncode, p.stderr) == (0, "")


def test_tests_needing_a_missing_tool_are_skipped_with_its_name_not_errors(tmp_path):
    (tmp_path / "test_needs.py").write_text(
        "def test_on_the_farm(farm):\n    pass\n\n"
        "def test_under_qemu(aarch64):\n    pass\n")
    path = tool_dir(tmp_path, ["cmake", "ssh", "ssh-keygen"])
    p = subprocess.run([sys.executable, "-m", "pytest", "-p", "tests.conftest", "-p", "no:cacheprovider",
                        "--junitxml", tmp_path / "out.xml", tmp_path / "test_needs.py"],
                       cwd=REPO, capture_output=True, text=True, timeout=120, env={**os.environ, "PATH": str(path)})
    assert p.returncode == 0, p.stdout[-2000:]
    skipped = {case.get("name"): case.find("skipped").get("message")
               for case in ET.parse(tmp_path / "out.xml").iter("testcase")}
    assert skipped["test_on_the_farm"] == ("missing sshd (sudo apt-get install openssh-server); "
                                           "`make test` installs them where apt is usable")
    assert skipped["test_under_qemu"] == ("missing aarch64-linux-gnu-g++, qemu-aarch64 (sudo apt-get install "
                                          "g++-aarch64-linux-gnu qemu-user); `make test` installs them where apt is usable")


def test_a_tool_in_the_sbin_beside_a_bin_on_path_is_found(tmp_path, monkeypatch):
    (tmp_path / "bin").mkdir()
    (tmp_path / "sbin").mkdir()
    sshd = tmp_path / "sbin" / "sshd"
    sshd.write_text("#!/bin/sh\n")
    sshd.chmod(0o755)
    monkeypatch.setenv("PATH", str(tmp_path / "bin"))
    assert tools.which("sshd") == str(sshd)
    monkeypatch.setenv("PATH", str(tmp_path / "elsewhere"))
    assert tools.which("sshd") is None
