"""Unit-suite setup for the JAX modules: strict rank promotion (a shape bug raises
instead of broadcasting silently) and float32 everywhere; and the fixtures two modules
share: `closing` (the transport tests) and `run` (a copy of the report tests' recorded run)."""
from __future__ import annotations

import shutil
from pathlib import Path

import jax
import pytest

jax.config.update("jax_numpy_rank_promotion", "raise")

REPORT_RUN = Path(__file__).parent / "data" / "report_run"


@pytest.fixture
def closing():
    """Closes what a test opened, in reverse order, whatever happens."""
    opened = []
    yield opened.append
    for thing in reversed(opened):
        thing.close()


@pytest.fixture
def run(tmp_path) -> Path:
    """A fresh copy of the recorded run the report tests render (data/report_run)."""
    d = tmp_path / "unit-faults"
    shutil.copytree(REPORT_RUN, d)
    return d
