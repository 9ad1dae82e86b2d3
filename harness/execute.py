"""Running jobs on a target through its transport, and turning however a job
ended into a schema-1 result.

The same code serves this machine and a board over SSH: a Site says where the
workloads code and the job directories are on the target. The runner reports
its own failures (status failed/oom with a reason); everything it cannot
report -- a hang, a crash, a signal, a lost connection, a missing or corrupt
result -- is classified here, so every job of a run ends with a result.
"""
from __future__ import annotations

import json
import secrets
import shlex
import signal
import time
from dataclasses import dataclass
from datetime import datetime, timezone
from pathlib import Path

from . import paths, schema
from .build import build, variant
from .deploy import (bundle_files, deploy, init_weights_dir, init_weights_file, init_weights_name, onnx_dir,
                     onnx_graph, raw_idx, raw_idx_root, sha256)
from .errors import UserError
from .inventory import Target
from .plan import Job
from .transport import LocalTransport, TransportError

RUNNER_MODULES = {"torch": "workloads.torch_runner", "ort": "workloads.ort_runner"}


@dataclass
class Site:
    """Where a target's jobs run: the code root and the jobs folder on the target."""
    transport: object
    root: str               # holds the workloads package (the checkout here, a bundle on a board)
    jobs: str               # job folders go below this
    data_dir: str = ""      # where the bundle's dataset files are ("" = the runner searches as usual)
    binary: str = ""        # zobench-train on the target, for cpp jobs
    binary_sha256: str = ""
    init_dir: str = ""      # the initial-weights files every runtime starts from
    onnx_dir: str = ""      # the ONNX graphs of ort jobs


def graph_of(spec: dict) -> Path:
    return onnx_graph(spec["workload"]["model"], spec["method"], spec["bp_layers"])


@dataclass
class Prepared:
    """What the host made for one target before any board started; the board only deploys it."""
    files: dict[str, Path]          # a board's bundle: path in it -> file here ({} for this machine)
    hashes: dict[str, str]          # path in the bundle -> sha256 of the file
    binary: Path | None = None      # zobench-train for the target's cpp jobs
    binary_sha256: str = ""
    build_error: str = ""           # why the binary did not build: the target's cpp jobs fail with it
    inits: bool = False             # initial-weights files were written for its jobs


def prepare(jobs_by_target: dict[str, list[Job]], targets: dict[str, Target]) -> dict[str, Prepared]:
    """The host-side work of a run, each piece once and before any board starts, so boards
    running in parallel never build, decompress or write the same file at the same time:
    one build per build variant, the uncompressed datasets, the initial weights, the ONNX
    graphs and the sha256 of every file sent."""
    built: dict[str, Path | str] = {}       # variant -> binary, or why it did not build
    digests: dict[Path, str] = {}

    def digest(p: Path) -> str:
        if p not in digests:
            digests[p] = sha256(p)
        return digests[p]

    out = {}
    for name, jobs in jobs_by_target.items():
        target = targets[name]
        binary, error = None, ""
        if any(j.spec["runtime"] == "cpp" for j in jobs):
            v = variant(target)
            if v not in built:
                try:
                    built[v] = build(target)
                except UserError as e:
                    built[v] = str(e)
            binary, error = (built[v], "") if isinstance(built[v], Path) else (None, built[v])
        need = {(j.spec["workload"]["dataset"], j.spec["workload"]["data_dir"]) for j in jobs}
        inits = {(j.spec["workload"]["model"], j.spec["seed"]) for j in jobs
                 if not j.spec["init_weights"] and j.spec["precision"] == "fp32"}   # int8 inits come from the seed
        graphs = {graph_of(j.spec) for j in jobs if j.spec["runtime"] == "ort" and not j.spec["onnx_model"]}
        if target.transport == "local":
            files = {}
            for model, seed in inits:
                init_weights_file(model, seed)
            if binary:
                for dataset, data_dir in need:   # the binary reads uncompressed IDX files
                    raw_idx(dataset, data_dir)
        else:
            files = bundle_files(need, binary, inits, graphs)
        out[name] = Prepared(files, {rel: digest(p) for rel, p in files.items()}, binary,
                             digest(binary) if binary else "", error, bool(inits))
    return out


def open_site(target: Target, transport, prepared: Prepared, local_jobs: Path, run_id: str) -> Site:
    """Connect and, on a board, deploy the bundle the host prepared for it."""
    transport.connect()
    p = prepared
    if isinstance(transport, LocalTransport):
        return Site(transport, str(paths.REPO), str(local_jobs / "attempts"), str(raw_idx_root()) if p.binary else "",
                    str(p.binary or ""), p.binary_sha256, str(init_weights_dir()) if p.inits else "", str(onnx_dir()))
    workdir = transport.path(target.workdir)
    bundle = deploy(transport, workdir, p.files, p.hashes)
    return Site(transport, bundle, f"{workdir}/jobs/{run_id}", f"{bundle}/data",
                f"{bundle}/bin/zobench-train" if p.binary else "", p.binary_sha256, f"{bundle}/init", f"{bundle}/onnx")


