"""Safety under any schedule: each contribution merged at most once, fragment versions
never go back, no NaN, no durable round lost across a syncer restart, staleness
bounded, no round committed under quorum, merges weighted by their true staleness.
Decoupled with K = 2 (so that the quorum is something to respect), and data-parallel
(whose gradients are re-sent after a reconnect: at-most-once has work to do)."""
from __future__ import annotations

import dataclasses

from hypothesis import assume, example, given

from diloco_chaos.faults.kinds import Corrupt, KillSyncer, Partition, PauseUnit, Reset, SlowUnit, Wan
from diloco_chaos.faults.kinds.corrupt_checkpoint import CorruptCheckpoint
from diloco_chaos.faults.schedule import Schedule
from diloco_chaos.faults.strategies import failure_processes, near_bound_sdc, schedules, weak_spots
from diloco_chaos.harness.judging import checks
from diloco_chaos.harness.judging.ledger import tokens_conserved
from sim_cases import WINDOW, examples, reported, scenario, simulate_case
from sim_props import safety, staleness_bound


# Found by a CI draw: a shard restored save 6 after a kill, and a later corrupt_checkpoint
# damaged that same save; restore_latest_intact took the later damage for one at the first
# restart (the judge now counts only damage done before each listing).
RESTORED_THEN_DAMAGED = Schedule((KillSyncer("syncer-0", 3.4, down_for_s=1.1),
                                  CorruptCheckpoint("syncer-0", 6.2, down_for_s=0.5, damage="flip")))

# Found by CI draws: one save damaged twice (its shard killed twice before a new save landed);
# durable_rounds_kept took the second damage's time as the first's and owed the save at the
# restart between them (the judge now keeps the first damage's time).
DAMAGED_TWICE_INT4 = Schedule((CorruptCheckpoint("syncer-0", 0.7, down_for_s=3.8, damage="flip"),
                               SlowUnit("learner-0", 1.7, duration_s=3.0, speed=0.95),
                               CorruptCheckpoint("syncer-0", 5.8, down_for_s=0.5, damage="flip"),
                               PauseUnit("learner-0", 6.4, duration_s=0.5)))
DAMAGED_TWICE_SPARSE = Schedule((CorruptCheckpoint("syncer-1", 2.2, down_for_s=0.5, damage="flip"),
                                 SlowUnit("learner-0", 3.2, duration_s=4.1, speed=0.35),
                                 Partition("link:*", 4.6, duration_s=0.5, direction="upstream"),
                                 CorruptCheckpoint("syncer-1", 5.7, down_for_s=0.5, damage="flip")))


@examples(40)
@given(schedules(WINDOW, max_faults=5))
@example(RESTORED_THEN_DAMAGED)
def test_decoupled_is_safe_under_any_schedule(schedule):
    case = simulate_case(scenario(schedule, quorum=2))
    with reported(case, "safety"):
        safety(case)


# kept from a CI draw that failed (shrunk by Hypothesis): a reset's reconnect answered while
# the paused learner's Δ was on the wire, its closing Δ from the same base legitimately
# next; delta_bases_advance called it a re-sent drift until it counted re-anchoring takes
CROSSED_FETCH = Schedule((PauseUnit("learner-2", 3.3, duration_s=4.0), Reset("link:*", 4.7, duration_s=0.5),
                          Wan("link:*", 6.4, duration_s=0.5, bandwidth_kbps=250000.0)))


@examples(20)
@given(schedules(WINDOW, max_faults=5))
@example(CROSSED_FETCH)
@example(DAMAGED_TWICE_INT4)
def test_decoupled_with_compressed_broadcasts_is_safe_under_any_schedule(schedule):
    case = simulate_case(scenario(schedule, quorum=2, broadcast_compression="int4"))
    with reported(case, "safety"):
        safety(case)


@examples(20)
@given(schedules(WINDOW, max_faults=5))
@example(DAMAGED_TWICE_SPARSE)
def test_decoupled_with_sparse_pseudo_gradients_is_safe_under_any_schedule(schedule):
    """Sparse Δs both ways (the `sparse` preset's codec): the learner's error feedback is its
    kept progress and the shard's is its copies, so kills, cuts and shard crashes meet it
    where it lives (docs/PROTOCOL.md "Sparse pseudo-gradients")."""
    case = simulate_case(scenario(schedule, quorum=2, compression="sparse", broadcast_compression="sparse"))
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
@given(weak_spots(WINDOW))
def test_decoupled_is_safe_at_the_weak_spots(schedule):
    """Schedules built around a storm on every link (latency, bandwidth, partition), a long
    one-way cut with a kill or a shard crash inside it, or a long shard outage, where the
    uniform draws above rarely go (suites/unit/test_fault_space.py counts how often a CI
    run meets each)."""
    case = simulate_case(scenario(schedule, quorum=2))
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


