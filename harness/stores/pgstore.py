"""The shared results store on PostgreSQL (`--store postgresql://user@host/db`, $ZOBENCH_STORE):
where a lab's boards, people and CI runners keep one history (docs/store.md).

The local folder (harness/stores/store.py) stays where a run writes: a board's results land there first
whatever the network does, and a run that cannot reach the shared store loses nothing. `push`
copies a run into the shared store, `pull` copies one back. The result JSON is stored whole
(JSONB: the source of truth, from which every other column can be recomputed) beside the
columns the commands query: job key, target, fingerprint, commit, branch, status, step time,
peak memory, energy, accuracy.

A push is one transaction, keyed by (run id, job id): pushing twice changes nothing, a run
resumed since its last push updates just the results that changed, and any number of pushes
from different machines at once neither lose nor duplicate a row (the primary key decides;
INSERT ... ON CONFLICT is atomic in PostgreSQL). A second version of zobench extends the schema
with a new entry of MIGRATIONS, applied once, under a lock, by whichever process connects first.
"""
from __future__ import annotations

import hashlib
import json
import os
import sys
from dataclasses import dataclass
from datetime import datetime

from harness.stores import measurements
from harness import paths, tomlfile
from harness.stores import validity
from harness.stores.machine_load import of_steps, starved
from harness.stores.metrics import METRICS
from harness.errors import UserError
from harness.stores.schema import plan_problems, upgrade
from harness.stores.store import Store, checked
from harness.store_url import known, said, shown, shown_argv

ENV = "ZOBENCH_STORE"
LOCK = 0x7A6F62656E6368      # "zobench": the advisory lock that serialises migrations
# Each entry is one schema version, applied in order, never edited once released: a later
# version appends. (1) the runs and their results, with the columns history and compare read.
MIGRATIONS = (
    """
    CREATE TABLE runs (
        run_id      text PRIMARY KEY,
        created_at  timestamptz NOT NULL,
        suite       text NOT NULL DEFAULT '',
        git_commit  text NOT NULL DEFAULT '',
        branch      text NOT NULL DEFAULT '',
        plan        jsonb NOT NULL,
        pushed_at   timestamptz NOT NULL DEFAULT now()
    );
    CREATE INDEX runs_by_branch ON runs (branch, created_at DESC);
    CREATE INDEX runs_by_commit ON runs (git_commit text_pattern_ops);
    CREATE TABLE fingerprints (
        fingerprint text PRIMARY KEY,       -- sha256 of facts, measurements.fingerprint()
        facts       jsonb NOT NULL
    );
    -- one row per job key and machine: history resolves its filters here (thousands of rows at
    -- lab scale), then reads each series by results_by_series
    CREATE TABLE series (
        job_key     text NOT NULL,
        fingerprint text NOT NULL REFERENCES fingerprints,
        target      text NOT NULL,
        PRIMARY KEY (job_key, fingerprint)
    );
    CREATE TABLE results (
        run_id          text NOT NULL REFERENCES runs ON DELETE CASCADE,
        job_id          text NOT NULL,
        job_key         text NOT NULL,
        target          text NOT NULL,
        fingerprint     text NOT NULL REFERENCES fingerprints,
        status          text NOT NULL,
        step_seconds    double precision,
        peak_rss_bytes  bigint,
        joules_per_step double precision,
        test_accuracy   double precision,
        starved         double precision,   -- the share of the CPU it wanted that other work took (machine_load.starved)
        started_at      timestamptz,
        result          jsonb NOT NULL,
        PRIMARY KEY (run_id, job_id)
    );
    CREATE INDEX results_by_series ON results (job_key, fingerprint, run_id);
    """,
    # the validity flags of a job (harness/stores/validity.py): history leaves a throttled result's time out
    """
    ALTER TABLE results ADD COLUMN flags text[] NOT NULL DEFAULT '{}';
    UPDATE results SET flags = ARRAY(SELECT jsonb_array_elements_text(result->'validity'->'flags'))
        WHERE jsonb_typeof(result->'validity'->'flags') = 'array';
    """,
    # peak memory as the gate judges it (harness/stores/metrics.py): a GPU job's own allocation, else RSS
    """
    ALTER TABLE results ADD COLUMN peak_bytes bigint;
    UPDATE results SET peak_bytes = COALESCE(NULLIF((result->'memory'->>'device_peak_bytes')::bigint, 0),
                                             NULLIF(peak_rss_bytes, 0));
    """,
    # the test-only settings a result's job set (measurements.test_only: inject_slowdown, fault, as
    # KEY_IGNORES named them when this was written): baseline and history leave such rows out
    """
    ALTER TABLE results ADD COLUMN test_only text[] NOT NULL DEFAULT '{}';
    UPDATE results SET test_only = ARRAY(SELECT k FROM unnest(ARRAY['inject_slowdown', 'fault']) AS k
        WHERE COALESCE(result->'job'->'hyper'->>k, '') NOT IN ('', '0', '0.0'));
    CREATE INDEX results_test_only ON results (run_id) WHERE test_only <> '{}';
    """,
    # instructions per step where a job counted them (harness/planning/counting.py): history charts them
    """
    ALTER TABLE results ADD COLUMN instructions_per_step double precision;
    UPDATE results SET instructions_per_step = (result->'instructions'->>'per_step')::double precision
        WHERE jsonb_typeof(result->'instructions'->'per_step') = 'number';
    """,
)
# a result of a run with no test-only setting: what a baseline pools and a history series holds
REAL = "r.test_only = '{}'"

