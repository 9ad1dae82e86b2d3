"""The dashboard (`zobench publish`, docs/dashboard.md) in a real browser: Debian's headless
Chromium driven by Selenium, against a site published and served by `zobench publish --serve`
from a real PostgreSQL store that holds real short runs of two commits, a made-up series of six
commits slowed down at the fourth (a change point of known place), and a result whose target
name is hostile markup."""
import json
import os
import re
from pathlib import Path

import pytest

from harness.analysis.site import key_id
from harness.stores import pgstore
from harness.stores.store import Store
from testkit import compare_runs
from testkit.postgres import Postgres
from testkit.runners import TINY_CPP, in_process, start
from testkit.browser import chromium
from testkit.tools import require

HOSTILE = '<img src=x onerror="window.pwned=1"><script>window.pwned=1</script>'
COMMITS = [f"{i:x}" * 40 for i in range(1, 7)]
REAL = ["a1" * 20, "b2" * 20]


def made_up(store: Store, ms: float, n: int, commit: str, target: str = "solo") -> str:
    results = [compare_runs.made_up_result(ms * (1 + 0.004 * i), repeat=i) for i in (3, 0, 4, 1, 2)]
    for r in results:
        r["job"]["target"] = target
    return compare_runs.made_up_run(store, results, f"2026-01-01T00:00:{n:02d}+00:00",
                                    {"commit": commit, "branch": "main", "dirty": False})


@pytest.fixture(scope="module")
def store(tmp_path_factory):
    """The shared store: its URL, the local folder its runs came from, and the runs by commit."""
    require("initdb")
    pg = Postgres()
    url, root = pg.new_database(), tmp_path_factory.mktemp("dashboard")
    local, runs = Store(root / "results"), {}
    for i, commit in enumerate(COMMITS):         # 50% slower from the fourth commit on
        runs[commit] = made_up(local, 15.0 if i >= 3 else 10.0, i, commit)
    runs["hostile"] = made_up(local, 10.0, 30, "c3" * 20, target=HOSTILE)
    for commit in REAL:
        before = set(local.run_ids())
        os.environ.update(ZOBENCH_COMMIT=commit, ZOBENCH_BRANCH="main")
        try:
            r = in_process("run", "--results", local.root, "--no-report", *TINY_CPP, "--method", "full-zo")
        finally:
            del os.environ["ZOBENCH_COMMIT"], os.environ["ZOBENCH_BRANCH"]
        assert r.returncode == 0, r.stderr
        (runs[commit],) = set(local.run_ids()) - before
    for run_id in runs.values():
        assert in_process("push", run_id, "--store", url, "--results", local.root).returncode == 0
    yield url, local, runs, pg
    pg.stop()


@pytest.fixture(scope="module")
def site(store, tmp_path_factory):
    """`zobench publish --serve` on any free port: the site's folder, its address and what the
    command printed."""
    url, _, _, _ = store
    out = tmp_path_factory.mktemp("site")
    p = start("publish", "--store", url, "--out", out, "--reports", "1", "--threshold", "25", "--serve", "--port", "0")
    said = ""
    while "serving http" not in said:
        line = p.stderr.readline()
        if not line:
            pytest.fail(f"publish --serve ended (exit {p.wait()}): {said}")
        said += line
    address = re.search(r"http://127\.0\.0\.1:\d+/", said)[0]
    yield out, address, p.stdout.readline()
    p.terminate()
    p.wait(30)


@pytest.fixture(scope="module")
def browser():
    driver = chromium()
    yield driver
    driver.quit()


def visit(browser, address: str, page: str, ready: str):
    """Open the page and wait until `ready` (a CSS selector) is drawn; no error on its console."""
    from selenium.webdriver.support.ui import WebDriverWait

    browser.get(address + page)
    WebDriverWait(browser, 60).until(lambda d: d.find_elements("css selector", f"{ready}, .error"))
    assert not browser.find_elements("css selector", ".error"), browser.find_element("css selector", ".error").text
    return browser


def console_errors(browser) -> list:
    return [e for e in browser.get_log("browser") if e["level"] == "SEVERE"]


def key_of(url: str, target: str) -> str:
    with pgstore.SharedStore(url) as shared:
        (key,) = {row[0] for row in shared.history([], target, None, None)[0]}
    return key


