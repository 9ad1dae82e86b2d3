"""The harness's folders follow the data flow (README.md, "Layout"): each imports only the
folders before it and the shared basics, so that planning makes nothing, a store never reaches
for a board, and a reader of results pulls in no runner."""
from __future__ import annotations

import ast
from pathlib import Path

from testkit.runners import REPO

ORDER = ("planning", "boards", "preparation", "stores", "execution", "analysis", "search")
BASICS = {p.stem for p in (REPO / "harness").glob("*.py")} - {"__init__"}


def imported_parts(path: Path) -> set[str]:
    """The harness folders (or basics) a module imports, lazily or not."""
    out = set()
    for node in ast.walk(ast.parse(path.read_text())):
        if isinstance(node, ast.ImportFrom) and node.module and node.module.split(".")[0] == "harness":
            parts = node.module.split(".")
            out |= {parts[1]} if len(parts) > 1 else {a.name for a in node.names}
        elif isinstance(node, ast.Import):
            out |= {a.name.split(".")[1] for a in node.names if a.name.startswith("harness.")}
    return out


def test_each_harness_folder_imports_only_those_before_it_and_the_basics():
    back = []
    for folder in ORDER:
        for path in sorted((REPO / "harness" / folder).glob("*.py")):
            for part in imported_parts(path) - BASICS:
                if ORDER.index(part) > ORDER.index(folder):
                    back.append(f"{path.relative_to(REPO)} imports harness.{part}")
    assert back == []
    assert {p.name for p in (REPO / "harness").iterdir() if p.is_dir() and p.name != "__pycache__"} == set(ORDER)


def test_what_runs_on_a_board_imports_nothing_of_the_host():
    """workloads/ is shipped to every board (harness/preparation/bundle.py): none of it imports
    the harness, the reports or the command."""
    found = [f"{p.relative_to(REPO)}: {n}" for p in sorted((REPO / "workloads").rglob("*.py"))
             for node in ast.walk(ast.parse(p.read_text()))
             for n in ([node.module] if isinstance(node, ast.ImportFrom) and node.module else
                       [a.name for a in node.names] if isinstance(node, ast.Import) else [])
             if n.split(".")[0] in ("harness", "reports", "zobench")]
    assert found == []