# why a row under a job id its run's plan does not hold is left out and named
UNPLANNED = "a job the run never planned"
# the results columns of the metrics (harness/stores/metrics.py), in its order: what history reads
COLUMNS = ", ".join(m.column for m in METRICS)


def url_from(arg: str | None, what: str = "--store") -> str | None:
    """--store, else $ZOBENCH_STORE, else the user config's [store] url; None: no shared store."""
    url, where = arg, what
    if not url and os.environ.get(ENV):
        url, where = os.environ[ENV], f"${ENV}"
    config = paths.user_config()
    if not url and config.is_file():
        t = tomlfile.Table(tomlfile.load(config), config)
        table = tomlfile.Table(t.take("store", dict, default={}), config, "store.")
        t.done()
        url, where = table.take("url", str), f"{config}: store.url"
        table.done()
    known(url)
    if url and not url.startswith(("postgresql://", "postgres://")) and not _conninfo(url):
        raise UserError(f"{where}: expected a PostgreSQL URL, postgresql://USER@HOST[:PORT]/DB, or a connection "
                        f"string, host=HOST dbname=DB, got {shown(url)!r}")
    return url or None


def _conninfo(text: str) -> bool:
    """Whether text is a key=value connection string libpq takes."""
    from psycopg.conninfo import conninfo_to_dict    # noqa: PLC0415
    import psycopg    # noqa: PLC0415

    try:
        return "=" in text and bool(conninfo_to_dict(text))
    except psycopg.ProgrammingError:
        return False


def required(arg: str | None, command: str) -> str:
    url = url_from(arg)
    if url is None:
        raise UserError(f"{command}: no store: give --store postgresql://USER@HOST/DB, or set ${ENV}")
    return url


def _older(mine: dict, theirs: dict) -> bool:
    """Whether a local result started before the store's of the same job (so the store's is the
    job run again, elsewhere); a time that cannot be read is never older."""
    def when(r):
        try:
            return datetime.fromisoformat(str(r.get("started_at")))
        except ValueError:
            return None
    a, b = when(mine), when(theirs)
    try:
        return a is not None and b is not None and a < b
    except TypeError:       # one with a time zone, one without
        return False


@dataclass
class Pushed:
    added: int = 0
    updated: int = 0
    unchanged: int = 0
    moved_from: str | None = None   # the branch a re-push with --branch moved the run from


def fingerprint_id(facts: dict) -> str:
    return hashlib.sha256(json.dumps(facts, sort_keys=True).encode()).hexdigest()


