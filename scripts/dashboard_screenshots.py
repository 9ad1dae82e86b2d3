"""The screenshots of docs/dashboard.md: a throwaway PostgreSQL store (testkit/postgres.py) filled
with made-up runs of two keys over eight commits on two kernels of one machine (a step-time
regression at the sixth commit, a memory change at the fourth), published by `zobench publish`
and photographed in headless Chromium, page by page.

    .venv/bin/python scripts/dashboard_screenshots.py [--out docs/dashboard]
"""
from __future__ import annotations

import argparse
import json
import sys
import tempfile
import threading
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

from harness.stores.store import Store  # noqa: E402
from testkit import compare_runs  # noqa: E402
from testkit.postgres import Postgres  # noqa: E402
from testkit.runners import in_process  # noqa: E402
from testkit.browser import chromium  # noqa: E402
from zobench.commands.publish import server  # noqa: E402


def fill(store: Store, url: str) -> list[str]:
    commits = [f"{i:x}" * 40 for i in range(1, 9)]
    for i, commit in enumerate(commits):
        for kernel, method in (("6.1.0", "full-zo"), ("6.1.0", "full-bp"), ("6.12.0", "full-zo")):
            ms = (14.0 if i >= 5 else 10.0) * (1.0 if method == "full-zo" else 1.6) * (0.9 if kernel == "6.12.0" else 1)
            peak = 20.0 + 4.0 * (i >= 3 and method == "full-bp")
            results = [compare_runs.made_up_result(ms * (1 + 0.01 * j), repeat=j, method=method, kernel=kernel,
                                                   peak_mib=peak * (1 + 0.001 * j)) for j in (3, 0, 4, 1, 2)]
            for r in results:
                r["epochs"][0]["test_accuracy"] = 0.70 + 0.01 * i + 0.002 * r["job"]["repeat"]
            run_id = compare_runs.made_up_run(store, results, f"2026-01-{i + 1:02d}T{10 + (kernel == '6.12.0')}:00:00+00:00",
                                              {"commit": commit, "branch": "main", "dirty": False})
            assert in_process("push", run_id, "--store", url, "--results", store.root).returncode == 0
    return commits


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--out", type=Path, default=Path("docs/dashboard"))
    args = ap.parse_args()
    from selenium.webdriver.support.ui import WebDriverWait

    pg = Postgres()
    try:
        with tempfile.TemporaryDirectory() as d:
            url, store = pg.new_database(), Store(Path(d) / "results")
            commits = fill(store, url)
            site = Path(d) / "site"
            r = in_process("publish", "--store", url, "--out", site, "--reports", "0")
            assert r.returncode == 0, r.stderr
            overview = json.loads((site / "data" / "overview.json").read_text())["rows"]
            key = next(row for row in overview if row["verdict"] == "regressed")
            httpd = server(site, 0)
            threading.Thread(target=httpd.serve_forever, daemon=True).start()
            base = f"http://127.0.0.1:{httpd.server_address[1]}/"
            driver = chromium(1200, 900, console=False)
            args.out.mkdir(parents=True, exist_ok=True)
            pages = {"overview": ("index.html", "#overview tbody tr"),
                     "key": (f"key.html?k={key['id']}", "#plot-step_time path.point"),
                     "compare": (f"compare.html?a={commits[4][:12]}&b={commits[5][:12]}&k={key['id']}", "#verdicts tbody tr"),
                     "machine": (f"machine.html?f={key['fingerprint'][:16]}", "h2")}
            try:
                for name, (page, ready) in pages.items():
                    driver.get(base + page)
                    WebDriverWait(driver, 60).until(lambda dr, sel=ready: dr.find_elements("css selector", sel))
                    driver.save_screenshot(str(args.out / f"{name}.png"))
                    print(f"{args.out / name}.png")
            finally:
                driver.quit()
                httpd.shutdown()
    finally:
        pg.stop()
    return 0


if __name__ == "__main__":
    sys.exit(main())
