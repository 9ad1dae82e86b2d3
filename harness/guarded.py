"""The one writer of folders zobench does not own outright (a published site; later a lease,
a board's workdir): it writes only into a folder that is empty, new, or marked as its own, and
never into /, the home folder itself or a system folder. A user's files are never overwritten or
deleted: anything else is refused in one line that names what is there (issue 47)."""
from __future__ import annotations

import os
from pathlib import Path

from harness.errors import UserError
from workloads import jsonfile

# folders whose every file is the system's: nothing of zobench's is made inside them (leases
# included: harness/planning/inventory.py lease_problem)
SYSTEM_TREES = ("/proc", "/sys", "/dev", "/etc", "/bin", "/sbin", "/usr", "/lib", "/lib32", "/lib64", "/boot")
# folders no zobench output belongs in, whatever they hold
SYSTEM = ("/", "/bin", "/boot", "/dev", "/etc", "/lib", "/lib32", "/lib64", "/proc", "/root", "/run", "/sbin",
          "/sys", "/usr", "/var", "/opt", "/srv", "/tmp", "/home", "/mnt", "/media")


def system_tree(path: str) -> str | None:
    """The system tree (SYSTEM_TREES) path lies in, or None."""
    return next((t for t in SYSTEM_TREES if path == t or path.startswith(t + "/")), None)


def own_file(path: Path, what: str, where: str, ours) -> Path:
    """The file `path` resolved, for zobench to write its `what` to: refused (UserError) where it
    is a folder, in a system tree, or a file ours(path) does not recognise as one zobench wrote
    (a file has no room for a marker beside it: its content is the mark). The rule of own_folder,
    for an --out that is a file: a user's file is never replaced."""
    p = Path(os.path.abspath(path)).resolve()
    if system_tree(str(p)):
        raise UserError(f"{where}: {p} is in a system folder; give a file of your own for the {what}")
    if p.is_dir():
        raise UserError(f"{where}: {p} is a folder, not a file")
    if p.exists() and not ours(p):
        raise UserError(f"{where}: {p} exists and zobench did not write it; give a new file, or one zobench wrote "
                        f"the {what} into (it replaces only its own)")
    return p


def write_file(path: Path, text: str, where: str) -> None:
    """text into path whole or not at all (a temporary file beside it, renamed over it): a full
    disk leaves the old file as it was and no half-written one; a UserError names the file."""
    try:
        with jsonfile.atomic(path) as tmp:
            Path(tmp).write_text(text)
    except OSError as e:
        raise UserError(f"{where}: cannot write {path}: {e.strerror}") from None


def own_folder(path: Path, marker: str, what: str, where: str) -> Path:
    """Make `path` zobench's for `what` (its marker file named `marker` inside, written now) and
    return it resolved; UserError where it is a system folder, the home folder, a file, or a
    folder holding something without the marker. Only the marker makes a folder zobench's: what
    merely looks like its output (a site's data/overview.json) may sit beside a user's files."""
    p = Path(os.path.abspath(path)).resolve()
    if str(p) in SYSTEM or p == Path.home().resolve() or system_tree(str(p)):
        raise UserError(f"{where}: {p} is {'the home folder' if p == Path.home().resolve() else 'a system folder'}; "
                        f"give a folder of its own for the {what}")
    if p.exists() and not p.is_dir():
        raise UserError(f"{where}: {p} is a file, not a folder")
    mark = p / marker
    if p.is_dir() and not mark.is_file():
        there = sorted(os.listdir(p))
        if there:
            shown = ", ".join(n + ("/" if (p / n).is_dir() else "") for n in there[:4]) + (", …" if len(there) > 4 else "")
            raise UserError(f"{where}: {p} holds {len(there)} entr{'y' if len(there) == 1 else 'ies'} zobench did not "
                            f"write ({shown}); give an empty folder, or one zobench wrote the {what} into (it keeps "
                            f"a {marker} file)")
    p.mkdir(parents=True, exist_ok=True)
    mark.write_text(f"zobench wrote the {what} in this folder; it replaces what it wrote here, and nothing else.\n")
    return p