REWARMUP_S = 2.0  # a learner restarted from no checkpoint (or an early one) warms its inner lr up again


def _rewarming(schedule) -> bool:
    """A corruption that reaches a learner's first REWARMUP_S after its restart."""
    return any(c.kind == "corrupt" and k.kind == "kill_unit" and k.target == c.target and k.end_s is not None
               and c.at_s < k.end_s + REWARMUP_S and c.end_s > k.end_s for c in schedule.faults for k in schedule.faults)


@examples(60)
@given(schedules(WINDOW, ("corrupt", "kill_unit", "partition", "slow_unit"), max_faults=4, min_at_s=3.0))
def test_the_guard_keeps_every_corrupt_contribution_out(schedule):
    """Silent data corruption (scale, bit flips, non-finite values) on any learner, with kills
    and partitions: the shards drop every corrupt Δ (tokens_conserved names any that got in),
    and the model never sees a NaN. From 3 s: the learners start at 2 s, and a shard's first
    GUARD_WARMUP contributions are judged by the Θ[p] bound alone, which a 1000× Δ of the
    inner lr's first warm-up steps passes (found here, corrupting from 0.5 s; docs/PROTOCOL.md).
    The same gap after a restart: a learner restarted with no checkpoint yet warms its
    inner lr up from 0 again, and a ×1000 of its first Δs is a size an honest Δ has (found
    here: killed at 5.1 s for 0.5 s, corrupted from 6.3 s, its first Δ merged): such
    schedules are rejected (`assume`), the gap is in docs/PROTOCOL.md."""
    assume(not _rewarming(schedule))
    case = simulate_case(scenario(schedule, quorum=1))
    with reported(case, "safety"):
        safety(case)


@examples(20)
@given(near_bound_sdc(WINDOW))
def test_sdc_near_the_guards_bound_is_judged_by_its_rule(schedule):
    """SDC of x10 to x100, either sign, over several Δs of one learner, with kills, shard
    crashes or partitions beside it: the sizes the Θ-size bound does not stop, where the
    guard's history decides (x100 is 3x past its 30x bound; x10 inside it: let in by design).
    Every guard decision is the judge's own (`guard_decisions`: each accepted Δ within the
    bound of the history of accepted sizes, each dropped one over it), nothing non-finite,
    every other safety check holds; tokens_conserved may name only corrupt merges, the
    Δs the rule could not tell (it names them: the verdict of such a run does not pass),
    and only a run with such a merge may miss global_loss_regression (a x10 Δ merged: the
    global loss rose 0.27, found here; the damage the verdict then sees twice)."""
    assume(not _rewarming(schedule))
    case = simulate_case(scenario(schedule, quorum=1))
    with reported(case, "safety"):
        results = {r.name: r for r in checks.safety_checks(case.log, max_staleness=staleness_bound(case))}
        ledger = results.pop("tokens_conserved")
        let_in = [v for v in ledger.details.get("violations", ()) if v.get("kind") == "corrupt_merged"]
        other = [v for v in ledger.details.get("violations", ()) if v.get("kind") != "corrupt_merged"]
        assert not other, f"tokens_conserved: {other[:3]}"
        for name, r in results.items():
            if name != "no_global_downtime" and not (let_in and name == "global_loss_regression"):
                case.check(r)
        case.check(checks.no_crash(case.log))


def test_sdc_inside_the_guards_bound_gets_in_and_the_ledger_names_it():
    """The defence's known gap, and the verdict that is not fooled by it: the shards' guard
    bounds a Δ's norm (30× the learner's recent ones), so a corruption that keeps the norm
    (a plain sign flip, ×−1) or stays inside the bound (×10) is merged; the token-fate
    ledger, which knows which Δs the harness corrupted, names each (tokens_conserved:
    9 corrupt merges each, measured), so the run does not pass. docs/PROTOCOL.md "Corrupt
    contributions". ×1000, either sign, is kept out (the property above); ×100 is kept out
    here but got in on one CI draw (learner-0, 6.2 s, 0.5 s long, a slow_unit after it)."""
    for factor in (10.0, -1.0):
        case = simulate_case(scenario([Corrupt("learner-1", 3.0, duration_s=2.0, factor=factor)], quorum=1))
        r = tokens_conserved(case.log)
        kinds = {v["kind"] for v in r.details.get("violations", ())}
        assert r.valid is False and "corrupt_merged" in kinds, (factor, r.to_dict())
