"""One run over two Docker engines: learner units spread over the engines that
`cluster.engines` names (learner-i on engines[i % n]), syncer shards on the first,
links and shards listening on `cluster.listen`. This is how a run spans hosts
(docs/DOCKER.md); here both engines are private dockerds on this machine, and the
listen address is 127.0.0.2 rather than the default 127.0.0.1, so a part that still
used a fixed address would fail. Each engine's own event stream says which containers
it ran and killed."""
from __future__ import annotations

import json
import os
import subprocess
import time
from pathlib import Path

import pytest

from diloco_chaos.harness import eventlog

from diloco_chaos.harness.backends import runner
from diloco_chaos.harness.backends.docker_cluster import UNIT_LABEL, Containers
from diloco_chaos.harness.backends.docker_engine import LABEL, engine
from diloco_chaos.harness.scenarios.scenario import scenario_from_dict

pytestmark = [pytest.mark.docker, pytest.mark.cluster, pytest.mark.slow]

DOCKERD_SH = Path(__file__).resolve().parents[2] / "scripts" / "dockerd.sh"
SECOND = "/tmp/diloco-dockerd-2"


@pytest.fixture(scope="module")
def second_engine(docker_engine, unavailable):
    """A second private engine (its own socket, data root and containerd), stopped after."""
    if os.geteuid() != 0:
        unavailable("a second private engine needs root")
    env = {**os.environ, "DILOCO_DOCKERD_DIR": SECOND}
    r = subprocess.run(["bash", str(DOCKERD_SH), "start"], capture_output=True, text=True, timeout=120, env=env)
    assert r.returncode == 0, r.stderr
    url = r.stdout.strip().splitlines()[-1]
    try:
        client = engine(url=url)
        yield url, client
        client.close()
    finally:
        subprocess.run(["bash", str(DOCKERD_SH), "stop"], capture_output=True, timeout=120, env=env)


def _events(client, run_id: str, since: float, until: float) -> list[tuple[str, str, str]]:
    """(action, unit, incarnation) of every container event of the run on that engine."""
    out = []
    for e in client.events(since=int(since), until=int(until) + 1, decode=True,
                           filters={"type": "container", "label": f"{LABEL}={run_id}"}):
        attrs = e["Actor"]["Attributes"]
        out.append((e["Action"], attrs[UNIT_LABEL], attrs["diloco-chaos.incarnation"]))
    return out


# nightly (43 s): CI's run over two engines is suites/multihost (two engines in network
# namespaces of their own, units placed across them, faults on both)
@pytest.mark.nightly
def test_a_run_over_two_engines(tmp_path, docker_engine, second_engine):
    url_b, client_b = second_engine
    url_a = Containers._engine_name(docker_engine)
    s = scenario_from_dict({
        "name": "two-engines", "seed": 3,
        "cluster": {"learners": 2, "shards": 1, "backend": "docker", "engines": [url_a, url_b],
                    "listen": "127.0.0.2"},
        "train": {"task": "markov", "steps": 1000, "duration": "14s", "end_grace": "0s", "batch_size": 16},
        "faults": [{"kind": "kill_unit", "target": "learner-1", "at": "4s", "down_for": "3s"}]})
    since = time.time()
    result = runner.run_scenario(s, tmp_path, live=False)
    until = time.time()
    log = eventlog.read(result.run_dir)
    assert not log.header.get("crashes"), log.header.get("crashes")
    backend = log.header["topology"]["backend"]
    assert backend["engines"] == [url_a, url_b]
    assert backend["placement"] == {"learner-0": url_a, "learner-1": url_b, "syncer-0": url_a}

    run_id = log.header["topology"]["run_id"]
    on_a = _events(docker_engine, run_id, since, until)
    on_b = _events(client_b, run_id, since, until)
    # a pool of two warm spares on each engine that runs learners (a spare takes only the
    # identity of a unit on its own engine); on B a spare took learner-1's restart, and was replaced
    assert {(u, i) for a, u, i in on_a if a == "start"} == {("learner-0", "0"), ("syncer-0", "0"),
                                                            ("spare-learner-1", "spare"),
                                                            ("spare-learner-2", "spare")}, on_a
    assert {(u, i) for a, u, i in on_b if a == "start"} == {("learner-1", "0"), ("spare-learner-3", "spare"),
                                                            ("spare-learner-4", "spare"),
                                                            ("spare-learner-5", "spare")}, on_b
    assert ("kill", "learner-1", "0") in on_b  # the fault, done by engine B
    assert [e["start"] for e in log.of("unit_up") if e.get("reason") == "restarted"] == ["spare"]
    # the restarted unit, on engine B, reached the shard on engine A through its proxy
    assert any(m["learner"] == "learner-1" and m["incarnation"] == 1 for m in log.of("merge"))

    topo = log.header["topology"]
    addrs = [*topo["shard_addrs"].values(), *(a for links in topo["links"].values() for a in links.values())]
    assert addrs and all(a.startswith("127.0.0.2:") for a in addrs), addrs
    run = json.loads((result.run_dir / "run.json").read_text())
    for client in (docker_engine, client_b):
        assert not client.containers.list(all=True, filters={"label": f"{LABEL}={run['topology']['run_id']}"})
