"""Planted bugs on real processes: the oracles that catch them in the simulator catch them
on processes, Toxiproxy and real TCP too (the sim-tier proofs are in suites/properties).

`resend_drift` (trainer/learner_core.py): a learner whose answers are lost re-sends its
whole drift since the last Θ[p] every turn, while its `contribute` lines claim only the
steps since its previous send, as the correct code's would. The run is `one-way-cut`,
shortened (learner-2's downstream black-holed from 5 s for 7 s; ~30 s in all). The
checks that read the learner's own account (`progress_merged_once`, `tokens_conserved`)
pass it; `delta_bases_advance`, which reads only the shards' merge and send lines, fails.
The same run without the bug passes every check: suites/cluster/test_staleness_cluster.py."""
from __future__ import annotations

import dataclasses

import pytest

from harness.backends import runner
from harness.scenarios.scenario import load_scenario
from trainer.shell import BUGS_ENV

pytestmark = [pytest.mark.cluster, pytest.mark.slow]


def test_a_drift_re_sender_with_a_clean_log_is_caught_by_the_shards_lines(tmp_path, monkeypatch):
    monkeypatch.setenv(BUGS_ENV, "resend_drift")
    s = load_scenario("one-way-cut")
    (cut,) = s.faults
    s = dataclasses.replace(s, faults=(dataclasses.replace(cut, at_s=5.0, duration_s=7.0),),
                            train=dataclasses.replace(s.train, steps=320, duration_s=40.0))
    result = runner.run_scenario(s, tmp_path, live=False)
    assert result.summary["faults_applied"] == 1, result.summary
    by = {c["name"]: c for c in result.summary["checks"]}
    caught = by["delta_bases_advance"]
    assert caught["valid"] is False, (caught, str(result.run_dir))
    # the learner's own account looks right: what it claims holds no step twice
    assert by["progress_merged_once"]["valid"] is True, by["progress_merged_once"]
    assert by["tokens_conserved"]["valid"] is True, by["tokens_conserved"]
