"""Running one job on a target through its transport, and turning however it ended into a
result (docs/results.md).

The same code serves this machine and a board over SSH: a Site (bundle.py) says where the
workloads code, the job's files and the job directories are on the target. The runner reports
its own failures (status failed/oom with a reason); everything it cannot
report -- a hang, a crash, a signal, a lost connection, an interrupted run, a missing or
corrupt result, a board leased to another run for the whole lease timeout (busy) -- is
classified here, so every job that started ends with a result.

A job is `oom` only on evidence that memory ran out (Evidence): a SIGKILL alone may be the
OOM killer or anyone's `kill -9`, and is `failed` with the signal unless the job's memory
cgroup counted an OOM kill or the kernel's log names the runner's pid since its launch.
"""
from __future__ import annotations

import json
import re
import secrets
import shlex
import signal
import time
from dataclasses import dataclass, field
from datetime import datetime, timezone
from pathlib import Path

from workloads import vocab
from workloads.launch import THRASHED, parse_size

from harness.execution import instructions
from harness.stores import convergence, schema
from harness.boards import lease
from harness.stores import machine_load, validity
from harness.preparation.artifacts import content_id
from harness.preparation.bundle import Site
from harness.planning.inventory import Target
from harness.planning import runs
from harness.planning.runs import Job, failure
from harness.boards.transport import KILLED, Deadline, TransportError

RUNNER_MODULES = {"torch": "workloads.torch_runner", "ort": "workloads.ort_runner"}
THERMAL = "thermal.jsonl"   # the launcher's sampler's lines (workloads/thermal.py), in the job's folder

# What a runtime says when an allocation fails (Python, numpy, C++, torch, ONNX Runtime, CUDA,
# the dynamic loader under RLIMIT_AS), matched in the last stderr line of a runner that wrote no result.
ALLOCATION_FAILURES = ("memoryerror", "bad_alloc", "cannot allocate memory", "can't allocate memory",
                       "failed to allocate", "failed to map segment", "out of memory")
# The kernel's OOM-kill lines: "Out of memory: Killed process 8947 (python3) ..." (older kernels:
# "Kill process"), "oom-kill:constraint=...,task=python3,pid=8947,uid=0".
KERNEL_LOG = "dmesg 2>/dev/null | grep -E 'Kill(ed)? process|oom-kill' | tail -n 50"
KERNEL_LINE = re.compile(r"\[\s*(\d+\.\d+)\]\s*(.*)")
CLOCK_SLACK_S = 1.0     # the kernel log's clock and CLOCK_MONOTONIC may differ by a little


@dataclass
class Evidence:
    """What the target said about a job's memory, raw, for classify to judge."""
    launch: dict = field(default_factory=dict)  # the launcher's first event: pid, monotonic, method, cgroup
    mem_limit: str = ""                         # the job's limit as written ("512M"), "" for none
    cgroup_counters: str = ""                   # its cgroup's memory.events (v2) / memory.oom_control (v1), after it
    kernel_log: str = ""                        # KERNEL_LOG's lines, read after a SIGKILL

def omp_env(policy: str) -> dict:
    """What a runner is started with for a target's wait policy (docs/threads.md): nothing for
    "default" (each runtime's own) and "auto" (the binary's team decides as it runs, the launcher
    for a Python runner: omp_args)."""
    return {} if policy in ("default", "auto") else {"OMP_WAIT_POLICY": policy.upper()}


def omp_args(policy: str, runtime: str) -> list[str]:
    """The launcher's options for a target's wait policy: under "auto" it picks a Python
    runner's from the load it measures just before the start (workloads/wait_policy.py)."""
    return ["--omp-wait", "auto"] if policy == "auto" and runtime != "cpp" else []


def oom_kills(counters: str) -> int:
    """The OOM kills a memory cgroup counted (its `oom_kill N` line; 0 when it has none)."""
    return sum(int(f[1]) for f in (line.split() for line in counters.splitlines())
               if len(f) == 2 and f[0] == "oom_kill" and f[1].isdigit())


def kernel_oom_line(log: str, pid, since) -> str:
    """The kernel's line about an OOM kill of `pid` logged after `since` (CLOCK_MONOTONIC), or ""."""
    if not isinstance(pid, int) or not isinstance(since, (int, float)):
        return ""
    names_pid = re.compile(rf"(Kill(ed)? process |pid=){pid}\b")
    for line in reversed(log.splitlines()):
        m = KERNEL_LINE.search(line)
        if m and float(m[1]) >= since - CLOCK_SLACK_S and names_pid.search(m[2]):
            return m[2][:300]
    return ""


