"""Targets: the boards jobs run on, from profiles (targets/*.toml) and the user's inventory.

A profile holds a board type's defaults (arch, runtimes, threads, ...). The
inventory (--inventory FILE, else ~/.config/zobench/targets.toml) names real
boards in [targets.NAME] tables that may start from a profile. A profile that
needs no host (targets/local.toml) is a target by itself.

Every target names the file its jobs lease on the board (harness/boards/lease.py); targets that are
one board (this machine's profiles; SSH targets of one host, port and user) lease one file,
so two runs through two names still never share the board.

A target may be a pool of interchangeable boards (`members`): named targets of the inventory, or
as many places at once as a labgrid `tags` filter matches. Its jobs are planned once, under the
pool's name, and the scheduler spreads them over the members that are free
(harness/execution/pool.py), so a pool's results are one target's.
"""
from __future__ import annotations

import dataclasses
import os
import platform
import posixpath
import re
import sys
from dataclasses import dataclass, field
from pathlib import Path

from workloads import vocab
from workloads.spec import NAME, NAME_TEXT, Bounds, JobSpec

from harness.planning import cpu as cpus
from harness import guarded, paths, tomlfile
from harness.errors import UserError

# a memory size above zero: "0M" would read as no limit at all
MEM_LIMIT = re.compile(r"^0*[1-9][0-9]*[KMG]$")
# What `uname -m` says on the boards zobench builds for; the arch names a build folder and a
# toolchain file, so a fixed list keeps both inside the checkout.
ARCHES = tuple(cpus.NAMES)
PORT = Bounds(1, 65535)
COOL_C = Bounds(0, 150, open_lo=True)               # degrees C a board must be below before a job
COOL_WAIT_S = Bounds(0, 3600, open_lo=True)         # and the longest a job waits for it
SLOTS = Bounds(1, 256)                              # the labgrid places a tags pool holds at once
ATTEMPTS = Bounds(1, 20)                            # a pool job's tries, on as many members
DROP_AFTER = Bounds(1, 20)                          # failures in a row that drop a member from a run
# What a pool's members must share, read off the inventory: the fields a job's plan and its
# runner take from its target. What is read off the board (the CPU, the runtimes' versions) is
# checked when each member is probed (harness/execution/pool.py).
POOL_SHARED = ("transport", "arch", "runtimes", "device", "threads", "mem_limit", "cpu", "omp_wait_policy")


@dataclass
class Target:
    name: str
    transport: str = "ssh"           # "local" or "ssh"
    profile: str = ""
    description: str = ""
    host: str = ""
    port: int = 0                     # 0: from ~/.ssh/config, else 22
    user: str = ""
    key: str = ""
    host_key: str = "strict"          # or "accept-new"
    arch: str = ""
    runtimes: list = field(default_factory=lambda: ["torch"])
    device: str = "cpu"
    python: str = "python3"
    workdir: str = "~/zobench"
    threads: int = 0
    mem_limit: str = ""
    cpu: str = ""                     # the CPU zobench-train is built for (harness/planning/cpu.py); "": from the probe
    lease: str | None = None          # the file its jobs lease on the board; "": none; None: the board's default
    cooldown: dict | None = None      # {"below_c", "max_wait_s"}: each job waits until the board is that cool
    labgrid: dict | None = None       # {"coordinator", "place" or "tags"}: the board is a labgrid place's
    omp_wait_policy: str = vocab.OMP_WAIT_POLICY   # how idle OpenMP threads wait (docs/targets.md)
    instructions: str = "off"         # count a cpp job's instructions after it (vocab.INSTRUCTION_COUNTERS)
    source: str = ""                  # the file it was defined in
    members: list = field(default_factory=list)    # a pool's boards (Targets); [] for one board
    attempts: int = 3                 # a pool: how many members a job may be tried on
    drop_after: int = 2               # a pool: a member failing this many times in a row leaves the run

    @property
    def pool(self) -> bool:
        return bool(self.members)

    def board(self) -> tuple:
        """What makes two targets one board: this machine, or one SSH host, port and user."""
        if self.labgrid:        # the place's board, whatever address it has today
            return ("labgrid", self.labgrid["coordinator"], self.labgrid["place"] or str(sorted(self.labgrid["tags"].items())))
        return ("local",) if self.transport == "local" else (self.host, self.port, self.user)


