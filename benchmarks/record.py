"""A benchmark's committed record (a JSON file under docs/) and the table a doc shows from it:
read and checked by rendering it, and `--show FILE` printed from it without running anything.
fig7.py and a53_estimate.py keep their records so; tests/test_fig7.py checks each doc table is
its record shown."""
from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent


def commit() -> str:
    """The checkout's commit, short: the one a record is measured at."""
    return subprocess.run(["git", "-C", str(ROOT), "rev-parse", "--short", "HEAD"], capture_output=True,
                          text=True).stdout.strip()


def read(path: Path, table, script: str) -> dict:
    """The record at path, checked by table(record); ValueError naming the file and what is wrong."""
    try:
        record = json.loads(path.read_text())
        table(record)
    except OSError as e:
        raise ValueError(f"{path}: {e.strerror}") from None
    except (ValueError, KeyError, TypeError, AttributeError, ZeroDivisionError) as e:
        raise ValueError(f"{path}: not a record of {script} ({type(e).__name__}: {e})") from None
    return record


def speedup(row: dict, rows: list[dict], cost: str, same: str) -> str:
    """An INT8 row's speed-up over the FP32 row of the same `same` (its configuration) in rows, per
    sample, so per epoch as Fig. 7 gives it: cost is a step's, and the rows' batches may differ.
    Blank for an FP32 row, and where rows have no FP32 row beside it."""
    fp32 = next((r for r in rows if r[same] == row[same] and r["precision"] == "fp32"), None)
    if row["precision"] != "int8" or fp32 is None:
        return ""
    return f"{fp32[cost] / fp32['batch'] / (row[cost] / row['batch']):.2f}"


def show(path: Path, table, script: str) -> int:
    """`--show`: the record's table on stdout, 0; a damaged or missing one in one line on stderr, 2."""
    try:
        print(table(read(path, table, script)))
    except ValueError as e:
        print(f"{script}: {e}", file=sys.stderr)
        return 2
    return 0
