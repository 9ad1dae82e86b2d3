"""The set-up (scripts/setup.py) and its lock (harness/envlock.py), run as `make` runs them: the system's
Python, real uv and pip, a venv in a temporary folder. The package index is pip's own configuration
(harness/pip_config.py), or a closed port on loopback where a test needs "no network"."""
from __future__ import annotations

import importlib.util
import json
import os
import shutil
import signal
import socket
import subprocess
import sys
import time
from pathlib import Path

import pytest

from harness import envlock, pip_config
from workloads.envinfo import LOCK_STAMP

REPO = Path(__file__).resolve().parent.parent
SETUP = REPO / "scripts" / "setup.py"
# The HOME this session began under, read at collection, before a fixture gives the session one of its
# own (the sshd farm's): make test's set-up ran under it, so its uv and uv's cache hold the lock. A set-up
# under test runs there as a second `make run` would, rather than fetching uv and every wheel again.
SETUP_HOME = os.environ["HOME"]


def setup_env(extra: dict | None = None) -> dict:
    """The environment a set-up under test runs in: this process's, under SETUP_HOME."""
    return {**os.environ, "HOME": SETUP_HOME, **(extra or {})}


# what scripts/setup.py reads before it installs anything: a copy of these is a project of its own
FILES = ("scripts/setup.py", "scripts/ensure-deps.sh", "testkit/tools.py", "harness/__init__.py", "harness/envlock.py",
         "harness/pip_config.py", "workloads/__init__.py", "workloads/envinfo.py", "pyproject.toml",
         *(f"lock/{p.name}" for p in (REPO / "lock").iterdir()))


def setup_module_object(monkeypatch):
    monkeypatch.setenv("HOME", SETUP_HOME)     # where it looks for uv, read as the module loads
    spec = importlib.util.spec_from_file_location("zobench_setup", SETUP)
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


def project_copy(root: Path, pyproject: str | None = None) -> Path:
    for f in FILES:
        (root / f).parent.mkdir(parents=True, exist_ok=True)
        shutil.copy2(REPO / f, root / f)
    if pyproject is not None:
        (root / "pyproject.toml").write_text(pyproject)
    return root


def set_up(root: Path, *args, env: dict | None = None) -> subprocess.CompletedProcess:
    """The set-up as `make run` starts it: the system's Python (the venv's base), from the project's root."""
    return subprocess.run([sys._base_executable, root / "scripts" / "setup.py", *map(str, args)], cwd=root,
                          capture_output=True, text=True, env=setup_env(env), timeout=600)


def zobench_lines(p: subprocess.CompletedProcess) -> list[str]:
    return [line for line in p.stderr.splitlines() if line.startswith("zobench:")]


def closed_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def no_index(tmp_path: Path) -> dict:
    """pip's settings pointing at nothing that answers, and caches of no use: no network to the index."""
    return {"PIP_CONFIG_FILE": os.devnull, "PIP_INDEX_URL": f"http://127.0.0.1:{closed_port()}/simple",
            "UV_CACHE_DIR": str(tmp_path / "empty-uv-cache"), "PIP_NO_CACHE_DIR": "1",
            "PIP_RETRIES": "0", "UV_HTTP_RETRIES": "0"}


def test_the_committed_lock_matches_pyproject_for_every_arch():
    """CI's check that pyproject.toml and the lock agree: a requirement changed without `make lock` fails here."""
    p = set_up(REPO, "check")
    assert p.returncode == 0, p.stderr
    for arch in envlock.ARCHES:
        text = envlock.path(arch).read_text()
        assert envlock.recorded(text) == envlock.inputs()
        pins = [line.split(" ", 1)[0] for line in text.splitlines() if line and line[0].isalnum()]
        assert pins and all("==" in pin for pin in pins)     # exact versions, each with its hashes
        assert text.count("--hash=sha256:") >= len(pins)
        assert "://" not in text                             # no index named


