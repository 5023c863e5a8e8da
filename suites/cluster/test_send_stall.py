"""`send_stall` (faults/kinds/send_stall.py), the fault kind added as one module and one
hook (trainer/protocol/unit_faults.py `before_send`): while it lasts, what a unit's core sends
waits inside the unit and leaves at the heal, in order. On both tiers, from the event log:
a learner's contributions decided during its stall (its `contribute` lines) leave after
the stall's fault_end, each once and in the order decided, as do the messages a stalled
shard's core sent (its commits' broadcasts); outside the stalls the same units send at
once; every safety check holds. The simulator's run without the hook shows the check
fails: the contributions then leave when they are decided."""
from __future__ import annotations

import pytest

from diloco_chaos.harness import eventlog
from diloco_chaos.harness.backends.runner import run_scenario
from diloco_chaos.harness.judging import checks, metrics
from diloco_chaos.harness.scenarios.scenario import scenario_from_dict
from diloco_chaos.harness.sim.run import simulate
from diloco_chaos.trainer.protocol import unit_faults

STALLED = {  # one learner's sends stalled, then one shard's (the other's commits go on meanwhile)
    "name": "send-stall", "seed": 3,
    "cluster": {"learners": 2, "slices": 1, "shards": 2},
    "train": {"task": "markov", "steps": 400, "duration": "40s"},
    "faults": [{"kind": "send_stall", "target": "learner-1", "at": "2s", "duration": "2s"},
               {"kind": "send_stall", "target": "syncer-0", "at": "6s", "duration": "2s"}],
}
SIM_STALLED = {**STALLED, "train": {"task": "quadratic", "steps": 400, "duration": "40s"}}
READ_S = 0.5  # a process reads its control file between two steps or every 50 ms: the stall's start is that late


def _window(log, target: str) -> tuple[float, float]:
    start = next(e for e in log.of("fault_start") if e["fault"]["target"] == target)
    end = next(e for e in log.of("fault_end") if e["id"] == start["id"])
    return start["t"], end["t"]


def held_until_the_heal(log) -> None:
    """What the log says of the two stalls; fails on what a correct run cannot do."""
    # the learner: each contribution decided in its stall leaves after the heal, once, in order
    t0, t1 = _window(log, "learner-1")
    decided = [(e["fragment"], e["seq"]) for e in log.of("contribute", src="learner-1") if t0 + READ_S <= e["t"] < t1]
    assert decided, "learner-1 decided no contribution during its stall"
    sends = [e for e in log.of("send", src="learner-1") if e["msg"] == "Contribution"]
    left = [(e["fragment"], e["seq"]) for e in sends if (e["fragment"], e["seq"]) in set(decided)]
    assert left == decided, "a held contribution left twice, never, or out of order"
    early = [e for e in sends if (e["fragment"], e["seq"]) in set(decided) and e["t"] < t1]
    assert not early, f"learner-1 sent {len(early)} held contributions before its stall ended at {t1}: {early[:2]}"
    assert not [e for e in log.of("send", src="learner-1") if t0 + READ_S <= e["t"] < t1]
    before = [e for e in log.of("send", src="learner-1") if t0 - 2.0 <= e["t"] < t0]
    assert before, "learner-1 sent nothing in the 2 s before its stall: the check above would see nothing"
    # the shard: nothing leaves it during its stall, though it goes on receiving; all of it after
    s0, s1 = _window(log, "syncer-0")
    assert not [e for e in log.of("send", src="syncer-0") if s0 + READ_S <= e["t"] < s1]
    assert [e for e in log.of("recv", src="syncer-0") if s0 + READ_S <= e["t"] < s1], "syncer-0 received nothing"
    assert [e for e in log.of("send", src="syncer-0") if s1 <= e["t"] < s1 + 1.0], "syncer-0 sent nothing at its heal"
    assert [e for e in log.of("send", src="syncer-0") if s0 - 2.0 <= e["t"] < s0], "syncer-0 sent nothing before"
    m = metrics.compute(log)
    for r in checks.safety_checks(log, m):
        assert r.valid is not False, r


def test_a_stalled_unit_sends_at_the_heal_in_the_simulator(monkeypatch):
    s = scenario_from_dict(SIM_STALLED)
    held_until_the_heal(simulate(s).log())
    monkeypatch.delitem(unit_faults.HOOKS["before_send"], "send_stall")  # the hook off: nothing held
    with pytest.raises(AssertionError, match="before its stall ended"):
        held_until_the_heal(simulate(s).log())


@pytest.mark.cluster
@pytest.mark.slow
def test_a_stalled_unit_sends_at_the_heal_on_real_processes(tmp_path):
    result = run_scenario(scenario_from_dict(STALLED), tmp_path, live=False)
    log = eventlog.read(result.run_dir)
    held_until_the_heal(log)
    assert any(e["kind"] == "fault_start" and "held in the unit" in e["via"] for e in log.events)
