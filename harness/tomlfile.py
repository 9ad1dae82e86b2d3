"""TOML files read with errors that name the file, the key and what was expected."""
from __future__ import annotations

import sys
from pathlib import Path

if sys.version_info >= (3, 11):
    import tomllib
else:  # pragma: no cover
    import tomli as tomllib

from workloads.spec import Bounds

from harness.errors import UserError

TYPES = {str: "a string", int: "an integer", float: "a number", bool: "true or false",
         list: "a list", dict: "a table"}


def load(path: Path) -> dict:
    try:
        with open(path, "rb") as f:
            return tomllib.load(f)
    except FileNotFoundError:
        raise UserError(f"{path}: no such file") from None
    except tomllib.TOMLDecodeError as e:
        raise UserError(f"{path}: malformed TOML: {e}") from None
    except UnicodeDecodeError as e:     # TOML is UTF-8: a file in another encoding, or not text
        raise UserError(f"{path}: not UTF-8 text (byte {e.start}: {e.object[e.start:e.start + 1]!r}); "
                        "TOML files are UTF-8") from None
    except OSError as e:
        raise UserError(f"{path}: cannot read: {e.strerror}") from None


class Table:
    """A TOML table being validated: take() each known key, then done() rejects the rest."""

    def __init__(self, data: dict, path: Path, where: str = ""):
        self.data, self.path, self.where = data, path, where
        self.seen: set[str] = set()

    def error(self, key: str, msg: str) -> UserError:
        return UserError(f"{self.path}: {self.where}{key}: {msg}")

    def take(self, key: str, kind, default=None, choices=None, item=None, bounds: Bounds | None = None):
        """The value of key, checked: its type (kind, or a tuple of kinds), a list's item type,
        choices, and for a number finiteness and bounds."""
        self.seen.add(key)
        kinds = kind if isinstance(kind, tuple) else (kind,)
        expected = " or ".join(TYPES.get(k, str(k)) for k in kinds)
        if key not in self.data:
            if default is ...:
                raise self.error(key, f"missing; expected {expected}")
            return default
        v = self.data[key]
        ok = isinstance(v, kinds) and not (bool not in kinds and isinstance(v, bool))
        if kind is float and isinstance(v, int) and not isinstance(v, bool):
            v, ok = float(v), True
        if not ok:
            raise self.error(key, f"expected {expected}, got {v!r}")
        problem = (bounds or Bounds()).problem(v) if kind in (int, float) else None
        if problem:
            raise self.error(key, problem)
        if item is not None and any(not isinstance(x, item) for x in v):
            raise self.error(key, f"expected a list of {TYPES[item].split(' ', 1)[1]}s, got {v!r}")
        values = v if isinstance(v, list) else [v]
        bad = [x for x in values if choices is not None and x not in choices]
        if bad:
            raise self.error(key, f"expected one of {', '.join(map(repr, choices))}, got {bad[0]!r}")
        return v

    def done(self) -> None:
        extra = sorted(set(self.data) - self.seen)
        if extra:
            raise self.error(extra[0], f"unknown key; expected one of {', '.join(sorted(self.seen))}")