@pytest.mark.parametrize("change, said", [
    (("pandas>=2.0", "pandas>=2.1"), "pandas: pyproject.toml asks for 'pandas>=2.1', the lock was made for 'pandas>=2.0'"),
    (('"rich>=13",', '"rich>=13", "tabulate>=0.9",'), "tabulate: pyproject.toml asks for 'tabulate>=0.9', which the lock"),
    (('"plotly>=6",', ""), "plotly: the lock was made for 'plotly>=6', which pyproject.toml no longer asks for"),
])
def test_a_lock_that_does_not_match_pyproject_is_refused_in_one_line_before_any_venv(tmp_path, change, said):
    pyproject = (REPO / "pyproject.toml").read_text()
    assert change[0] in pyproject
    root = project_copy(tmp_path / "p", pyproject.replace(change[0], change[1], 1))
    p = set_up(root, "run", "--venv", tmp_path / "venv")
    arch = envlock.path().name
    assert p.returncode == 1 and p.stdout == ""
    assert p.stderr.startswith(f"zobench: set-up: lock/{arch} does not match pyproject.toml: {said}"), p.stderr
    assert p.stderr.count("\n") == 1 and p.stderr.endswith("; run `make lock`\n")
    assert not (tmp_path / "venv").exists()
    assert set_up(root, "check").returncode == 1


def test_without_the_index_a_complete_venv_is_kept_and_said_so_in_one_line(tmp_path, monkeypatch):
    """uv fetches everything before it changes the venv: a set-up that cannot reach the index leaves the
    venv it had, which goes on working, and says so in one line; without a complete venv it stops."""
    uv = setup_module_object(monkeypatch).find_uv()
    if uv is None:
        pytest.skip("no uv on this machine (the set-up used pip)")
    root = project_copy(tmp_path / "p")
    venv = tmp_path / "venv"
    subprocess.run([sys._base_executable, "-m", "venv", "--without-pip", venv], check=True)
    (venv / LOCK_STAMP).write_text(json.dumps({"lock": "0" * 64}))        # complete, for another lock
    def listing():      # every file, but uv's own lock file, which it takes to work on a venv
        return sorted(f.relative_to(venv) for f in venv.rglob("*") if f.name != ".lock")

    before = listing()
    env = {**no_index(tmp_path), "PATH": f"{uv.parent}{os.pathsep}{os.environ['PATH']}"}
    p = set_up(root, "run", "--venv", venv, env=env)
    lines = zobench_lines(p)
    assert p.returncode == 0, p.stderr
    assert len(lines) == 1 and "could not install lock/" in lines[0], p.stderr
    assert f"{venv} is left as it was (the environment of lock 000000000000)" in lines[0]
    assert listing() == before
    assert json.loads((venv / LOCK_STAMP).read_text()) == {"lock": "0" * 64}
    assert subprocess.run([venv / "bin" / "python", "-c", "print(6 * 7)"], capture_output=True,
                          text=True).stdout == "42\n"
    (venv / LOCK_STAMP).unlink()                                          # never completed: nothing to go on with
    for installer in ("uv", "pip"):
        p = set_up(root, "run", "--venv", venv, "--installer", installer, env=env)
        lines = zobench_lines(p)
        assert p.returncode == 1 and len(lines) == 1, p.stderr
        assert lines[0].startswith(f"zobench: set-up: {installer}") and "could not install lock/" in lines[0], lines
        assert not (venv / LOCK_STAMP).exists()


