"""Wall time of the same jobs on 1 board vs 3 boards in parallel, side by side in one run.

The boards are real sshd servers on loopback (testkit/sshd.py), so all three share this
machine's cores: the ratio shows the harness's fan-out, bounded by the cores there are.
Prints medians over --repeats; asserts nothing.
"""
from __future__ import annotations

import argparse
import os
import statistics
import sys
import tempfile
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

from testkit.sshd import board_toml, client_home, make_farm  # noqa: E402

from harness.stores.store import Store  # noqa: E402
from zobench import running  # noqa: E402


def timed_run(inventory: Path, results: Path, targets: list[str]) -> float:
    req = running.Request(targets=targets, inventory=inventory, methods=["full-zo"], report=False,
                          overrides=["epochs=2", "train_samples=3200", "test_samples=200"])
    t0 = time.perf_counter()
    if running.run(Store(results), req, lambda line: None).exit_code != 0:
        raise SystemExit("a job failed; see the results folder")
    return time.perf_counter() - t0


def run(repeats: int) -> None:
    with tempfile.TemporaryDirectory() as tmp:
        root = Path(tmp)
        boards, key = make_farm(root / "sshd", ["b1", "b2", "b3"])
        os.environ["HOME"] = str(client_home(root / "home", boards))
        inv = root / "inventory.toml"
        inv.write_text("".join(board_toml(b.name, b, key, root / b.name) for b in boards))
        try:
            timed_run(inv, root / "warm", ["b1", "b2", "b3"])        # deploy once, warm caches
            one, three = [], []
            for _ in range(repeats):
                one.append(timed_run(inv, root / "r", ["b1"]))
                three.append(timed_run(inv, root / "r", ["b1", "b2", "b3"]))
        finally:
            for b in boards:
                b.stop()
    m1, m3 = statistics.median(one), statistics.median(three)
    print(f"\n1 board, 1 job:    median {m1:6.2f} s  (runs: {', '.join(f'{x:.2f}' for x in one)})")
    print(f"3 boards, 3 jobs:  median {m3:6.2f} s  (runs: {', '.join(f'{x:.2f}' for x in three)})")
    print(f"3 boards / 1 board wall time: {m3 / m1:.2f}x for 3x the work "
          f"(serial would be 3.00x; {os.cpu_count()} cores here)")


if __name__ == "__main__":
    ap = argparse.ArgumentParser(description=__doc__)
    ap.add_argument("--repeats", type=int, default=3)
    run(ap.parse_args().repeats)
