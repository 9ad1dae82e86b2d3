"""Counting a cpp job's instructions per step on its target, after its timed run, through the
transport the job ran by (what is counted and recorded: harness/planning/counting.py;
docs/compare.md, "Instructions per step")."""
from __future__ import annotations

import json
import shlex

from harness.boards.transport import TransportError
from harness.planning.counting import TIMEOUT_S, command, count_spec, not_counted, parse, record
from workloads.launch import BUSY_EXIT


def count(job, target, site, leased: list[str] | None = None, wait_s: float = 0.0) -> dict:
    """Count a cpp job's instructions on its target after its timed run: the record, or why not.
    leased: the launcher's lease options the timed job ran with; the count holds the board's lease
    too (waiting up to wait_s for it), so its Valgrind never runs beside another run's timed job."""
    if job.spec["runtime"] != "cpp":
        return not_counted(f"runtime {job.spec['runtime']}: only the C++ binary's instructions are counted")
    if not site.count_binary:
        return not_counted(site.count_error or "no binary to count with", site.count_build or None)
    t, q = site.transport, shlex.quote
    rc, where, _ = t.exec("command -v valgrind")
    valgrind = where.strip().splitlines()[0] if rc == 0 and where.strip() else ""
    if not valgrind:
        return not_counted(f"no valgrind on {target.name} (install it there: Debian's valgrind package)",
                           site.count_build)
    folder = f"{site.jobs}/{job.job_id}/count"
    try:
        t.exec(f"rm -rf {q(folder)} && mkdir -p {q(folder)}")
        t.put_bytes(json.dumps(count_spec(site.job_spec(job.spec)), allow_nan=False).encode(), f"{folder}/spec.json")
        counting = command(valgrind, site.count_binary, folder)
        if leased:      # through the launcher, which holds the lease for the command's life
            launch = " ".join(q(a) for a in [target.python, "-m", "workloads.launch", *leased, "--", "sh", "-c", counting])
            counting = f"cd {q(site.root)} && PYTHONPATH={q(site.root)} {launch}"
        rc, out, err = t.exec(counting, timeout=TIMEOUT_S + wait_s)
        t.exec(f"rm -rf {q(folder)}")
    except TransportError as e:
        return not_counted(f"the count did not end: {' '.join(str(e).split())}", site.count_build)
    if rc == BUSY_EXIT:
        return not_counted(f"{target.name} was leased by another run for the {wait_s:g} s the count could wait",
                           site.count_build)
    if rc != 0:
        last = (err.strip().splitlines() or [""])[-1][:200]
        return not_counted(f"valgrind exited with {rc}" + (f": {last}" if last else ""), site.count_build)
    return record(parse(out), site.count_build)
