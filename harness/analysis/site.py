"""`zobench publish`: the shared store, or a results folder, as a static website (docs/dashboard.md).

What asv publish does for asv: files only, no server process, so a lab serves it from any web
server or a CI artifact and CI rebuilds it after each push to main. The site is a few fixed
pages (reports/site/) and the data they load:

OUT/data/overview.json            one row per job key x machine (fingerprint): what the overview lists
OUT/data/overview.js              the same, as a script the overview loads (so it opens from disk too)
OUT/data/keys/<id>.json           a key's series on every machine, loaded by its page alone
OUT/data/compare/<a>_<b>.json     the gate's verdicts between two commits' runs
OUT/data/machines.json            each fingerprint's facts, when its target's changed, its keys
OUT/runs/<run_id>/report.html     the report of the latest runs (--reports), as `zobench report` makes it

Every number is computed here by the functions the CLI uses (history.series, compare.compare,
the report), never in the browser; the pages only draw and filter. The overview holds a row per
series and a short sparkline each, so its weight grows with keys and machines, never with
results; a key's page loads its own file.
"""
from __future__ import annotations

import hashlib
import json
import shutil
import tempfile
from dataclasses import dataclass
from importlib import resources
from pathlib import Path

from harness import guarded
from harness.analysis import compare, history
from harness.stores import machine_load, measurements, pgstore
from harness.stores.metrics import BY_NAME, METRICS
from harness.stores.store import Store

SPARK = 40          # the overview's sparkline: a series' last this many commits
BASE = "main"       # the branch pull requests are compared with (as compare --baseline-from's default)
PAGES = ("index.html", "key.html", "compare.html", "machine.html", "site.js", "site.css")


@dataclass
class Run:
    run_id: str
    created_at: str
    commit: str         # a run pushed without its commit stands for one (history.build)
    branch: str


class SharedSource:
    """The shared store, read with the queries `zobench history` and `compare` make."""

    def __init__(self, shared: pgstore.SharedStore):
        self.shared, self.name = shared, pgstore.shown(shared.url)

    def runs(self) -> list[Run]:
        return [Run(r, c.isoformat(timespec="seconds"), g or r, b) for r, c, g, b in self.shared.conn.execute(
            "SELECT run_id, created_at, git_commit, branch FROM runs ORDER BY created_at, run_id")]

    def history(self) -> tuple[list[tuple], dict]:
        self.shared.refuse_damaged("publish", [], None)     # as history: no damaged row counted as a result
        return self.shared.history([], None, None, None)

    def results(self, run_id: str) -> list[dict]:
        return self.shared.results(run_id)

    def local_store(self, run_id: str, folder: Path) -> Store:
        """A results folder holding the run, for the report to read: pulled into `folder`."""
        store = Store(folder)
        self.shared.pull(run_id, store)
        return store


class FolderSource:
    """A results folder without a store: its runs' ok results, in the rows the store's history
    query returns (pgstore.history_row), so the site is the one the store would give."""

    def __init__(self, store: Store):
        self.store, self.name = store, str(store.root)
        self._runs = []
        for run_id in store.run_ids():
            plan = store.run_plan(run_id)
            git = plan.get("git") or {}
            self._runs.append(Run(run_id, str(plan.get("created_at") or ""), git.get("commit") or run_id,
                                  git.get("branch") or ""))
        self._runs.sort(key=lambda r: (r.created_at, r.run_id))

    def runs(self) -> list[Run]:
        return self._runs

    def history(self) -> tuple[list[tuple], dict]:
        rows, facts = [], {}
        for run in self._runs:
            for r in self.results(run.run_id):
                if r["status"] == "ok" and not measurements.test_only(r["job"].get("hyper") or {}):    # as the store's history
                    row = pgstore.history_row(r, run.run_id, run.commit if run.commit != run.run_id else "")
                    rows.append(row)
                    if row[2] not in facts:
                        facts[row[2]] = measurements.fingerprint(r.get("env") or {})
        return rows, facts

    def results(self, run_id: str) -> list[dict]:
        return self.store.results(run_id)

    def local_store(self, run_id: str, folder: Path) -> Store:
        return self.store


