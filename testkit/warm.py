"""The Python runners started from a process that has already imported torch and onnxruntime.

A runner's own work in a test is a fraction of a second; importing torch is about 1.3 s of CPU
each time, and the tests start a runner a few hundred times. So each test process keeps one
server that imports them once, and forks it per run: the runner still runs as `python -m
workloads.torch_runner` does (its module run as __main__, its own process, argv, working
folder, environment, stdout and stderr), only without paying for the import again. The server
never runs a torch op itself, so no thread pool exists when it forks.

Used by testkit.runners.run_runner for TORCH_RUNNER and ORT_RUNNER. A call whose environment
sets what an import reads (OpenMP's, torch's, Python's own variables) otherwise than the
server's starts a fresh interpreter instead, as every run of the harness itself does (its
transports launch the runners)."""
from __future__ import annotations

import atexit
import json
import os
import runpy
import subprocess
import sys
import threading
import traceback
from pathlib import Path

# variables read when torch, onnxruntime or Python start: a call that sets them differently
# from the server's own gets a fresh interpreter
READ_AT_IMPORT = ("OMP_", "GOMP_", "KMP_", "MKL_", "OPENBLAS_", "TORCH", "PYTORCH", "ORT_", "PYTHON", "LD_")

_server: subprocess.Popen | None = None
_server_env: dict = {}
_lock = threading.Lock()


def run(module: str, args: list[str], cwd: Path, env: dict, stdout: Path, stderr: Path, timeout: float) -> int | None:
    """`python -m module *args` in cwd with env, forked from the server: its exit code
    (negative: the signal that ended it), its output in the two files; None where env sets a
    variable read at import differently from the server's (the caller starts an interpreter).
    subprocess.TimeoutExpired after `timeout` seconds, the runner killed."""
    global _server, _server_env
    with _lock:   # one runner at a time per test process: the server forks and waits in turn
        if _server is None or _server.poll() is not None:
            _server_env = dict(env)
            _server = subprocess.Popen([sys.executable, "-m", "testkit.warm"], cwd=cwd, env=env, text=True,
                                       stdin=subprocess.PIPE, stdout=subprocess.PIPE)
            atexit.register(_server.kill)
        keys = {k for k in set(env) | set(_server_env) if k.startswith(READ_AT_IMPORT)}
        if any(env.get(k) != _server_env.get(k) for k in keys):
            return None
        request = {"module": module, "args": args, "cwd": str(cwd), "env": env,
                   "stdout": str(stdout), "stderr": str(stderr)}
        _server.stdin.write(json.dumps(request) + "\n")
        _server.stdin.flush()
        pid = json.loads(_server.stdout.readline())["pid"]
        late = threading.Event()
        timer = threading.Timer(timeout, lambda: (late.set(), _kill(pid)))
        timer.start()
        try:
            rc = json.loads(_server.stdout.readline())["rc"]
        finally:
            timer.cancel()
        if late.is_set():
            raise subprocess.TimeoutExpired([module, *args], timeout)
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
        sys.argv = [request["module"], *request["args"]]
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
        sys.stdout.flush()
        sys.stderr.flush()
        os._exit(code)


def serve() -> None:
    import numpy  # noqa: F401  what every runner imports first
    import onnxruntime  # noqa: F401
    import torch  # noqa: F401

    for line in sys.stdin:
        request = json.loads(line)
        pid = os.fork()
        if pid == 0:
            _child(request)
        print(json.dumps({"pid": pid}), flush=True)
        _, status = os.waitpid(pid, 0)
        print(json.dumps({"rc": os.waitstatus_to_exitcode(status)}), flush=True)


if __name__ == "__main__":
    serve()
