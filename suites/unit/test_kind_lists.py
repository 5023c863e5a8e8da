"""The hand-written lists of fault kinds in the docs name every registered kind: a kind
added as a module (docs/ARCHITECTURE.md "Adding a fault kind") fails here until the
glossary, the scenario format's fault table, the local backend's table and the fleet
model's pricing table say what it is. (docs/reference/fault-kinds.md and `diloco-chaos
faults` are generated from the kinds themselves: suites/unit/test_reference_docs.py.)"""
from __future__ import annotations

import re
from pathlib import Path

import pytest

from diloco_chaos.faults.kinds import FAULT_KINDS

DOCS = Path(__file__).resolve().parents[2] / "docs"


def _paragraph(doc: str, heading: str) -> str:
    """The text under `heading` up to the first blank line after it."""
    text = (DOCS / doc).read_text(encoding="utf-8")
    return text[text.index(heading) + len(heading):].strip().split("\n\n")[0]


def _first_column(doc: str, header: str) -> str:
    """The first cells of the Markdown table whose header row starts with `header`."""
    lines = (DOCS / doc).read_text(encoding="utf-8").splitlines()
    start = next(i for i, line in enumerate(lines) if line.startswith(header)) + 2
    rows = []
    for line in lines[start:]:
        if not line.startswith("|"):
            break
        rows.append(line.split("|")[1])
    return "\n".join(rows)


LISTS = {  # where a list of the kinds is written by hand -> the text that must name each
    "docs/GLOSSARY.md \"Fault kind\"": lambda: _paragraph("GLOSSARY.md", "### Fault kind"),
    "docs/SCENARIOS.md fault table": lambda: _first_column("SCENARIOS.md", "| kind | keys (besides target, at) |"),
    "docs/ARCHITECTURE.md local backend table": lambda: _first_column("ARCHITECTURE.md", "| fault | local backend |"),
    "docs/FLEET.md pricing table": lambda: _first_column("FLEET.md", "| fault | Decoupled DiLoCo"),
}


@pytest.mark.parametrize("where", LISTS)
def test_every_registered_kind_is_in_each_hand_written_list(where):
    text = LISTS[where]()
    missing = [k for k in FAULT_KINDS if not re.search(rf"(?<![\w-]){re.escape(k)}(?![\w-])", text)]
    assert not missing, f"{where} does not name {', '.join(missing)}"


def test_a_kind_missing_from_a_list_is_seen():
    text = LISTS["docs/FLEET.md pricing table"]()
    assert re.search(r"(?<![\w-])kill_unit(?![\w-])", text)
    assert not re.search(r"(?<![\w-])no_such_kind(?![\w-])", text)
    assert not re.search(r"(?<![\w-])corrupt(?![\w-])", "`corrupt_checkpoint`")  # a kind inside another's name