def key_id(key: str) -> str:
    """A job key's file name and URL parameter: keys hold spaces, '=' and user text."""
    return hashlib.sha256(key.encode()).hexdigest()[:16]


def short(commit: str) -> str:
    return commit[:12]


def key_parts(key: str, target: str) -> dict:
    """The overview's filters, from the key (measurements.job_key: workload, method, precision,
    runtime, then the target, which may hold spaces, so it is taken from the row)."""
    workload, method, precision, runtime, *_ = key.split(" ", 4)
    return {"model": workload.split("/")[0], "method": method, "precision": precision, "runtime": runtime,
            "target": target}


def machine_label(facts: dict) -> str:
    return " ".join(str(facts.get(k)) for k in ("hostname", "cpu_model") if facts.get(k)) or "unknown machine"


# what a published site's folder holds (its marker: guarded.own_folder), every name zobench writes
SITE_MARKER = ".zobench-site"


def publish(source, out: Path, threshold: float, estimator: str, reports: int, compare_last: int,
            say=lambda line: None, track=lambda items, what: items) -> dict:
    """Write the site into out; what it wrote (counts and bytes), for the command to print.
    track(items, what) shows the long loops' progress. The data is written beside the old and
    swapped in at the end: a publish that fails leaves the last site whole. It writes only into a
    new or empty folder or a site it published (guarded.own_folder): a user's files are never
    replaced."""
    out = guarded.own_folder(out, SITE_MARKER, "site", "publish --out")
    new = out / ".data-new"
    shutil.rmtree(new, ignore_errors=True)
    for sub in ("keys", "compare"):
        (new / sub).mkdir(parents=True)
    runs = source.runs()
    by_run = {r.run_id: r for r in runs}
    commits: dict[str, list] = {}
    for r in runs:
        commits.setdefault(r.commit, []).append(r.run_id)
    rows, facts = source.history()
    say(f"{len(rows)} ok results, {len(runs)} runs")
    found = history.series(rows, facts, threshold, estimator, lambda items: track(items, "change points"))
    machines = {s.fingerprint: machine_label(s.facts) for s in found}
    published = publish_reports(source, runs[-reports:] if reports else [], out, say)
    overview, keys = [], {}
    for s in found:
        keys.setdefault(s.key, []).append(s)
    pairs: dict[tuple[str, str], None] = {}      # in order, once each
    for key, series in track(list(keys.items()), "keys"):
        kid = key_id(key)
        data = {"key": key, "id": kid, "estimator": estimator, "threshold": threshold,
                "metrics": [{"name": m.name, "title": m.title, "unit": m.unit} for m in METRICS],
                "series": [series_json(s, by_run, published, estimator) for s in series]}
        write_json(new / "keys" / f"{kid}.json", data)
        for s, sj in zip(series, data["series"]):
            overview.append(overview_row(s, sj, kid))
            pairs.update(((c["before_commit"], c["commit"]), None) for c in sj["changes"])
    pairs.update((pair, None) for pair in recent_pairs(runs, compare_last))
    sides: dict[str, dict] = {}

    def side(commit: str) -> dict:
        """A commit's runs as the gate reads them, per machine (each commit read once: the pairs
        share them)."""
        if commit not in sides:
            by_fp: dict[str, list] = {}
            for rid in commits.get(commit, []):
                for r in source.results(rid):
                    fp = pgstore.fingerprint_id(measurements.fingerprint(r.get("env") or {}))
                    by_fp.setdefault(fp, []).append((rid, r))
            sides[commit] = {fp: measurements.from_results(rs) for fp, rs in by_fp.items()}
        return sides[commit]

    for a, b in track(list(pairs), "compare views"):
        write_json(new / "compare" / f"{short(a)}_{short(b)}.json",
                   compare_json(a, b, side, commits, machines, threshold, estimator))
    write_json(new / "compare" / "index.json", [[short(a), short(b)] for a, b in pairs])
    summary = {"source": source.name, "estimator": estimator, "threshold": threshold, "rows": overview}
    write_json(new / "overview.json", summary)
    write_script(new / "overview.js", "ZOBENCH_OVERVIEW", summary)
    write_json(new / "machines.json", machines_json(found, by_run))
    copy_pages(out)
    old = out / ".data-old"
    shutil.rmtree(old, ignore_errors=True)
    if (out / "data").exists():
        (out / "data").rename(old)
    new.rename(out / "data")
    shutil.rmtree(old, ignore_errors=True)
    return {"keys": len(keys), "series": len(found), "compares": len(pairs), "reports": len(published),
            "overview_bytes": page_weight(out)}


