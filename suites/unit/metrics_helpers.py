"""Helpers shared by the metrics tests (test_metrics_goodput.py, test_metrics_summary.py)."""
from __future__ import annotations

import pytest


def approx(x):
    return pytest.approx(x, abs=1e-9)


def total(m) -> float:
    return m.goodput + sum(m.badput.values())
