"""restores_faithful (harness/judging/restores.py) in the simulator: on the property base
with outer momentum (Nesterov 0.5, outer lr 0.7: with the default momentum 0 the shard has
no outer state to restore), syncer-0 killed at 4 s and learner-1 at 14 s (after its step-100
save), each for 1 s, so both hosts' restore paths run. Without a bug every restore loads
what the save it names wrote; with a planted slip in the shard host's restore it does not,
and the check names the part that differs."""
from __future__ import annotations

import pytest

from diloco_chaos.faults.kinds import KillSyncer, KillUnit
from diloco_chaos.harness.judging import checks
from diloco_chaos.harness.judging.restores import restores_faithful
from sim_cases import scenario, simulate_case

CRASHES = (KillSyncer(target="syncer-0", at_s=4.0, down_for_s=1.0),
           KillUnit(target="learner-1", at_s=14.0, down_for_s=1.0))
TRAIN = {"steps": 300, "outer_momentum": 0.5, "outer_lr": 0.7}  # a learner reaches its step-50 saves


def _case(bugs=()):
    return simulate_case(scenario(CRASHES, **TRAIN), bugs=set(bugs))


def test_restores_without_a_bug_load_what_was_saved():
    case = _case()
    restored = {e["src"]: e["step"] for e in case.log.of("checkpoint_restored")}
    assert restored == {"syncer-0": 7, "learner-1": 100}  # measured: save 7 of the shard, step 100
    r = restores_faithful(case.log)
    assert (r.valid, r.value, r.details["checked"], r.details["restores"]) == (True, 0, 2, 2), r.details
    assert all(c.valid is not False for c in checks.safety_checks(case.log, case.metrics))


@pytest.mark.parametrize("bug, differs", [
    # Θ and versions from the latest save, the momentum from the oldest: only this check sees it
    pytest.param("restore_stale_outer", ["outer[0]", "outer[2]"], id="restore_stale_outer"),
    # the oldest save whole, named the latest (durable_rounds_kept sees its versions too)
    pytest.param("restore_oldest", ["outer[0]", "outer[2]", "theta[0]", "theta[2]", "versions"], id="restore_oldest"),
])
def test_a_shard_host_that_restores_another_save_is_caught(bug, differs):
    case = _case({bug})
    r = restores_faithful(case.log)
    assert (r.valid, r.value) == (False, 1), r.details
    v = r.details["violations"][0]
    assert (v["unit"], v["restored"], v["differs"]) == ("syncer-0", 7, differs)
    if bug == "restore_stale_outer":  # no other check of the verdict fails (the loss: 0.07278 either way)
        failed = [c.name for c in checks.safety_checks(case.log, case.metrics) if c.valid is False]
        assert set(failed) <= {"restores_faithful"}, failed