def _oom_evidence(ev: Evidence, rc: int | None, tail: str) -> str:
    """Why the job ran out of memory, from the evidence; "" when there is none. tail: its stderr's
    last lines, where the launcher's watchdog's line may stand above a remote shell's "Killed"."""
    why = _last_line(tail)
    kills = oom_kills(ev.cgroup_counters)
    if kills:
        return f"the OOM killer fired in its {ev.mem_limit} memory cgroup: oom_kill {kills}"
    thrashed = [line for line in tail.splitlines() if line.startswith(THRASHED)]
    if rc == -signal.SIGKILL and thrashed:     # the launcher's watchdog ended it
        return f"it thrashed at its {ev.mem_limit} memory cgroup's limit{thrashed[-1].removeprefix(THRASHED)}"
    line = kernel_oom_line(ev.kernel_log, ev.launch.get("pid"), ev.launch.get("monotonic")) \
        if rc == -signal.SIGKILL else ""
    if line:
        return f"kernel: {line}"
    if any(w in why.lower() for w in ALLOCATION_FAILURES):
        under = f" under its {ev.mem_limit} address-space limit" if ev.launch.get("method") == "rlimit-as" else ""
        return f"an allocation failed{under}"
    return ""


def reason(e: Exception) -> str:
    """An exception as a result's one-line error: a TransportError's message is written for the
    user; any other exception is named by its type too."""
    text = str(e) if isinstance(e, TransportError) else f"{type(e).__name__}: {e}"
    return " ".join(text.split())


def _signal_name(num: int) -> str:
    try:
        return signal.Signals(num).name
    except ValueError:
        return f"signal {num}"


def _last_line(text: str) -> str:
    lines = [l.strip() for l in text.strip().splitlines() if l.strip()]
    return lines[-1][:300] if lines else ""


def device_limit(spec: dict, limit: str) -> tuple[dict, str]:
    """(the spec, the launcher's host limit): a GPU job's limit is its device memory's, which its
    runner caps (JobSpec.device_mem_limit; a host limit on the address space would stop CUDA's
    own mappings), a CPU job's the launcher's."""
    if limit and spec.get("device", "cpu") != "cpu":
        return {**spec, "device_mem_limit": parse_size(limit)}, ""
    return spec, limit


def classify(job: Job, outcome, result_path: Path, started_at: str, wall: float, steps: int,
             evidence: Evidence | None = None, busy: dict | None = None) -> dict:
    """busy: the launcher's "busy" line, when it gave up waiting for the board's lease."""
    def fail(status, error):
        return failure(job, status, error, started_at, wall, steps)

    if busy and not result_path.is_file() and not outcome.interrupted:
        return fail("busy", f"{job.target} was leased by {lease.describe(busy.get('holder'))} for the whole "
                            f"{busy.get('waited_s', 0):g} s this job could wait (--lease-timeout)")
    if outcome.lost:
        return fail("lost", outcome.error)
    if outcome.interrupted:
        return fail("interrupted", outcome.error)
    if outcome.timed_out:
        return fail("timeout", f"no result within the {job.timeout_s:g} s timeout; {KILLED}")
    if result_path.is_file():
        try:
            r = json.loads(result_path.read_text())
        except (json.JSONDecodeError, UnicodeDecodeError) as e:
            return fail("failed", f"corrupt result file: {e}")
        bad = schema.problems(r)
        if bad:
            return fail("failed", "invalid result: " + "; ".join(bad[:3]))
        if (r.get("job") or {}).get("job_id") != job.job_id:
            return fail("failed", f"result is for job {(r.get('job') or {}).get('job_id')!r}, not {job.job_id!r}")
        return r
    rc = outcome.returncode
    why = _last_line(outcome.stderr_tail)
    ended = f"runner killed by {_signal_name(-rc)}" if rc is not None and rc < 0 else \
        f"runner exited with code {rc} without a result"
    oom = _oom_evidence(evidence or Evidence(), rc, outcome.stderr_tail)
    if oom:
        return fail("oom", f"{ended}: out of memory ({oom})" + (f": {why}" if why and not why.startswith(THRASHED) else ""))
    return fail("failed", ended + (f": {why}" if why else ""))


