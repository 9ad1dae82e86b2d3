"""Results, plans and probes as files: valid JSON only, written atomically.

Python's json writes NaN and Infinity bare, which no strict JSON reader accepts (jq, a
browser, pandas with another engine). A value that is not finite is written as null instead,
and the object records where and what it was under "nonfinite" (e.g. "epochs[2].train_loss:
nan"), so a diverged loss is still visible. A file an older version wrote with bare NaN still
reads (loads), as the same nulls and "nonfinite" list, so it is normalised when written again.
Standard library only: the runners ship it to boards, and the store writes with it too.
"""
from __future__ import annotations

import contextlib
import json
import math
import os
import secrets


def finite(obj, where: str = "", found: list | None = None):
    """obj with every non-finite float replaced by None; the places are appended to found."""
    if isinstance(obj, float) and not math.isfinite(obj):
        if found is not None:
            found.append(f"{where or 'value'}: {obj}")
        return None
    if isinstance(obj, dict):
        return {k: finite(v, f"{where}.{k}" if where else str(k), found) for k, v in obj.items()}
    if isinstance(obj, (list, tuple)):
        return [finite(v, f"{where}[{i}]", found) for i, v in enumerate(obj)]
    return obj


def normal(obj):
    """obj as strict JSON can hold it: each top-level object (obj, or each item of a list obj)
    with its non-finite numbers as null, listed under its "nonfinite"."""
    if isinstance(obj, list):
        return [normal(item) for item in obj]
    found: list[str] = []
    clean = finite(obj, "", found)
    if found and isinstance(clean, dict):
        before = clean.get("nonfinite") or []
        clean["nonfinite"] = sorted({*(before if isinstance(before, list) else [before]), *found})
    return clean


def dumps(obj, indent: int | None = 1) -> str:
    """Strict JSON text of obj (see normal). Nearly every object is finite throughout: json
    refuses the others (ValueError), and only they are copied by normal()."""
    try:
        return json.dumps(obj, indent=indent, allow_nan=False)
    except ValueError:
        return json.dumps(normal(obj), indent=indent, allow_nan=False)


def loads(text: str):
    """A JSON document, also one with bare NaN/Infinity, as normal() holds it. json parses every
    number and constant through the two hooks, which note one that is not finite (a bare constant,
    or a literal too large for a double); a document with none is finite as parsed."""
    seen = []

    def number(literal: str) -> float:
        value = float(literal)
        if math.isinf(value):        # a literal too large for a double
            seen.append(literal)
        return value

    obj = json.loads(text, parse_float=number, parse_constant=lambda c: seen.append(c) or float(c))
    return normal(obj) if seen else obj


def temp_name(path) -> str:
    """A name next to path for writing it before the rename: unique per process and per call
    (threads of one process, two targets on one board and workdir), never a name another
    writer could be using."""
    return f"{path}.part-{os.getpid()}-{secrets.token_hex(6)}"


@contextlib.contextmanager
def atomic(path):
    """A temporary name beside path to write it under (yielded), renamed over path when the
    block ends well and removed when it does not: a reader, and a full disk, see the old file or
    the whole new one, never a part. An OSError names path, whatever the writer said (a
    library writing through a file object raises one with no file name)."""
    tmp = temp_name(path)
    try:
        yield tmp
        os.replace(tmp, path)
    except OSError as e:
        raise OSError(e.errno, e.strerror or str(e), str(path)) from None
    finally:
        if os.path.exists(tmp):
            os.unlink(tmp)


def write_atomic(path, obj: dict) -> None:
    """Write obj to path through a temporary file in the same folder, then rename (atomic())."""
    with atomic(path) as tmp, open(tmp, "w") as f:
        f.write(dumps(obj))
        f.flush()
        os.fsync(f.fileno())
