"""Where `make run`'s time goes on a fresh clone: apt, the venv, the install, the C++ build, the start,
each job and the report, for one or more commits side by side.

  python benchmarks/setup_time.py [--rev REV ...] [--purge-apt] [--json FILE]

Each commit is cloned afresh into a temporary folder and `make run` runs there with caches of its own
(XDG_CACHE_HOME: pip's, uv's and zobench's data, ONNX and uv caches all start empty), as on a machine that
never installed anything; only the system's page cache and the torch file a machine keeps on disk are
shared. --purge-apt first removes the Debian packages `make run` installs (testkit/tools.py's "run"
level) and their downloaded files, so that apt's time is counted too (root only: it uninstalls them;
the run puts them back). Each line `make run` prints is stamped as it comes, and the phases are the
spans between the lines that start them; the jobs come from the run's results (each job's time under its
board's lease: its runner's start-up and its training and evaluation).
"""
from __future__ import annotations

import argparse
import datetime
import hashlib
import json
import os
import re
import shutil
import subprocess
import sys
import tempfile
import time
from pathlib import Path

REPO = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(REPO))

from testkit import tools  # noqa: E402

# a line that starts a phase -> its name (what precedes the first: FIRST); the Makefile before
# scripts/setup.py echoed its set-up's steps, scripts/setup.py says its own on one line at its end
RUN_MARKS = [(re.compile(r"zobench run --suite quick"), "zobench start, plan, data (before scripts/setup.py: the C++ build)"),
             (re.compile(r"^run \S+: \d+ jobs on"), "jobs"),
             (re.compile(r"^report: "), "-")]
JOB_LINE = re.compile(r"^\s+\w+ \S+\.r\d+(\s|$)")     # a job's end, as the progress view prints it off a terminal
PIP_MARKS = [(re.compile(r"zobench: installing"), "apt"),
             (re.compile(r"-m venv "), "venv (pip)"),
             (re.compile(r"pip install --quiet numpy"), "install (pip)")]
SETUP_LINE = re.compile(r"zobench: set-up in ")


def purge_apt() -> None:
    packages = sorted({t.package for t in tools.TOOLS if t.level == tools.RUN} - {"g++", "cmake"})
    subprocess.run(["apt-get", "purge", "-y", "-qq", *packages, "fortunes-min"], check=True,
                   stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL, env={**os.environ, "DEBIAN_FRONTEND": "noninteractive"})
    for deb in Path("/var/cache/apt/archives").glob("*.deb"):
        if any(deb.name.startswith(f"{p}_") for p in (*packages, "fortunes-min")):
            deb.unlink()


