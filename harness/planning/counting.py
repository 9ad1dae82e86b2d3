"""What an instruction count of a C++ job runs and what it records (the count itself:
harness/execution/instructions.py): a measure other work on the machine cannot move, as
CodSpeed and iai-callgrind gate CI on (docs/compare.md, "Instructions per step").

The timed job's numbers move with the load; the instructions its steps execute do not. This
kernel's perf counters are not always readable (a VM's `perf stat -e instructions` says "not
supported"), so after the timed job the same job runs again, short, under Valgrind's callgrind
on the same target through the same transport, and its phases' counts become the result's
`instructions`. The binary dumps callgrind's counters at every phase's end (PhaseClock::lap,
workloads/cpp/common.hpp), each dump named by its step and phase, and callgrind zeroes its
counters at each dump, so each dump holds one phase of one step.

Deterministic to the instruction for a given binary and input, which is what a gate needs:
- one thread: a team's threads spin and sleep as the load lets them, which is not the step's work;
- on x86, a build without AVX-512 or FMA, named in the record: Valgrind 3.19 stops at AVX-512
  code (SIGILL) and runs each FMA a lane at a time through a helper (a count 17x slower; the
  measurements are docs/compare.md's), so a board whose timed build has either is counted on
  x86-64-v3-nofma (AVX2's kernels, each multiply-add two instructions), built and deployed beside it;
- no busy-wait (inject_slowdown spins on a clock: not work), no progress lines (the binary
  prints those by the clock, and not under Valgrind), no warm-up, the smallest evaluation;
- COUNT_STEPS steps after a first, which carries the start's work (data loading) and is left out.
"""
from __future__ import annotations

import re
import shlex
import statistics

from harness.planning import cpu as cpus

TOOL = "callgrind"
COUNT_BUILD = "x86-64-v3-nofma"      # the x86 build Valgrind 3.19 runs at its usual speed
ARCH_OF_BUILD = "x86_64"
AT_SPEED = ("x86-64", "x86-64-v2", COUNT_BUILD)      # the x86 builds with neither AVX-512 nor FMA
COUNT_STEPS = 5                      # counted steps, after the first: inject_work=0.2 adds exactly one
TIMEOUT_S = 900                      # Valgrind runs some 50x slower than the binary
# the phases a step's dumps are named by (workloads/cpp/common.hpp PHASES, eval aside)
PHASES = ("data", "zo_perturb", "forward", "loss", "backward", "zo_update", "bp_update")
DUMP = re.compile(r"zobench step=(-?\d+) phase=([a-z_]+)")
# what the count's grep prints per dump file: "<file>:desc: Trigger: ..." and "<file>:summary: N"
LINE = re.compile(r"^(?P<file>\S+?\.(?P<part>\d+)):(?:desc: Trigger: Client Request: (?P<name>.*)|summary: (?P<n>\d+))$")


def counted_build(arch: str, timed: str, flags=()) -> str:
    """The build a target's count runs: the one it timed, where Valgrind runs it at speed; on
    x86 one with FMA or AVX-512 (v3 and above) is counted on COUNT_BUILD. This machine's
    -march=native is judged by its /proc/cpuinfo flags: with neither, counted as timed; with
    them but without AVX2 (FMA came first on AMD's Piledriver), on the highest level it runs;
    flags unknown, on COUNT_BUILD as if it had both."""
    if arch != ARCH_OF_BUILD or timed in AT_SPEED:
        return timed
    have = set(flags)
    if timed == cpus.NATIVE and have:
        if not have & {"fma", "avx512f"}:
            return timed
        levels = cpus.x86_names(have)
        return COUNT_BUILD if "x86-64-v3" in levels else levels[-1]
    return COUNT_BUILD


def count_spec(spec: dict) -> dict:
    """The job's spec as counted: the same step (model, method, batch, data, seed), one thread,
    1 + COUNT_STEPS steps of one epoch, no warm-up, one test sample, nothing saved."""
    h = spec["hyper"]
    hyper = {**h, "epochs": 1, "train_samples": h["batch_size"] * (1 + COUNT_STEPS), "test_samples": 1,
             "warmup_steps": 0, "max_train_seconds": 0.0, "inject_slowdown": 0.0, "fault": ""}
    return {**spec, "threads": 1, "hyper": hyper, "save_weights": False, "eval_start": False}


def command(valgrind: str, binary: str, folder: str) -> str:
    """The shell command that counts on the target: callgrind over the binary, then only the
    lines that matter of its dumps (no file comes back: a board sends a few hundred bytes)."""
    q = shlex.quote
    out = f"{folder}/callgrind.out"
    return (f"cd {q(folder)} && {q(valgrind)} --tool={TOOL} --callgrind-out-file={q(out)} --dump-instr=no "
            f"--compress-strings=no --compress-pos=no -q {q(binary)} --spec spec.json --out result.json "
            f">/dev/null 2>valgrind.err; rc=$?; grep -H -E '^(desc: Trigger: Client Request|summary:)' "
            f"{q(out)}.* 2>/dev/null; tail -c 400 valgrind.err >&2; exit $rc")


def parse(text: str) -> list[tuple[int, str, int]]:
    """(step, phase, instructions) per dump, in the order they were taken."""
    parts: dict[int, dict] = {}
    for line in text.splitlines():
        m = LINE.match(line.strip())
        if not m:
            continue
        d = parts.setdefault(int(m["part"]), {})
        if m["name"] is not None:
            named = DUMP.search(m["name"])
            if named:
                d["step"], d["phase"] = int(named[1]), named[2]
        else:
            d["n"] = int(m["n"])
    return [(d["step"], d["phase"], d["n"]) for _, d in sorted(parts.items()) if {"step", "phase", "n"} <= d.keys()]


def record(dumps: list[tuple[int, str, int]], build: str) -> dict:
    """The result's `instructions` from a count's dumps: per step, the mean of the steps after
    the first, in all and per phase (their sum), and each counted step's total."""
    steps: dict[int, dict[str, int]] = {}
    for step, phase, n in dumps:
        if step >= 0:
            by = steps.setdefault(step, {})
            by[phase] = by.get(phase, 0) + n
    counted = sorted(steps)[1:]
    if not counted:
        return not_counted(f"the count saw {len(steps)} step(s): none after the first", build)
    per = {p: statistics.fmean(steps[s].get(p, 0) for s in counted) for p in PHASES}
    totals = [sum(steps[s].values()) for s in counted]
    return {"tool": TOOL, "build": build, "threads": 1, "steps": len(counted),
            "per_step": statistics.fmean(totals), "phases": {p: v for p, v in per.items() if v},
            "step_totals": totals, "why": None}


def not_counted(why: str, build: str | None = None) -> dict:
    """The record of a job whose instructions were asked for and could not be counted: why."""
    return {"tool": TOOL, "build": build, "threads": 1, "steps": 0, "per_step": None, "phases": None,
            "step_totals": [], "why": why}


def problem(rec) -> str:
    """What is wrong with a result's `instructions` record ("" when nothing: null is no count)."""
    if rec is None:
        return ""
    if not isinstance(rec, dict):
        return "instructions must be null or a table"
    n = rec.get("per_step")
    if n is None:
        return "" if isinstance(rec.get("why"), str) else "instructions without a count must say why"
    if isinstance(n, bool) or not isinstance(n, (int, float)) or not n > 0:
        return "instructions.per_step must be a number > 0"
    if not isinstance(rec.get("phases"), dict) or not all(
            isinstance(v, (int, float)) and not isinstance(v, bool) and v >= 0 for v in rec["phases"].values()):
        return "instructions.phases must be a table of numbers >= 0"
    return ""
