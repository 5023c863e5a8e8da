"""Loss parity: for a bounded fault load (fault_load ≤ 0.25), the final held-out loss
of the global model is within 8% of the fault-free run's at the same token budget."""
from __future__ import annotations

from hypothesis import given

from faults.strategies import schedules
from sim_cases import WINDOW, examples, reported, scenario, simulate_case
from sim_props import PARITY_LOAD, loss_parity


@examples(40)
@given(schedules(WINDOW, max_faults=4, max_load=PARITY_LOAD))
def test_final_loss_stays_near_the_fault_free_run(schedule):
    case = simulate_case(scenario(schedule))
    with reported(case, "loss_parity"):
        loss_parity(case)
