"""The Python runners, the CLI and the scripts started from a process that has already imported
what they import.

A runner's own work in a test is a fraction of a second; importing torch is about 1.3 s of CPU
each time, and the tests start a runner a few hundred times. So each test process keeps a
server that imports them once, and forks it per run: the runner still runs as `python -m
workloads.torch_runner` does (its module run as __main__, its own process, argv, working
folder, environment, stdout and stderr), only without paying for the import again. The server
never runs a torch op itself, so no thread pool exists when it forks.

The CLI (`python -m zobench`, testkit.runners.zobench) and the scripts (`python scripts/x.py`)
are served the same way by a second kind of server, "cli", which imports what their commands
import on demand (pandas, seaborn, matplotlib, scipy, optuna, psycopg, paramiko: about 2 s of
CPU a process) and the CLI itself with the project's modules it loads (80 ms a process, a few
hundred times a make test). That is a fresh interpreter's start only while no project module
reads its process as it loads (its environment, HOME, pid, clock: each forked process has the
caller's only from its start), which tests/test_runner.py checks of every module. A forked CLI
ends as the interpreter does: its non-daemon threads joined, its atexit functions run.

Used by testkit.runners.run_runner for TORCH_RUNNER and ORT_RUNNER ("runner") and by
testkit.runners.zobench and the scripts' tests ("cli"). A server is kept per environment, as
far as that environment sets what an import reads (OpenMP's, torch's, Python's own variables;
for "cli" also matplotlib's, HOME and XDG's): the first environment a test process calls with
gets one, another gets one the second time it is seen (a session-wide HOME, the sshd farm's,
a variable a test set for good), up to a few servers a kind; a one-off environment starts a
fresh interpreter, as every run of the harness itself does (its transports launch the
runners). A "cli" call made while another is under way in the same test process (a run in a
thread) starts a fresh interpreter too, never waiting on the other."""
from __future__ import annotations

import atexit
import json
import os
import runpy
import subprocess
import sys
import threading
import traceback
from collections import Counter
from pathlib import Path

# variables read when torch, onnxruntime or Python start: a call that sets them differently
# from a server's own gets another server, or a fresh interpreter
READ_AT_IMPORT = ("OMP_", "GOMP_", "KMP_", "MKL_", "OPENBLAS_", "TORCH", "PYTORCH", "ORT_", "PYTHON", "LD_")
# and for the CLI's libraries: matplotlib's configuration and cache folders (MPLCONFIGDIR, else
# under HOME or XDG's), which its import reads
READ_AT_IMPORT_CLI = (*READ_AT_IMPORT, "MPL", "HOME", "XDG_")
# but not these: torch writes them into os.environ itself the first time it compiles (inductor's
# cache folder), and reads them then, never at import. A test process that had compiled once
# differed from its server for good, and each of its runners imported torch afresh (49 runners
# in a make test, about 80 s of CPU). The forked process gets the caller's value anyway.
SET_BY_TORCH = ("TORCHINDUCTOR_CACHE_DIR",)
# per kind: what its server imports before it forks, which of the caller's variables must match
# the server's, and for how many environments a test process keeps a server
KINDS = {"runner": (("numpy", "onnxruntime", "torch"), READ_AT_IMPORT, 2),
         "cli": (("numpy", "scipy.stats", "scipy.ndimage", "pandas", "matplotlib", "matplotlib.pyplot", "seaborn",
                  "paramiko", "psycopg", "optuna", "zobench.cli"), READ_AT_IMPORT_CLI, 3)}

_servers: dict[tuple, tuple[subprocess.Popen, threading.Lock]] = {}
_seen: Counter = Counter()
_servers_lock = threading.Lock()


def _start(kind: str, cwd: Path, env: dict) -> subprocess.Popen:
    server = subprocess.Popen([sys.executable, "-m", "testkit.warm", kind], cwd=cwd, env=env, text=True,
                              stdin=subprocess.PIPE, stdout=subprocess.PIPE)
    atexit.register(lambda: (server.kill(), server.wait()))    # reaped: its CPU counts in the test process's children's
    return server