def test_publish_writes_files_only_a_row_per_series_a_file_per_key_and_the_newest_report(site, store):
    out, _, said = site
    url, _, runs, _ = store
    with pgstore.SharedStore(url) as shared:
        series = shared.conn.execute("SELECT count(*) FROM series").fetchone()[0]
        keys = shared.conn.execute("SELECT count(DISTINCT job_key) FROM series").fetchone()[0]
    overview = json.loads((out / "data" / "overview.json").read_text())
    assert len(overview["rows"]) == series == 3, [r["key"] for r in overview["rows"]]
    assert len(list((out / "data" / "keys").iterdir())) == keys
    assert f"({keys} keys, {series} series," in said
    # the charting library is the Python package's copy: the pages load nothing from elsewhere
    for page in ("index.html", "key.html", "compare.html", "machine.html"):
        assert not re.search(r"(src|href)=\"(https?:)?//", (out / page).read_text())
    # compare views: each change point's, and main's consecutive commits (the default 20 covers them all)
    pairs = json.loads((out / "data" / "compare" / "index.json").read_text())
    assert all([a[:12], b[:12]] in pairs for a, b in zip(COMMITS, COMMITS[1:])) and all(a != b for a, b in pairs)
    assert len(pairs) == len(COMMITS) + 2 == len(list((out / "data" / "compare").iterdir())) - 1
    # --reports 1: the newest run's (the real runs started within a second: the store orders them by id then)
    newest = pgstore.SharedStore(url).run_ids()[-1]
    assert newest in (runs[REAL[0]], runs[REAL[1]]) and [p.name for p in (out / "runs").iterdir()] == [newest]
    assert "zobench report" in (out / "runs" / newest / "report.html").read_text()


def test_the_overview_lists_every_key_a_filter_narrows_it_in_the_url_and_a_reload_keeps_it(site, store, browser):
    from selenium.webdriver.support.ui import Select

    _, address, _ = site
    with pgstore.SharedStore(store[0]) as shared:
        keys = {k for k, in shared.conn.execute("SELECT job_key FROM series")}
    b = visit(browser, address, "index.html", "#overview tbody tr")
    assert {tr.get_attribute("data-key") for tr in b.find_elements("css selector", "#overview tbody tr")} == keys
    Select(b.find_element("id", "f-target")).select_by_value("solo")
    rows = b.find_elements("css selector", "#overview tbody tr")
    assert [tr.get_attribute("data-key") for tr in rows] == [key_of(store[0], "solo")]
    assert "target=solo" in b.current_url
    assert "regressed at " + COMMITS[3][:12] in rows[0].find_element("css selector", ".verdict").text
    b.refresh()
    visit(b, address, b.current_url.removeprefix(address), "#overview tbody tr")
    assert len(b.find_elements("css selector", "#overview tbody tr")) == 1
    assert Select(b.find_element("id", "f-target")).first_selected_option.get_attribute("value") == "solo"
    assert console_errors(b) == []


def test_a_keys_page_draws_every_point_and_a_click_on_its_change_opens_the_gates_verdict(site, store, browser):
    from selenium.webdriver.common.action_chains import ActionChains
    from selenium.webdriver.support.ui import Select, WebDriverWait

    _, address, _ = site
    url, local, runs, _ = store
    key = key_of(url, "solo")
    b = visit(browser, address, f"key.html?k={key_id(key)}", "#plot-step_time path.point")
    # every commit the store holds for the key, a point each (accuracy: every point has one)
    assert len(b.find_elements("css selector", "#plot-accuracy path.point")) == len(COMMITS)
    # the step time's points and its one change point, where zobench history finds it
    assert len(b.find_elements("css selector", "#plot-step_time path.point")) == len(COMMITS) + 1
    assert [a.text for a in b.find_elements("css selector", "a.change-link")] == \
        [f"{COMMITS[2][:12]} -> {COMMITS[3][:12]}"]
    (change,) = b.find_elements("css selector", "#plot-step_time .scatterlayer .trace")[-1] \
        .find_elements("css selector", "path.point")
    ActionChains(b).move_to_element(change).click().perform()
    WebDriverWait(b, 60).until(lambda d: "compare.html" in d.current_url)
    assert f"compare.html?a={COMMITS[2][:12]}&b={COMMITS[3][:12]}" in b.current_url
    visit(b, address, b.current_url.removeprefix(address), "#verdicts tbody tr")
    shown = {tr.find_element("css selector", "a").text: tr.get_attribute("data-status")
             for tr in b.find_elements("css selector", "#verdicts tbody tr")}
    # the gate's own verdict on the same runs
    r = in_process("compare", runs[COMMITS[2]], runs[COMMITS[3]], "--results", local.root, "--threshold", "25",
                   "--format", "json")
    assert r.returncode == 1 and shown == {v["key"]: v["status"] for v in json.loads(r.stdout)["verdicts"]}
    assert shown[key] == "regressed"
    # back to the history with both commits highlighted; the view restored from its URL on a reload
    b.find_element("link text", key).click()
    visit(b, address, b.current_url.removeprefix(address), "#plot-step_time path.point")
    assert f"hl={COMMITS[2][:12]}%2C{COMMITS[3][:12]}" in b.current_url
    Select(b.find_element("id", "r-from")).select_by_value(COMMITS[2][:12])
    assert f"from={COMMITS[2][:12]}" in b.current_url
    b.refresh()
    visit(b, address, b.current_url.removeprefix(address), "#plot-step_time path.point")
    assert len(b.find_elements("css selector", "#plot-accuracy path.point")) == 4      # commits 3 to 6
    assert console_errors(b) == []