def _check_weights(job: Job, result: dict, transport, remote: str, local: Path) -> dict:
    """A fine-tuning job must have started from the weights its spec names, and a job that
    saves its weights must hand over the bytes its result hashes; either is a failed job if not."""
    def fail(error: str) -> dict:
        return {**result, "status": "failed", "error": error}

    model, spec = result.get("model") or {}, job.spec
    if spec["init_sha256"] and model.get("init_sha256") != spec["init_sha256"]:
        return fail(f"started from weights of sha256 {model.get('init_sha256')}, not the {spec['init_sha256']} "
                    f"its pretraining job {spec['pretrained_from']} ended with")
    if spec["save_weights"]:
        local.unlink(missing_ok=True)
        transport.get(remote, local)
        got = content_id(local)[0] if local.is_file() else None
        if got != model.get("weights_sha256"):
            return fail(f"its {vocab.WEIGHTS_FILE} " + (f"has sha256 {got}, not its result's {model.get('weights_sha256')}"
                                                         if got else "did not come back from the target"))
    return result


def _seconds(x) -> float:
    """A wait the launcher reported (the board's line: trusted for nothing), 0 if not a number."""
    return float(x) if isinstance(x, (int, float)) and not isinstance(x, bool) else 0.0


def _samples(path: Path) -> list[dict]:
    """The sampler's lines; a line cut off by a killed sampler is left out."""
    out = []
    for line in (path.read_text(errors="replace").splitlines() if path.is_file() else []):
        try:
            s = json.loads(line)
        except json.JSONDecodeError:
            continue
        if isinstance(s, dict) and _sample_ok(s):
            out.append(s)
    return out


def _sample_ok(s: dict) -> bool:
    """A sample in workloads/thermal.read()'s shape (the file is the board's: trusted for nothing)."""
    num = lambda x: isinstance(x, (int, float)) and not isinstance(x, bool)
    return (isinstance(s.get("zones"), dict) and all(num(t) for t in s["zones"].values())
            and isinstance(s.get("clocks"), list)
            and all(isinstance(c, list) and len(c) == 3 and all(x is None or num(x) for x in c) for c in s["clocks"])
            and (s.get("throttled") is None or (isinstance(s["throttled"], int) and not isinstance(s["throttled"], bool))))


