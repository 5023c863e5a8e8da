"""The lists of fault kinds a reader meets: every registered kind is in the generated
reference (docs/reference/fault-kinds.md, `python -m diloco_chaos.reference`), with how
each tier does it; the scenario format's fault table (a row per kind, written by hand)
names every kind; and the docs whose lists name only some kinds (docs/GLOSSARY.md
"Fault kind", the local backend's table in docs/ARCHITECTURE.md, docs/FLEET.md's pricing
table) point to the reference for the rest and name no kind that does not exist. So a
kind added as a module (docs/ARCHITECTURE.md "Adding a fault kind") needs its row in
docs/SCENARIOS.md and the reference regenerated, no other list edited by hand.
(The reference page equal to the code: suites/unit/test_reference_docs.py.)"""
from __future__ import annotations

import re
from pathlib import Path

import pytest

from diloco_chaos import reference
from diloco_chaos.faults.kinds import FAULT_KINDS

DOCS = Path(__file__).resolve().parents[2] / "docs"
REFERENCE = "docs/reference/fault-kinds.md"


def _paragraph(doc: str, heading: str) -> str:
    """The text under `heading` up to the first blank line after it."""
    text = (DOCS / doc).read_text(encoding="utf-8")
    return text[text.index(heading) + len(heading):].strip().split("\n\n")[0]


def _table(doc: str, header: str, column: int | None = 0) -> str:
    """The rows (their `column`'s cells; None: whole rows) of the Markdown table whose
    header row starts with `header`, in `doc` or, for a page's text, in `doc` itself."""
    text = doc if "\n" in doc else (DOCS / doc).read_text(encoding="utf-8")
    lines = text.splitlines()
    start = next(i for i, line in enumerate(lines) if line.startswith(header)) + 2
    rows = []
    for line in lines[start:]:
        if not line.startswith("|"):
            break
        rows.append(line if column is None else line.split("|")[column + 1])
    return "\n".join(rows)


def _kind_words(text: str) -> set[str]:
    """The words of `text` written as a kind's name is (snake case; not in a path)."""
    return set(re.findall(r"(?<![\w/.-])[a-z]+(?:_[a-z]+)+(?![\w/.-])", text))


def _names(kind: str, text: str) -> bool:
    return re.search(rf"(?<![\w-]){re.escape(kind)}(?![\w-])", text) is not None


EVERY_KIND = {  # lists that name every kind
    "docs/SCENARIOS.md fault table": lambda: _table("SCENARIOS.md", "| kind | keys (besides target, at) |"),
    REFERENCE: lambda: _table(reference.fault_kinds_page(), "| kind | target |"),
}
SOME_KINDS = {  # lists of some kinds, with a pointer to the reference for every kind: (the list, its kinds' cells)
    "docs/GLOSSARY.md \"Fault kind\"": lambda: (_paragraph("GLOSSARY.md", "### Fault kind"),) * 2,
    "docs/ARCHITECTURE.md local backend table": lambda: (_table("ARCHITECTURE.md", "| fault | local backend |", None),
                                                          _table("ARCHITECTURE.md", "| fault | local backend |")),
    "docs/FLEET.md pricing table": lambda: (_table("FLEET.md", "| fault | Decoupled DiLoCo", None),
                                            _table("FLEET.md", "| fault | Decoupled DiLoCo")),
}


@pytest.mark.parametrize("where", EVERY_KIND)
def test_every_registered_kind_is_in_each_full_list(where):
    text = EVERY_KIND[where]()
    missing = [k for k in FAULT_KINDS if not _names(k, text)]
    assert not missing, f"{where} does not name {', '.join(missing)}"


def test_the_reference_says_how_each_tier_does_every_kind():
    rows = _table(reference.fault_kinds_page(), "| kind | target |", None).splitlines()
    assert len(rows) == len(FAULT_KINDS)
    for kind, row in zip(FAULT_KINDS, rows):
        cells = [c.strip() for c in re.split(r"(?<!\\)\|", row)[1:-1]]
        assert cells[0] == f"`{kind}`"
        on_processes, in_the_simulator, what = cells[3], cells[4], cells[5]
        assert on_processes and on_processes != kind, f"{kind}: no mechanism on processes"
        assert in_the_simulator.startswith("simulated: "), f"{kind}: no mechanism in the simulator"
        assert what, f"{kind}: its class has no docstring"


@pytest.mark.parametrize("where", SOME_KINDS)
def test_a_partial_list_points_to_the_reference_and_names_only_kinds(where):
    text, kinds = SOME_KINDS[where]()
    assert REFERENCE in text, f"{where} does not point to {REFERENCE} for every kind"
    stale = sorted(w for w in _kind_words(kinds) if w not in FAULT_KINDS)
    assert not stale, f"{where} names {', '.join(stale)}, no registered fault kind"


def test_a_kind_missing_from_a_list_is_seen():
    text = EVERY_KIND["docs/SCENARIOS.md fault table"]()
    assert _names("kill_unit", text) and not _names("no_such_kind", text)
    assert not _names("corrupt", "`corrupt_checkpoint`")  # a kind inside another's name
    assert _kind_words("`kill_unit`, `no_such_kind` (faults/kinds/kill_unit.py)") == {"kill_unit", "no_such_kind"}
