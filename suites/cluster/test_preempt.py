"""`preempt` (faults/kinds/preempt.py), the fault kind added as one module: a learner unit
evicted with notice (SIGTERM) closes, sending the progress no Δ holds yet, leaves, and is
replaced after `down_for`. On both tiers, from the event log: the harness's unit_down says
`preempted`, the unit's own `closing` and `done` (finished: false) come after it and before
its replacement's unit_up, and the token-fate ledger finds none of its tokens lost — where
the same schedule with kill_unit loses the progress of its last turn (the simulator, by
hand: 32 tokens, `dead_learner`). Every safety check holds."""
from __future__ import annotations

import dataclasses

import pytest

from diloco_chaos.faults.kinds import KillUnit
from diloco_chaos.faults.kinds.preempt import Preempt
from diloco_chaos.harness import eventlog
from diloco_chaos.harness.backends.runner import run_scenario
from diloco_chaos.harness.judging import checks, metrics
from diloco_chaos.harness.judging.ledger import tokens_conserved
from diloco_chaos.harness.scenarios.scenario import scenario_from_dict
from diloco_chaos.harness.sim.run import simulate

PREEMPTED = {  # two learners, so that the one preempted is half the fleet
    "name": "preempt", "seed": 2,
    "cluster": {"learners": 2, "slices": 1},
    "train": {"task": "markov", "steps": 400, "duration": "40s"},
    "faults": [{"kind": "preempt", "target": "learner-1", "at": "2s", "down_for": "1s"}],
}
# the simulator's twin on the quadratic task (400 Markov steps cost it ~25 s a run; real
# processes step the quadratic ~650 times a second, so its run is over before the fault)
SIM_PREEMPTED = {**PREEMPTED, "train": {"task": "quadratic", "steps": 400, "duration": "40s"},
                 "faults": [{"kind": "preempt", "target": "learner-1", "at": "1s", "down_for": "1s"}]}


def heeded_its_notice(log) -> dict:
    """What the log says of learner-1's preemption; fails on what a correct run cannot do."""
    t = lambda kind, **match: [e["t"] for e in log.events if e["kind"] == kind  # noqa: E731
                               and all(e.get(k) == v for k, v in match.items())]
    (down,) = t("unit_down", src="learner-1", reason="preempted")
    (back,) = t("unit_up", src="learner-1", reason="restarted")
    closing = [x for x in t("closing", src="learner-1") if down - 0.5 <= x <= back]
    done = [e for e in log.of("done", src="learner-1") if down <= e["t"] <= back]
    assert closing, "learner-1 did not close on its notice"
    assert done and done[0]["finished"] is False, done
    m = metrics.compute(log)
    for r in checks.safety_checks(log, m):
        assert r.valid is not False, r
    assert tokens_conserved(log).valid is True
    return m.ledger["learners"]["learner-1"]


def test_a_preempted_learner_keeps_its_progress_in_the_simulator():
    s = scenario_from_dict(SIM_PREEMPTED)
    fate = heeded_its_notice(simulate(s).log())
    assert fate["lost"] == 0.0, fate
    killed = dataclasses.replace(s, faults=(KillUnit("learner-1", 1.0, down_for_s=1.0),))
    lost = metrics.compute(simulate(killed).log()).ledger["learners"]["learner-1"]["lost"]
    assert lost > 0, "the same schedule with kill_unit should lose its last turn's progress"
    assert isinstance(s.faults[0], Preempt)


@pytest.mark.cluster
@pytest.mark.slow
def test_a_preempted_learner_keeps_its_progress_on_real_processes(tmp_path):
    result = run_scenario(scenario_from_dict(PREEMPTED), tmp_path, live=False)
    log = eventlog.read(result.run_dir)
    fate = heeded_its_notice(log)
    assert fate["lost"] == 0.0, (fate, str(result.run_dir))
    assert any(e["kind"] == "fault_start" and e["via"].startswith("SIGTERM") for e in log.events)