def copy_pages(out: Path) -> None:
    """The pages and the charting library's JavaScript, from the Python packages that ship them:
    the site loads nothing from the internet (a lab's network may have none)."""
    pages = resources.files("reports") / "site"
    for name in PAGES:
        (out / name).write_bytes((pages / name).read_bytes())
    plotly = resources.files("plotly") / "package_data" / "plotly.min.js"
    (out / "plotly.min.js").write_bytes(plotly.read_bytes())


def series_json(s: history.Series, by_run: dict, published: set, estimator: str) -> dict:
    """A series as its key's page draws it: each point's estimate and range per metric (the
    estimate history.render shows), its results and those left out, and its run's branch."""
    shown_as, estimate = compare.point_estimate(estimator)
    points = []
    for p in s.points:
        run = by_run.get(p.first_run)
        points.append({
            "commit": p.commit, "run": p.first_run, "branch": run.branch if run else "",
            "created_at": run.created_at if run else "", "results": p.results, "loaded": p.loaded,
            "flagged": p.flagged, "report": p.first_run in published,
            "values": {m.name: [estimate(v) * m.scale, min(v) * m.scale, max(v) * m.scale]
                       for m in METRICS if (v := p.samples.get(m.name))},
            # what the loaded or throttled results measured, left out of the values, and the busiest one's load
            "left_out": {m.name: [estimate(v) * m.scale, min(v) * m.scale, max(v) * m.scale]
                         for m in METRICS if (v := p.left_out.get(m.name))},
            "load": max(p.shares) if p.shares else None,
            "accuracy": 100 * sum(p.accuracy) / len(p.accuracy) if p.accuracy else None})
    changes = [{"metric": c.metric, "commit": c.commit, "before_commit": s.points[c.at - 1].commit, "at": c.at,
                "before": c.before * (scale := BY_NAME[c.metric].scale), "after": c.after * scale,
                "change": c.change, "p_value": c.p_value, "verdict": "regressed" if c.change > 0 else "improved"}
               for c in s.changes]
    return {"fingerprint": s.fingerprint, "machine": machine_label(s.facts), "target": s.target,
            "split_from": s.split_from, "estimate": shown_as, "points": points, "changes": changes}