def test_a_hostile_target_name_shows_as_text_on_every_page(site, store, browser):
    _, address, _ = site
    key = key_of(store[0], HOSTILE)
    b = visit(browser, address, "index.html", "#overview tbody tr")
    cells = [td.text for td in b.find_elements("css selector", "#overview tbody td")]
    assert HOSTILE in cells
    b = visit(browser, address, f"key.html?k={key_id(key)}", "#plot-step_time path.point")
    assert b.find_element("id", "title").text == key
    fp = json.loads((site[0] / "data" / "overview.json").read_text())["rows"]
    machine = next(r["fingerprint"] for r in fp if r["target"] == HOSTILE)
    b = visit(browser, address, f"machine.html?f={machine[:16]}", "h2")
    assert HOSTILE in b.find_element("id", "main").text
    assert b.execute_script("return window.pwned") is None
    assert console_errors(b) == []


def test_a_results_folder_publishes_the_site_its_store_does(site, store, tmp_path):
    """The folder the runs were pushed from, published without a store: the same series, points
    and change points, because its rows are the ones push stores (pgstore.history_row)."""
    out, _, _ = site
    r = in_process("publish", "--results", store[1].root, "--out", tmp_path / "site", "--reports", "0",
                   "--threshold", "25")
    assert r.returncode == 0, r.stderr
    for name in ("overview.json", "machines.json"):
        a, b = (json.loads((o / "data" / name).read_text()) for o in (out, tmp_path / "site"))
        if name == "overview.json":
            assert a.pop("source") != b.pop("source")
        assert a == b
    for f in (out / "data" / "keys").iterdir():
        mine = json.loads((tmp_path / "site" / "data" / "keys" / f.name).read_text())
        theirs = json.loads(f.read_text())
        for s in (*mine["series"], *theirs["series"]):
            for p in s["points"]:
                p.pop("report")         # the store's site published one report, this one none
        assert mine == theirs


def test_bad_input_is_one_line_and_leaves_the_last_site_whole(store, tmp_path):
    empty = tmp_path / "results"
    empty.mkdir()
    r = in_process("publish", "--results", empty, "--out", tmp_path / "site")
    assert r.returncode == 2 and r.stderr.count("\n") == 1 and "no run in" in r.stderr
    assert not (tmp_path / "site").exists()
    (tmp_path / "file").write_text("")
    r = in_process("publish", "--results", store[1].root, "--out", tmp_path / "file" / "site", "--reports", "0")
    assert r.returncode == 2 and "publish --out" in r.stderr and r.stderr.count("\n") == 1, r.stderr
    r = in_process("publish", "--store", "postgresql://nobody@127.0.0.1:1/none", "--out", tmp_path / "site2")
    assert r.returncode == 2 and r.stderr.count("\n") == 1 and "Traceback" not in r.stderr, r.stderr
    # a publish that fails half-way (its store's results table dropped by hand after the runs were
    # read) keeps the site it would have replaced, whole
    url, local, runs, pg = store
    other = pg.new_database()
    assert in_process("push", runs[COMMITS[0]], "--store", other, "--results", local.root).returncode == 0
    site = tmp_path / "site3"
    assert in_process("publish", "--store", other, "--out", site, "--reports", "0").returncode == 0
    before = {f: f.read_bytes() for f in (site / "data").rglob("*") if f.is_file()}
    import psycopg
    with psycopg.connect(other, autocommit=True) as c:
        c.execute("DROP TABLE results")
    r = in_process("publish", "--store", other, "--out", site, "--reports", "0")
    assert r.returncode == 2 and "the shared store" in r.stderr and r.stderr.count("\n") == 1, r.stderr
    assert {f: f.read_bytes() for f in (site / "data").rglob("*") if f.is_file()} == before