def _fields(t: tomlfile.Table, into: dict) -> dict:
    """Validate every target key present in t, layering it over `into`."""
    spec = {
        "transport": (str, ("local", "ssh")), "profile": (str, None), "description": (str, None),
        "host": (str, None), "port": (int, None), "user": (str, None), "key": (str, None),
        "host_key": (str, ("strict", "accept-new")), "arch": (str, ARCHES),
        "runtimes": (list, vocab.RUNTIMES), "device": (str, vocab.DEVICES), "python": (str, None),
        "workdir": (str, None), "threads": (int, None), "mem_limit": (str, None), "cpu": (str, None),
        "omp_wait_policy": (str, vocab.OMP_WAIT_POLICIES), "instructions": (str, vocab.INSTRUCTION_COUNTERS)}
    bounds = {"port": PORT, "threads": JobSpec.BOUNDS["threads"]}
    out = dict(into)
    lease = t.take("lease", (str, bool))     # a path, or false for none
    if lease is True or lease == "":
        raise t.error("lease", f"expected a file path on the board, or false for no lease, got {lease!r}")
    if lease:
        if why := lease_problem(lease):
            raise t.error("lease", f"{why}, got {lease!r}")
    if lease is not None:
        out["lease"] = lease or ""
    lab = t.take("labgrid", dict)
    if lab is not None:
        g = tomlfile.Table(lab, t.path, f"{t.where}labgrid.")
        out["labgrid"] = {"coordinator": g.take("coordinator", str, default=...), "place": g.take("place", str),
                          "tags": g.take("tags", dict)}
        g.done()
        if bool(out["labgrid"]["place"]) == bool(out["labgrid"]["tags"]):
            raise g.error("place", "expected a place or tags (a table like { board = \"pi-zero2\" }), one of them")
        if any(not isinstance(v, str) for v in (out["labgrid"]["tags"] or {}).values()):
            raise g.error("tags", f"expected a table of strings, got {out['labgrid']['tags']!r}")
    cool = t.take("cooldown", dict)
    if cool is not None:
        c = tomlfile.Table(cool, t.path, f"{t.where}cooldown.")
        out["cooldown"] = {"below_c": c.take("below_c", float, default=..., bounds=COOL_C),
                           "max_wait_s": c.take("max_wait_s", float, default=..., bounds=COOL_WAIT_S)}
        c.done()
    for key, (kind, choices) in spec.items():
        v = t.take(key, kind, choices=choices, item=str if kind is list else None, bounds=bounds.get(key))
        if v is not None:
            out[key] = v
    t.done()
    if "workdir" in t.data and posixpath.normpath(out["workdir"]) == "/":
        raise t.error("workdir", "expected a folder of zobench's own, like \"~/zobench\", not the root /")
    if out.get("mem_limit") and not MEM_LIMIT.match(out["mem_limit"]):
        raise t.error("mem_limit", f"expected a size above zero like \"512M\" or \"2G\", got {out['mem_limit']!r}")
    if out.get("cpu"):     # checked against the arch it is built for, which may come from a profile
        arch = out.get("arch") or (platform.machine() if out.get("transport") == "local" else "")
        if why := cpus.problem(arch, out["cpu"]):
            raise t.error("cpu", why)
    return out


def load_profile(name: str, where: str = "") -> dict:
    """A profile's values; `where` (the inventory file and table naming it) starts a refusal."""
    if name not in profile_names():     # a name, never a path: "../x" reads no file outside targets/
        raise UserError(f"{where}profile: expected one of {', '.join(map(repr, profile_names()))}, got {name!r}")
    path = paths.TARGETS_DIR / f"{name}.toml"
    return _fields(tomlfile.Table(tomlfile.load(path), path), {"profile": name, "source": str(path)})