def run_job(job: Job, target: Target, site: Site, work: Path, on_event=None,
            terms: lease.Terms | None = None) -> dict:
    """Launch the job's runner on the site, holding the board's lease on `terms` (None: no
    lease), and return its (validated) result."""
    t, q = site.transport, shlex.quote
    # one folder per attempt: the orphaned runner of a lost attempt can never touch a later one's result
    job_dir = f"{site.jobs}/{job.job_id}/{datetime.now(timezone.utc):%Y%m%dT%H%M%S}-{secrets.token_hex(3)}"
    # the device cap goes into the spec the runner reads (a GPU job's mem_limit is its runner's to set)
    spec, limit = device_limit(site.job_spec(job.spec), job.mem_limit or target.mem_limit)
    rc, _, err = t.exec(f"mkdir -p {q(job_dir)}")
    if rc != 0:
        raise TransportError(f"{t.where}: cannot make {job_dir}: {err.strip()}")
    t.put_bytes(json.dumps(spec, indent=1, allow_nan=False).encode(), f"{job_dir}/spec.json")   # checked: all finite
    (work / "result.json").unlink(missing_ok=True)
    py = target.python
    runtime = job.spec["runtime"]
    runner = [site.binary] if runtime == "cpp" else [py, "-m", RUNNER_MODULES[runtime]]
    leased = lease.launcher_args(target.lease or "", terms, job.job_id, job.timeout_s) if terms else []
    cooldown = ["--cooldown", f"{target.cooldown['below_c']:g}:{target.cooldown['max_wait_s']:g}"] if target.cooldown else []
    argv = [py, "-m", "workloads.launch", *leased, *cooldown, *omp_args(target.omp_wait_policy, runtime),
            "--thermal", f"{job_dir}/{THERMAL}"] + \
           (["--mem-limit", limit] if limit else []) + \
           ["--", *runner, "--spec", f"{job_dir}/spec.json", "--out", f"{job_dir}/result.json"]
    steps, evidence, busy, cooled = 0, Evidence(mem_limit=limit), {}, {}
    # the launcher gives up waiting for the lease (and the cooldown) itself; the job's own time runs from its
    # runner's start
    ends = Deadline((terms.wait_s(job.timeout_s) if leased else 0) + (target.cooldown or {}).get("max_wait_s", 0)
                    + job.timeout_s)

    def on_line(line: str) -> None:
        nonlocal steps
        try:
            ev = json.loads(line)
        except json.JSONDecodeError:
            return
        if not isinstance(ev, dict) or "event" not in ev:
            return
        if ev["event"] == "launch" and not evidence.launch:     # the launcher's line: the runner starts now
            evidence.launch = ev
            ends.restart(job.timeout_s)
        elif ev["event"] == "busy":
            busy.update(ev)
        elif ev["event"] == "cooldown":
            cooled.update({k: v for k, v in ev.items() if k != "event"})
        steps = ev.get("step", steps)
        if on_event:
            on_event(ev)

    started_at = datetime.now(timezone.utc).isoformat(timespec="seconds")
    t0 = time.perf_counter()
    outcome = t.run(argv, cwd=site.root, timeout=ends, on_line=on_line,
                    env={"PYTHONPATH": site.root, "PYTHONUNBUFFERED": "1", **omp_env(target.omp_wait_policy)},
                    stdout_path=work / "stdout.log", stderr_path=work / "stderr.log")
    held = evidence.launch.get("lease") if isinstance(evidence.launch.get("lease"), dict) else {}
    waited = _seconds(held.get("waited_s", busy.get("waited_s")))
    wall = max(0.0, time.perf_counter() - t0 - waited - _seconds(cooled.get("waited_s")))   # waiting is not the job's time
    # the machine's counters as the launcher read them once it held the lease, just before the runner
    load_before = machine_load.parse(evidence.launch["load"]) if isinstance(evidence.launch.get("load"), str) else None
    load_after = None
    if not outcome.lost:
        load_after = machine_load.sample(t)
        cgroup = evidence.launch.get("cgroup")
        if cgroup:      # its OOM counter, then the cgroup itself (empty now: the runner's group has ended)
            c = q(cgroup)
            evidence.cgroup_counters = t.exec(f"cat {c}/memory.events {c}/memory.oom_control 2>/dev/null; "
                                              f"rmdir {c} 2>/dev/null; true")[1]
        if outcome.returncode == -signal.SIGKILL:
            evidence.kernel_log = t.exec(KERNEL_LOG)[1]
        t.get(f"{job_dir}/result.json", work / "result.json")
        if outcome.returncode is not None and not (outcome.timed_out or outcome.interrupted):
            # the sampler's last line follows the runner's end by a moment (a killed job's never comes)
            t.exec(f"for i in $(seq 30); do grep -qs '\"final\": true' {q(job_dir + '/' + THERMAL)} && break; "
                   "sleep 0.1; done")
        (work / THERMAL).unlink(missing_ok=True)
        t.get(f"{job_dir}/{THERMAL}", work / THERMAL)
    result = classify(job, outcome, work / "result.json", started_at, wall, steps, evidence, busy)
    if result["status"] == "ok":
        result = _check_weights(job, result, t, f"{job_dir}/{vocab.WEIGHTS_FILE}", work / vocab.WEIGHTS_FILE)
    if result["status"] == "ok":    # a loss that exploded leaves the job ok, but flagged (harness/stores/convergence.py)
        result["convergence"] = convergence.judge(result)
    result["load"] = machine_load.during(load_before, load_after, result.get("cpu_seconds"))
    result["spec_sha256"] = runs.spec_sha256(job.spec)
    if evidence.launch:     # the runner started: how the board's clocks and temperatures were meanwhile
        result["validity"] = validity.judge(_samples(work / THERMAL), cooled or None)
    if leased:
        result["lease"] = {"file": held.get("file") or busy.get("lease"), "waited_s": waited,
                           "waited_for": held.get("waited_for") if held else busy.get("holder"),
                           "acquired_at": held.get("acquired_at"),
                           "ended_by": datetime.now(timezone.utc).isoformat(timespec="milliseconds")}
    result["env"]["omp_wait_policy"] = target.omp_wait_policy    # set for the runner: part of its timing
    picked = evidence.launch.get("wait")
    if isinstance(picked, dict) and isinstance(result["env"].get("threads"), dict):   # what auto chose, and from what
        result["env"]["threads"].update(picked=picked.get("picked"), other_share=picked.get("other_share"))
    if runtime == "cpp":
        result["env"]["binary_sha256"] = site.binary_sha256
        result["env"]["build_cpu"], result["env"]["build_cpu_reason"] = site.build.cpu, site.build.why
    # after the timed job, never beside it; once a key a run: its other repeats would count the same
    if target.instructions != "off" and result["status"] == "ok" and not job.spec.get("repeat"):
        result["instructions"] = instructions.count(job, target, site, leased,
                                                    terms.wait_s(job.timeout_s) if leased else 0.0)
    return result
