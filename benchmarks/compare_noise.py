"""How `zobench compare` sees a real 20% slowdown and no change at all, per estimator.

Each trial is the regression test's set-up: five rounds of three single-threaded cpp runs
(five repeats each) taken in turn — the code as it is, the same code again, and the code
with `inject_slowdown=0.2` — pooled per side. It prints, per trial, each side's change
against the first by the minimum, the 10th percentile and the median, with the Mann-Whitney
p-value. On a shared machine the minimum is the one that stays on 0% and 20%: the reason
it is compare's default estimate. Asserts nothing.
"""
from __future__ import annotations

import argparse
import statistics
import sys
import tempfile
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent.parent / "tests"))

from conftest import interleaved_runs  # noqa: E402

from harness.compare import mann_whitney_p  # noqa: E402
from harness.measurements import load  # noqa: E402

ESTIMATES = (("min", min), ("p10", lambda x: statistics.quantiles(x, n=10)[0]), ("median", statistics.median))


def trial(root: Path, rounds: int) -> dict[str, list[float]]:
    """Each side's per-step times, pooled over its runs."""
    results, ids = interleaved_runs(root, rounds)
    return {side: next(iter(load(",".join(v), results)[1].values())).step_s for side, v in ids.items()}


def main(trials: int, rounds: int) -> None:
    print(f"{'trial':>5}  {'base min ms':>11}  {'side':<4}  " + "  ".join(f"{n:>7}" for n, _ in ESTIMATES) + "  p")
    for t in range(trials):
        with tempfile.TemporaryDirectory() as tmp:
            s = trial(Path(tmp), rounds)
        for side in ("same", "slow"):
            changes = [f"{100 * (f(s[side]) / f(s['base']) - 1):+6.1f}%" for _, f in ESTIMATES]
            print(f"{t + 1:>5}  {1e3 * min(s['base']):>11.3f}  {side:<4}  " + "  ".join(changes)
                  + f"  {mann_whitney_p(s['base'], s[side]):.3f}")


if __name__ == "__main__":
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--trials", type=int, default=3)
    ap.add_argument("--rounds", type=int, default=5)
    a = ap.parse_args()
    main(a.trials, a.rounds)