def measure(rev: str, purge: bool, machine: str) -> dict:
    work = Path(tempfile.mkdtemp(prefix="zobench-setup-time-"))
    try:
        clone = work / "zobench"
        subprocess.run(["git", "clone", "-q", "--no-local", str(REPO), str(clone)], check=True)
        subprocess.run(["git", "-C", str(clone), "checkout", "-q", rev], check=True)
        commit = subprocess.run(["git", "-C", str(clone), "rev-parse", "--short", "HEAD"], capture_output=True,
                                text=True, check=True).stdout.strip()
        if purge:
            purge_apt()
        env = {**os.environ, "XDG_CACHE_HOME": str(work / "cache")}
        env.pop("PIP_CACHE_DIR", None)
        env.pop("UV_CACHE_DIR", None)
        lines, started = [], time.monotonic()
        p = subprocess.Popen(["make", "run"], cwd=clone, env=env, stdout=subprocess.PIPE, stderr=subprocess.STDOUT,
                             text=True)
        for line in p.stdout:
            lines.append((time.monotonic() - started, line.rstrip("\n")))
        rc = p.wait()
        total = time.monotonic() - started
        stepped = any(SETUP_LINE.search(line) for _, line in lines)
        marks = [(SETUP_LINE, "-"), *RUN_MARKS] if stepped else [*PIP_MARKS, *RUN_MARKS]
        last_job = max((i for i, (_, line) in enumerate(lines) if JOB_LINE.match(line)), default=None)
        phases, current, since = {}, "set-up (its steps side by side: below)" if stepped else "make and its checks", 0.0
        for i, (t, line) in enumerate(lines):
            if i - 1 == last_job:       # the report is written after the last job ends, before the run's last lines
                phases[current] = phases.get(current, 0.0) + lines[last_job][0] - since
                current, since = "report", lines[last_job][0]
            for pattern, name in marks:
                if pattern.search(line):
                    phases[current] = phases.get(current, 0.0) + t - since
                    current, since = name, t
                    break
        phases[current] = phases.get(current, 0.0) + total - since
        phases.pop("-", None)
        freeze = subprocess.run([clone / ".venv" / "bin" / "python", "-m", "pip", "freeze", "--exclude-editable"],
                                capture_output=True, text=True).stdout
        stamp = clone / ".venv" / "zobench-lock.json"
        setup = json.loads(stamp.read_text())["seconds"] if stamp.is_file() else {}
        jobs = {}
        runs = sorted((clone / "results" / "runs").glob("*/"))
        for f in sorted(runs[-1].glob("*.r0.json")) if runs else []:
            r = json.loads(f.read_text())
            lease = r.get("lease") or {}
            if lease.get("acquired_at") and lease.get("ended_by"):
                seconds = (datetime.datetime.fromisoformat(lease["ended_by"]) -
                           datetime.datetime.fromisoformat(lease["acquired_at"])).total_seconds()
                jobs[r["job"]["job_id"]] = {"leased": round(seconds, 2), "wall": round(r["wall_seconds"], 2)}
        return {"rev": rev, "commit": commit, "machine": machine, "rc": rc, "total_s": round(total, 1), "purged_apt": purge,
                "phases": {k: round(v, 1) for k, v in phases.items()}, "setup_steps": setup, "jobs": jobs,
                "pip_freeze_sha256": hashlib.sha256(freeze.encode()).hexdigest(), "packages": len(freeze.splitlines()),
                "tail": [line for _, line in lines[-3:]]}
    finally:
        shutil.rmtree(work, ignore_errors=True)


def table(results: list[dict]) -> str:
    names = list(dict.fromkeys(k for r in results for k in r["phases"]))
    head = "| phase | " + " | ".join(f"{r['commit']} (s)" for r in results) + " |"
    rows = [head, "|---" * (len(results) + 1) + "|"]
    for n in names:
        rows.append(f"| {n} | " + " | ".join(f"{r['phases'].get(n, 0):.1f}" for r in results) + " |")
    rows.append("| **make run in all** | " + " | ".join(f"**{r['total_s']:.1f}**" for r in results) + " |")
    steps = list(dict.fromkeys(k for r in results for k in r["setup_steps"]))
    for s in steps:
        rows.append(f"| set-up step: {s} (side by side) | " + " | ".join(
            f"{r['setup_steps'][s]:.1f}" if s in r["setup_steps"] else "-" for r in results) + " |")
    for runtime in ("torch", "cpp", "ort"):
        rows.append(f"| jobs on {runtime}: leased (of which training, evaluation and start-up in the runner) | " +
                    " | ".join(f"{sum(j['leased'] for k, j in r['jobs'].items() if f'.{runtime}.' in k):.1f} "
                               f"({sum(j['wall'] for k, j in r['jobs'].items() if f'.{runtime}.' in k):.1f})"
                               for r in results) + " |")
    return "\n".join(rows)


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--rev", action="append", help="a commit to measure (repeatable; default HEAD)")
    parser.add_argument("--purge-apt", action="store_true", help="uninstall make run's Debian packages before each")
    parser.add_argument("--json", type=Path, help="write the measurements here too")
    parser.add_argument("--machine", default="", help="what the machine is, kept with each measurement")
    a = parser.parse_args()
    if a.purge_apt and os.geteuid() != 0:
        parser.error("--purge-apt uninstalls packages: run it as root")
    results = []
    for rev in a.rev or ["HEAD"]:
        r = measure(rev, a.purge_apt, a.machine)
        results.append(r)
        print(f"{r['commit']}: make run exited {r['rc']} in {r['total_s']:.1f} s; the venv's pip freeze: "
              f"{r['packages']} packages, sha256 {r['pip_freeze_sha256'][:16]}", file=sys.stderr)
        if r["rc"] != 0:
            print("\n".join(r["tail"]), file=sys.stderr)
    print(table(results))
    if a.json:
        a.json.write_text(json.dumps(results, indent=1) + "\n")
    return 0 if all(r["rc"] == 0 for r in results) else 1


if __name__ == "__main__":
    sys.exit(main())
