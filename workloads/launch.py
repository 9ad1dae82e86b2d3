"""`python -m workloads.launch [--lease FILE --lease-timeout S --holder JSON] [--cooldown C:S]
[--omp-wait auto] [--thermal FILE] [--mem-limit 512M] -- COMMAND...`: exec COMMAND holding the
board's lease, once the board is cool, with its threads' waiting picked from the board's load,
with its temperatures and clocks sampled beside it, under a hard memory limit, so a big machine
can stand in for a Pi Zero 2's 512 MB and running out of memory is observable.

The lease is an exclusive flock(2) on FILE, taken before anything is timed and inherited by
COMMAND through exec: it is held exactly for the runner's life, so a controller that dies or a
connection that drops never leaves it taken (the kernel frees a lock with its last holder). The
holder writes who it is into FILE (run, job, host, user, since), which is what a waiting launcher
reports in its "lease-wait" lines. One that cannot take the lease within S seconds prints a
"busy" line and exits with BUSY_EXIT; the harness records the job as `busy`.

With --cooldown C:S it then waits (up to S seconds, untimed) until every thermal zone is below C
degrees, and prints a "cooldown" line. With --omp-wait auto it watches the board's CPU for a
tenth of a second and picks how the runner's thread pool waits (workloads/wait_policy.py: a short
spin where the board is quiet, passive where other work runs), put in the runner's environment
and in the launch line's "wait". With --thermal it forks workloads/thermal.py's sampler,
which writes the board's temperatures, clocks and throttle bits to FILE while the runner lives.

The limit is a memory cgroup where this user may make one (v2, else v1: the kernel's
OOM killer then ends the job with SIGKILL), else RLIMIT_AS (allocations fail instead,
which the runner reports as oom). The launcher execs COMMAND in its own process, so
the pid, process group and exit status the harness sees are the command's. Under a cgroup's
limit the kernel need not kill: where the job's own code and libraries no longer fit beside
its data, it reclaims their file pages and reads them back at each touch, and the job thrashes
in the kernel until its timeout (torch under 64M of a v1 cgroup: 60 page faults a second,
99.8% of its CPU time in the kernel, for the whole 900 s). So a watchdog forked beside it ends
a job that thrashes at its limit for THRASH_S (watch_thrash) with SIGKILL, after one stderr
line beginning THRASHED that names what it saw, which the harness reads as out of memory.

Its "launch" line (after the lease's lines) is the evidence the harness needs to tell an OOM
kill from any other SIGKILL (harness/execution/job.py): {"event": "launch", "pid": the command's pid, "monotonic": the
kernel's clock at launch (CLOCK_MONOTONIC, the clock of its log's timestamps)} plus, under a
limit, "mem_limit" (bytes), "method" and the "cgroup" whose OOM counter the harness reads; with a
lease, "lease" (its file, the seconds waited for it, whom for); and "load", the machine's CPU
counters as harness/stores/machine_load.py's PROBE prints them, read after the lease was taken, so the
other work measured beside a job never includes the job it waited for.
"""
from __future__ import annotations

import fcntl
import json
import os
import resource
import select
import signal
import stat
import sys
import time
from datetime import datetime, timezone
from pathlib import Path

from workloads import thermal, wait_policy

UNITS = {"K": 1 << 10, "M": 1 << 20, "G": 1 << 30}
BUSY_EXIT = 75          # EX_TEMPFAIL: the board was leased to another run for the whole lease timeout
LEASE_EXIT = 78         # EX_CONFIG: the lease file is not zobench's (a user's file, a folder, a device)
LEASE_MARK = "lease"    # what a lease file zobench made holds under "zobench", beside its holder
POLL_S = 0.25           # how often a waiting launcher tries the lease again
REPORT_S = 5.0          # and says whom it waits for (at once when that changes)
OPTIONS = ("--lease", "--lease-timeout", "--holder", "--cooldown", "--omp-wait", "--thermal", "--mem-limit")


# Thrashing at the memory limit (watch_thrash): for THRASH_S on end the cgroup holds at least
# THRASH_FULL of its limit, the job takes at least THRASH_FAULTS_S major page faults a second, it
# keeps at least THRASH_CPU of a core busy, and less than THRASH_USER of that is its own code's:
# busy in the kernel, faulting. A job near its limit that streams its data (faults, but computes
# between them), waits on a slow disk (little CPU) or waits at all (no faults) is none of these.
THRASH_S, THRASH_FULL, THRASH_FAULTS_S, THRASH_CPU, THRASH_USER = 10.0, 0.9, 10.0, 0.1, 0.1
THRASH_POLL_S = 0.5
THRASHED = "zobench-launch: thrashing at its memory limit"


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


def _usage(cgroup: str) -> int | None:
    for name in ("memory.current", "memory.usage_in_bytes"):     # v2, v1
        try:
            return int((Path(cgroup) / name).read_text())
        except (OSError, ValueError):
            continue
    return None


