"""restores_faithful (harness/judging/restores.py) on real processes: orbax checkpoints,
SIGKILLed units, the digests each process writes when a save starts and after its restore.

syncer-crash, shortened: syncer-0 killed at 6 s for 2 s, learner-1 at 9 s for 2 s (after
its step-50 save), with outer momentum (Nesterov 0.5, outer lr 0.7: with momentum 0 the
shard has no outer state to restore), every process run with `restore_stale_outer`: the
shard host restores Θ and the versions from its latest checkpoint and the momentum from
its oldest kept one. The check fails on the shard's restore, naming only its outer state;
`durable_rounds_kept` (versions) passes it. The learner's restore in the same run is the
correct code's (the bug is the shard host's) and is judged faithful: the digests of what
orbax gave back equal those of what the learner saved. (The no-bug shard case: the
simulator's suites/properties/test_restore_audit.py.)

Nightly (`make nightly`): restores_faithful failing on processes is in CI through
`restore_mixed` (suites/cluster/test_planted_bugs_cluster.py), and every process run's
verdict judges its learners' restores; this run adds the outer state (~34 s).
"""
from __future__ import annotations

import dataclasses

import pytest

from diloco_chaos.faults.kinds import KillUnit
from diloco_chaos.harness import eventlog
from diloco_chaos.harness.backends import runner
from diloco_chaos.harness.judging.restores import restores_faithful
from diloco_chaos.harness.scenarios.scenario import load_scenario
from diloco_chaos.trainer.units.shell import BUGS_ENV

pytestmark = [pytest.mark.cluster, pytest.mark.slow, pytest.mark.nightly]


def _scenario():
    s = load_scenario("syncer-crash")
    crash = dataclasses.replace(s.faults[0], at_s=6.0, down_for_s=2.0)
    kill = KillUnit(target="learner-1", at_s=9.0, down_for_s=2.0)
    return dataclasses.replace(s, faults=(crash, kill), train=dataclasses.replace(
        s.train, steps=160, duration_s=20.0, outer_momentum=0.5, outer_lr=0.7))


def test_a_shard_that_restores_a_stale_momentum_is_seen_on_real_processes(tmp_path, monkeypatch):
    monkeypatch.setenv(BUGS_ENV, "restore_stale_outer")
    result = runner.run_scenario(_scenario(), tmp_path, live=False)
    log = eventlog.read(result.run_dir)
    restored = {e["src"]: e["step"] for e in log.of("checkpoint_restored")}
    assert "syncer-0" in restored, (restored, str(result.run_dir))
    r = restores_faithful(log)
    assert (r.valid, r.value) == (False, 1), (r.details, str(result.run_dir))
    v = r.details["violations"][0]
    assert v["unit"] == "syncer-0" and v["differs"] == ["outer[0]", "outer[2]"], v
    assert r.details["checked"] == len(restored)  # the learner's restore, if it had saved, checked and faithful
    by = {c["name"]: c for c in result.summary["checks"]}
    assert by["durable_rounds_kept"]["valid"] is True, by["durable_rounds_kept"]
