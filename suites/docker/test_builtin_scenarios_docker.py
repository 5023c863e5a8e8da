"""Built-in scenarios, unchanged but for `backend = "docker"`, judged by their own
checks (none may fail; loss parity is unknown without a fault-free reference run).
One run each, 40-90 s on 2 cores: set DILOCO_DOCKER_SCENARIOS=1 to include them."""
from __future__ import annotations

import dataclasses
import json
import os

import pytest

from harness import eventlog, runner
from harness.docker_cluster import LABEL
from harness.scenario import load_scenario

from test_faults_docker import docker_backend

pytestmark = [pytest.mark.docker, pytest.mark.cluster, pytest.mark.slow,
              pytest.mark.skipif(os.environ.get("DILOCO_DOCKER_SCENARIOS") != "1",
                                 reason="built-in scenarios on docker take minutes: set DILOCO_DOCKER_SCENARIOS=1")]

# scenario -> the fault kind it is about, done the container way
SCENARIOS = {"unit-loss": "kill_unit", "hang": "pause_unit", "syncer-crash": "kill_syncer"}


@pytest.mark.parametrize("name", sorted(SCENARIOS))
def test_builtin_scenario_on_docker(name, tmp_path, docker_engine):
    s = load_scenario(name)
    s = dataclasses.replace(s, cluster=dataclasses.replace(s.cluster, backend="docker"))
    with docker_backend():
        result = runner.run_scenario(s, tmp_path, live=False)
    failed = [c["name"] for c in result.summary["checks"] if c.get("valid") is False]
    assert not failed, (failed, result.summary["checks"])
    log = eventlog.read(result.run_dir)
    assert any(e["fault"]["kind"] == SCENARIOS[name] for e in log.of("fault_start"))
    run = json.loads((result.run_dir / "run.json").read_text())
    assert run["backend"]["name"] == "docker"
    assert not docker_engine.containers.list(all=True, filters={"label": f"{LABEL}={run['topology']['run_id']}"})