def test_a_commit_alone_opens_its_newest_published_comparison(site, browser):
    """compare.html?b=COMMIT, the link a CI job summary writes: the pair that ends at that commit."""
    _, address, _ = site
    b = visit(browser, address, f"compare.html?b={COMMITS[3][:12]}", "#verdicts tbody tr")
    assert f"a={COMMITS[2][:12]}" in b.current_url
    assert b.find_element("id", "title").text == f"compare {COMMITS[2][:12]} -> {COMMITS[3][:12]}"
    assert console_errors(b) == []


def test_only_zobenchs_marker_makes_a_folder_a_site_publish_may_write_into(store, tmp_path):
    """Folders that look like an older site (data/overview.json) beside a user's files, at the top
    or inside data/: refused in one line, nothing changed; a marker of another output (a report's)
    does not make a folder a site either."""
    results = str(store[1].root)
    looks = {"csv": {"data/overview.json": "{}", "data/important.csv": "thesis numbers\n"},
             "page": {"data/overview.json": "{}", "index.html": "my page\n"},
             "report": {".zobench-report": "", "report.md": "my notes\n"}}
    for name, files in looks.items():
        out = tmp_path / name
        for rel, text in files.items():
            (out / rel).parent.mkdir(parents=True, exist_ok=True)
            (out / rel).write_text(text)
        r = in_process("publish", "--results", results, "--out", out, "--reports", "0")
        assert r.returncode == 2 and "zobench did not write" in r.stderr and len(r.stderr.splitlines()) == 1, r.stderr
        assert {str(p.relative_to(out)): p.read_text() for p in out.rglob("*") if p.is_file()} == files


def test_publish_writes_only_where_no_user_file_would_be_lost(store, tmp_path, monkeypatch):
    """Into a folder holding a user's files, its home or a system folder, publish refuses in one
    line naming what is there and changes nothing; into a new folder it writes the site and its
    marker, and publishes over that site again."""
    results = str(store[1].root)
    mine = tmp_path / "mine"
    (mine / "data").mkdir(parents=True)
    (mine / "data" / "important.csv").write_text("thesis numbers\n")
    (mine / "index.html").write_text("my page\n")
    home = tmp_path / "home"
    (home / "thesis.tex").parent.mkdir()
    (home / "thesis.tex").write_text("\\\\documentclass{article}\n")
    monkeypatch.setenv("HOME", str(home))
    for out, needle in ((mine, "holds 2 entries zobench did not write (data/, index.html)"),
                        (home, "is the home folder"), (Path("/"), "is a system folder"),
                        (mine / "data" / "important.csv", "is a file, not a folder")):
        r = in_process("publish", "--results", results, "--out", out, "--reports", "0")
        assert r.returncode == 2 and needle in r.stderr and "Traceback" not in r.stderr, r.stderr
    assert (mine / "data" / "important.csv").read_text() == "thesis numbers\n"
    assert (mine / "index.html").read_text() == "my page\n" and sorted(p.name for p in mine.iterdir()) == ["data", "index.html"]
    assert (home / "thesis.tex").is_file() and sorted(p.name for p in home.iterdir()) == ["thesis.tex"]
    new = tmp_path / "site"
    for _ in range(2):      # a new folder, then the site zobench published there
        r = in_process("publish", "--results", results, "--out", new, "--reports", "0")
        assert r.returncode == 0, r.stderr
    assert (new / ".zobench-site").is_file() and (new / "data" / "overview.json").is_file()


