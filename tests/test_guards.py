"""What zobench must never do to a user (issue 47), tested as classes: an unexpected error in any
command is one scrubbed line and a log file, never a traceback; a store's password never reaches
a printed line, whatever shape its URL takes (Hypothesis); the preview server serves the site's
files and nothing else; an --out folder that is not zobench's is refused; a full disk while the
report is written keeps the results and says how to make the report again."""
import contextlib
import json
import io
import os
import re
import shutil
import subprocess
import threading
import time
import urllib.error
import urllib.request
from pathlib import Path

import pytest
from hypothesis import HealthCheck, given, settings, strategies as st

from harness.errors import UserError
from harness.store_url import HIDDEN, scrub, known
from harness.stores import store as store_module
from harness.stores.store import Store
from zobench import cli
from zobench.commands import COMMANDS, publish

from testkit.compare_runs import made_up_result, made_up_run
from testkit.damage import damage_json, damage_text
from testkit.runners import TINY_CPP, zobench

SECRET = "hunter2-Zq9"


@pytest.fixture(autouse=True)
def forget_passwords():
    """The passwords these tests make known (store_url.known) are forgotten after each: the
    registry is the process's, and a later test in this worker must not see its words scrubbed."""
    from harness import store_url
    before = set(store_url._SECRETS)
    yield
    store_url._SECRETS.clear()
    store_url._SECRETS.update(before)


def run_main(argv) -> tuple[int, str, str]:
    """cli.main in this process: its exit code, stdout and stderr."""
    out, err = io.StringIO(), io.StringIO()
    with contextlib.redirect_stdout(out), contextlib.redirect_stderr(err):
        code = cli.main(argv)
    return code, out.getvalue(), err.getvalue()


# each command's shortest command line its parser takes: what its required options need
ARGV = {"publish": ["--out", "site"], "build": ["--target", "local"], "export": ["--format", "csv"],
        "memory": ["--batch", "1"], "tune": ["--method", "full-zo"], "targets": ["list"],
        "push": ["x"], "pull": ["x"], "compare": ["x", "y"]}


def parsed_argv(name: str) -> list[str]:
    argv = [name, *ARGV.get(name, [])]
    cli.build_parser().parse_args(argv)
    return argv


@pytest.mark.parametrize("module", COMMANDS, ids=lambda m: m.__name__.rsplit(".", 1)[1])
def test_every_command_turns_an_unexpected_error_into_one_scrubbed_line_and_a_log(module, monkeypatch, tmp_path):
    """Each subcommand, driven into an error nobody planned for (a library's OSError that quotes
    a store URL with its password): exit 1, one line naming the command, where it was and the
    exception, the password scrubbed; the traceback, scrubbed too, in the log file the line names."""
    monkeypatch.setenv("HOME", str(tmp_path))
    known(f"postgresql://bob:{SECRET}@db.invalid/zobench")

    def deep_in_the_library(args):
        raise OSError(28, "No space left on device", f"postgresql://bob:{SECRET}@db.invalid/zobench")

    monkeypatch.setattr(module, "main", deep_in_the_library)
    argv = parsed_argv(module.__name__.rsplit(".", 1)[1].replace("_", "-"))
    code, out, err = run_main(argv)
    assert code == 1 and out == ""
    (line,) = err.strip().splitlines()
    # where: the innermost frame of zobench's own packages (a test's frame is not one of them)
    assert re.match(rf"zobench {argv[0]}: unexpected error in \w+ \((zobench|harness|workloads|reports)/[\w/]+\.py:\d+\): ", line)
    assert "OSError: [Errno 28] No space left on device" in line and SECRET not in line and HIDDEN in line
    log = Path(line.rsplit("the traceback is in ", 1)[1])
    assert log.is_relative_to(tmp_path / ".cache" / "zobench" / "logs")
    text = log.read_text()
    assert "Traceback (most recent call last)" in text and "deep_in_the_library" in text and SECRET not in text


def test_an_error_that_cannot_be_logged_is_still_one_line(monkeypatch, tmp_path):
    """With the log's folder unwritable (its parent a file), the line says the traceback could not be kept."""
    (tmp_path / ".cache").write_text("not a folder")
    monkeypatch.setenv("HOME", str(tmp_path))
    monkeypatch.setattr(COMMANDS[5], "main", lambda args: 1 / 0)
    code, _, err = run_main(parsed_argv(COMMANDS[5].__name__.rsplit(".", 1)[1]))
    (line,) = err.strip().splitlines()
    assert code == 1 and "ZeroDivisionError: division by zero" in line and "could not be logged" in line


