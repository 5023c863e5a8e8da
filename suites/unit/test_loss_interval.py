"""The final loss's interval and the paired parity interval (harness/judging/losses.py), and the
tri-state `loss_parity_max` built on it, on numbers worked out by hand."""
from __future__ import annotations

import numpy as np
import pytest
from log_builder import LogBuilder

from diloco_chaos.harness.judging import checks, losses, metrics
# batches of very different difficulty, as held-out text has
HARD_EASY = np.array([1.2, 2.4, 1.6, 2.0, 1.4, 2.2, 1.8, 1.0] * 8)


def test_a_constant_ratio_has_a_zero_width_interval_at_that_ratio():
    # every batch 1 % worse: on any resample the ratio of the two means is exactly 1.01
    lo, hi = losses.parity_ci(HARD_EASY * 1.01, HARD_EASY)
    assert lo == pytest.approx(0.01, abs=1e-12) and hi == pytest.approx(0.01, abs=1e-12)
    assert losses.parity_ci(HARD_EASY, HARD_EASY) == [0.0, 0.0]


def test_pairing_removes_what_the_batches_share():
    # unpaired, the spread of batch difficulty (sd 0.46 nats) would dominate; paired, only the
    # per-batch differences (uniform ±0.01 around +0.02, sd 0.0058) are left
    rng = np.random.default_rng(1)
    run = HARD_EASY + 0.02 + rng.uniform(-0.01, 0.01, len(HARD_EASY))
    lo, hi = losses.parity_ci(run, HARD_EASY)
    assert lo < 0.02 / HARD_EASY.mean() < hi and hi - lo < 0.003   # ≈ 4 × 0.0058 / √64 / 1.7
    mlo, mhi = losses.mean_ci(run)
    assert mlo < run.mean() < mhi and (mhi - mlo) / HARD_EASY.mean() > 30 * (hi - lo)


def test_no_interval_without_two_comparable_sides():
    assert losses.parity_ci(HARD_EASY, None) is None
    assert losses.parity_ci(HARD_EASY, HARD_EASY[:-1]) is None   # not the same batches
    assert losses.mean_ci(np.array([1.7])) is None
    assert losses.mean_ci(np.full(8, 1.7)) == [pytest.approx(1.7)] * 2


def test_excess_loss_ratio_by_hand():
    assert losses.excess_loss_ratio(1.80, 1.75, 1.70) == pytest.approx(2.0)
    assert losses.excess_loss_ratio(1.80, 1.70, 1.70) is None    # the reference at the floor
    assert losses.excess_loss_ratio(1.80, 1.75, None) is None


def _log(batch_losses):
    b = LogBuilder(learners=1)
    e = losses.final_eval_event(10.0, 100, list(batch_losses))
    b.add(e["t"], "harness", "eval", **{k: v for k, v in e.items() if k not in ("t", "src", "kind")})
    return b.log()


@pytest.mark.parametrize("shift, want", [(1.002, True),    # the interval [+0.2 %, +0.2 %] ≤ 1 %
                                         (1.03, False),    # wholly over the bound
                                         (0.995, True),    # a little below the reference: fine
                                         (0.97, False),    # wholly 3 % below: suspect (two-sided)
                                         (None, None)])    # straddles it: the eval cannot tell
def test_loss_parity_max_is_judged_on_the_interval(shift, want):
    ref = HARD_EASY
    if shift is None:   # +1 % on average, but batch by batch anywhere from −7 % to +9 %
        run = ref * (1.01 + np.random.default_rng(0).uniform(-0.08, 0.08, len(ref)))
    else:
        run = ref * shift
    m = metrics.compute(_log(run), _log(ref))
    assert m.final_loss == pytest.approx(run.mean(), abs=1e-5) and m.final_loss_ci[0] < m.final_loss < m.final_loss_ci[1]
    (r,) = checks.expect_checks({"loss_parity_max": 0.01}, m)
    assert r.valid is want and r.details["ci"] == m.loss_parity_ci
    if shift == 0.97:
        assert "suspect" in r.details["why"]
    if shift is None:
        # the point value alone would have said PASS or FAIL; the check a point-value
        # implementation gives (the planted mistake) is not what the interval allows
        assert m.loss_parity_ci[0] < 0.01 < m.loss_parity_ci[1]


def test_a_log_without_batch_losses_is_judged_on_the_point_value():
    b, ref = LogBuilder(learners=1), LogBuilder(learners=1)
    b.add(10.0, "harness", "eval", loss=1.80, step=100, **{"global": True})
    ref.add(10.0, "harness", "eval", loss=1.79, step=100, **{"global": True})
    m = metrics.compute(b.log(), ref.log())
    assert m.loss_parity_ci is None and m.final_loss_ci is None
    (r,) = checks.expect_checks({"loss_parity_max": 0.01}, m)
    assert r.valid is True and "point value" in r.details["why"]
