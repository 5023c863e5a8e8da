"""Goodput under faults (DESIGN.md "Metrics and checks"), over the simulator.

1. Decoupled DiLoCo's goodput stays above a bound that falls with the fault load:
   goodput ≥ fault-free goodput − fault_load − 0.05, where fault_load is the share of
   learner time the schedule takes away, each hit costing RECOVERY_S on top of its
   span (sim_props.py says why).
2. It is at least data-parallel's on the same schedule, less DP_SLACK: under a syncer
   crash both modes lose the outage (dp learners wait, decoupled learners' work on the
   dead shard's fragments is overwritten by the fetch at reconnect), so there the two
   come within a hair of each other; everywhere else decoupled is well ahead.
"""
from __future__ import annotations

from hypothesis import given

from faults.strategies import schedules
from sim_cases import WINDOW, examples, reported, scenario, simulate_case
from sim_props import decoupled_beats_dp, goodput_bound


@examples(30)
@given(schedules(WINDOW, max_faults=4))
def test_goodput_stays_above_the_fault_load_bound(schedule):
    case = simulate_case(scenario(schedule))
    with reported(case, "goodput_bound"):
        goodput_bound(case)


@examples(15)
@given(schedules(WINDOW, max_faults=3))
def test_decoupled_goodput_is_at_least_data_parallel(schedule):
    case, dp = simulate_case(scenario(schedule)), simulate_case(scenario(schedule, mode="dp"))
    with reported(case, "decoupled_beats_dp"):
        decoupled_beats_dp(case, dp)
