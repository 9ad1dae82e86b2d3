"""The ElasticZO paper's accuracy tables, and a run's numbers set beside them: what a suite named
for the paper must reproduce (docs/reproduction.md).

The numbers are the paper's Tables 1 and 2 (Sugiura and Matsutani, ElasticZO), test accuracy in
percent. INT8 is its integer training with the ZO gradient from the float loss, INT8* from the
integer loss (Sec. 4.3). Table 2's text lost its two rotation angles and its fine-tuning subset's
size; paper-finetune uses those a calibration recovered, 30 and 45 degrees and 1,000 images
(docs/reproduction.md), set here against its first and second column.
"""
from __future__ import annotations

import re

import pandas as pd

from harness.stores import convergence
from workloads.vocab import method_label

from .finetune import BEFORE

# the suites whose runs are set beside the paper
SUITES = ("paper-fmnist", "paper-mnist", "paper-finetune", "paper-modelnet40")
METHODS = [method_label(m, k) for m, k in (("full-zo", 0), ("elastic-zo", 1), ("elastic-zo", 2), ("full-bp", 0))]

# Table 1: data set -> precision -> accuracy per METHODS row (None: the paper has no such cell)
TABLE1 = {
    "mnist": {"fp32": (89.80, 94.85, 97.53, 99.10), "int8": (89.78, 94.34, 97.34, 98.77),
              "int8*": (88.92, 93.92, 95.83, None)},
    "fashion-mnist": {"fp32": (77.09, 82.28, 86.60, 91.37), "int8": (73.98, 80.33, 84.66, 90.40),
                      "int8*": (71.02, 77.93, 81.60, None)},
    "modelnet40": {"fp32": (32.05, 70.38, 73.50, 71.60)},
}
# Table 2: precision -> data set -> its two angles' accuracy per row, BEFORE first, then METHODS
TABLE2 = {
    "fp32": {"mnist": ((74.41, 85.94, 90.04, 93.16, 94.82), (46.58, 74.71, 86.23, 91.60, 93.85)),
             "fashion-mnist": ((39.65, 61.33, 77.25, 75.98, 80.37), (23.34, 59.08, 74.51, 76.86, 79.49))},
    "int8": {"mnist": ((84.08, 85.94, 93.07, 93.46, 96.68), (60.25, 64.36, 87.99, 91.80, 95.21)),
             "fashion-mnist": ((28.13, 37.21, 69.43, 76.07, 80.08), (13.77, 22.95, 68.95, 75.68, 80.86))},
}
ANGLES = (30.0, 45.0)       # Table 2's two columns' angles, as calibrated (docs/reproduction.md)


def shown(plans: list[dict]) -> bool:
    """Whether a report's runs are of a suite named for the paper."""
    return any(p.get("suite") in SUITES for p in plans)


def paper_table1(data_set: str, precision: str, mlabel: str) -> float | None:
    row = TABLE1.get(data_set, {}).get(precision)
    return row[METHODS.index(mlabel)] if row and mlabel in METHODS else None


def paper_table2(data_set: str, precision: str, mlabel: str) -> float | None:
    """The paper's cell of a fine-tuning group: its data set's name as a job reads it
    (name-rotANGLE, with -subN where it fine-tunes on a subset, datasets.data_name)."""
    found = re.fullmatch(r"(.+)-rot(-?[\d.]+)(?:-sub\d+)?", data_set)
    cells = TABLE2.get(precision, {}).get(found[1]) if found else None
    if not cells or float(found[2]) not in ANGLES:
        return None
    angle = found[2]
    rows = (BEFORE, *METHODS)
    return cells[ANGLES.index(float(angle))][rows.index(mlabel)] if mlabel in rows else None


def _row(mlabel, data_set, precision, runtime, ours, paper, flag="", best=float("nan"), hyper="",
         std=float("nan"), seeds=1) -> dict:
    """A cell beside the paper's: over several seeds their mean ± standard deviation (n seeds),
    the mean judged against the target."""
    pct = lambda v: "-" if v is None or pd.isna(v) else f"{v:.2f}"   # noqa: E731
    spread = f" ± {std:.2f} ({seeds:.0f} seeds)" if seeds > 1 and not pd.isna(std) else ""
    return {"method": mlabel, "data": data_set, "precision": precision.upper(), "runtime": runtime, "hyper": hyper,
            "zobench %": convergence.annotate(pct(ours) + spread, flag, pct(best)), "paper %": pct(paper),
            "difference (points)": "-" if paper is None or pd.isna(ours) else f"{ours - paper:+.2f}",
            "within 2 points": "-" if paper is None or pd.isna(ours) else ("yes" if abs(ours - paper) <= 2 else "no")}


def table1(ok: pd.DataFrame) -> pd.DataFrame:
    """Table 1 beside the paper: each from-scratch job group's final test accuracy, the paper's
    cell and the difference in points."""
    g = ok[~ok["pretrained_from"].astype(bool) & (ok["stage"] != "pretrain") & ~ok["study"]]
    rows = [_row(r.mlabel, r.data_set, r.precision, r.runtime, r.test_acc, paper_table1(r.data_set, r.precision, r.mlabel),
                 r.flag, r.best_acc, r.hyper, r.test_acc_std, r.seeds) for r in g.itertuples()]
    return _ordered(pd.DataFrame(rows))


def table2(ok: pd.DataFrame) -> pd.DataFrame:
    """Table 2 beside the paper: per fine-tuning column "w/o fine-tuning" (the pretrained weights'
    accuracy) and each method's final accuracy."""
    g = ok[ok["pretrained_from"].astype(bool) & ~ok["study"]]
    rows = []
    for (data_set, precision, runtime), col in g.groupby(["data_set", "precision", "runtime"], sort=False):
        rows.append(_row(BEFORE, data_set, precision, runtime, col["start_acc"].mean(),
                         paper_table2(data_set, precision, BEFORE), std=col["start_acc_std"].mean(),
                         seeds=col["seeds"].max()))
        rows += [_row(r.mlabel, data_set, precision, runtime, r.test_acc, paper_table2(data_set, precision, r.mlabel),
                      r.flag, r.best_acc, r.hyper, r.test_acc_std, r.seeds) for r in col.itertuples()]
    return _ordered(pd.DataFrame(rows))


def _ordered(t: pd.DataFrame) -> pd.DataFrame:
    """Rows by data set, runtime, precision and the paper's method order; the hyper column (what
    sets apart two groups of one method, as the report's) only where some row has one."""
    if not len(t):
        return t
    t = t if t["hyper"].astype(bool).any() else t.drop(columns="hyper")
    rank = {m: i for i, m in enumerate((BEFORE, *METHODS))}
    return t.sort_values(["data", "runtime", "precision", "method"], key=lambda c: c.map(rank) if c.name == "method"
                         else c, kind="stable").reset_index(drop=True)
