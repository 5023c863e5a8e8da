"""The planted-bug catalogue (harness/judging/planted.py, `diloco-chaos planted`) is
complete and true: every bug the cores know is in it, and every test it names exists
and runs that bug."""
from __future__ import annotations

import re
from pathlib import Path

from diloco_chaos.cli import main
from diloco_chaos.harness.judging.planted import CATALOGUE, rows
from diloco_chaos.trainer.protocol.protocol_base import BUGS

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


def test_every_check_is_proven_on_both_tiers_by_a_test_that_plants_its_bug():
    """Every check a run's verdict can hold (the safety checks, staleness_bounded, every
    [expect] key, no_crash, the baseline's) and the property suites' own checks has a
    planted bug that fails it in the simulator and on processes, in a test that exists
    and plants that bug. global_loss_regression's second proof (restore_oldest) is
    simulator-only, said so; its first is on both tiers."""
    from diloco_chaos.harness.judging import checks
    from diloco_chaos.harness.judging.planted import PROOFS
    from log_builder import LogBuilder

    log = LogBuilder(crashes=[]).log()
    names = {r.name for r in checks.safety_checks(log, max_staleness=1)} | set(checks.EXPECT)
    names |= {"no_crash", "baseline_parity_max", "quorum_respected", "weights_match_staleness",
              "fetched_before_contributing"}
    assert names <= set(PROOFS), sorted(names - set(PROOFS))
    for check, proofs in PROOFS.items():
        first = proofs[0]
        assert "not yet" not in first.sim and "not yet" not in first.processes, (check, first)
        for p in proofs:
            for nodeid in (p.sim, p.processes):
                if nodeid.startswith("not yet"):
                    continue
                path, _, name = nodeid.partition("::")
                func, _, param = name.partition("[")
                text = (ROOT / path).read_text()
                assert re.search(rf"^def {re.escape(func)}\(", text, re.M), (check, nodeid)
                assert f'"{p.bug}"' in text or f"{p.bug}" in param or f'"{param.rstrip("]")}"' in text, (check, nodeid)
