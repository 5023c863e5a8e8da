"""Zero global downtime: while at least K learner units are alive and reachable (and
a syncer shard is up), outer rounds keep committing, with no gap over 2 s (a fragment
cycle is 0.6 s here). Judged by harness/judging/checks.py `no_global_downtime`, which works
out from the log when a quorum was reachable."""
from __future__ import annotations

from hypothesis import given

from faults.strategies import KINDS, schedules
from sim_cases import WINDOW, examples, reported, scenario, simulate_case
from sim_props import zero_downtime


@examples(40)
@given(schedules(WINDOW, max_faults=4))
def test_rounds_keep_committing_while_one_learner_is_reachable(schedule):
    case = simulate_case(scenario(schedule))
    with reported(case, "zero_downtime"):
        zero_downtime(case)


# Streaming DiLoCo (K = M): every round needs every unit, so a restarted unit must come
# back in phase with the others' fragment schedule (trainer/learner_core.py, `phase`);
# out of phase it waits on a round they have not reached while they wait on one it has
# not: before the fix a single kill_unit stalled every round to the end of the run.
@examples(20)
@given(schedules(WINDOW, ["kill_unit", "pause_unit", "partition"], max_faults=3))
def test_streaming_rounds_keep_committing_after_a_unit_restarts(schedule):
    case = simulate_case(scenario(schedule, mode="streaming"))
    with reported(case, "zero_downtime"):
        zero_downtime(case)


# With K = 2 a slowed unit is still "reachable" but may take longer than the bound per
# step: the check counts units, not their speed, so slow_unit is left out here.
@examples(20)
@given(schedules(WINDOW, [k for k in KINDS if k != "slow_unit"], max_faults=4))
def test_rounds_keep_committing_while_a_quorum_of_two_is_reachable(schedule):
    case = simulate_case(scenario(schedule, quorum=2))
    with reported(case, "zero_downtime"):
        zero_downtime(case)