def overview_row(s: history.Series, sj: dict, kid: str) -> dict:
    """The overview's row of a series: its last SPARK step times, the latest judged one, the last
    commit's as measured with its load flag (issue 60: never a bare blank), its last count of
    instructions per step (M/step) where it has counts, and the verdict of
    its latest change point (one at the last commit first: its memory or count, which load does
    not move), or noisy where the latest commit's times were all left out (loaded or throttled),
    not judged where one commit leaves nothing to compare, or unchanged."""
    points = sj["points"]
    times = [float(f"{t:.4g}") if (t := p["values"].get("step_time", [None])[0]) else None for p in points]
    last = points[-1]
    latest = max(sj["changes"], key=lambda c: c["at"], default=None)
    if latest and latest["at"] == len(points) - 1:     # at the last commit, by what load did not hide
        verdict, at = latest["verdict"], latest["commit"]
    elif "step_time" not in last["values"] and last["loaded"] + last["flagged"]:
        verdict, at = "noisy", last["commit"]
    elif latest:
        verdict, at = latest["verdict"], latest["commit"]
    elif len(points) < 2:
        verdict, at = "not judged (one commit)", ""
    else:
        verdict, at = "unchanged", ""
    measured = (last["values"].get("step_time") or last["left_out"].get("step_time") or [None])[0]
    # the last count of instructions per step, where the series has one: load moves no count
    counted = next((p["values"]["instructions"][0] for p in reversed(points) if "instructions" in p["values"]), None)
    return {"id": kid, "key": s.key, **key_parts(s.key, s.target), "fingerprint": s.fingerprint[:16],
            "machine": sj["machine"], "spark": times[-SPARK:], "latest": next((t for t in reversed(times) if t), None),
            # the last commit's time however it was measured, with its load flag (a loaded one is not judged)
            "measured": float(f"{measured:.4g}") if measured else None,
            "measured_flag": "⚠ throttled" if "step_time" not in last["values"] and last["flagged"] and
                             not last["loaded"] else machine_load.flag(last["load"]),
            "instructions": float(f"{counted:.5g}") if counted else None,
            "latest_commit": short(last["commit"]), "commits": len(points), "verdict": verdict,
            "verdict_commit": short(at),
            "verdict_metric": latest["metric"] if latest and verdict != "noisy" else ""}


def recent_pairs(runs: list[Run], last: int, base: str = BASE) -> list[tuple[str, str]]:
    """Each branch's consecutive commits among its last `last` + 1, and each of another branch's
    last `last` commits against the newest commit of the base branch before it (what a pull
    request's CI job compares with, and its job summary links to: compare.html?b=COMMIT)."""
    if not last:
        return []
    order: dict[str, list[str]] = {}
    newest_base, against = None, {}
    for r in runs:      # in created order
        seen = order.setdefault(r.branch, [])
        if r.commit not in seen:
            seen.append(r.commit)
            if r.branch != base and newest_base:
                against[(r.branch, r.commit)] = newest_base
        if r.branch == base:
            newest_base = r.commit
    pairs = [(a, b) for commits in order.values() for a, b in zip(commits[-last - 1:], commits[-last - 1:][1:])]
    return pairs + [(against[(branch, c)], c) for branch, commits in order.items() if branch != base
                    for c in commits[-last:] if (branch, c) in against]


def compare_json(a: str, b: str, side, commits: dict, machines: dict, threshold: float, estimator: str) -> dict:
    """The gate between the runs of commit a and those of commit b on each machine that ran both
    (each side's runs pooled, as `zobench compare A1,A2 B1,B2` pools them), by compare.compare:
    its table, summary and exit code; the machines that ran only one of them are named."""
    before, after = side(a), side(b)
    rows, verdicts = [], []
    for fp in [fp for fp in before if fp in after]:
        for v in compare.compare(before[fp], after[fp], threshold, estimator):
            verdicts.append(v)
            rows.append((fp, v))
    shown = [m for m in METRICS if any(m.name in v.metrics for v in verdicts)]
    counted = any(v.instructions for v in verdicts)     # instructions per step: where some key has a count
    code, why = compare.gate(verdicts)
    return {"a": a, "b": b, "a_runs": commits.get(a, []), "b_runs": commits.get(b, []),
            "title": compare.title_of(verdicts, short(a), short(b), threshold, estimator),
            "summary": compare.counts(verdicts), "exit_code": code, "why": why,
            "one_side": [{"fingerprint": fp, "machine": machines.get(fp, ""), "only_in": short(a if fp in before else b)}
                         for fp in [*before, *after] if (fp in before) != (fp in after)],
            "columns": ["job key", "machine", "status", *(m.title for m in shown), *["instructions"] * counted, "note"],
            "rows": [{"key": v.key, "id": key_id(v.key), "fingerprint": fp, "machine": machines.get(fp, ""),
                      "status": v.status, "label": compare.label(v.status), "cells": compare.cells(v, shown) + [compare.instruction_cell(v.instructions)] * counted,
                      "note": v.reason} for fp, v in rows]}


