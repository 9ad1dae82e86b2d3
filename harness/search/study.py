"""The Optuna study behind `zobench tune`: this process's own, in memory (as it always was), or
one shared through the lab's PostgreSQL (`--storage postgresql://... --study NAME`: Optuna's own
distributed mode, its RDB storage), so that `zobench tune` processes on several hosts search as
one. Both go through the same rules, so one process alone behaves as it did:

- Each trial runs once. A process asks for a trial under a PostgreSQL advisory lock (ASK), and
  a grid point is queued only then, when no trial of the study holds it: two processes never
  take one point, and a grid ends when its points are taken.
- --trials is the study's total: a process asks only while the study holds fewer trials that
  count (counted()); then it waits for those running elsewhere to end (one may fail and come
  back to be run again), so that every process reads the same best at its end.
- The pruner sees every process's epochs: each report is a row of the database, where the
  pruner reads the other trials' intermediate values.
- A trial whose process is interrupted (Ctrl-C, SIGTERM) is failed and queued again with the
  same values (Optuna's RetryFailedTrialCallback). One whose process died without a word stops
  beating (HEARTBEAT_S) and, GRACE_S later, the next process to ask fails and queues it so.
- A study is one search: zobench's description of it (suite, method, params, ...) is its user
  attribute DESCRIPTION, and a process whose search differs is refused, naming what differs.
"""
from __future__ import annotations

import contextlib
import json
import threading
import time
import warnings

from harness.errors import UserError
from harness.store_url import said, shown
from harness.stores import pgstore

# how often a running trial records that its process lives; a trial silent for GRACE_S is taken
# as its process's death (a board's epoch takes seconds, a host's pause for a minute is no death)
HEARTBEAT_S = 60
GRACE_S = 180
# how often one trial's values are queued again after its process was interrupted or died
RETRIES = 3
# how often a process that asked its last trial looks whether the others' have ended
POLL_S = 1.0
# the advisory locks (pg_advisory_lock(KEY, n)) of a storage's database: JOIN serialises the
# creation of Optuna's tables and of a study (two first processes at once would race to make
# them), ASK a process's count, grid queueing and ask
KEY = 0x7A74756E        # "ztun"
JOIN, ASK = 1, 2
# the study's user attribute that holds the search's description
DESCRIPTION = "zobench"


def counted(trials) -> int:
    """The trials that count toward --trials: those complete, pruned or running, and those that
    failed and are not queued again (a retry counts in their place, once it runs)."""
    from optuna.trial import TrialState

    retried = {n for t in trials for n in t.system_attrs.get("retry_history", ())}
    return sum(t.state in (TrialState.COMPLETE, TrialState.PRUNED, TrialState.RUNNING)
               or (t.state == TrialState.FAIL and t.number not in retried) for t in trials)


def storage_url(url: str) -> str:
    """The URL Optuna's RDB storage takes (SQLAlchemy's, on psycopg 3: postgresql+psycopg://)
    from any form libpq takes, a URL or key=value words; braces doubled, as RDBStorage formats
    its URL (a password may hold one)."""
    from psycopg.conninfo import conninfo_to_dict
    from sqlalchemy.engine import URL

    words = {k: str(v) for k, v in conninfo_to_dict(url).items()}
    port = words.pop("port", None)
    if port is not None and not port.isdigit():     # several hosts' ports: libpq takes them as a word
        words["port"], port = port, None
    made = URL.create("postgresql+psycopg", username=words.pop("user", None), password=words.pop("password", None),
                      host=words.pop("host", None), port=int(port) if port else None,
                      database=words.pop("dbname", None), query=words)
    return made.render_as_string(hide_password=False).replace("{", "{{").replace("}", "}}")


def retried():
    """Optuna's callback that queues a failed trial's values again, at most RETRIES times: the
    storage's, for a trial whose heartbeat stopped, and the study's, for one interrupted."""
    import optuna

    with _quiet():
        return optuna.storages.RetryHeartbeatStaleTrialCallback(max_retry=RETRIES)


def differences(theirs: dict, mine: dict) -> list[str]:
    """What two descriptions of a search disagree on, each as 'KEY X in the study, Y here'."""
    return [f"{k} {json.dumps(theirs.get(k))} in the study, {json.dumps(mine.get(k))} here"
            for k in sorted(set(theirs) | set(mine)) if theirs.get(k) != mine.get(k)]