def profile_names() -> list[str]:
    return sorted(p.stem for p in paths.TARGETS_DIR.glob("*.toml"))


def _finish(name: str, values: dict) -> Target:
    t = Target(name=name, **values)
    if t.transport == "local":
        t.arch = t.arch or platform.machine()
        t.python = sys.executable if t.python == "python3" else t.python
    elif not t.host and not t.labgrid:
        raise UserError(f"{t.source}: targets.{name}.host: missing; an ssh target needs a host or ~/.ssh/config alias"
                        " (or a labgrid place)")
    return t


def load(inventory: Path | None = None) -> dict[str, Target]:
    """All targets: host-less profiles, then the inventory's boards (which may override them)."""
    targets = {}
    for name in profile_names():
        values = load_profile(name)
        if values.get("transport") == "local" or values.get("host"):
            targets[name] = _finish(name, values)
    path = inventory or paths.user_inventory()
    if inventory is None and not path.is_file():
        return _shared_leases(targets)
    data = tomlfile.load(path)
    top = tomlfile.Table(data, path)
    boards = top.take("targets", dict, default={})
    top.done()
    named_pools = {}
    for name, table in boards.items():
        where = f"targets.{name}."
        if not re.fullmatch(NAME, name):    # it names job ids and folders
            raise UserError(f"{path}: targets: expected a board name of {NAME_TEXT}, got {name!r}")
        if not isinstance(table, dict):
            raise UserError(f"{path}: targets.{name}: expected a table, got {table!r}")
        if isinstance(table.get("members"), list):      # a pool of the inventory's boards: made once they all are
            named_pools[name] = table
            continue
        table, pool = _pool_terms(table, path, where)
        base = {}
        if "profile" in table:
            if not isinstance(table["profile"], str):
                raise UserError(f"{path}: {where}profile: expected a string, got {table['profile']!r}")
            base = load_profile(table["profile"], f"{path}: {where}")
        values = _fields(tomlfile.Table(table, path, where), {**base, "source": str(path)})
        values.setdefault("transport", "ssh")
        targets[name] = _finish(name, values)
        if pool:
            targets[name] = _slots(targets[name], pool, path, where)
    for name, table in named_pools.items():
        targets[name] = _named_pool(name, table, targets, path)
    return _shared_leases(targets)


def _pool_terms(table: dict, path: Path, where: str) -> tuple[dict, dict | None]:
    """A board's table less a pool's own keys, and those keys checked (None: not a pool). Only
    a labgrid target that names tags can be a pool of a number of places."""
    if "members" not in table:
        for key in ("attempts", "drop_after"):
            if key in table:
                raise UserError(f"{path}: {where}{key}: only a pool (a target with members) takes it")
        return table, None
    t = tomlfile.Table({k: table[k] for k in ("members", "attempts", "drop_after") if k in table}, path, where)
    pool = {"members": t.take("members", int, bounds=SLOTS), "attempts": t.take("attempts", int, 3, bounds=ATTEMPTS),
            "drop_after": t.take("drop_after", int, 2, bounds=DROP_AFTER)}
    t.done()
    lab = table.get("labgrid")
    if not (isinstance(lab, dict) and lab.get("tags") and not lab.get("place")):
        raise UserError(f"{path}: {where}members: a number of members is a labgrid pool: expected labgrid.tags "
                        "(the places it may take), or a list of the inventory's target names")
    return {k: v for k, v in table.items() if k not in pool}, pool


def _slots(template: Target, pool: dict, path: Path, where: str) -> Target:
    """A labgrid pool: `members` slots, each reserving any free place its tags match, as
    `labgrid-client reserve` does; the place a slot got names the member in its results."""
    members = [dataclasses.replace(template, name=f"{template.name}.{i + 1}", lease=None)
               for i in range(pool["members"])]
    return dataclasses.replace(template, members=members, attempts=pool["attempts"], drop_after=pool["drop_after"])