def _faults_and_times(pid: int) -> tuple[int, int, int] | None:
    """(major faults, user ticks, system ticks) of a process, from /proc/PID/stat."""
    try:
        fields = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()
        return int(fields[9]), int(fields[11]), int(fields[12])
    except (OSError, ValueError, IndexError):
        return None


def thrashing(samples: list[tuple[float, int | None, tuple | None]], limit: int, tick_s: float = 0.01) -> str:
    """What THRASH_S of (monotonic, cgroup usage, _faults_and_times) samples show of a job
    thrashing at its limit, as the one line the watchdog prints; "" while they do not. tick_s:
    the seconds of a clock tick, /proc's unit of CPU time."""
    if len(samples) < 2 or samples[-1][0] - samples[0][0] < THRASH_S:
        return ""
    if any(u is None or u < THRASH_FULL * limit or p is None for _, u, p in samples):
        return ""
    (t0, _, (f0, u0, s0)), (t1, _, (f1, u1, s1)) = samples[0], samples[-1]
    faults, cpu = f1 - f0, (u1 - u0) + (s1 - s0)
    if faults < THRASH_FAULTS_S * (t1 - t0) or cpu * tick_s < THRASH_CPU * (t1 - t0) or (u1 - u0) >= THRASH_USER * cpu:
        return ""
    return (f"{THRASHED}: {faults} major page faults in {t1 - t0:.0f} s at {limit >> 20} MiB, "
            f"{(u1 - u0) / cpu:.1%} of its CPU time in its own code; killed")


def watch_thrash(cgroup: str, limit: int) -> None:
    """Fork the watchdog of the module docstring: it leaves the job's cgroup (its memory is not
    the job's), keeps stderr (its one line is the job's last) and ends with its parent, the
    launcher that becomes the runner by exec."""
    parent = os.getpid()
    if os.fork():
        return
    try:
        (Path(cgroup).parent / "cgroup.procs").write_text(str(os.getpid()))
        null = os.open(os.devnull, os.O_RDWR)
        os.dup2(null, 0)
        os.dup2(null, 1)
        os.closerange(3, os.sysconf("SC_OPEN_MAX"))
        try:        # readable when the parent ends: the job's stderr is not held open past it
            ended = os.pidfd_open(parent)
        except (AttributeError, OSError):   # before Linux 5.3: the parent checked each poll
            ended = None
        samples: list = []
        while os.getppid() == parent:
            now = time.monotonic()
            samples.append((now, _usage(cgroup), _faults_and_times(parent)))
            while len(samples) > 2 and now - samples[1][0] >= THRASH_S:     # the last THRASH_S, and no more
                samples.pop(0)
            line = thrashing(samples, limit, 1 / os.sysconf("SC_CLK_TCK"))
            if line:
                print(line, file=sys.stderr, flush=True)
                os.kill(parent, signal.SIGKILL)
                break
            if ended is None:
                time.sleep(THRASH_POLL_S)
            elif select.select([ended], [], [], THRASH_POLL_S)[0]:
                break
    except OSError:
        pass
    finally:
        os._exit(0)


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


def _say(event: dict) -> None:
    print(json.dumps(event), flush=True)


def _holder_of(fd: int) -> dict | None:
    """Who holds the lease, as its holder wrote it (None: not written yet, or not ours)."""
    try:
        found = json.loads(os.pread(fd, 4096, 0) or b"null")
    except (OSError, ValueError):
        return None
    return found if isinstance(found, dict) and "run" in found else None


def _refuse(file: Path, why: str) -> None:
    """End the launch before anything is written: the lease file is not one zobench may use."""
    print(f"lease {file}: {why}; give the target's lease a file of zobench's own, or lease = false", file=sys.stderr)
    sys.exit(LEASE_EXIT)


def _ours(fd: int) -> bool:
    """Whether the lease file holds what only zobench writes there: its mark, or a holder an older
    zobench wrote (run, job and host)."""
    try:
        found = json.loads(os.pread(fd, 65536, 0))
    except (OSError, ValueError):
        return False
    return isinstance(found, dict) and (found.get("zobench") == LEASE_MARK or {"run", "job", "host"} <= set(found))


def _open_lease(file: Path) -> int:
    """The lease file, opened for its lock: made, with zobench's mark in it, where there is none
    (written beside it and linked into place, so no other launcher ever sees it empty); never
    through a symlink, and only a regular file."""
    file.parent.mkdir(parents=True, exist_ok=True)
    if not file.exists() and not file.is_symlink():
        made = file.with_name(f".{file.name}.{os.getpid()}.new")
        made.write_text(json.dumps({"zobench": LEASE_MARK}))
        try:
            os.link(made, file)
        except FileExistsError:         # another launcher made it first: theirs is as good
            pass
        finally:
            made.unlink()
    fd = os.open(file, os.O_RDWR | os.O_NOFOLLOW)
    if not stat.S_ISREG(os.fstat(fd).st_mode):
        os.close(fd)
        _refuse(file, "is not a regular file")
    return fd