def run(module: str, args: list[str], cwd: Path, env: dict, stdout: Path, stderr: Path, timeout: float,
        kind: str = "runner", path: Path | None = None) -> int | None:
    """`python -m module *args` (or `python path *args` where path is given) in cwd with env,
    forked from a server of `kind`: its exit code (negative: the signal that ended it), its
    output in the two files; None where no server is kept for env's variables read at import
    (a one-off environment, or too many), or a "cli" server is busy (the caller starts an
    interpreter). subprocess.TimeoutExpired after `timeout` seconds, the process killed."""
    request = {"module": module, "path": str(path) if path else None, "args": args, "cwd": str(cwd), "env": env,
               "stdout": str(stdout), "stderr": str(stderr), "finish": kind == "cli"}
    _, prefixes, most = KINDS[kind]
    key = (kind, tuple(sorted((k, v) for k, v in env.items() if k.startswith(prefixes) and k not in SET_BY_TORCH)))
    with _servers_lock:
        _seen[key] += 1
        got = _servers.get(key)
        if got is not None and got[0].poll() is not None:
            del _servers[key]
            got = None
        if got is None:
            mine = [k for k in _servers if k[0] == kind]
            if len(mine) >= most or (mine and _seen[key] < 2):
                return None     # a one-off environment: not worth a server's imports
            got = _servers[key] = (_start(kind, cwd, env), threading.Lock())
    server, lock = got
    # a runner waits its turn (one at a time per server); a CLI call made while another is under
    # way (a run in a thread) starts an interpreter rather than wait on the other
    if not lock.acquire(blocking=kind == "runner"):
        return None
    try:
        return _call(server, request, [module if path is None else str(path), *args], timeout)
    finally:
        lock.release()


def _call(server: subprocess.Popen, request: dict, what: list[str], timeout: float) -> int:
    server.stdin.write(json.dumps(request) + "\n")
    server.stdin.flush()
    pid = json.loads(server.stdout.readline())["pid"]
    late = threading.Event()
    timer = threading.Timer(timeout, lambda: (late.set(), _kill(pid)))
    timer.start()
    try:
        rc = json.loads(server.stdout.readline())["rc"]
    finally:
        timer.cancel()
    if late.is_set():
        raise subprocess.TimeoutExpired(what, timeout)
    return rc


def _kill(pid: int) -> None:
    try:
        os.kill(pid, 9)
    except ProcessLookupError:
        pass


def _child(request: dict) -> None:
    """The runner, in the forked process: never returns."""
    code = 1
    try:
        os.chdir(request["cwd"])
        os.environ.clear()
        os.environ.update(request["env"])
        null = os.open(os.devnull, os.O_RDONLY)
        os.dup2(null, 0)
        for fd, path in ((1, request["stdout"]), (2, request["stderr"])):
            out = os.open(path, os.O_WRONLY | os.O_CREAT | os.O_TRUNC, 0o644)
            os.dup2(out, fd)
        if request.get("path"):     # `python path`: the script's folder first on sys.path, as the interpreter puts it
            sys.argv = [request["path"], *request["args"]]
            sys.path[0] = os.path.dirname(os.path.abspath(request["path"]))
            runpy.run_path(request["path"], run_name="__main__")
        else:
            sys.argv = [request["module"], *request["args"]]
            sys.path[0] = os.getcwd()     # `python -m`: the working folder first on sys.path
            runpy.run_module(request["module"], run_name="__main__", alter_sys=True)
        code = 0
    except SystemExit as e:     # as the interpreter ends on it: None is 0, a message is 1
        if e.code is None or isinstance(e.code, int):
            code = e.code or 0
        else:
            print(e.code, file=sys.stderr)
    except BaseException:
        traceback.print_exc()
    finally:
        if request.get("finish"):     # as the interpreter ends: its threads joined, its atexit functions run
            try:
                threading._shutdown()
                atexit._run_exitfuncs()
            except BaseException:
                traceback.print_exc()
        sys.stdout.flush()
        sys.stderr.flush()
        os._exit(code)


def serve(kind: str = "runner") -> None:
    import importlib

    for name in KINDS[kind][0]:      # what every runner, or the CLI's commands, import first
        importlib.import_module(name)

    for line in sys.stdin:
        request = json.loads(line)
        pid = os.fork()
        if pid == 0:
            _child(request)
        print(json.dumps({"pid": pid}), flush=True)
        _, status = os.waitpid(pid, 0)
        print(json.dumps({"rc": os.waitstatus_to_exitcode(status)}), flush=True)


if __name__ == "__main__":
    serve(*sys.argv[1:])
