"""Table 2's lost setting, recovered by calibration: the arithmetic of scripts/calibrate_table2.py.

The ElasticZO paper's Sec. 5.1 says of its fine-tuning data: "We randomly choose [N] images from
train and test splits and rotate them by either [A] or [B]"; the three numbers were lost from the
text. They are the unknowns, fitted in order, each on cells the next steps do not use:
- A < B, on the "w/o fine-tuning" cells: the pretrained network's accuracy on the rotated test
  images depends on the angle and the network, not on N (N only draws which test images);
- N, on one Full BP FP32 cell per data set, at the angles fitted;
- every other cell is then an out-of-sample check of the three.
Each fit is a least-squares choice among the grid points measured, so what was measured and the
residuals are the finding (docs/reproduction.md), not a curve tuned toward the answer."""
from __future__ import annotations

import itertools
import statistics
from dataclasses import dataclass


@dataclass(frozen=True)
class Fit:
    value: tuple                # the unknowns chosen: (A, B) or (N,)
    sse: float                  # the sum of squared residuals, points^2
    residuals: dict             # cell -> measured - paper, points


def fit_angles(curves: dict, paper: dict) -> Fit:
    """(A, B), two of the angles every curve measured (either sign, either order: the paper's
    columns are not known to be ordered), that minimise the squared residuals of the w/o
    fine-tuning cells. curves: cell group (a data set and precision) -> {angle: accuracy %};
    paper: the same groups -> (the paper's cell at A, its cell at B)."""
    groups = [g for g in paper if g in curves]
    if not groups:
        raise ValueError("no w/o fine-tuning curve to fit the angles on")
    angles = sorted(set.intersection(*(set(curves[g]) for g in groups)))
    best = None
    for a, b in itertools.permutations(angles, 2):
        residuals = {(g, angle): curves[g][angle] - paper[g][i] for g in groups for i, angle in enumerate((a, b))}
        sse = sum(r * r for r in residuals.values())
        if best is None or sse < best.sse:
            best = Fit((a, b), sse, residuals)
    if best is None:
        raise ValueError(f"fewer than two angles measured by every curve ({angles})")
    return best


def fit_subset(measured: dict, paper: dict) -> Fit:
    """(N,) among the subset sizes measured for every cell, that minimises the squared residuals
    of the cells fitted on. measured: N -> {cell: accuracy %}; paper: cell -> the paper's %."""
    sizes = sorted(n for n, cells in measured.items() if all(c in cells for c in paper))
    if not sizes:
        raise ValueError("no subset size measured for every cell fitted on")
    fits = []
    for n in sizes:
        residuals = {c: measured[n][c] - paper[c] for c in paper}
        fits.append(Fit((n,), sum(r * r for r in residuals.values()), residuals))
    return min(fits, key=lambda f: f.sse)


def spread(values: list[float]) -> tuple[float, float]:
    """(mean, sample standard deviation; 0 for one value) of a cell's seeds."""
    return statistics.mean(values), statistics.stdev(values) if len(values) > 1 else 0.0
