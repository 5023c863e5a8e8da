"""The planted-bug catalogue (harness/judging/planted.py, `diloco-chaos planted`) is
complete and true: every bug the cores know is in it, and every test it names exists
and runs that bug."""
from __future__ import annotations

import re
from pathlib import Path

from diloco_chaos.cli import main
from harness.judging.planted import CATALOGUE, rows
from trainer.protocol_base import BUGS

ROOT = Path(__file__).parents[2]


def test_every_planted_bug_is_in_the_catalogue():
    assert set(CATALOGUE) == set(BUGS)


def test_every_test_it_names_exists_and_plants_that_bug():
    for bug, p in CATALOGUE.items():
        for nodeid in filter(None, (p.sim, p.processes)):
            path, _, name = nodeid.partition("::")
            func, _, param = name.partition("[")
            text = (ROOT / path).read_text()
            assert re.search(rf"^def {re.escape(func)}\(", text, re.M), nodeid
            planted = param.rstrip("]").split(",") if param else [bug]
            assert bug in planted, nodeid  # the test's own case plants it
            assert f'"{param.rstrip("]") or bug}"' in text, (bug, nodeid)  # ... by that name, in that file


def test_the_command_prints_it(capsys):
    assert main(["planted"]) == 0
    out = capsys.readouterr().out
    assert all(bug in out for bug in BUGS)
    assert f"{len(BUGS)} planted bugs" in out and len(rows()) == len(BUGS)
