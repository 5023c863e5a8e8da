"""Goodput under faults (DESIGN.md "Metrics and checks"), over the simulator.

1. Decoupled DiLoCo's goodput stays above a bound that falls with the fault load:
   goodput ≥ fault-free goodput − fault_load − 0.05, where fault_load is the share of
   learner time the schedule takes away, each hit costing RECOVERY_S on top of its
   span (sim_props.py says why).
2. It is at least data-parallel's on the same schedule (less DP_SLACK), for every
   schedule without a job-wide outage, i.e. as long as every shard stays reachable from
   some learner. Under a job-wide outage (a shard down; every learner cut off, down or
   paused) both modes lose the outage, but decoupled learners step on through it: the
   fetch at reconnect throws that work away (and up to H steps before it), and it has
   spent their token budget, so the run ends sooner with the loss in it, while dp waits
   and trains the budget after. In a run this short (6.5 s) an outage of a few seconds
   makes dp's goodput the higher one (found by this suite: a 2.6 s reset of every link,
   decoupled 0.33 vs dp 0.48); over a long run the outage is a small share and dp's round
   trip on every step decides. So the filter: schedules with `outages(...) == 0`.
"""
from __future__ import annotations

from hypothesis import given

from diloco_chaos.faults.strategies import schedules
from sim_cases import WINDOW, examples, reported, scenario, simulate_case
from sim_props import decoupled_beats_dp, goodput_bound, outages


def test_every_kind_that_takes_a_shard_down_is_a_job_wide_outage():
    from diloco_chaos.faults.kinds import FAULT_KINDS

    downs = [cls for cls in FAULT_KINDS.values() if "syncer" in cls.roles and cls.downs_target]
    assert {c.kind for c in downs} >= {"kill_syncer", "corrupt_checkpoint"}
    for cls in downs:
        fault = cls(target="syncer-0", at_s=0.6, **{cls.length_field: 5.0})
        assert outages([fault], WINDOW) == 1, cls.kind


@examples(40)
@given(schedules(WINDOW, max_faults=4))
def test_goodput_stays_above_the_fault_load_bound(schedule):
    case = simulate_case(scenario(schedule))
    with reported(case, "goodput_bound"):
        goodput_bound(case)


@examples(25)
@given(schedules(WINDOW, max_faults=3).filter(lambda s: outages(s.faults, WINDOW) == 0))
def test_decoupled_goodput_is_at_least_data_parallel_without_a_job_wide_outage(schedule):
    case, dp = simulate_case(scenario(schedule)), simulate_case(scenario(schedule, mode="dp"))
    with reported(case, "decoupled_beats_dp"):
        decoupled_beats_dp(case, dp)
