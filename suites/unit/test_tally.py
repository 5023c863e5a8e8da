"""trainer/tally.py by hand: what the inner steps did to each fragment, summed over a Δ's steps."""
from __future__ import annotations

import numpy as np

from diloco_chaos.trainer.tally import AUDIT_SAMPLE, StepTally, audit_index


def _get(params, p):  # two fragments: leaf 0, and leaves 1 and 2
    return [params[0]] if p == 0 else [params[1], params[2]]


def _params(a, b, c):
    return [np.array(a, np.float32), np.array(b, np.float32), np.array(c, np.float32)]


def test_a_tally_sums_each_fragments_changes_over_the_claimed_steps():
    t = StepTally(_get, 2)
    p0 = _params([1, 1], [0], [5, 5])
    p1 = _params([1.5, 1], [0.25], [5, 4])    # step 1: fragment 0 +(0.5, 0), fragment 1 +(0.25, 0, −1)
    p1_taken = _params([3, 3], [0.25], [5, 4])  # a take between the steps moves fragment 0: not a step
    p2 = _params([3, 2], [0.75], [5, 4])      # step 2: fragment 0 +(0, −1), fragment 1 +(0.5, 0, 0)
    t.record(1, p0, p1)
    t.record(2, p1_taken, p2)
    assert t.progress(0, 0, 2).tolist() == [-0.5, 1.0]        # Δ = −(sum of the changes)
    assert t.progress(1, 0, 2).tolist() == [-0.75, 0.0, 1.0]
    assert t.progress(0, 1, 2).tolist() == [0.0, 1.0]
    t.forget_before(1)  # no anchor before step 1 any more
    assert t.progress(0, 0, 2) is None and t.progress(0, 1, 2).tolist() == [0.0, 1.0]
    assert t.progress(0, 2, 5) is None  # steps it never saw


def test_a_large_fragment_is_tallied_at_the_audits_coordinates():
    n = 10_000
    idx = audit_index(n)
    assert len(idx) == AUDIT_SAMPLE and idx[0] == 0 and idx[-1] == n - 1 and audit_index(4096) is None
    before = [np.zeros(6000, np.float32), np.zeros(4000, np.float32)]
    after = [np.arange(6000, dtype=np.float32), -np.arange(4000, dtype=np.float32)]
    t = StepTally(lambda params, p: params, 1)
    t.record(1, before, after)
    flat = np.concatenate([after[0], after[1]])
    assert t.progress(0, 0, 1).tolist() == (-flat[idx]).tolist()
