"""The held-out loss chart's default view: clipped to where the run spends its time, the
whole range behind a checkbox (issue 16: the first eval at ~5.5 nats squashed 1.7–1.8)."""
from __future__ import annotations

import json

import pytest

from diloco_chaos.reports import charts

ROWS = [{"t": 5.0, "loss": 5.5}, {"t": 30.0, "loss": 1.9}, {"t": 60.0, "loss": 1.8}, {"t": 90.0, "loss": 1.75}]


def test_the_view_runs_from_the_floor_to_the_highest_loss_after_the_first_quarter():
    # lo = the floor 1.713 (under every loss), hi = 1.9 (t = 30 ≥ 25), pad = 5 % of 0.187
    lo, hi = charts.loss_view(ROWS, 1.713, (0.0, 100.0))
    assert (lo, hi) == (pytest.approx(1.713 - 0.00935, abs=1e-4), pytest.approx(1.9 + 0.00935, abs=1e-4))
    assert charts.loss_view(ROWS, None, (0.0, 100.0))[0] == pytest.approx(1.75 - 0.0075, abs=1e-4)


def test_no_clip_when_it_would_hide_nothing():
    assert charts.loss_view(ROWS[1:], 1.713, (0.0, 100.0)) is None       # no start-up spike
    assert charts.loss_view([], 1.713, (0.0, 100.0)) is None
    assert charts.loss_view(ROWS[:1], None, (0.0, 100.0)) is None         # nothing after the first quarter


def test_the_chart_starts_clipped_and_a_checkbox_shows_the_whole_range():
    spec = charts.loss([], [{**r, "who": "run", "step": 0, "n": 4} for r in ROWS], [], 1.713, [], (0.0, 100.0))
    params = {p["name"]: p for p in spec.get("params", [])}
    assert params[charts.FULL_LOSS]["value"] is False and params[charts.FULL_LOSS]["bind"]["input"] == "checkbox"
    text = json.dumps(spec)
    assert f"{charts.FULL_LOSS} ? null : [1.7037, 1.9093]" in text
    flat = charts.loss([], [{**r, "who": "run", "step": 0, "n": 4} for r in ROWS[1:]], [], 1.713, [], (0.0, 100.0))
    assert charts.FULL_LOSS not in json.dumps(flat)
