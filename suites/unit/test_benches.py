"""The benchmark helpers (harness/bench_runs.py): rates from step lines, checked by hand.
No timing is asserted. (The bare loop itself is left to `bench overhead`: its two
compiles take 5-11 s on the shared 2-core machine, over this suite's 10 s budget.)"""
from __future__ import annotations

import pytest

from harness.bench_runs import best_window_rate, rate_without, window_rate


def _steps(times: list[float], tokens: int = 10) -> list[dict]:
    return [{"step": i + 1, "t": t, "tokens": tokens} for i, t in enumerate(times)]


def test_window_rate_counts_the_steps_after_first_up_to_last():
    steps = _steps([0.0, 1.0, 2.0, 4.0, 5.0])
    r = window_rate(steps, 1, 4)          # steps 2, 3, 4: 30 tokens in 4 - 0 = 4 s
    assert (r["tokens"], r["seconds"], r["tokens_per_s"]) == (30, 4.0, 7.5)
    with pytest.raises(ValueError):
        window_rate(steps, 4, 4)


def test_rate_without_drops_the_gaps_holding_a_pause():
    steps = _steps([0.0, 1.0, 2.0, 4.0, 5.0])
    r = rate_without(steps, 1, 5, pauses=[2.5])   # the 2 s gap before step 4 held an eval
    assert r == {"tokens_per_s": 10.0, "gaps_dropped": 1}   # 30 tokens in 1 + 1 + 1 s


def test_best_window_rate_is_the_fastest_stretch():
    steps = _steps([0.0, 1.0, 2.0, 4.0, 5.0, 6.0])
    assert best_window_rate(steps, 1, 6, width=2) == 10.0    # steps 6-5-4: 2 s for 20 tokens
    assert best_window_rate(steps, 1, 6, width=3) == 7.5
