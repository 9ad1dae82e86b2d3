"""`python -m workloads.launch [--mem-limit 512M] -- COMMAND...`: exec COMMAND under a hard
memory limit, so a big machine can stand in for a Pi Zero 2's 512 MB and running out
of memory is observable.

The limit is a memory cgroup where this user may make one (v2, else v1: the kernel's
OOM killer then ends the job with SIGKILL), else RLIMIT_AS (allocations fail instead,
which the runner reports as oom). The launcher execs COMMAND in its own process, so
the pid, process group and exit status the harness sees are the command's.

Its first stdout line is the evidence the harness needs to tell an OOM kill from any other
SIGKILL (harness/job.py): {"event": "launch", "pid": the command's pid, "monotonic": the
kernel's clock at launch (CLOCK_MONOTONIC, the clock of its log's timestamps)} plus, under a
limit, "mem_limit" (bytes), "method" and the "cgroup" whose OOM counter the harness reads.
"""
from __future__ import annotations

import json
import os
import resource
import sys
import time
from pathlib import Path

UNITS = {"K": 1 << 10, "M": 1 << 20, "G": 1 << 30}


def parse_size(text: str) -> int:
    return int(text[:-1]) * UNITS[text[-1].upper()]


def _own_cgroup(controller: str | None) -> str | None:
    for line in Path("/proc/self/cgroup").read_text().splitlines():
        _, names, path = line.split(":", 2)
        if (controller is None and names == "") or (controller and controller in names.split(",")):
            return path
    return None


def _cgroup_v2(limit: int) -> str | None:
    base, own = Path("/sys/fs/cgroup"), _own_cgroup(None)
    if own is None or not (base / "cgroup.controllers").exists():
        return None
    d = base / own.lstrip("/") / f"zobench-{os.getpid()}"
    d.mkdir()
    if not (d / "memory.max").exists():     # the memory controller is not delegated here
        d.rmdir()
        return None
    (d / "memory.max").write_text(str(limit))
    if (d / "memory.swap.max").exists():
        (d / "memory.swap.max").write_text("0")
    (d / "cgroup.procs").write_text(str(os.getpid()))
    return str(d)


def _cgroup_v1(limit: int) -> str | None:
    own = _own_cgroup("memory")
    base = Path("/sys/fs/cgroup/memory")
    if own is None or not base.is_dir():
        return None
    d = base / own.lstrip("/") / f"zobench-{os.getpid()}"
    d.mkdir()
    (d / "memory.limit_in_bytes").write_text(str(limit))
    if (d / "memory.memsw.limit_in_bytes").exists():
        (d / "memory.memsw.limit_in_bytes").write_text(str(limit))
    (d / "cgroup.procs").write_text(str(os.getpid()))
    return str(d)


def apply_limit(limit: int) -> dict:
    for name, how in (("cgroup-v2", _cgroup_v2), ("cgroup-v1", _cgroup_v1)):
        try:
            path = how(limit)
        except OSError:
            continue
        if path:
            return {"method": name, "cgroup": path}
    resource.setrlimit(resource.RLIMIT_AS, (limit, limit))
    return {"method": "rlimit-as"}


def main(argv: list[str]) -> None:
    limit = None
    if argv[:1] == ["--mem-limit"]:
        limit, argv = parse_size(argv[1]), argv[2:]
    if argv[:1] == ["--"]:
        argv = argv[1:]
    if not argv:
        sys.exit("usage: python -m workloads.launch [--mem-limit 512M] -- COMMAND...")
    event = {"event": "launch", "pid": os.getpid(), "monotonic": time.monotonic()}
    if limit:
        event.update(mem_limit=limit, **apply_limit(limit))
    print(json.dumps(event), flush=True)
    os.execvp(argv[0], argv)


if __name__ == "__main__":
    main(sys.argv[1:])
