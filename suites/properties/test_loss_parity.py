"""Loss parity: for a bounded fault load (fault_load ≤ 0.25), the final held-out loss
of the global model is within 8% of the fault-free run's at the same token budget.

Judged on the base still learning at its end (the default inner lr: 60 steps end at
12× the floor), not near its floor (lr 0.1, 1.11×, harness/bench/sim.py CONVERGED_LR).
Near its floor the quadratic's final loss is set by the noise of the last merges, not
by what the faults cost: measured over 60 drawn schedules on the 60-step base at lr
0.1, a single pause of one learner ended +31 %; on the 300-step one, a learner killed at
10.7 s of 25 ended +27.5 % (restarted, it trains on alone at the end, and Θ carries one
learner's noise instead of the mean of three). Damage to the model is judged near the
floor by `global_loss_regression` (a shard restored from its oldest checkpoint: +0.52
nats, test_planted_bugs.py), and by the known-good baseline (test_baseline.py)."""
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
