"""docs/reliability.md and the fault tests are kept in step: every test marked ``fault`` has a
row, and every row names a test that exists."""

from __future__ import annotations

import ast
import re
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]
DOC = ROOT / "docs" / "reliability.md"
ROW_TEST = re.compile(r"`(tests/[\w/]+\.py)::(\w+)`")


def _marked_fault_tests() -> set[str]:
    """``path::name`` of every test function marked ``fault`` (on itself or its module)."""
    found: set[str] = set()
    for path in sorted((ROOT / "tests").rglob("test_*.py")):
        tree = ast.parse(path.read_text(), filename=str(path))
        module_marked = any(
            isinstance(node, ast.Assign) and any(getattr(t, "id", "") == "pytestmark"
                                                 for t in node.targets)
            and "fault" in ast.unparse(node.value)
            for node in tree.body)
        for node in ast.walk(tree):
            if isinstance(node, (ast.FunctionDef, ast.AsyncFunctionDef)) \
                    and node.name.startswith("test_"):
                marked = module_marked or any("mark.fault" in ast.unparse(d)
                                              for d in node.decorator_list)
                if marked:
                    found.add(f"{path.relative_to(ROOT)}::{node.name}")
    return found


def _rows() -> set[str]:
    return {f"{m.group(1)}::{m.group(2)}" for m in ROW_TEST.finditer(DOC.read_text())}


def test_every_fault_test_has_a_row() -> None:
    missing = _marked_fault_tests() - _rows()
    assert not missing, f"fault tests without a row in {DOC.name}: {sorted(missing)}"


def test_every_row_names_a_test_that_exists() -> None:
    tests = set()
    for path in sorted((ROOT / "tests").rglob("test_*.py")):
        tree = ast.parse(path.read_text())
        tests |= {f"{path.relative_to(ROOT)}::{n.name}" for n in ast.walk(tree)
                  if isinstance(n, (ast.FunctionDef, ast.AsyncFunctionDef))}
    stale = _rows() - tests
    assert not stale, f"rows in {DOC.name} naming no test: {sorted(stale)}"
