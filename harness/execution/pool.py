"""A pool's jobs spread over its members: each member a thread that takes the next job whenever
it is free, under its own board's lease, so a farm of interchangeable boards runs one suite
as fast as it has boards, and its results are one target's (the member that ran each is in
its result's `pool` record).

A member must be what its siblings are: the fingerprint `compare` pools results by
(harness/stores/measurements.py), read off its probe; one that differs is left out of the run,
with one line naming the field, before it runs anything. Members are judged against the
fingerprint most of them share (a named pool; ties go to the first in the inventory's order),
or the first place a labgrid pool got; where no two members agree, none is the pool's, and the
jobs fail saying so.

A member that cannot be reached, or goes away mid-job, loses only that attempt: the job is put
back for another member, at most `attempts` tries in all (each recorded in its result); a
member that fails `drop_after` times in a row leaves the pool for the rest of the run, with one
line. A member whose lease is held by another run (two runs on one pool) waits for it a short
while, then lets another member try: the job ends `busy` only once it has waited its whole
lease timeout. A Stop ends every member's job as on a lone board, and --resume runs the rest.
"""
from __future__ import annotations

import collections
import threading
import time
from concurrent.futures import ThreadPoolExecutor, wait
from dataclasses import dataclass, field

from harness.boards import lease
from harness.boards.transport import POLL_S, Stop
from harness.execution.board import connected
from harness.execution.job import reason
from harness.execution.progress import ProgressView
from harness.planning.inventory import Target
from harness.planning.runs import Job, failure
from harness.preparation.bundle import Prepared
from harness.stores.measurements import differs, fingerprint
from harness.stores.store import Store

# what a job's attempt ended as when its member, not the job, failed: tried again elsewhere
MEMBER_FAULTS = ("lost",)
# how long a pool's job waits for one member's lease before another member may try it
LEASE_TRY_S = 10.0
# how long a member that could not be reached waits before it tries again
RETRY_S = 2.0
# how long the first members probed wait for their siblings' probes before the fingerprint is
# chosen among those in (a member held in labgrid's queue is judged when it comes)
JUDGE_WAIT_S = 120.0


class LeftOut(Exception):
    """A member that is not what its siblings are; the message names the field."""


class Queue:
    """The pool's jobs not yet done: members take the next one, and put back one whose attempt
    their fault ended. A member waits while others still run jobs, since any of those may come back."""

    def __init__(self, jobs: list[Job]):
        self.todo = collections.deque(jobs)
        self.running = 0
        self.cond = threading.Condition()

    def wait_for_work(self, stop: Stop) -> bool:
        """True once a job waits to be taken; False when none will (all done, or stopped)."""
        with self.cond:
            while not self.todo and self.running and not stop.is_set():
                self.cond.wait(POLL_S)
            return bool(self.todo) and not stop.is_set()

    def take(self, stop: Stop) -> Job | None:
        with self.cond:
            if not self.wait_for_work(stop):
                return None
            self.running += 1
            return self.todo.popleft()

    def done(self, job: Job, again: bool = False) -> None:
        with self.cond:
            self.running -= 1
            if again:
                self.todo.appendleft(job)     # next, so a put-back job does not wait behind the rest
            self.cond.notify_all()

    def pause(self, seconds: float, stop: Stop) -> bool:
        """Wait up to `seconds` (a member before it tries its board again); True, at once, where
        there is nothing left to wait for: the run stopped, or every job is done."""
        end = time.monotonic() + seconds
        with self.cond:
            while time.monotonic() < end and not stop.is_set() and (self.todo or self.running):
                self.cond.wait(min(POLL_S, max(0.0, end - time.monotonic())))
            return stop.is_set() or not (self.todo or self.running)

    def left(self) -> list[Job]:
        with self.cond:
            out, self.todo = list(self.todo), collections.deque()
            return out


class Reference:
    """The fingerprint a pool's members are judged by: the one most members share, once every
    member has probed or failed to (`expected` of them; at most JUDGE_WAIT_S after the first
    probe); the first one where that number is 1."""

    def __init__(self, expected: int, order: list[str]):
        self.expected, self.order = expected, order
        self.seen: dict[str, dict | None] = {}
        self.chosen: dict | None = None
        self.conflict = ""          # why no member is the pool's, where no two agree
        self.cond = threading.Condition()

    def absent(self, member: str) -> None:
        """A member that could not be probed: no one waits for it."""
        with self.cond:
            self.seen.setdefault(member, None)
            self.cond.notify_all()

    def judge(self, member: str, facts: dict, stop: Stop) -> None:
        """Raise LeftOut where the member's fingerprint differs from the reference."""
        fp = fingerprint(facts)
        with self.cond:
            self.seen[member] = fp
            self.cond.notify_all()
            end = time.monotonic() + JUDGE_WAIT_S
            while self.chosen is None and len(self.seen) < self.expected and not stop.is_set() \
                    and time.monotonic() < end:
                self.cond.wait(POLL_S)
            if self.chosen is None:
                probed = [(m, f) for m, f in self.seen.items() if f is not None]
                counts = collections.Counter(repr(sorted(f.items())) for _, f in probed)
                rank = {m: i for i, m in enumerate(self.order)}
                first, self.chosen = max(probed, key=lambda mf: (counts[repr(sorted(mf[1].items()))],
                                                                  -rank.get(mf[0], len(rank))))
                if len(probed) > 1 and max(counts.values()) == 1:     # no two agree: none is the pool's
                    other, theirs = next((m, f) for m, f in probed if m != first)
                    self.conflict = (f"no two of its members agree on the fingerprint results are pooled by ({first} "
                                     f"and {other} differ in {', '.join(differing(self.chosen, theirs))})")
            ref = self.chosen
        if self.conflict:
            raise LeftOut(self.conflict)
        diff = differing(ref, fp)
        if diff:
            raise LeftOut("; ".join(f"{k} {fp.get(k)!r}, its siblings' {ref.get(k)!r}" for k in diff))


