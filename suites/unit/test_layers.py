"""The import direction of docs/ARCHITECTURE.md, read from the source (every import, at
any depth, lazy ones included): trainer/ imports nothing of the others; faults/ nothing
of trainer/, harness/, reports/; harness/ never reports/ (the CLI, diloco_chaos/, is the
one layer above both); nothing imports diloco_chaos/."""
from __future__ import annotations

import ast
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[2]
PACKAGES = ("trainer", "faults", "harness", "reports", "diloco_chaos")
MAY_NOT = {"trainer": {"faults", "harness", "reports", "diloco_chaos"},
           "faults": {"trainer", "harness", "reports", "diloco_chaos"},
           "harness": {"reports", "diloco_chaos"},
           "reports": {"diloco_chaos"}}


def imported_packages(source: str) -> set[str]:
    """The top-level names a module imports (absolute imports), at any depth of the file."""
    names = set()
    for node in ast.walk(ast.parse(source)):
        if isinstance(node, ast.Import):
            names |= {a.name.split(".")[0] for a in node.names}
        elif isinstance(node, ast.ImportFrom) and node.level == 0 and node.module:
            names.add(node.module.split(".")[0])
    return names


def test_the_reader_sees_lazy_and_nested_imports():
    src = "def f():\n    from reports import render_run\n    import harness.checks\n"
    assert imported_packages(src) == {"reports", "harness"}


@pytest.mark.parametrize("package", sorted(MAY_NOT))
def test_the_import_direction_holds(package):
    wrong = {}
    for path in sorted((ROOT / package).glob("**/*.py")):
        bad = imported_packages(path.read_text()) & MAY_NOT[package]
        if bad:
            wrong[str(path.relative_to(ROOT))] = sorted(bad)
    assert not wrong, f"imports against the direction in docs/ARCHITECTURE.md: {wrong}"
