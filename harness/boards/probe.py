"""Probing a target: the facts a benchmark result depends on, read on the target itself.

The probe is workloads/envinfo.py fed to the target's python on stdin, so it
works before anything is deployed and is the same code the runners use. The transport adds how
files reach the target (`transfer`: sftp, tar or local)."""
from __future__ import annotations

import json
import shlex

from harness import paths
from harness.boards.transport import TransportError


def probe(transport, target) -> dict:
    source = (paths.REPO / "workloads" / "envinfo.py").read_text()
    workdir = transport.path(target.workdir)
    rc, out, err = transport.exec(f"{shlex.quote(target.python)} - {shlex.quote(workdir)}", stdin=source,
                                  timeout=60)
    lines = out.strip().splitlines()
    if rc != 0 or not lines:
        why = (err.strip().splitlines() or ["no output"])[-1]
        raise TransportError(f"{transport.where}: probe with {target.python} failed: {why}")
    try:
        facts = json.loads(lines[-1])
    except json.JSONDecodeError:
        raise TransportError(f"{transport.where}: probe printed no facts: {lines[-1][:200]}") from None
    # how files reach the board: sftp, or tar over an exec channel where its sshd has no SFTP (a board
    # with neither is this probe's error: nothing could be deployed to it)
    facts["transfer"] = transport.transfer()
    return facts