def test_the_error_log_never_writes_through_a_planted_file_and_is_the_users_alone(monkeypatch, tmp_path):
    """Symlinks planted at every name the log could take by date and pid (this second and the
    next minute), pointing at a file of the user's: after an unexpected error that file is
    untouched, the log is a new regular file of mode 0600 in a folder of mode 0700. A log folder
    that is a symlink, or writable by others, is refused: the line says the traceback could not
    be logged, and nothing is written there."""
    monkeypatch.setenv("HOME", str(tmp_path))
    logs = tmp_path / ".cache" / "zobench" / "logs"
    logs.mkdir(parents=True, mode=0o700)
    victim = tmp_path / "victim"
    victim.write_text("mine")
    now = time.time()
    for t in range(int(now) - 1, int(now) + 60):
        (logs / f"zobench-{time.strftime('%Y%m%d-%H%M%S', time.localtime(t))}-{os.getpid()}.log").symlink_to(victim)
    monkeypatch.setattr(COMMANDS[5], "main", lambda args: 1 / 0)
    argv = parsed_argv(COMMANDS[5].__name__.rsplit(".", 1)[1])
    code, _, err = run_main(argv)
    log = Path(err.strip().rsplit("the traceback is in ", 1)[1])
    assert code == 1 and victim.read_text() == "mine"
    assert not log.is_symlink() and log.stat().st_mode & 0o777 == 0o600 and logs.stat().st_mode & 0o777 == 0o700
    assert "ZeroDivisionError" in log.read_text()

    elsewhere = tmp_path / "elsewhere"
    elsewhere.mkdir()
    shutil.rmtree(logs)
    for bad in ("symlink", "group-writable"):
        if bad == "symlink":
            logs.symlink_to(elsewhere)
        else:
            logs.mkdir()
            logs.chmod(0o775)
        code, _, err = run_main(argv)
        (line,) = err.strip().splitlines()
        assert code == 1 and "could not be logged" in line and list(elsewhere.iterdir()) == list(logs.iterdir()) == []
        logs.unlink() if bad == "symlink" else None


# Malformed store URLs, each holding the password: the shapes the issue found (a bad IPv6 host,
# text after the bracket, a bad percent-escape) and whatever Hypothesis makes of their parts.
PASSWORDS = st.text(st.characters(codec="ascii", exclude_characters="\x00 '\"\\@/?#%:[]"), min_size=6, max_size=16)
HOSTS = st.sampled_from(["[::1:5432", "[::1]x:5432", "[::1", "127.0.0.1:1", "127.0.0.1:notaport", "::1]", "[", "127.0.0.1:99999"])
TAILS = st.sampled_from(["/db", "", "/db?sslmode=bogus", "/db?connect_timeout=x", "/db?password=%zz", "?"])
MANGLE = st.sampled_from(["", "%zz", "%00", "%", "%4", "@"])


@settings(max_examples=40, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture])
@given(password=PASSWORDS, host=HOSTS, tail=TAILS, mangle=MANGLE, scheme=st.sampled_from(["postgresql", "postgres"]))
def test_a_malformed_store_url_never_prints_its_password(password, host, tail, mangle, scheme, tmp_path):
    """`zobench history --store URL` with a URL libpq cannot use: exit 2 (or 1 for what nobody
    planned), and the password, in any form, in no line printed, nor in the log."""
    secret = password + mangle
    url = f"{scheme}://bob:{secret}@{host}{tail}"
    code, out, err = run_main(["history", "--store", url])
    assert code in (1, 2) and out == ""
    assert len(err.strip().splitlines()) == 1, err
    for form in {password, secret}:
        if form in err:     # or is it in the line's own words ("zobenc" is in "zobench: error")?
            placeholder = run_main(["history", "--store", f"{scheme}://bob:{'x' * len(password)}{mangle}@{host}{tail}"])[2]
            assert err.count(form) == placeholder.count(form), (url, err)
    assert "Traceback" not in err


@given(password=PASSWORDS, kind=st.sampled_from(["url", "query", "kv", "kv-quoted"]))
@settings(max_examples=60, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture])
def test_the_scrubber_takes_a_known_password_out_of_any_message(password, kind):
    """Once a URL is known, its password is gone from any text that quotes it, as written,
    percent-decoded or escaped; unknown URLs lose their user:password@ by shape."""
    url = {"url": f"postgresql://u:{password}@h/db", "query": f"postgresql://u@h/db?password={password}",
           "kv": f"host=h password={password} dbname=d", "kv-quoted": f"host=h password='{password}' dbname=d"}[kind]
    known(url)
    for message in (f"invalid dsn: {url}", f'missing "=" after "{url}" in connection info string',
                    f"could not connect: {password}"):
        assert password not in scrub(message)
    assert "pw-unknown" not in scrub("libpq: postgres://x:pw-unknown@[::1:5432/db")