def take_lease(path: str, timeout: float, holder: dict) -> dict:
    """Hold the lease on `path` (left open and inheritable: exec hands it to the runner), waiting
    up to `timeout` seconds; the lease part of the launch line. Past the timeout: a "busy" line
    and exit BUSY_EXIT. A file zobench did not make (a user's, a folder, a device) is refused in
    one line before anything is written to it, exit LEASE_EXIT."""
    file = Path(os.path.expanduser(path))
    try:
        fd = _open_lease(file)
    except OSError as e:    # a folder, an immutable file, a symlink, a folder zobench may not write
        _refuse(file, f"cannot be used ({e.strerror or e})")
    start, seen, next_report, blocked = time.monotonic(), None, 0.0, False
    while True:
        try:
            fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
            break
        except BlockingIOError:
            blocked = True
        waited = time.monotonic() - start
        now = _holder_of(fd)
        if waited >= timeout:
            _say({"event": "busy", "lease": str(file), "holder": now, "waited_s": round(waited, 3)})
            sys.exit(BUSY_EXIT)
        if now != seen or waited >= next_report:
            _say({"event": "lease-wait", "lease": str(file), "holder": now, "waited_s": round(waited, 3)})
            seen, next_report = now, waited + REPORT_S
        time.sleep(POLL_S)
    if not _ours(fd):       # read under the lock: a holder's write is whole by then
        _refuse(file, f"holds {os.fstat(fd).st_size} bytes zobench did not write")
    # a lease had at the first try was waited for by no one: the milliseconds of opening and
    # reading it (more on a busy machine) are no wait, and a record saying 0.004 s would be wrong
    waited = time.monotonic() - start if blocked else 0.0
    since = datetime.now(timezone.utc).isoformat(timespec="milliseconds")
    record = json.dumps({"zobench": LEASE_MARK, **holder, "pid": os.getpid(), "since": since}).encode()
    os.pwrite(fd, record, 0)
    os.ftruncate(fd, len(record))
    os.set_inheritable(fd, True)
    return {"file": str(file), "waited_s": round(waited, 3), "waited_for": seen, "acquired_at": since}


def proc_load() -> str | None:
    """The CPU counters harness/stores/machine_load.py's PROBE reads, in its format; None off Linux."""
    try:
        cpu = [line for line in Path("/proc/stat").read_text().splitlines() if line.startswith("cpu")]
        return "\n".join([Path("/proc/uptime").read_text().strip(), Path("/proc/loadavg").read_text().strip(),
                          *cpu, str(os.sysconf("SC_CLK_TCK"))]) + "\n"
    except (OSError, ValueError):
        return None


def main(argv: list[str]) -> None:
    opts = {}
    while argv[:1] and argv[0] in OPTIONS and len(argv) > 1:
        opts[argv[0]], argv = argv[1], argv[2:]
    if argv[:1] == ["--"]:
        argv = argv[1:]
    if not argv:
        sys.exit("usage: python -m workloads.launch [--lease FILE --lease-timeout S --holder JSON] "
                 "[--mem-limit 512M] -- COMMAND...")
    event = {"event": "launch"}
    if "--lease" in opts:
        event["lease"] = take_lease(opts["--lease"], float(opts.get("--lease-timeout", "inf")),
                                    json.loads(opts.get("--holder", "{}")))
    if "--cooldown" in opts:
        below, most = opts["--cooldown"].split(":")
        waiting = lambda temp: _say({"event": "cooldown-wait", "temp_c": temp, "below_c": float(below)})
        _say({"event": "cooldown", **thermal.cool_down(float(below), float(most), waiting)})
    if opts.get("--omp-wait") == "auto":     # before the sampler starts: its reads are not other work
        share = wait_policy.other_share()
        picked = wait_policy.pick(share)
        os.environ.update(wait_policy.environment(picked))
        event["wait"] = {"picked": picked, "other_share": None if share is None else round(share, 3)}
    if "--thermal" in opts:     # before the memory limit: the sampler is not the job's memory
        thermal.start_sampler(opts["--thermal"])
    event.update(pid=os.getpid(), monotonic=time.monotonic(), load=proc_load())
    if "--mem-limit" in opts:
        limit = parse_size(opts["--mem-limit"])
        event.update(mem_limit=limit, **apply_limit(limit))
    _say(event)
    if "cgroup" in event:
        watch_thrash(event["cgroup"], event["mem_limit"])
    os.execvp(argv[0], argv)


if __name__ == "__main__":
    main(sys.argv[1:])
