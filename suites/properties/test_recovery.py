"""Recovery: a restarted learner unit contributes again within a bound, and rejoins on
the global model. Mixing α = 0.5 here, so that a rejoin that mixed instead of
overwriting (the rejoin rule broken) would leave θ[p] ≠ Θ[p] and show."""
from __future__ import annotations

from hypothesis import given

from diloco_chaos.faults.strategies import schedules
from sim_cases import WINDOW, examples, reported, scenario, simulate_case
from sim_props import recovery

RESTARTS = ("kill_unit", "kill_syncer", "partition", "reset", "wan", "kill_slice")


@examples(40)
@given(schedules(WINDOW, RESTARTS, max_faults=4))
def test_restarted_units_rejoin_on_the_global_model_and_contribute_again(schedule):
    case = simulate_case(scenario(schedule, mixing=0.5))
    with reported(case, "recovery"):
        recovery(case)


@examples(20)
@given(schedules(WINDOW, RESTARTS, max_faults=4))
def test_with_compressed_broadcasts_too(schedule):
    """int4 deltas with error feedback coming back (FragmentDelta): a restarted learner,
    or one whose link dropped, must still fetch the whole Θ[p] and build on it."""
    case = simulate_case(scenario(schedule, mixing=0.5, broadcast_compression="int4"))
    with reported(case, "recovery"):
        recovery(case)
        assert any(e.get("msg") == "FragmentDelta" for e in case.log.of("recv")), "no delta was received"