def failure(job: Job, status: str, error: str, started_at: str = "", wall: float = 0.0, steps: int = 0) -> dict:
    """A schema-1 result for a job whose runner could not write one."""
    return {"schema": 1, "job": job.spec, "status": status, "error": error,
            "started_at": started_at or datetime.now(timezone.utc).isoformat(timespec="seconds"),
            "wall_seconds": wall, "train_seconds": 0.0, "steps": steps, "phases": {}, "epochs": [],
            "memory": {"peak_rss_bytes": 0, "baseline_rss_bytes": 0, "device_peak_bytes": None},
            "model": None, "env": {"harness_commit": job.spec.get("harness_commit", "")}}


def _signal_name(num: int) -> str:
    try:
        return signal.Signals(num).name
    except ValueError:
        return f"signal {num}"


def _last_line(text: str) -> str:
    lines = [l.strip() for l in text.strip().splitlines() if l.strip()]
    return lines[-1][:300] if lines else ""


def classify(job: Job, outcome, result_path: Path, started_at: str, wall: float, steps: int,
             kernel_log: str = "", mem_limit: str = "") -> dict:
    def fail(status, error):
        return failure(job, status, error, started_at, wall, steps)

    if outcome.lost:
        return fail("lost", outcome.error)
    if outcome.timed_out:
        return fail("timeout", f"no result within the {job.timeout_s:g} s timeout; "
                               "the runner's process group was killed")
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
    if rc is not None and rc < 0:
        name = _signal_name(-rc)
        if -rc == signal.SIGKILL:
            return fail("oom", f"runner killed by {name} (out of memory)" + (f"; kernel: {kernel_log}" if kernel_log else ""))
        return fail("failed", f"runner killed by {name}" + (f": {why}" if why else ""))
    if mem_limit and any(w in why.lower() for w in ("memory", "failed to map", "mmap")):
        # under RLIMIT_AS an allocation fails (often while loading the runtime) instead of a kill
        return fail("oom", f"runner ran out of its {mem_limit} memory limit: {why}")
    return fail("failed", f"runner exited with code {rc} without a result" + (f": {why}" if why else ""))


def run_job(job: Job, target: Target, site: Site, work: Path, on_event=None) -> dict:
    """Launch the job's runner on the site and return its (validated) result."""
    t, q = site.transport, shlex.quote
    # one folder per attempt: the orphaned runner of a lost attempt can never touch a later one's result
    job_dir = f"{site.jobs}/{job.job_id}/{datetime.now(timezone.utc):%Y%m%dT%H%M%S}-{secrets.token_hex(3)}"
    spec = dict(job.spec)
    if site.data_dir:
        spec["workload"] = {**spec["workload"], "data_dir": site.data_dir}
    if not spec["init_weights"] and site.init_dir and spec["precision"] == "fp32":
        spec["init_weights"] = f"{site.init_dir}/{init_weights_name(spec['workload']['model'], spec['seed'])}"
    if spec["runtime"] == "ort" and not spec["onnx_model"]:
        spec["onnx_model"] = f"{site.onnx_dir}/{graph_of(spec).name}"
    rc, _, err = t.exec(f"mkdir -p {q(job_dir)}")
    if rc != 0:
        raise TransportError(f"{t.where}: cannot make {job_dir}: {err.strip()}")
    t.put_bytes(json.dumps(spec, indent=1).encode(), f"{job_dir}/spec.json")
    (work / "result.json").unlink(missing_ok=True)
    py = target.python
    runtime = job.spec["runtime"]
    runner = [site.binary] if runtime == "cpp" else [py, "-m", RUNNER_MODULES[runtime]]
    argv = [py, "-m", "workloads.launch"] + (["--mem-limit", target.mem_limit] if target.mem_limit else []) + \
           ["--", *runner, "--spec", f"{job_dir}/spec.json", "--out", f"{job_dir}/result.json"]
    steps, cgroup = 0, None

    def on_line(line: str) -> None:
        nonlocal steps, cgroup
        try:
            ev = json.loads(line)
        except json.JSONDecodeError:
            return
        if not isinstance(ev, dict) or "event" not in ev:
            return
        cgroup = ev.get("cgroup", cgroup)
        steps = ev.get("step", steps)
        if on_event:
            on_event(ev)

    started_at = datetime.now(timezone.utc).isoformat(timespec="seconds")
    t0 = time.perf_counter()
    outcome = t.run(argv, cwd=site.root, timeout=job.timeout_s, on_line=on_line,
                    env={"PYTHONPATH": site.root, "PYTHONUNBUFFERED": "1"},
                    stdout_path=work / "stdout.log", stderr_path=work / "stderr.log")
    wall = time.perf_counter() - t0
    kernel_log = ""
    if not outcome.lost:
        if cgroup:
            t.exec(f"rmdir {q(cgroup)} 2>/dev/null || true")
        if outcome.returncode == -signal.SIGKILL:
            kernel_log = _last_line(t.exec("dmesg 2>/dev/null | grep -iE 'out of memory|killed process' "
                                           "| tail -n 1")[1])
        t.get(f"{job_dir}/result.json", work / "result.json")
    result = classify(job, outcome, work / "result.json", started_at, wall, steps, kernel_log, target.mem_limit)
    if runtime == "cpp":
        result["env"]["binary_sha256"] = site.binary_sha256
    return result