@pytest.fixture
def site(tmp_path):
    """A served site: index.html, a page, a folder without an index, a symlink out of the site."""
    root = tmp_path / "site"
    (root / "runs" / "r1").mkdir(parents=True)
    (root / "index.html").write_text("<p>site</p>")
    (root / "runs" / "r1" / "report.html").write_text("<p>report</p>")
    outside = tmp_path / "private.txt"
    outside.write_text("not the site's")
    (root / "leak.txt").symlink_to(outside)
    (root / "up").symlink_to(tmp_path)
    httpd = publish.server(root, 0)
    threading.Thread(target=httpd.serve_forever, daemon=True).start()
    yield f"http://127.0.0.1:{httpd.server_address[1]}", httpd
    httpd.shutdown()
    httpd.server_close()


def status(url: str) -> tuple[int, str]:
    try:
        with urllib.request.urlopen(url, timeout=30) as r:
            return r.status, r.read().decode()
    except urllib.error.HTTPError as e:
        return e.code, ""


def test_the_preview_server_serves_the_sites_files_and_nothing_else(site, capfd):
    base, _ = site
    assert status(f"{base}/") == (200, "<p>site</p>")
    assert status(f"{base}/runs/r1/report.html") == (200, "<p>report</p>")
    assert status(f"{base}/leak.txt")[0] == 404          # a symlink out of the site
    assert status(f"{base}/up/private.txt")[0] == 404    # a folder symlinked out
    assert status(f"{base}/runs/")[0] == 404             # no listing of a folder
    assert status(f"{base}/runs/r1/")[0] == 404
    assert status(f"{base}/%00")[0] == 400               # a NUL byte: a bad request, not a traceback
    assert status(f"{base}/../private.txt")[0] == 404
    assert "Traceback" not in capfd.readouterr().err


def test_publish_serve_on_a_busy_port_is_one_line(site):
    _, httpd = site
    with pytest.raises(UserError, match=r"publish --serve --port \d+: cannot listen on .*--port 0 for any free one"):
        publish.server(Path("."), httpd.server_address[1])


def test_report_out_refuses_a_folder_that_is_not_zobenchs(tmp_path, monkeypatch):
    """`zobench report --out DIR`: a system folder, the home folder or a folder with the user's
    files is refused in one line, and nothing in it changes; a new folder gets the report and
    zobench's marker, which lets a later report write there again."""
    monkeypatch.setenv("HOME", str(tmp_path))
    store = Store(tmp_path / "results")
    run_id = made_up_run(store, [made_up_result(2.0)])
    (tmp_path / "mine").mkdir()
    (tmp_path / "mine" / "thesis.tex").write_text("mine")
    for target in ("/proc/self", str(tmp_path), "/tmp", str(tmp_path / "mine")):
        before = sorted(os.listdir(target))
        code, _, err = run_main(["report", "--run", run_id, "--results", str(store.root), "--out", target])
        assert code == 2 and err.startswith("zobench: error: report --out") and len(err.strip().splitlines()) == 1, err
        if target == "/tmp":    # everyone's: the other test workers make and remove their folders there meanwhile
            assert not {"report.md", ".zobench-report"} & set(os.listdir(target))
        else:
            assert sorted(os.listdir(target)) == before
    assert "thesis.tex" in err
    code, _, err = run_main(["report", "--run", run_id, "--results", str(store.root), "--out", str(tmp_path / "new")])
    assert code == 0 and (tmp_path / "new" / "report.md").is_file() and (tmp_path / "new" / ".zobench-report").is_file()


@contextlib.contextmanager
def small_disk(path: Path, size: str):
    """A real tmpfs of `size` at path (the machine must let this process mount one)."""
    path.mkdir()
    r = subprocess.run(["mount", "-t", "tmpfs", "-o", f"size={size}", "tmpfs", str(path)], capture_output=True, text=True)
    if r.returncode:
        pytest.skip(f"cannot mount a tmpfs here: {r.stderr.strip()}")
    try:
        yield path
    finally:
        subprocess.run(["umount", "-l", str(path)], check=False)