def _named_pool(name: str, table: dict, targets: dict[str, Target], path: Path) -> Target:
    """A pool of the inventory's boards, named in `members`. They must agree on what a job's plan
    and runner read of a target (POOL_SHARED), so the pool plans as any one of them."""
    where = f"targets.{name}."
    t = tomlfile.Table(table, path, where)
    names = t.take("members", list, item=str)
    attempts = t.take("attempts", int, 3, bounds=ATTEMPTS)
    drop_after = t.take("drop_after", int, 2, bounds=DROP_AFTER)
    description = t.take("description", str, "")
    t.done()
    if not names:
        raise t.error("members", "an empty pool: expected the names of one or more targets")
    members = []
    for i, m in enumerate(names):
        if m in names[:i]:
            raise t.error("members", f"{m!r} is named twice")
        if m not in targets or m == name:
            raise t.error("members", f"unknown target {m!r}; known targets: {', '.join(sorted(set(targets) - {name}))}")
        if targets[m].pool:
            raise t.error("members", f"{m!r} is a pool itself; name its boards")
        members.append(targets[m])
    first = members[0]
    for m in members[1:]:
        for key in POOL_SHARED:
            if getattr(m, key) != getattr(first, key):
                raise t.error("members", f"{m.name!r} has {key} = {getattr(m, key)!r} but {first.name!r} has "
                                         f"{getattr(first, key)!r}: a pool's members are interchangeable boards")
    return dataclasses.replace(first, name=name, description=description, source=str(path), host="", labgrid=None,
                               lease="", members=members, attempts=attempts, drop_after=drop_after)


def lease_problem(path: str) -> str | None:
    """Why a target's lease path is refused before any job runs, or None: it must name a file by
    an absolute or ~/ path, without '..', outside the system's trees. The board's launcher refuses
    the rest when it opens the file (workloads/launch.py: only a file zobench made is written)."""
    if not (path.startswith("/") or path.startswith("~/")):
        return "expected an absolute path or one under ~/ on the board"
    if ".." in path.split("/"):
        return "expected a path without '..' (it would land outside the folder it names)"
    norm = posixpath.normpath(path)
    if norm in ("/", "~") or norm.endswith("/"):
        return "expected a file, not a folder"
    if tree := guarded.system_tree(norm):
        return f"expected a file of zobench's own, not one in {tree}"
    return None


def _shared_leases(targets: dict[str, Target]) -> dict[str, Target]:
    """Each target without its own `lease` gets its board's: the first such target's
    `<workdir>/lease` ($ZOBENCH_LOCAL_LEASE for this machine, where set)."""
    first = {}
    for t in [m for t in targets.values() for m in (t.members or [t])]:
        if t.lease is None:
            local = os.environ.get("ZOBENCH_LOCAL_LEASE") if t.transport == "local" else None
            t.lease = first.setdefault(t.board(), local or f"{t.workdir.rstrip('/')}/lease")
    return targets


def resolve(names: list[str], inventory: Path | None) -> list[Target]:
    """The named targets, each ready to connect to: a missing key file is a configuration
    error here, not an unreachable board later."""
    targets = load(inventory)
    out = []
    for i, n in enumerate(names):
        if n not in targets:
            raise UserError(f"unknown target {n!r}; known targets: {', '.join(sorted(targets)) or 'none'}"
                            " (add boards in --inventory FILE or ~/.config/zobench/targets.toml)")
        if n in names[:i]:      # its jobs would be planned twice, under the same ids
            raise UserError(f"target {n!r} is named twice")
        t = targets[n]
        for board in t.members or [t]:
            if board.key and not Path(board.key).expanduser().is_file():
                raise UserError(f"{board.source}: targets.{board.name}.key: no such file {board.key!r}")
        out.append(t)
    return out
