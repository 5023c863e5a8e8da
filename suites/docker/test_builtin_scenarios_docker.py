"""Built-in scenarios, unchanged but for `backend = "docker"`, judged by their own
checks (none may fail or end UNKNOWN; loss parity is left out: no fault-free reference run).
One run each, 60-80 s on 2 cores, all three in `make nightly`. Their container faults are
in `make test` elsewhere, each in a run judged by its checks: a unit's container killed,
restarted and merged again in suites/multihost/test_multihost_run.py (`assert_held`, two
hosts) and test_spares_docker.py; docker pause in test_pause_docker.py and
test_cluster_faults.py's docker runs; a shard's container killed and restored likewise."""
from __future__ import annotations

import dataclasses
import json

import pytest

from diloco_chaos.harness import eventlog

from diloco_chaos.harness.backends import runner
from diloco_chaos.harness.backends.docker_engine import LABEL
from diloco_chaos.harness.judging.judge import held as verdict_held
from diloco_chaos.harness.scenarios.scenario import load_scenario
from diloco_chaos.run_cmd import judged_expect

pytestmark = [pytest.mark.docker, pytest.mark.cluster, pytest.mark.slow]

# scenario -> the fault kind it is about, done the container way
SCENARIOS = {"unit-loss": "kill_unit", "hang": "pause_unit", "syncer-crash": "kill_syncer"}


@pytest.mark.nightly
@pytest.mark.parametrize("name", sorted(SCENARIOS))
def test_builtin_scenario_on_docker(name, tmp_path, docker_engine):
    s = load_scenario(name)
    s = dataclasses.replace(s, cluster=dataclasses.replace(s.cluster, backend="docker"))
    result = runner.run_scenario(judged_expect(s, "none")[0], tmp_path, live=False)
    log = eventlog.read(result.run_dir)
    not_held = [c for c in result.summary["checks"] if c.get("valid") is not True]  # UNKNOWN is not a pass
    assert verdict_held(result.summary), (not_held, log.header.get("crashes"), str(result.run_dir))
    # the whole schedule played out (the token budget outlasts it), so the checks judged it
    assert result.summary["faults_applied"] == result.summary["faults_scheduled"] >= 1, result.summary
    if name == "unit-loss":  # the restarted unit was merged again: recovery decided, not censored
        by = {c["name"]: c for c in result.summary["checks"]}
        assert by["recovery_max_s"]["valid"] is True and by["rejoin_cycles_max"]["valid"] is True, by
    done = [e for e in log.of("fault_start") if e["fault"]["kind"] == SCENARIOS[name]]
    assert done and all(e["via"].startswith("docker ") for e in done), done  # the container way
    run = json.loads((result.run_dir / "run.json").read_text())
    assert run["backend"]["name"] == "docker"
    assert not docker_engine.containers.list(all=True, filters={"label": f"{LABEL}={run['topology']['run_id']}"})
