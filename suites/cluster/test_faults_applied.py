"""A chaos run without its chaos does not pass: a run that spends its token budget before a
scheduled fault is due is UNKNOWN on `faults_applied` (not a pass: `held` is False and the CLI
exits 1), and the check names the faults that never started. Both tiers, one scenario: the
property base (quadratic) with one fault at 1 s and one at 25 s, which the run never reaches:
its own 60 steps in the simulator (6.9 s of virtual time), 1,000 on processes (at 60 the
processes ended 0.23 s after time zero, before even the first fault: the case this check is
for)."""
from __future__ import annotations

import dataclasses

import pytest

from diloco_chaos.faults.kinds import KillUnit
from diloco_chaos.harness.backends import runner
from diloco_chaos.harness.bench.sim import PROPERTY_BASE
from diloco_chaos.harness.judging.judge import held
from diloco_chaos.harness.scenarios.scenario import scenario_from_dict
from diloco_chaos.harness.sim.run import run_sim

LATE = KillUnit(target="learner-2", at_s=25.0, down_for_s=1.0)
SIM_SCENARIO = dataclasses.replace(scenario_from_dict(PROPERTY_BASE),
                                   faults=(KillUnit(target="learner-1", at_s=1.0, down_for_s=0.5), LATE))
SCENARIO = dataclasses.replace(SIM_SCENARIO, train=dataclasses.replace(SIM_SCENARIO.train, steps=1000))


def _judged(summary: dict) -> dict:
    check = next(c for c in summary["checks"] if c["name"] == "faults_applied")
    assert check["details"]["run_s"] < LATE.at_s, check
    assert check["valid"] is None and (check["value"], check["bound"]) == (1, 2), check
    assert check["details"]["not_applied"] == [LATE.to_dict()], check
    assert not held(summary)
    # and it is the one opted out of that flips it (a short run may leave others UNKNOWN too)
    others = [c["name"] for c in summary["checks"] if c["valid"] is None and c["name"] != "faults_applied"]
    assert held(summary, allow_unknown=("faults_applied", *others))
    return check


def test_a_run_that_ends_before_a_fault_is_unknown_in_the_simulator(tmp_path):
    _judged(run_sim(SIM_SCENARIO, tmp_path).summary)


@pytest.mark.cluster
def test_a_run_that_ends_before_a_fault_is_unknown_on_real_processes(tmp_path):
    _judged(runner.run_scenario(SCENARIO, tmp_path, live=False).summary)