def test_an_interrupted_set_up_is_taken_up_by_the_next_and_the_venv_is_the_lock_exactly(tmp_path):
    """Ctrl-C in the middle of filling the venv: one line, no stamp; the next set-up completes it from uv's
    cache, and what the venv holds is the lock's versions, no more and no fewer."""
    venv = tmp_path / "venv"
    # SIGINT as a terminal's Ctrl-C delivers it (a shell ignores it for its background jobs, and their children inherit that)
    p = subprocess.Popen([sys._base_executable, SETUP, "run", "--venv", venv], cwd=REPO, text=True,
                         env=setup_env(),
                         stdout=subprocess.PIPE, stderr=subprocess.PIPE, start_new_session=True,
                         preexec_fn=lambda: signal.signal(signal.SIGINT, signal.SIG_DFL))
    deadline = time.monotonic() + 300
    while not (venv / "bin" / "python").exists() and p.poll() is None and time.monotonic() < deadline:
        time.sleep(0.05)
    os.killpg(p.pid, signal.SIGINT)
    out, err = p.communicate(timeout=300)
    assert p.returncode == 130, err
    assert [line for line in err.splitlines() if line.startswith("zobench:")] == [
        "zobench: set-up interrupted by SIGINT; the next `make run` or `make test` takes it up again"]
    assert not (venv / LOCK_STAMP).exists()
    again = set_up(REPO, "run", "--venv", venv)
    assert again.returncode == 0, again.stderr
    stamp = json.loads((venv / LOCK_STAMP).read_text())
    assert stamp["lock"] == envlock.digest(envlock.path()) and stamp["file"] == f"lock/{envlock.path().name}"
    assert {"install", "venv", "C++ build", "system packages"} <= stamp["seconds"].keys()
    locked = {envlock.name(line.split("==")[0]): line.split("==")[1].split()[0]
              for line in envlock.path().read_text().splitlines() if line and line[0].isalnum()}
    listed = subprocess.run([venv / "bin" / "python", "-m", "pip", "list", "--format", "json"], capture_output=True,
                            text=True, check=True).stdout
    installed = {envlock.name(d["name"]): d["version"] for d in json.loads(listed) if d["name"] != "zobench"}
    assert installed == locked
    # done once: the next set-up checks the system and the stamp, and touches nothing
    third = set_up(REPO, "run", "--venv", venv)
    assert third.returncode == 0 and zobench_lines(third) == [] and json.loads((venv / LOCK_STAMP).read_text()) == stamp


def test_uv_takes_packages_from_where_pip_is_configured_to():
    config = {":env:.index-url": "https://mirror.example/simple", "global.index-url": "https://other.example/simple",
              "global.extra-index-url": "file:///opt/a/simple file:///opt/b/simple", "global.find-links": "/opt/wheels",
              "global.cert": "/etc/ca.pem", "global.trusted-host": "mirror.example"}
    args, env = pip_config.uv_options(config)
    assert args == ["--index-strategy", "unsafe-best-match", "--index-url", "https://mirror.example/simple",
                    "--extra-index-url", "file:///opt/a/simple", "--extra-index-url", "file:///opt/b/simple",
                    "--find-links", "/opt/wheels", "--allow-insecure-host", "mirror.example"]
    assert env == {"SSL_CERT_FILE": "/etc/ca.pem"}
    assert pip_config.index_urls(config) == ["https://mirror.example/simple", "file:///opt/a/simple",
                                             "file:///opt/b/simple"]
    assert pip_config.uv_options({"global.no-index": "true"})[0][-1] == "--no-index"
    assert pip_config.index_urls({"global.no-index": "true"}) == []


def test_the_readmes_make_run_time_is_its_committed_measurement():
    """README's `make run` line quotes benchmarks/setup_time.py's record (docs/setup_time.json): the
    last commit measured, whole and by phase, and the one before it."""
    before, after = json.loads((REPO / "docs" / "setup_time.json").read_text())[-2:]
    line = next(l for l in (REPO / "README.md").read_text().splitlines() if l.startswith("make run "))
    jobs = after["phases"]["jobs"]
    assert f": {after['total_s']:.0f} s from a fresh clone (set-up {after['phases']['set-up (its steps side by side: below)']:.0f} s, " \
           f"its {len(after['jobs'])} jobs {jobs:.0f} s, the report {after['phases']['report']:.0f} s; was " \
           f"{before['total_s']:.0f} s)" in line, line
    assert after["rc"] == before["rc"] == 0 and after["pip_freeze_sha256"] and after["purged_apt"]


def test_a_venv_whose_making_was_interrupted_is_made_again_never_taken_for_one(tmp_path, monkeypatch):
    """Ctrl-C can land after bin/python (a link to the system's) and before pyvenv.cfg: that python
    runs as the system's, so taking it for the venv would list, or change, the system's packages."""
    setup = setup_module_object(monkeypatch)
    venv = tmp_path / "venv"
    (venv / "bin").mkdir(parents=True)
    (venv / "bin" / "python").symlink_to(os.path.realpath(sys._base_executable))
    assert not setup.usable(venv / "bin" / "python")
    assert setup.half_made(venv)
    (venv / "bin" / "python").unlink()
    (venv / "bin" / "python").write_text("a user's file")
    assert not setup.half_made(venv)       # a folder that is not ours is refused, not removed
    assert setup.usable(Path(sys.prefix) / "bin" / "python") == (sys.prefix != sys.base_prefix)