def machines_json(found: list[history.Series], by_run: dict) -> list[dict]:
    """Each fingerprint: its facts, its target's earlier fingerprints and what changed from
    each (the facts that start a new series), when it was first and last seen, its keys."""
    out: dict[str, dict] = {}
    for s in found:
        m = out.setdefault(s.fingerprint, {"fingerprint": s.fingerprint, "machine": machine_label(s.facts),
                                           "targets": [], "facts": s.facts, "first": None, "last": None,
                                           "keys": []})
        if s.target not in m["targets"]:
            m["targets"].append(s.target)
        m["keys"].append({"id": key_id(s.key), "key": s.key, "commits": len(s.points)})
        for run in (by_run.get(s.points[0].first_run), by_run.get(s.points[-1].first_run)):
            if run:
                m["first"] = min(filter(None, (m["first"], run.created_at)))
                m["last"] = max(filter(None, (m["last"], run.created_at)))
    machines = sorted(out.values(), key=lambda m: (m["first"] or "", m["fingerprint"]))
    for i, m in enumerate(machines):     # what changed since the target's previous fingerprint
        prev = next((p for p in reversed(machines[:i]) if set(p["targets"]) & set(m["targets"])), None)
        m["changed_from"] = None if prev is None else {
            "fingerprint": prev["fingerprint"], "when": m["first"],
            "facts": {k: [prev["facts"].get(k), m["facts"].get(k)] for k in sorted(set(prev["facts"]) | set(m["facts"]))
                      if prev["facts"].get(k) != m["facts"].get(k)}}
    return machines


def publish_reports(source, runs: list[Run], out: Path, say) -> set:
    """report.html of each run, as `zobench report` writes it, kept from an earlier publish
    (a run's results no longer change once pushed: resuming it pushes again, so a changed run is
    rebuilt when its results differ from the ones its report was made of)."""
    from reports import build as build_report

    done = set()
    for run in runs:
        folder = out / "runs" / run.run_id
        made_of = hashlib.sha256(json.dumps(source.results(run.run_id), sort_keys=True).encode()).hexdigest()
        if (folder / "report.html").is_file() and (folder / "made_of").is_file() and \
                (folder / "made_of").read_text() == made_of:
            done.add(run.run_id)
            continue
        say(f"report of {run.run_id}")
        with tempfile.TemporaryDirectory() as d:
            try:
                build_report(source.local_store(run.run_id, Path(d)), [run.run_id], folder)
            except Exception as e:      # noqa: BLE001 (a run without a chartable result: its points link nowhere)
                say(f"no report of {run.run_id}: {e}")
                continue
        (folder / "made_of").write_text(made_of)
        done.add(run.run_id)
    return done


def write_json(path: Path, data) -> None:
    path.write_text(json.dumps(data, separators=(",", ":"), allow_nan=False))


def write_script(path: Path, name: str, data) -> None:
    """data as a script that sets window[name]: what a page opened from disk (file://) can load,
    where a browser refuses to fetch a JSON file. JSON is JavaScript, and the file is a script of
    its own, never markup, so no text in it can end it early."""
    path.write_text(f"window.{name} = {json.dumps(data, separators=(',', ':'), allow_nan=False)};\n")


def page_weight(out: Path) -> int:
    """What a browser loads to show the overview: its page, script, style and data."""
    return sum((out / f).stat().st_size for f in ("index.html", "site.js", "site.css", "data/overview.js"))
