"""harness/global_eval.py's choice of evaluation times (the evaluations themselves run
on real checkpoints in suites/cluster/test_cluster_faults.py)."""
from __future__ import annotations

from harness.global_eval import thin


def test_thin_keeps_first_and_last_and_spreads_the_rest():
    times = [float(t) for t in range(11)]             # 0 … 10
    assert thin(times, 20) == times                   # few enough: all
    assert thin(times, 3) == [0.0, 5.0, 10.0]         # index 0, 5, 10
    assert thin(times, 5) == [0.0, 2.0, 5.0, 8.0, 10.0]  # round(i × 10 / 4): 0, 2 (2.5 → 2), 5, 8 (7.5 → 8), 10
    assert thin(times, 1) == [10.0] and thin([], 5) == []