def test_a_disk_that_fills_while_the_report_is_written_keeps_the_results(tmp_path):
    """`zobench run` with its results on a disk that holds its five jobs' results (about 320 KiB) but
    not their report (about 780 KiB):
    one line, exit 2, the result stored and readable, and the command that makes the report."""
    with small_disk(tmp_path / "disk", "640k") as disk:
        p = zobench("run", "--suite", "ci", "--method", "full-zo", "--target", "local-1t", *TINY_CPP,
                    "--set", "trace_steps=0", "--results", disk / "results", timeout=600)
        assert p.returncode == 2, p.stderr
        assert "Traceback" not in p.stderr
        (line,) = [x for x in p.stderr.splitlines() if "report could not be written" in x]
        assert "No space left on device" in line and "zobench report" in line
        store = Store(disk / "results")
        results = store.results(store.latest())
        assert results and all(r["status"] == "ok" for r in results)


def test_a_run_json_edited_after_the_run_is_said_by_every_reader(tmp_path):
    """Issue 47: each result carries the hash of the spec its job was planned with; with run.json's
    hyperparameters changed by hand afterwards, results, export and compare each say so (once)
    and keep the result as it ran."""
    from harness.planning.runs import spec_sha256
    store = Store(tmp_path / "results")
    results = [made_up_result(2.0, repeat=i) for i in range(2)]
    for r in results:
        r["spec_sha256"] = spec_sha256(r["job"])
    run_id = made_up_run(store, results)
    plan = store.run_dir(run_id) / "run.json"
    for command in (["results", "--run", run_id], ["export", "--format", "csv", "--run", run_id]):
        code, _, err = run_main([*command, "--results", str(store.root)])
        assert code == 0 and "warning" not in err, err
    text = json.loads(plan.read_text())
    text["jobs"][1]["spec"]["hyper"]["lr_zo"] = 0.5
    plan.write_text(json.dumps(text))
    edited = results[1]["job"]["job_id"]
    for command in (["results", "--run", run_id], ["export", "--format", "csv", "--run", run_id], ["compare", run_id, run_id]):
        store_module._reported.clear()     # said once a process; each command here is a process of its own
        code, out, err = run_main([*command, "--results", str(store.root)])
        warned = [x for x in err.splitlines() if "spec is not the one it ran by" in x]
        assert warned == [f"zobench: warning: {plan}: job {edited}'s spec is not the one it ran by (its result's "
                          "spec_sha256 differs: run.json was changed after the run); its result stands as it ran, "
                          "its own job record says how"], (command, err)
        assert "Traceback" not in err


@pytest.mark.parametrize("field, value", [("method", "full-bp"), ("hyper.lr_zo", 0.5)])
def test_a_result_whose_own_job_record_was_edited_is_corrupt_in_every_reader(tmp_path, field, value):
    """Issue 61, item 11: a result's job record edited by hand (its method, its lr_zo) no longer
    hashes to its spec_sha256: results, export and compare each name the file and the field, once,
    and leave the result out (it is no measurement of what it now says), as run --resume does."""
    from harness.planning.runs import spec_sha256
    store = Store(tmp_path / "results")
    results = [made_up_result(2.0, repeat=i) for i in range(2)]
    for r in results:
        r["spec_sha256"] = spec_sha256(r["job"])
    run_id = made_up_run(store, results)
    edited = results[1]["job"]["job_id"]
    path = store.run_dir(run_id) / f"{edited}.json"
    text = json.loads(path.read_text())
    where, _, key = field.rpartition(".")
    (text["job"][where] if where else text["job"])[key] = value
    path.write_text(json.dumps(text))
    expected = (f"zobench: warning: {path} is corrupt (its job record is not the spec it ran by: its {field} "
                "differs from its spec_sha256 and run.json (edited after the run)): left out; "
                f"`zobench run --resume {run_id} --results {store.root}` re-runs it")
    for command in (["results", "--run", run_id, "--format", "json"], ["export", "--format", "csv", "--run", run_id],
                    ["compare", run_id, run_id]):
        store_module._reported.clear()     # said once a process; each command here is a process of its own
        code, out, err = run_main([*command, "--results", str(store.root)])
        assert [x for x in err.splitlines() if "corrupt" in x] == [expected], (command, err)
        assert "Traceback" not in err and "full-bp" not in out and "0.5" not in out, (command, out)
        if command[0] == "results":
            assert [row["job_id"] for row in json.loads(out)] == [results[0]["job"]["job_id"]]
    # the fields filled in for the target (where its files were there) are not an edit
    text["job"] = {**results[1]["job"], "init_weights": "/board/zobench/bundles/x/init/w.f32",
                   "workload": {**results[1]["job"]["workload"], "data_dir": "/board/zobench/bundles/x/data"}}
    path.write_text(json.dumps(text))
    store_module._reported.clear()
    assert len(store.results(run_id)) == 2


