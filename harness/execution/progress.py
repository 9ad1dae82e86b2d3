"""Progress bars: per target, one bar over its jobs (with the run's ETA on that
board) and one over the steps of the job running now (with that job's ETA), or whom the job
waits for while another run holds the board's lease. A pool has one bar over its jobs and one
steps bar per member (a lane), since its members run jobs at once.
Finished jobs are printed as lines, so a log without a terminal still shows them; names and
error texts are printed literally (escaped), never read as rich markup."""
from __future__ import annotations

import threading

from rich.console import Console
from rich.markup import escape
from rich.progress import (BarColumn, MofNCompleteColumn, Progress, TextColumn, TimeElapsedColumn,
                           TimeRemainingColumn)

from harness.boards.lease import describe
from harness.stores.schema import step_seconds

STYLE = {"ok": "green", "failed": "red", "timeout": "yellow", "oom": "magenta", "lost": "yellow",
         "interrupted": "yellow", "busy": "yellow"}
WIDTH = max(map(len, STYLE))


def accuracy_name(job: dict) -> str:
    """What a job's test_accuracy measures, as a progress line says it: a job with a validation
    split (a tune trial) scores on held-out training samples, not the test set."""
    return "validation acc" if (job.get("workload") or {}).get("validation") else "test acc"


class ProgressView:
    def __init__(self, jobs_per_target: dict[str, int], console: Console | None = None):
        self.console = console or Console(stderr=True)
        self.progress = Progress(TextColumn("{task.description}"), BarColumn(), MofNCompleteColumn(),
                                 TimeElapsedColumn(), TextColumn("ETA"), TimeRemainingColumn(),
                                 console=self.console, transient=True, disable=not self.console.is_terminal)
        self.lock = threading.Lock()
        self.tasks = {}
        self.running = {}           # target -> its job's id
        self.waiting_for = {}       # target -> the lease holder last printed
        for target, n in jobs_per_target.items():
            jobs = self.progress.add_task(f"[bold]{escape(target)}[/] jobs", total=n)
            steps = self.progress.add_task(f"  {escape(target)}: waiting", total=None)
            self.tasks[target] = (jobs, steps)

    def lane(self, pool: str, member: str) -> str:
        """The key a pool's member reports its job under: its own steps bar, the pool's jobs bar."""
        key = f"{pool}/{member}"
        with self.lock:
            if key not in self.tasks:
                jobs, steps = self.tasks[pool]
                if steps is not None:       # the pool's own steps bar gives way to its members'
                    self.progress.remove_task(steps)
                    self.tasks[pool] = (jobs, None)
                self.tasks[key] = (jobs, self.progress.add_task(f"  {escape(key)}: waiting", total=None))
        return key

    def say(self, line: str) -> None:
        """A line of the run's own (a pool's member left out or dropped), printed literally."""
        with self.lock:
            self.console.print(escape(line), highlight=False, markup=True, soft_wrap=True)

    def __enter__(self):
        self.progress.start()
        return self

    def __exit__(self, *exc):
        self.progress.stop()

    def job_started(self, target: str, job_id: str) -> None:
        with self.lock:
            self.running[target] = job_id
            self._describe(target)

    def _describe(self, target: str) -> None:
        self.progress.reset(self.tasks[target][1], total=None,
                            description=f"  {escape(target)}: {escape(self.running[target])}")
        self.waiting_for.pop(target, None)

    def event(self, target: str, ev: dict) -> None:
        with self.lock:
            task = self.tasks[target][1]
            if ev.get("event") == "lease-wait":
                self._waiting(target, f"waiting for {target}: leased by {describe(ev.get('holder'))}")
            elif ev.get("event") == "cooldown-wait":
                self._waiting(target, f"cooling {target}: {ev.get('temp_c')} C, waiting until it is below "
                                      f"{ev.get('below_c')} C")
            elif ev.get("event") == "launch" and target in self.waiting_for:     # the lease is its now
                self._describe(target)
            elif ev.get("event") == "start":
                self.progress.update(task, total=ev.get("steps_total"), completed=0)
            elif "step" in ev:
                self.progress.update(task, completed=ev["step"])

    def waiting(self, target: str, line: str) -> None:
        """Say what a board waits for (a labgrid place in the lab's queue)."""
        with self.lock:
            self._waiting(target, line)

    def _waiting(self, target: str, line: str) -> None:
        """On the board's bar, and as a line when it changes, so a log shows it too."""
        self.progress.update(self.tasks[target][1], description=f"  {escape(line)}")
        if self.waiting_for.get(target) != line:
            self.waiting_for[target] = line
            self.console.print(escape(line), highlight=False, markup=True, soft_wrap=True)

    def job_finished(self, target: str, result: dict) -> None:
        status = result["status"]
        epochs = result.get("epochs") or [{}]
        acc = epochs[-1].get("test_accuracy")
        step = step_seconds(result)
        detail = f"{1000 * step:.2f} ms/step" if step and status == "ok" else ""
        if acc is not None and status == "ok":
            detail += f", {accuracy_name(result['job'])} {acc:.3f}"
        if result.get("error"):
            detail = result["error"]
        with self.lock:
            self.progress.advance(self.tasks[target][0])
            self.console.print(f"[{STYLE.get(status, 'white')}]{status:>{WIDTH}}[/] "
                               f"{escape(result['job']['job_id'])}  {escape(detail)}", highlight=False, markup=True,
                               soft_wrap=True)     # one line per job in a log, however long its error
