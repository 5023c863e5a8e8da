"""Shared pytest setup: Hypothesis profiles and fixtures for real components.

Hypothesis profiles, chosen by HYPOTHESIS_PROFILE (default `dev`; CI sets `ci`):
  dev      fast feedback while editing
  ci       new schedules every run from a seed .ci/run draws and prints
           (`--hypothesis-seed`, replayed with HYPOTHESIS_SEED=N bash .ci/run); a failure
           it finds is shrunk, and kept as an explicit @example in the test
  nightly  many examples, an example database (.hypothesis/, failures replayed first);
           also runs the tests marked `nightly` (skipped otherwise)
The planted-bug searches fix their own settings (derandomized): they prove the oracles,
whatever the seed.
"""
from __future__ import annotations

import os
from pathlib import Path

import pytest
from hypothesis import HealthCheck, settings

from diloco_chaos.trainer.units.shell import use_compile_cache

use_compile_cache()  # the suites' simulations and the units they start load earlier compiles
# each test makes its own fault-free reference runs (a test that patches the trainer in
# this process would otherwise judge against another test's): suites/unit/test_reference_store.py
# turns the user's cache of them back on where it tests it
os.environ.setdefault("DILOCO_CHAOS_REFERENCE_CACHE", "off")

pytest_plugins = ["diloco_chaos.pytest_plugin"]  # the `chaos` fixture, `pytest --chaos-report DIR`

settings.register_profile("dev", max_examples=20, deadline=None)
settings.register_profile("ci", max_examples=40, deadline=None, database=None,
                          suppress_health_check=[HealthCheck.too_slow])
settings.register_profile("nightly", max_examples=1000, deadline=None,
                          suppress_health_check=[HealthCheck.too_slow])
settings.load_profile(os.environ.get("HYPOTHESIS_PROFILE", "dev"))


def pytest_report_header(config):
    seed = config.getoption("hypothesis_seed", None)
    return (f"hypothesis profile {os.environ.get('HYPOTHESIS_PROFILE', 'dev')}, seed "
            + (f"{seed} (replay: --hypothesis-seed {seed})" if seed is not None else "random (none given)"))


# Under `make test` (`pytest -n 2`) the tests that start real units (processes, containers,
# two hosts: the folders below) run on one pytest-xdist worker, one after the other in file
# order (a module's shared cluster stays one), while the other worker runs the unit, property
# and browser suites beside them. So they run beside one busy process, as on a shared CI
# runner (they are meant to pass beside two: `make test-loaded`), and never beside each
# other. (xdist's own `xdist_group` mark does not group here: with pytest 9 the node id
# suffix it relies on is lost, measured; a scheduler of our own keeps the rule in one place.)
REAL_UNITS = ("suites/cluster/", "suites/docker/", "suites/multihost/")


def pytest_xdist_make_scheduler(config, log):
    from xdist.scheduler import LoadScopeScheduling

    class RealUnitsOnOneWorker(LoadScopeScheduling):
        """Every test whose file starts real units in one scope; every other test its own."""

        def _split_scope(self, nodeid: str) -> str:
            return "real-units" if nodeid.startswith(REAL_UNITS) else nodeid

    return RealUnitsOnOneWorker(config, log)


def pytest_collection_modifyitems(config, items):
    """Tests marked `nightly` (long runs whose failure modes a CI test already covers) run
    only under the nightly profile (`make nightly`), keeping `make test` under 20 minutes."""
    if os.environ.get("HYPOTHESIS_PROFILE") == "nightly":
        return
    skip = pytest.mark.skip(reason="nightly only: HYPOTHESIS_PROFILE=nightly (make nightly) runs it")
    for item in items:
        if "nightly" in item.keywords:
            item.add_marker(skip)


@pytest.fixture(scope="session")
def toxiproxy_server():
    """One real Toxiproxy server for the test session, stopped at the end whatever happens."""
    from diloco_chaos.harness.backends.toxiproxy_server import ToxiproxyServer

    with ToxiproxyServer(seed=0) as server:
        yield server


@pytest.fixture
def toxiproxy(toxiproxy_server):
    """A client to the session's server; every proxy a test made is removed afterwards."""
    client = toxiproxy_server.client()
    client.delete_all()
    yield client
    client.delete_all()


@pytest.fixture
def run_dir(tmp_path: Path) -> Path:
    d = tmp_path / "run"
    d.mkdir()
    return d