def differing(a: dict, b: dict) -> list[str]:
    """The fingerprint's fields two members differ in (a fact one of them does not know, as the lock of a
    Python zobench's set-up did not fill, is no difference: measurements.differs)."""
    return [k for k in sorted({**a, **b}) if differs(k, a.get(k), b.get(k))]


@dataclass
class Tries:
    """A job's attempts that its member ended (each recorded in its result), and since when it
    has waited for a free lease."""
    attempts: list = field(default_factory=list)
    busy_since: float | None = None


def run(pool: Target, jobs: list[Job], prep: Prepared, store: Store, run_id: str, view: ProgressView, stop: Stop,
        finish, terms: lease.Terms) -> None:
    """Run a pool's jobs of one wave on its members; every job ends with a result (or none,
    where the run was stopped before it started: --resume runs it)."""
    queue = Queue(jobs)
    tries: dict[str, Tries] = collections.defaultdict(Tries)
    members = pool.members[:len(jobs)] if pool.labgrid else pool.members   # a named pool probes every member
    reference = Reference(1 if pool.labgrid else len(members), [m.name for m in members])
    gone: list[str] = []        # why each member left

    def record(result: dict, member: str, job: Job) -> dict:
        result["pool"] = {"member": member, "attempts": tries[job.job_id].attempts}
        return result

    def attempt(member: str, job: Job, result: dict) -> None:
        tries[job.job_id].attempts.append({"member": member, "status": result["status"], "error": result["error"],
                                           "started_at": result["started_at"], "wall_seconds": result["wall_seconds"]})

    def member_loop(m: Target) -> None:
        lane = view.lane(pool.name, m.name)
        failures, last = 0, ""

        def judge(reached: Target, facts: dict) -> None:
            reference.judge(m.name, facts, stop)

        while queue.wait_for_work(stop):
            try:
                with connected(lane, m, prep, store, run_id, view, stop, judge) as ready:
                    if ready is None:
                        return
                    reached, board = ready
                    name = (reached.labgrid or {}).get("acquired") or m.name
                    while (job := queue.take(stop)) is not None:
                        try:
                            view.job_started(lane, f"{job.job_id} on {name}")
                            result = board.run(job, store, run_id, lambda ev: view.event(lane, ev),
                                               _terms(terms, job, tries[job.job_id], len(members)))
                        except BaseException:   # the job goes back: no sibling may wait on it for good
                            queue.done(job, again=not stop.is_set())
                            raise
                        if result["status"] in MEMBER_FAULTS:
                            attempt(name, job, result)
                            failures, last = failures + 1, result["error"]
                            again = len(tries[job.job_id].attempts) < pool.attempts and not stop.is_set()
                            queue.done(job, again)
                            if not again:
                                finish(pool.name, record(result, name, job))
                            break       # the connection is suspect: reach the board again
                        if result["status"] == "busy" and len(members) > 1 and \
                                not _waited_out(tries[job.job_id], terms, job):
                            queue.done(job, again=True)     # another member may be free
                            continue
                        failures = 0
                        queue.done(job)
                        finish(pool.name, record(result, name, job))
                    else:
                        return
            except LeftOut as e:
                reference.absent(m.name)
                if reference.conflict:      # said once, for the pool, by its jobs' errors below
                    gone[:] = [reference.conflict]
                    return
                gone.append(f"{m.name}: left out: {e}")
                view.say(f"pool {pool.name}: member {m.name} left out of this run: {e}")
                return
            except Exception as e:      # unreachable, a probe or deploy that failed: no job was taken
                reference.absent(m.name)
                failures, last = failures + 1, reason(e)
            if failures >= pool.drop_after:
                gone.append(f"{m.name}: {last}")
                view.say(f"pool {pool.name}: member {m.name} dropped for the rest of this run after {failures} "
                         f"failures in a row; the last: {last}")
                return
            if failures and queue.pause(RETRY_S, stop):
                return

    with ThreadPoolExecutor(max_workers=len(members)) as threads:
        futures = [threads.submit(member_loop, m) for m in members]
        while wait(futures, timeout=POLL_S).not_done:
            pass
        for f in futures:
            f.result()
    if stop.is_set():
        return
    why = "; ".join(gone) or "no member could take it"
    if reference.conflict:
        view.say(f"pool {pool.name}: {reference.conflict}: none of them runs this run's jobs")
    for job in queue.left():        # every member left: the jobs say why
        finish(pool.name, record(failure(job, "lost" if tries[job.job_id].attempts else "failed",
                                         f"no member of pool {pool.name} left to run it ({why})"), "", job))


def _terms(terms: lease.Terms, job: Job, tried: Tries, members: int) -> lease.Terms:
    """A pool job's lease terms: with siblings to turn to, a short wait on one member's lease."""
    if members < 2:
        return terms
    left = terms.wait_s(job.timeout_s) - (time.monotonic() - tried.busy_since if tried.busy_since else 0)
    return lease.Terms(terms.run_id, max(0.0, min(LEASE_TRY_S, left)))


def _waited_out(tried: Tries, terms: lease.Terms, job: Job) -> bool:
    """Whether a job that found its member leased has waited its whole lease timeout, over members."""
    now = time.monotonic()
    if tried.busy_since is None:
        tried.busy_since = now - LEASE_TRY_S
    return now - tried.busy_since >= terms.wait_s(job.timeout_s)