class Study:
    """One search's Optuna study, and the rules every process of it keeps (the module's text).
    shared names it for messages and run.json ("" for one in memory)."""

    def __init__(self, study, lock=None, shared: dict | None = None, engine=None, retry=None):
        self.optuna = study
        self.lock = lock            # the database connection that takes the advisory locks; None in memory
        self.engine = engine        # the storage's SQLAlchemy engine; None in memory
        self.shared = shared or {}  # {"name": ..., "storage": the URL shown()}
        self.retry = retry or retried()     # what queues a failed trial's values again
        self.beats = {}             # each running trial's heartbeat thread, by its number
        # this process's threads (a pool's members, a trial each) ask one at a time: the database's
        # advisory lock is the connection's, which every thread of the process shares
        self.mutex = threading.Lock()

    @classmethod
    def in_memory(cls, sampler, pruner) -> "Study":
        import optuna

        return cls(optuna.create_study(direction="maximize", sampler=sampler, pruner=pruner))

    @classmethod
    def join(cls, url: str, name: str, description: dict, sampler, pruner) -> "Study":
        """The study NAME in the database at url, made with description where there is none
        yet; one that searches something else, a database that cannot be reached or is not
        Optuna's is a UserError (the password never in it)."""
        import optuna
        import sqlalchemy.exc

        optuna.logging.set_verbosity(optuna.logging.WARNING)
        where = f"tune --storage {shown(url)}"
        lock = pgstore.connect(url, "tune --storage", autocommit=True)
        try:
            retry = retried()
            with _locked(lock, JOIN), _quiet():
                storage = optuna.storages.RDBStorage(
                    storage_url(url), engine_kwargs={"connect_args": {"connect_timeout": 10}},
                    heartbeat_interval=HEARTBEAT_S, grace_period=GRACE_S, heartbeat_stale_trial_callback=retry)
                study = optuna.create_study(storage=storage, study_name=name, load_if_exists=True,
                                            direction="maximize", sampler=sampler, pruner=pruner)
                _claim(study, json.loads(json.dumps(description)), f"{where} --study {name}")
        except (sqlalchemy.exc.SQLAlchemyError, RuntimeError) as e:     # RuntimeError: another Optuna's schema
            lock.close()
            raise UserError(f"{where}: {said(e)}") from None
        except BaseException:
            lock.close()
            raise
        return cls(study, lock, {"name": name, "storage": shown(url)}, storage.engine, retry)

    def close(self) -> None:
        """Hang up on the database (nothing to do in memory)."""
        if self.lock is not None:
            self.engine.dispose()
            self.lock.close()

    def locked(self, which: int):
        """One of the database's advisory locks for the block; in memory, nothing to lock."""
        return _locked(self.lock, which) if self.lock is not None else contextlib.nullcontext()

    def ask(self, budget: int, grid: list[dict] | None, suggest, owner: dict, stop, show=lambda line: None):
        """(trial, its values from suggest(trial), the number of the trial it runs again or None)
        for this process to run next; None once the study holds budget trials that count (or its
        grid is taken) and none runs elsewhere, or once stop is set. Asked, queued and suggested
        under ASK, so that no other process takes it."""
        import optuna

        told = False
        while not stop.is_set():
            with self.mutex, self.locked(ASK):
                self._fail_stale()
                trials = self.optuna.get_trials(deepcopy=False)
                if counted(trials) < budget and self._queue(trials, grid):
                    with _quiet():      # Optuna expects a heartbeat in study.optimize alone
                        trial = self.optuna.ask()
                    self._start_beat(trial)
                    trial.set_user_attr("run", owner)
                    values = suggest(trial)
                    return trial, values, self._frozen(trial).system_attrs.get("failed_trial")
                running = sum(t.state == optuna.trial.TrialState.RUNNING for t in trials)
            if not running:
                return None
            if not told:
                show(f"study {self.shared.get('name')}: its trials are all taken; waiting for the {running} "
                     "running elsewhere to end (one that fails is run again here)")
                told = True
            _sleep(POLL_S, stop)
        return None

    def tell(self, trial, state, value: float | None = None, attrs: dict | None = None) -> str:
        """End a trial (its attrs recorded); "" or why the study had ended it already: another
        process failed it, its heartbeat having stopped (this one was paused past GRACE_S), and
        queued its values again."""
        import optuna

        self._stop_beat(trial)
        try:
            for k, v in (attrs or {}).items():
                trial.set_user_attr(k, v)
            ended = self.optuna.tell(trial, value, state=state, skip_if_finished=True)
        except optuna.exceptions.UpdateFinishedTrialError:
            ended = None
        if ended is None or ended.state != state:
            return "the study had failed it meanwhile (its heartbeat stopped for longer than " \
                   f"{GRACE_S} s) and queued its values again"
        return ""

    def interrupted(self, trial) -> str:
        """Fail a trial whose process was interrupted, and queue its values again for whichever
        process asks next (at most RETRIES times for one trial's values)."""
        from optuna.trial import TrialState

        why = self.tell(trial, TrialState.FAIL)
        if not why:
            self.retry(self.optuna, self._frozen(trial))
        return why

    def _frozen(self, trial):
        """A trial as the study holds it now (its system attributes: the retry it is)."""
        return next(t for t in self.optuna.get_trials(deepcopy=False) if t.number == trial.number)

    def best(self):
        """The study's best complete trial, by the value told (ties: the earliest), or None: the
        same wherever it is read."""
        from optuna.trial import TrialState

        done = self.optuna.get_trials(deepcopy=False, states=(TrialState.COMPLETE,))
        return max(done, key=lambda t: (t.value, -t.number)) if done else None

    def totals(self) -> dict:
        """How many of the study's trials are in each state ("complete", "pruned", ...)."""
        out = {}
        for t in self.optuna.get_trials(deepcopy=False):
            out[t.state.name.lower()] = out.get(t.state.name.lower(), 0) + 1
        return out

    def _queue(self, trials, grid: list[dict] | None) -> bool:
        """Whether there is a trial to ask: one waiting (a retry), the sampler's next (TPE),
        or the grid's next point that no trial holds, queued here."""
        from optuna.trial import TrialState

        if grid is None or any(t.state == TrialState.WAITING for t in trials):
            return True
        taken = [t.system_attrs.get("fixed_params", t.params) for t in trials]
        point = next((p for p in grid if p not in taken), None)
        if point is not None:
            self.optuna.enqueue_trial(point)
        return point is not None

    def _fail_stale(self) -> None:
        """Fail the trials whose process stopped beating, each queued again (the storage's
        callback): a process that died without a word hands its trial on."""
        import optuna

        if self.lock is not None:
            with _quiet():
                optuna.storages.fail_stale_trials(self.optuna)

    def _start_beat(self, trial) -> None:
        """The trial's heartbeat: its first beat recorded before the ASK lock is let go (a
        running trial that never beat is never judged stale, so the others would wait for it
        for ever), then one every HEARTBEAT_S from a thread, as study.optimize's."""
        from optuna.storages._heartbeat import get_heartbeat_thread, is_heartbeat_enabled

        if is_heartbeat_enabled(self.optuna._storage):
            self.optuna._storage.record_heartbeat(trial._trial_id)
        beat = self.beats[trial.number] = get_heartbeat_thread(trial._trial_id, self.optuna._storage)
        beat.start()

    def _stop_beat(self, trial) -> None:
        beat = self.beats.pop(trial.number, None)
        if beat is not None:
            beat.join()


