"""UNKNOWN is not a pass. A check a scenario or a test asks for that the run could not
judge (here: a recovery bound in a run whose only fault is a slow link, so no unit ever
restarts) fails the verdict, on the command line (exit 1), in the `chaos` fixture
(`assert_held`) and in the property suites (`Case.check`), unless the caller opts out by
name. And parity is judged wherever [expect] asks for it: `chaos.run` makes the
fault-free reference itself; `--reference none` says it leaves parity out."""
from __future__ import annotations

import sys
from pathlib import Path

import pytest

from diloco_chaos.cli import main
from diloco_chaos.pytest_plugin import Chaos
from diloco_chaos.harness.judging.check_base import Result

SCENARIO = """
name = "no-restart"
seed = 3
[cluster]
learners = 3
[train]
task = "quadratic"
steps = 40
duration = "20s"
[[faults]]
kind = "wan"
target = "link:learner-1"
at = "1s"
duration = "1.5s"
latency_ms = 50
[expect]
recovery_max = "5s"       # no unit restarts: the run cannot judge this
loss_parity_max = 0.5
"""


@pytest.fixture(scope="module")
def scenario(tmp_path_factory) -> Path:
    path = tmp_path_factory.mktemp("scenario") / "no-restart.toml"
    path.write_text(SCENARIO)
    return path


def test_the_cli_exits_1_on_unknown_unless_told_which_to_accept(scenario, tmp_path, capsys):
    argv = ["run", str(scenario), "--tier", "sim", "--out", str(tmp_path), "--no-live"]
    assert main(argv) == 1
    out = capsys.readouterr().out
    assert "UNKNOWN is not a pass" in out and "recovery_max_s" in out, out
    assert "reference (fault-free) run" in out  # parity was asked for: the reference is made
    assert main(argv + ["--allow-unknown", "recovery_max_s"]) == 0
    assert "accepted by --allow-unknown" in capsys.readouterr().out
    assert main(argv + ["--allow-unknown", "loss_parity_max"]) == 1  # only the checks named
    # --reference none: parity is left out of the verdict, and the run says so
    assert main(argv + ["--reference", "none", "--allow-unknown", "recovery_max_s"]) == 0
    assert "loss_parity_max not judged (--reference none)" in capsys.readouterr().out


def test_the_fixture_fails_on_unknown_and_judges_parity(scenario, tmp_path):
    chaos = Chaos(tmp_path)
    result = chaos.run(scenario, tier="sim")
    by = {c["name"]: c for c in result.summary["checks"]}
    assert by["recovery_max_s"]["valid"] is None
    assert by["loss_parity_max"]["valid"] is True  # chaos.run made the fault-free reference
    with pytest.raises(pytest.fail.Exception, match="UNKNOWN is not a pass: recovery_max_s"):
        chaos.assert_held(result)
    chaos.assert_held(result, allow_unknown=("recovery_max_s",))
    with pytest.raises(pytest.fail.Exception):
        chaos.assert_held(result, allow_unknown=("global_loss_regression",))


def test_a_property_check_fails_on_unknown():
    sys.path.insert(0, str(Path(__file__).parents[1] / "properties"))
    from sim_cases import Case

    case = Case.__new__(Case)
    with pytest.raises(AssertionError, match="UNKNOWN"):
        case.check(Result("global_loss_regression", None, None, 0.25, {"why": "1 global eval point(s)"}))
    case.check(Result("global_loss_regression", None), unknown_ok=True)
    case.check(Result("global_loss_regression", True, 0.0, 0.25))


def test_a_recorded_baseline_is_judged_on_the_next_run(scenario, tmp_path, capsys, monkeypatch):
    """`--record-baseline` stores the fault-free reference's final loss for this config and
    tier; the next run is judged against it (baseline_parity_max), on purpose only."""
    import json

    from diloco_chaos.harness.judging import baseline

    monkeypatch.setattr(baseline, "STORE", tmp_path / "baselines.json")
    argv = ["run", str(scenario), "--tier", "sim", "--out", str(tmp_path / "runs"), "--no-live",
            "--allow-unknown", "recovery_max_s"]
    assert main(argv + ["--record-baseline"]) == 0
    assert "baseline recorded: no-restart@sim:" in capsys.readouterr().out
    assert main(argv) == 0
    out = capsys.readouterr().out
    summary = json.loads(sorted((tmp_path / "runs").glob("no-restart*/summary.json"))[-1].read_text())
    (b,) = [c for c in summary["checks"] if c["name"] == "baseline_parity_max"]
    assert b["valid"] is True and b["details"]["baseline"] == json.loads(baseline.STORE.read_text()).popitem()[1]["final_loss"], out