def history_row(r: dict, run_id: str, commit: str) -> tuple:
    """A result as SharedStore.history returns it (history.build's row): what push stores in
    the columns, so that a results folder's history (`zobench publish --results`) is the store's."""
    last = (r["epochs"] or [{}])[-1]
    return (measurements.job_key(r["job"])[0], r["job"]["target"],
            fingerprint_id(measurements.fingerprint(r.get("env") or {})), commit, run_id,
            *(m.value(r) for m in METRICS), last.get("test_accuracy"),
            starved(of_steps(r), r["job"]["threads"]), validity.flags_of(r))


def connect(url: str, what: str, connect_timeout: int = 10, **kw):
    """A psycopg connection to url (kw: psycopg.connect's); one that cannot be made is a
    UserError naming what it was for, the password in no form in it. The store and zobench
    tune's storage (harness/search/study.py) connect here."""
    import psycopg    # noqa: PLC0415

    known(url)
    try:
        return psycopg.connect(url, connect_timeout=connect_timeout, application_name="zobench", **kw)
    except psycopg.Error as e:
        raise UserError(f"{what} {shown(url)}: cannot connect: {said(e)}") from None


class SharedStore:
    """One connection to the shared store, its schema brought up to date on connect."""

    def __init__(self, url: str, connect_timeout: int = 10):
        self.url = url
        self.damaged: list[str] = []    # the rows results() left out, named ("run R job J: why")
        self.conn = connect(url, "store", connect_timeout)
        self.migrate()

    def close(self) -> None:
        self.conn.close()

    def __enter__(self):
        return self

    def __exit__(self, *exc):
        self.close()

    def migrate(self) -> int:
        """Apply the migrations this store has not had; the schema version after them. A store
        whose tables were dropped or altered by hand is refused, naming what failed."""
        import psycopg    # noqa: PLC0415

        try:
            return self._migrate()
        except psycopg.Error as e:
            raise UserError(f"store {shown(self.url)}: its schema cannot be brought up to date ({said(e)}): a table "
                            "zobench made was dropped or changed by hand; restore it, or use a new database") from None

    def _migrate(self) -> int:
        with self.conn.transaction():
            self.conn.execute("SELECT pg_advisory_xact_lock(%s)", (LOCK,))
            self.conn.execute("CREATE TABLE IF NOT EXISTS zobench_schema (version integer NOT NULL)")
            row = self.conn.execute("SELECT max(version) FROM zobench_schema").fetchone()
            version = row[0] or 0
            if version > len(MIGRATIONS):
                raise UserError(f"store {shown(self.url)}: its schema is version {version}, newer than this "
                                f"zobench's {len(MIGRATIONS)}: upgrade zobench")
            for v, sql in enumerate(MIGRATIONS[version:], start=version + 1):
                self.conn.execute(sql)
                self.conn.execute("INSERT INTO zobench_schema VALUES (%s)", (v,))
        return len(MIGRATIONS)

    # -- writing ------------------------------------------------------------
    def push(self, store: Store, run_id: str, branch: str | None = None) -> Pushed:
        """Copy run_id's plan and valid results from the local store, in one transaction."""
        from psycopg.types.json import Jsonb    # noqa: PLC0415

        plan = store.run_plan(run_id)
        results = store.results(run_id, plan)
        if isinstance(plan.get("argv"), list):     # a run.json written before zobench hid every form of a password
            plan = {**plan, "argv": shown_argv([str(a) for a in plan["argv"]])}
        git = plan.get("git") or {}
        out = Pushed()
        with self.conn.transaction():
            was = self.conn.execute("SELECT branch FROM runs WHERE run_id = %s", (run_id,)).fetchone()
            # --branch moves a pushed run to that branch; without it a run keeps the branch it was pushed under
            self.conn.execute(
                "INSERT INTO runs (run_id, created_at, suite, git_commit, branch, plan) VALUES (%s, %s, %s, %s, %s, %s) "
                "ON CONFLICT (run_id) DO UPDATE SET plan = EXCLUDED.plan, "
                "branch = CASE WHEN %s THEN EXCLUDED.branch ELSE runs.branch END "
                "WHERE runs.plan IS DISTINCT FROM EXCLUDED.plan OR (%s AND runs.branch IS DISTINCT FROM EXCLUDED.branch)",
                (run_id, plan.get("created_at"), plan.get("suite") or "", git.get("commit") or "",
                 branch if branch is not None else git.get("branch") or "", Jsonb(plan), branch is not None,
                 branch is not None))
            if was is not None and branch is not None and was[0] != branch:
                out.moved_from = was[0]
            facts = [measurements.fingerprint(r.get("env") or {}) for r in results]
            rows = [history_row(r, run_id, git.get("commit") or "") for r in results]
            with self.conn.cursor() as cur:     # each once, however many results share it
                cur.executemany("INSERT INTO fingerprints VALUES (%s, %s) ON CONFLICT DO NOTHING",
                                list({row[2]: (row[2], Jsonb(f)) for row, f in zip(rows, facts)}.values()))
                cur.executemany("INSERT INTO series VALUES (%s, %s, %s) ON CONFLICT DO NOTHING",
                                list({(row[0], row[2]): (row[0], row[2], row[1]) for row in rows}.values()))
            for r, (key, target, fp, _, _, *values, acc, share, flags) in zip(results, rows):
                got = self.conn.execute(
                    f"INSERT INTO results (run_id, job_id, job_key, target, fingerprint, status, {COLUMNS}, "
                    "peak_rss_bytes, test_accuracy, starved, flags, test_only, started_at, result) "
                    f"VALUES ({', '.join(['%s'] * (13 + len(METRICS)))}) "
                    "ON CONFLICT (run_id, job_id) DO UPDATE SET "
                    + ", ".join(f"{c} = EXCLUDED.{c}" for c in ("job_key", "target", "fingerprint", "status",
                                                                *(m.column for m in METRICS), "peak_rss_bytes",
                                                                "test_accuracy", "starved", "flags", "test_only",
                                                                "started_at", "result")) +
                    " WHERE results.result IS DISTINCT FROM EXCLUDED.result RETURNING (xmax = 0)",
                    (run_id, r["job"]["job_id"], key, target, fp, r["status"], *values,
                     r["memory"]["peak_rss_bytes"], acc, share, flags, measurements.test_only(r["job"].get("hyper") or {}),
                     r["started_at"], Jsonb(r))).fetchone()
                if got is None:
                    out.unchanged += 1
                elif got[0]:
                    out.added += 1
                else:
                    out.updated += 1
        return out

    # -- reading ------------------------------------------------------------
    def run_ids(self, branch: str | None = None) -> list[str]:
        sql, args = "SELECT run_id FROM runs", ()
        if branch is not None:
            sql, args = sql + " WHERE branch = %s", (branch,)
        return [r[0] for r in self.conn.execute(sql + " ORDER BY created_at, run_id", args)]

    def run_plan(self, run_id: str) -> dict:
        row = self.conn.execute("SELECT plan FROM runs WHERE run_id = %s", (run_id,)).fetchone()
        if row is None:
            latest = ", ".join(self.run_ids()[-5:]) or "none"
            raise UserError(f"unknown run {run_id!r} in store {shown(self.url)}; its latest runs: {latest}")
        return row[0]

    def results(self, run_id: str, plan: dict | None = None) -> list[dict]:
        """The run's results in plan order, each checked as a local one is (store.checked: the schema, and
        its job record against its spec_sha256; a damaged row is left out, as a damaged local file is)
        and in this version's shape."""
        plan = plan if plan is not None else self.run_plan(run_id)
        if bad := plan_problems(plan):
            raise UserError(f"run {run_id} in store {shown(self.url)} is damaged: its plan: {bad[0]}")
        got = {job_id: r for job_id, r in self.conn.execute(
            "SELECT job_id, result FROM results WHERE run_id = %s", (run_id,))}
        out = []
        planned = {j["job_id"] for j in plan["jobs"]}
        for job_id in sorted(set(got) - planned):      # a row no job of the run wrote: named, never read
            self._damaged(run_id, job_id, UNPLANNED)
        for j in plan["jobs"]:
            if j["job_id"] not in got:
                continue
            if bad := checked(got[j["job_id"]], j)[0]:
                self._damaged(run_id, j["job_id"], "; ".join(bad[:2]))
                continue
            out.append(upgrade(got[j["job_id"]]))
        return out

    def _damaged(self, run_id: str, job_id: str, why: str) -> None:
        self.damaged.append(f"run {run_id} job {job_id}: {why}")
        print(f"zobench: warning: store {shown(self.url)}: the row of run {run_id} job {job_id} is damaged ({why}): "
              "left out", file=sys.stderr)

    def damaged_rows(self, keys: list[str], target: str | None) -> list[str]:
        """The rows history would read whose stored result is no result (a row changed by hand):
        history reads their columns, so it names them rather than chart them. Judged in the
        database by the result's shape (an object with a result's records, of its own job), so
        history still reads no result document."""
        query, args = self.history_query(keys, target, None, None)
        rows = self.conn.execute(
            f"WITH h AS ({query}) SELECT DISTINCT r.run_id, r.job_id, NOT (u.plan->'jobs' @> jsonb_build_array("
            "jsonb_build_object('job_id', r.job_id))) FROM results r JOIN h USING (run_id, job_key) JOIN runs u "
            "USING (run_id) WHERE jsonb_typeof(r.result) <> 'object' OR NOT r.result ?& array['schema', 'status', "
            "'job', 'epochs', 'phases', 'memory'] OR r.result->'job'->>'job_id' IS DISTINCT FROM r.job_id "
            "OR NOT (u.plan->'jobs' @> jsonb_build_array(jsonb_build_object('job_id', r.job_id)))", args).fetchall()
        return [f"run {run_id} job {job_id}: {UNPLANNED if unplanned else 'its stored result is not one'}"
                for run_id, job_id, unplanned in rows]

    def refuse_damaged(self, command: str, keys: list[str], target: str | None) -> None:
        """A UserError naming the damaged rows (damaged_rows) a reading of the store's columns
        would count (history, publish): they are no results, so nothing is read past them."""
        if damaged := self.damaged_rows(keys, target):
            raise UserError(f"{command}: {len(damaged)} row{'s' if len(damaged) > 1 else ''} of the store "
                            f"{'are' if len(damaged) > 1 else 'is'} damaged, their results no results ({damaged[0]}"
                            f"{', …' if len(damaged) > 1 else ''}): push those runs again from a results folder that "
                            "holds them, or delete the rows")

    def pull(self, run_id: str, store: Store) -> tuple[int, list[str]]:
        """Copy run_id into the local store: its plan, and every result the local copy lacks or
        holds an older one of. A local result that differs and is not older (a job resumed here
        after the run was pushed) is kept, never overwritten: (results written, job ids kept).
        A damaged plan in the store is refused before anything is written."""
        plan = self.run_plan(run_id)
        bad = plan_problems(plan)
        if bad:
            raise UserError(f"run {run_id} in store {shown(self.url)} is damaged: its plan: {bad[0]}; nothing pulled")
        remote = self.results(run_id, plan)
        store.adopt_run(run_id, plan)
        local = {r["job"]["job_id"]: r for r in store.results(run_id, plan)}
        written, kept = 0, []
        for r in remote:
            mine = local.get(r["job"]["job_id"])
            if mine == r:
                continue
            if mine is not None and not _older(mine, r):
                kept.append(r["job"]["job_id"])
                continue
            store.add_result(run_id, r)
            written += 1
        return written, kept

    def baseline(self, current: dict, branch: str, last: int, exclude: list[str]) -> tuple[dict, list[str]]:
        """For each measurement of current, the ok results of the same job key and fingerprint in
        the last `last` runs of branch that hold it (exclude: the current runs themselves; a run
        with a test-only setting is never one of them), pooled into one measurement; and the
        runs they came from."""
        keys = list(current)
        fps = [fingerprint_id(current[k].fingerprint) for k in keys]
        rows = self.conn.execute(
            f"""SELECT run_id, result FROM (
                   SELECT r.run_id, r.result, dense_rank() OVER (
                       PARTITION BY r.job_key ORDER BY u.created_at DESC, u.run_id DESC) AS newest
                   FROM results r JOIN runs u USING (run_id)
                   JOIN unnest(%s::text[], %s::text[]) AS want(job_key, fingerprint) USING (job_key, fingerprint)
                   WHERE u.branch = %s AND r.status = 'ok' AND {REAL} AND r.run_id <> ALL(%s)
               ) t WHERE newest <= %s ORDER BY run_id""",
            (keys, fps, branch, exclude, last)).fetchall()
        return measurements.from_results(rows, across_builds=True), sorted({r for r, _ in rows})

    def history(self, keys: list[str], target: str | None, since: str | None,
                branch: str | None, exact: bool = False) -> tuple[list[tuple], dict[str, dict]]:
        """The ok results whose job key contains one of keys (is one of them: exact; all keys
        where none), in run order, as history.build reads them; and their fingerprints' facts."""
        rows = self.conn.execute(*self.history_query(keys, target, since, branch, exact)).fetchall()
        fps = sorted({r[2] for r in rows})
        facts = dict(self.conn.execute("SELECT fingerprint, facts FROM fingerprints WHERE fingerprint = ANY(%s)",
                                       (fps,)).fetchall())
        return rows, facts

    def test_only_runs(self, keys: list[str], target: str | None, since: str | None,
                       branch: str | None) -> dict[str, list[str]]:
        """The runs with a test-only setting among those history would read, and what each set:
        history leaves their results out of its series and names them apart."""
        query, args = self.history_query(keys, target, since, branch, real=False)
        rows = self.conn.execute(f"WITH h AS ({query}) SELECT DISTINCT h.run_id, unnest(r.test_only) FROM h "
                                 "JOIN results r USING (run_id, job_key) WHERE r.test_only <> '{}' ORDER BY 1, 2",
                                 args).fetchall()
        out: dict[str, list[str]] = {}
        for run_id, setting in rows:
            out.setdefault(run_id, []).append(setting)
        return out

    def history_query(self, keys: list[str], target: str | None, since: str | None, branch: str | None,
                      exact: bool = False, real: bool = True) -> tuple[str, list]:
        """history's SQL: the series table picks the (key, fingerprint) pairs, results_by_series
        reads each one (benchmarks/store_scale.py prints its plan); real: only results of runs
        with no test-only setting (REAL)."""
        chosen, where, args = ["true"], ["r.status = 'ok'", *([REAL] if real else [])], []
        if keys and exact:
            chosen.append("job_key = ANY(%s)")
            args.append(keys)
        elif keys:
            chosen.append("(" + " OR ".join("strpos(job_key, %s) > 0" for _ in keys) + ")")
            args += keys
        if target:
            chosen.append("target = %s")
            args.append(target)
        if branch is not None:
            where.append("u.branch = %s")
            args.append(branch)
        if since:
            prefix = since.lower() + "%" if all(c in "0123456789abcdefABCDEF" for c in since) else since
            start = self.conn.execute("SELECT min(created_at) FROM runs WHERE git_commit LIKE %s OR run_id = %s",
                                      (prefix, since)).fetchone()[0]
            if start is None:
                raise UserError(f"history --since {since!r}: no run of that commit or id in store {shown(self.url)}")
            where.append("u.created_at >= %s")
            args.append(start)
        return (f"WITH s AS (SELECT job_key, fingerprint FROM series WHERE {' AND '.join(chosen)}) "
                "SELECT r.job_key, r.target, r.fingerprint, u.git_commit, r.run_id, "
                + "".join(f"r.{m.column}, " for m in METRICS) +
                "r.test_accuracy, r.starved, r.flags FROM s JOIN results r USING (job_key, fingerprint) "
                f"JOIN runs u USING (run_id) WHERE {' AND '.join(where)} ORDER BY u.created_at, r.run_id, r.job_id",
                args)