def test_the_overview_shows_the_last_judged_time_and_the_last_measured_one_with_its_load(tmp_path):
    """Issue 60: a series whose last commit ran while other work took 90% of the CPU the job
    wanted has no judged time at that commit; its overview row still shows what it measured,
    flagged, beside the last judged time, and its last count of instructions per step, which
    load does not move: where that count changed at the last commit, the row's verdict is that
    change, not "noisy". A one-commit series says it is not judged, and one never counted has
    no count."""
    for counts, verdict in (((15e6, 15e6), "noisy"), ((15e6, 15.3e6), "regressed")):
        store = Store(tmp_path / f"results-{verdict}")
        for n, (ms, share) in enumerate(((10.0, 0.02), (13.0, 0.95))):
            results = [compare_runs.made_up_result(ms * (1 + 0.004 * i), repeat=i, threads=1, instructions=counts[n]
                                                   if i == 0 else None, load=compare_runs.load_at(share)) for i in range(5)]
            compare_runs.made_up_run(store, results, f"2026-01-01T00:00:{n:02d}+00:00",
                                     {"commit": COMMITS[n], "branch": "main", "dirty": False})
        r = in_process("publish", "--results", store.root, "--out", tmp_path / f"site-{verdict}", "--reports", "0")
        assert r.returncode == 0, r.stderr
        (row,) = json.loads((tmp_path / f"site-{verdict}" / "data" / "overview.json").read_text())["rows"]
        assert (row["latest"], row["measured"], row["measured_flag"]) == (10.08, 13.1, "⚠ 90% other"), row
        assert (row["verdict"], row["instructions"]) == (verdict, counts[1] / 1e6), row
        assert row["verdict_metric"] == ("instructions" if verdict == "regressed" else "")
    only = Store(tmp_path / "one")
    compare_runs.made_up_run(only, [compare_runs.made_up_result(10.0, repeat=0, load=compare_runs.load_at(0.02))],
                             git={"commit": COMMITS[0], "branch": "main", "dirty": False})
    assert in_process("publish", "--results", only.root, "--out", tmp_path / "one-site", "--reports", "0").returncode == 0
    (row,) = json.loads((tmp_path / "one-site" / "data" / "overview.json").read_text())["rows"]
    assert (row["verdict"], row["measured"], row["measured_flag"]) == ("not judged (one commit)", 10.0, "2% other")
    assert row["instructions"] is None


def test_the_overview_opens_from_disk_and_the_other_pages_say_how_to_serve_the_site(browser, tmp_path):
    """Issue 61 item 18: a site opened from disk (file://.../index.html) showed only "Failed to
    fetch", since browsers fetch nothing into a file:// page. The overview's data is a script the
    page loads (data/overview.js), so it lists every series there too; a page that must fetch its
    data (a key's, a machine's, a comparison's) says so and how to serve the site instead."""
    from selenium.webdriver.support.ui import WebDriverWait

    store = Store(tmp_path / "results")
    for n, ms in enumerate((10.0, 10.0, 15.0)):
        made_up(store, ms, n, COMMITS[n])
    made_up(store, 10.0, 9, COMMITS[2], target=HOSTILE)
    out = tmp_path / "my site"          # a space: the address is escaped, the folder shown as it is
    r = in_process("publish", "--results", store.root, "--out", out, "--reports", "0", "--threshold", "25")
    assert r.returncode == 0, r.stderr
    rows = json.loads((out / "data" / "overview.json").read_text())["rows"]
    b = visit(browser, out.as_uri() + "/", "index.html", "#overview tbody tr")
    shown = b.find_elements("css selector", "#overview tbody tr")
    assert sorted(tr.get_attribute("data-key") for tr in shown) == sorted(r["key"] for r in rows) and len(rows) == 2
    assert HOSTILE in [td.text for td in b.find_elements("css selector", "#overview tbody td")]
    assert b.execute_script("return window.pwned") is None
    assert b.find_element("id", "count").text == "2 of 2 series"
    assert console_errors(b) == []
    for page in (f"key.html?k={rows[0]['id']}", f"machine.html?f={rows[0]['fingerprint']}",
                 f"compare.html?b={COMMITS[2][:12]}"):
        b.get(out.as_uri() + "/" + page)
        WebDriverWait(b, 60).until(lambda d: d.find_elements("css selector", ".error"))
        said = b.find_element("css selector", ".error").text
        assert "Failed to fetch" not in said, said
        assert f"a page opened from disk (file://); only the overview (index.html) works from there. Serve the " \
               f"site: python3 -m http.server -d '{out}' (or zobench publish --serve), then open " \
               f"http://localhost:8000/{page}" in said, said
