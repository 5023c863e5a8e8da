"""Failures the property suites found: kept as strict xfails while not fixed (each reproduces
exactly: the simulator is deterministic, and the test flips to a failure of its own the day
the cause is fixed), and as plain tests once fixed, so they stay fixed.

- A learner cut off from the start (learner-2's link reset 0.1-2.7 s, learner-0's 0.1-0.9 s,
  K = 2) rejoins with its whole drift since Θ0; after a pause of learner-1 and a crash of
  syncer-1 the global loss rises 0.251 nats over its best (bound 0.25) before it recovers
  (0.107 at the end). The same with fp32 broadcasts (0.256) and int8 (0.256), and at
  4c41f43: a recovery rule, not a codec or an audit (found 2026-11-28 by a random CI-profile
  draw of test_decoupled_with_compressed_broadcasts_is_safe_under_any_schedule). Without
  either early reset the rise is 0.004 / 0.0. Fixed 2026-11-29: a fragment whose turn came
  while it awaited its fetch now goes out the step after a fetch that kept its progress
  (trainer/protocol/learner_core.py): the rise is 0.075 (int4), 0.078 (fp32, int8).
- Aligned rounds (K = 2, int4 broadcasts, answers only, shares by the merged): learner-0
  paused 0.9-5.1 s, then learner-1's uploads cut 4.8-7.4 s. Fragment 0's rounds wait for a
  second learner from 6.6 s to 9.6 s, so the learners' closing Δs at the end carry 22-29
  steps each; merged in the last rounds near the quadratic's floor they set Θ back: the
  final model ends 0.103 nats over its best (0.096 -> 0.199; end bound 0.1). Found
  2026-11-30 by a CI-profile draw (seed 7) of
  test_decoupled_with_aligned_rounds_is_safe_under_any_schedule; the same at b06edd4 and
  with either fetch rule (keep_gap 0 or 1): not caused by that day's changes. Not fixed.
- Sparse pseudo-gradients and sparse broadcasts (K = 2), every link reset 1.8-3.4 s:
  commits_audited finds syncer-0's commit of fragment 0 at version 8 (t = 8.05 s) moving
  Θ[p] by 0.333 where the judge's outer step over its 2 merged Δs moves it by 0: the shard
  and the judge disagree on what that round merged. Found 2026-11-30 by a fresh-clone CI
  draw (hypothesis seed 365817633) of test_decoupled_with_sparse_pseudo_gradients_is_safe_
  under_any_schedule; the same at b06edd4 and under either fetch rule. Whether the shard or
  the judge is wrong is not yet known. Not fixed.
"""
from __future__ import annotations

import pytest

from diloco_chaos.faults.kinds import KillSyncer, Partition, PauseUnit, Reset
from diloco_chaos.harness.judging import audits
from diloco_chaos.harness.judging.model_checks import global_loss_regression
from sim_cases import scenario, simulate_case

EARLY_CUTS = (Reset(target="link:learner-0", at_s=0.1, duration_s=0.8),
              Reset(target="link:learner-2", at_s=0.1, duration_s=2.6),
              PauseUnit(target="learner-1", at_s=3.3, duration_s=0.5),
              KillSyncer(target="syncer-1", at_s=4.0, down_for_s=0.5))


def test_a_learner_cut_off_from_the_start_does_not_set_the_model_back():
    case = simulate_case(scenario(EARLY_CUTS, quorum=2, broadcast_compression="int4"))
    r = global_loss_regression(case.log)
    assert r.valid is True, (r.value, r.details.get("curve"))


LATE_CLOSING = (PauseUnit(target="learner-0", at_s=0.9, duration_s=4.2),
                Partition(target="link:learner-1", at_s=4.8, duration_s=2.6, direction="upstream"))


@pytest.mark.xfail(strict=True, raises=AssertionError, reason="closing Δs of 22-29 steps after a stalled aligned round set Θ back "
                                       "0.103 nats at the end (bound 0.1): not fixed")
def test_closing_after_a_stalled_aligned_round_does_not_set_the_model_back():
    case = simulate_case(scenario(LATE_CLOSING, quorum=2, broadcast_compression="int4", share_by="merged",
                                  downlink="answer", align=True))
    r = global_loss_regression(case.log)
    assert r.valid is True, (r.value, r.details.get("curve"))


ALL_LINKS_RESET = (Reset(target="link:*", at_s=1.8, duration_s=1.6),)


@pytest.mark.xfail(strict=True, raises=AssertionError, reason="a sparse round after every link was reset: the shard's commit and the "
                                       "judge's outer step disagree (commits_audited): not fixed")
def test_a_sparse_round_after_every_link_was_reset_commits_what_the_judge_computes():
    case = simulate_case(scenario(ALL_LINKS_RESET, quorum=2, compression="sparse", broadcast_compression="sparse"))
    r = next(x for x in audits.audit_checks(case.log) if x.name == "commits_audited")
    assert r.valid is True, r.details.get("violations")
