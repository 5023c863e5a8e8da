"""Safety under any schedule: each contribution merged at most once, fragment versions
never go back, no NaN, no durable round lost across a syncer restart, staleness
bounded, no round committed under quorum, merges weighted by their true staleness.
Decoupled with K = 2 (so that the quorum is something to respect), and data-parallel
(whose gradients are re-sent after a reconnect: at-most-once has work to do)."""
from __future__ import annotations

import dataclasses

from hypothesis import given

from faults.strategies import failure_processes, schedules
from sim_cases import WINDOW, examples, reported, scenario, simulate_case
from sim_props import safety


@examples(40)
@given(schedules(WINDOW, max_faults=5))
def test_decoupled_is_safe_under_any_schedule(schedule):
    case = simulate_case(scenario(schedule, quorum=2))
    with reported(case, "safety"):
        safety(case)


@examples(20)
@given(schedules(WINDOW, max_faults=5))
def test_decoupled_with_compressed_broadcasts_is_safe_under_any_schedule(schedule):
    case = simulate_case(scenario(schedule, quorum=2, broadcast_compression="int4"))
    with reported(case, "safety"):
        safety(case)


@examples(20)
@given(schedules(WINDOW, max_faults=5))
def test_decoupled_with_aligned_rounds_is_safe_under_any_schedule(schedule):
    """The paper preset's rounds: RoundOpens, joins that replace turns, rounds scaled by the
    learners merged, each commit answered only to them (docs/PROTOCOL.md "Aligned rounds")."""
    case = simulate_case(scenario(schedule, quorum=2, align=True, share_by="merged", downlink="answer",
                                  broadcast_compression="int4"))
    with reported(case, "safety"):
        safety(case)


@examples(20)
@given(schedules(WINDOW, ("partition", "reset", "truncate", "kill_syncer", "kill_unit"), max_faults=4))
def test_data_parallel_is_safe_under_link_and_process_faults(schedule):
    case = simulate_case(scenario(schedule, mode="dp"))
    with reported(case, "safety"):
        safety(case)


@examples(20)
@given(failure_processes(WINDOW, min_mtbi_s=8.0, max_mtbi_s=128.0))
def test_decoupled_is_safe_under_a_random_failure_process(process):
    """Faults drawn from a rate (per chip) and a cause mix, as the `chaos` built-in does, over
    the window (the scenario's duration is the window: the process draws up to it)."""
    s = scenario(quorum=2, duration_s=WINDOW.run_s)
    case = simulate_case(dataclasses.replace(s, failure_process=process))
    with reported(case, "safety"):
        safety(case)


@examples(20)
@given(schedules(WINDOW, ("corrupt", "kill_unit", "partition", "slow_unit"), max_faults=4, min_at_s=3.0))
def test_the_guard_keeps_every_corrupt_contribution_out(schedule):
    """Silent data corruption (scale, bit flips, non-finite values) on any learner, with kills
    and partitions: the shards drop every corrupt Δ (tokens_conserved names any that got in),
    and the model never sees a NaN. From 3 s: the learners start at 2 s, and a shard's first
    GUARD_WARMUP contributions are judged by the Θ[p] bound alone, which a 1000× Δ of the
    inner lr's first warm-up steps passes (found here, corrupting from 0.5 s; docs/PROTOCOL.md)."""
    case = simulate_case(scenario(schedule, quorum=1))
    with reported(case, "safety"):
        safety(case)
