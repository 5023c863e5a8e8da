"""Participation per committed round, from round_commit lines, by hand."""
from __future__ import annotations

from log_builder import LogBuilder

from diloco_chaos.harness.judging.participation import participation


def test_rounds_are_counted_by_how_many_learners_they_merged():
    b = LogBuilder(learners=4)
    for t, n in ((1.0, 1), (2.0, 1), (3.0, 3), (4.0, 4), (5.0, 1)):
        b.add(t, "syncer-0", "round_commit", fragment=0, version=int(t), n=n, tokens=100 * n)
    # 5 rounds of 1, 1, 3, 4, 1 learners: mean 10 / 5 = 2, two of five with >= 2
    assert participation(b.log()) == {"rounds": 5, "mean": 2.0, "share_at_least_2": 0.4,
                                      "histogram": {"1": 3, "3": 1, "4": 1}, "learners": 4}
    assert participation(LogBuilder().log()) is None


def test_participation_min_holds_the_mean_learners_per_round_to_a_bound():
    from diloco_chaos.harness.judging import checks, metrics
    b = LogBuilder(learners=4)
    for t, n in ((1.0, 1), (2.0, 1), (3.0, 3), (4.0, 4), (5.0, 1)):   # mean 2.0
        b.add(t, "syncer-0", "round_commit", fragment=0, version=int(t), n=n, tokens=100 * n)
    m = metrics.compute(b.log())
    assert m.participation["mean"] == 2.0 and m.to_dict()["participation"]["rounds"] == 5
    (ok,) = checks.expect_checks({"participation_min": 2.0}, m)
    (bad,) = checks.expect_checks({"participation_min": 2.5}, m)
    assert (ok.valid, bad.valid, bad.value, bad.bound) == (True, False, 2.0, 2.5)
    (none,) = checks.expect_checks({"participation_min": 1.0}, metrics.compute(LogBuilder().log()))
    assert none.valid is None      # nothing committed: not judged
