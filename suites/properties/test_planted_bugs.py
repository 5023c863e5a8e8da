"""The properties can fail: run against the cores' planted bugs (docs/PROTOCOL.md,
"Planted bugs"), each is caught, by the check named here, on some schedule Hypothesis
finds; and the same schedule passes without the bug, so it is the bug that is caught.

| bug                  | caught by                                           | where                |
|----------------------|-----------------------------------------------------|----------------------|
| merge_twice          | safety: merged_at_most_once                         | dp (re-sent grads)   |
| stale_as_fresh       | safety: weights_match_staleness                     | decoupled, K = 2     |
| ignore_quorum        | safety: quorum_respected                            | decoupled, K = 2     |
| rejoin_without_fetch | recovery: contributions against a Θ[p] never fetched | decoupled, α = 0.5   |
| rejoin_out_of_phase  | zero downtime: no_global_downtime                   | streaming (K = M)    |
| count_discarded      | safety: tokens_conserved                            | decoupled, no keep_on_fetch |
| trust_payloads       | tokens_conserved (a corrupt Δ merged; no_nan too)   | decoupled, corrupt   |
| restore_oldest       | safety: durable_rounds_kept                         | decoupled, kill_syncer |

merge_twice needs a contribution delivered twice. Decoupled learners never send one
twice; data-parallel learners re-send their unanswered gradients whenever a link
(re)connects, which the shard must drop when it merged them already.
"""
from __future__ import annotations

import pytest
from hypothesis import Phase, find, given, settings
from hypothesis.stateful import run_state_machine_as_test

from faults.model import KillSyncer
from faults.strategies import KINDS, schedules
from harness import eventlog
from harness.bench.sim import CONVERGED_LR
from harness.judging import checks
from harness.judging.ledger import tokens_conserved
from harness.sim.run import replay_sim
from sim_cases import WINDOW, reported, scenario, simulate_case
from sim_props import recovery, safety, zero_downtime
from test_cluster_model import SimulatedCluster
from test_recovery import RESTARTS

def conserved(case) -> None:
    """The token-fate ledger alone (safety() stops at no_nan first when a corrupt Δ blew up the model)."""
    case.check(tokens_conserved(case.log))


BUGS = {  # bug -> (property, [train] settings, fault kinds, what the failure names)
    "merge_twice": (safety, {"mode": "dp"}, ("partition", "reset"), "merged_at_most_once"),
    "stale_as_fresh": (safety, {"quorum": 2}, KINDS, "weights_match_staleness"),
    "ignore_quorum": (safety, {"quorum": 2}, KINDS, "quorum_respected"),
    "rejoin_without_fetch": (recovery, {"mixing": 0.5}, RESTARTS, "never fetched"),
    "rejoin_out_of_phase": (zero_downtime, {"mode": "streaming"}, ("kill_unit",), "no_global_downtime"),
    "count_discarded": (safety, {"keep_on_fetch": False}, ("partition", "reset"), "tokens_conserved"),
    "trust_payloads": (conserved, {}, ("corrupt",), "tokens_conserved"),
    "restore_oldest": (safety, {}, ("kill_syncer",), "durable_rounds_kept"),
}


def failure(prop, case) -> str | None:
    try:
        prop(case)
    except AssertionError as e:
        return str(e)
    return None


@pytest.mark.parametrize("bug", sorted(BUGS))
def test_a_planted_bug_is_caught(bug):
    prop, train, kinds, named = BUGS[bug]
    found = find(schedules(WINDOW, kinds, max_faults=3),
                 lambda sch: failure(prop, simulate_case(scenario(sch, **train), bugs={bug})) is not None,
                 settings=settings(max_examples=40, database=None, derandomize=True, phases=[Phase.generate]))
    message = failure(prop, simulate_case(scenario(found, **train), bugs={bug}))
    assert named in message
    assert failure(prop, simulate_case(scenario(found, **train))) is None


def test_a_failing_property_reports_the_shrunk_schedule_and_how_to_replay_it(tmp_path):
    """The whole path a CI failure takes: Hypothesis finds a failing schedule, the message
    carries it as TOML with the commands, and the replay reproduces the run. (Shrinking is
    left out: it is Hypothesis's own, and costs a hundred simulations here.)"""

    @settings(max_examples=20, database=None, derandomize=True, phases=[Phase.generate])
    @given(schedules(WINDOW, ("kill_unit",), max_faults=2).filter(len))
    def prop(schedule):
        case = simulate_case(scenario(schedule), bugs={"stale_as_fresh"})
        with reported(case, "safety", out=tmp_path):
            safety(case)

    with pytest.raises(AssertionError) as err:
        prop()
    text = str(err.value)
    assert "weights_match_staleness" in text and '[[faults]]\n    kind = "kill_unit"' in text
    run_dir = tmp_path / text.split("diloco-chaos replay ")[1].split()[0].split("/")[-1]
    assert f"diloco-chaos run {run_dir / 'scenario.toml'} --tier sim" in text
    replayed = replay_sim(run_dir, tmp_path / "again")
    first, again = eventlog.read(run_dir), eventlog.read(replayed.run_dir)
    assert again.events == first.events and again.header["sim"]["bugs"] == ["stale_as_fresh"]


def test_the_state_machine_catches_a_planted_bug(tmp_path):
    class Buggy(SimulatedCluster):
        bugs, reports = frozenset({"stale_as_fresh"}), tmp_path

    with pytest.raises(AssertionError, match="weights_match_staleness"):
        run_state_machine_as_test(Buggy, settings=settings(max_examples=10, stateful_step_count=6, database=None,
                                                           derandomize=True, phases=[Phase.generate]))


def test_a_shard_restored_from_its_oldest_checkpoint_is_seen_by_the_model_checks():
    """restore_oldest on the base near its floor (the inner lr 0.1: 1.11× fault-free), syncer-0
    killed 4-5 s: its versions go back (durable_rounds_kept), and the model with them: the
    final global loss rises 0.52 nats over its best (global_loss_regression, bound 0.25).
    The same schedule passes both without the bug. (On the base still learning at its end,
    12× the floor, the rise was 0.03 nats.)"""
    crash = (KillSyncer(target="syncer-0", at_s=4.0, down_for_s=1.0),)
    near_floor = scenario(crash, lr=CONVERGED_LR)
    bug, good = simulate_case(near_floor, bugs={"restore_oldest"}), simulate_case(near_floor)
    for check in (checks.durable_rounds_kept, checks.global_loss_regression):
        assert check(bug.log).valid is False, check(bug.log)
        assert check(good.log).valid is True, check(good.log)