# ---- the readers, fuzzed (issue 47): each damage is exit 2 and one line, or read as it is (exit 0),
# never a traceback, and nothing outside the test's folder is written

def one_line_or_ok(code: int, err: str) -> None:
    assert "Traceback" not in err, err
    assert code in (0, 2), err
    if code == 2:
        assert len(err.strip().splitlines()) == 1 and err.startswith("zobench: error: "), err


@settings(max_examples=30, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture])
@given(data=st.data())
def test_fuzzed_suites_and_inventories_are_one_line(tmp_path, data):
    """A shipped suite and an inventory, damaged: `zobench run` against a target that is not there
    (so nothing runs) and `zobench targets list` read them; no results folder is made."""
    from harness import paths
    suite = tmp_path / "s.toml"
    name = data.draw(st.sampled_from(["quick", "quick-zo-optimizers", "paper-fmnist", "quick-finetune"]))
    suite.write_bytes(damage_text((paths.SUITES_DIR / f"{name}.toml").read_text(), data.draw).encode("utf-8", "surrogateescape"))
    code, _, err = run_main(["run", "--suite", str(suite), "--target", "not-a-target", "--results", str(tmp_path / "r")])
    assert code == 2 and len(err.strip().splitlines()) == 1 and "Traceback" not in err, err
    assert not (tmp_path / "r").exists()
    inv = tmp_path / "inv.toml"
    inv.write_bytes(damage_text('[targets.pi]\nhost = "pi.local"\nport = 22\nuser = "pi"\narch = "aarch64"\n'
                                'threads = 4\nmem_limit = "400M"\nlease = "~/zobench/lease"\nruntimes = ["cpp"]\n'
                                '[targets.pi.cooldown]\nbelow_c = 60.0\nmax_wait_s = 300.0\n', data.draw)
                    .encode("utf-8", "surrogateescape"))
    one_line_or_ok(*run_main(["targets", "list", "--inventory", str(inv)])[::2])


@pytest.fixture(scope="module")
def made_up(tmp_path_factory):
    """A run of two made-up results, and a pytest-benchmark export of it."""
    root = tmp_path_factory.mktemp("fuzz")
    store = Store(root / "results")
    run_id = made_up_run(store, [made_up_result(2.0, repeat=i) for i in range(2)])
    code, _, err = run_main(["export", "--format", "pytest-benchmark", "--run", run_id, "--results", str(store.root),
                             "--out", str(root / "export.json")])
    assert code == 0, err
    return store, run_id, root / "export.json"


@settings(max_examples=60, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture])
@given(data=st.data(), which=st.sampled_from(["result", "run.json", "export"]))
def test_fuzzed_results_run_json_and_exports_are_one_line(made_up, tmp_path_factory, data, which):
    """A result file, a run.json or an export, damaged: results, export and compare read them;
    each is exit 0 (a damaged result is left out and named) or 2 with one line, and reading
    writes nothing."""
    import shutil
    store0, run_id, export0 = made_up
    root = tmp_path_factory.mktemp("copy")
    shutil.copytree(store0.root, root / "results")
    shutil.copy(export0, root / "export.json")
    store = Store(root / "results")
    target = {"result": next(store.run_dir(run_id).glob("solo.*.json")), "run.json": store.run_dir(run_id) / "run.json",
              "export": root / "export.json"}[which]
    if data.draw(st.booleans()):
        target.write_text(json.dumps(damage_json(json.loads(target.read_text()), data.draw)))
    else:
        target.write_bytes(damage_text(target.read_text(), data.draw).encode("utf-8", "surrogateescape"))
    before = sorted((p, p.stat().st_mtime_ns) for p in root.rglob("*"))
    store_module._reported.clear()
    for command in (["results", "--run", run_id], ["export", "--format", "csv", "--run", run_id],
                    ["compare", str(root / "export.json"), run_id]):
        code, _, err = run_main([*command, "--results", str(store.root)])
        assert "Traceback" not in err and code in (0, 1, 2, 3), (command, err)
        lines = [x for x in err.strip().splitlines() if not x.startswith("zobench: warning: ")]
        assert len(lines) <= 1 and (code != 2 or lines[0].startswith("zobench: error: ")), (command, err)
        assert "unexpected error" not in err, (command, err)
    assert sorted((p, p.stat().st_mtime_ns) for p in root.rglob("*")) == before