def _claim(study, description: dict, where: str) -> None:
    """Make description the study's, where it has none; refuse a study that searches something
    else, or that zobench did not make."""
    theirs = study.user_attrs.get(DESCRIPTION)
    if theirs is None:
        if study.get_trials(deepcopy=False):
            raise UserError(f"{where}: a study zobench tune did not make (it has trials and no description of "
                            "its search); name another study")
        study.set_user_attr(DESCRIPTION, description)
        return
    if (differ := differences(theirs, description)):
        raise UserError(f"{where}: the study searches something else ({'; '.join(differ)}); join it with its "
                        "options, or name another study")


@contextlib.contextmanager
def _locked(conn, which: int):
    """One of the storage's advisory locks (JOIN, ASK), held for the block: released by the
    database if this process dies in it."""
    conn.execute("SELECT pg_advisory_lock(%s, %s)", (KEY, which))
    try:
        yield
    finally:
        conn.execute("SELECT pg_advisory_unlock(%s, %s)", (KEY, which))


@contextlib.contextmanager
def _quiet():
    """Optuna's warnings that its distributed mode's parts are experimental, or meant for
    study.optimize alone: zobench uses them as designed, through ask and tell."""
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        yield


def _sleep(seconds: float, stop) -> None:
    """Sleep, waking within a tenth of a second of a stop."""
    end = time.monotonic() + seconds
    while not stop.is_set() and time.monotonic() < end:
        time.sleep(0.1)
