"""The unit faults on the `docker` backend, each done the container way (docker kill,
docker pause, a CPU quota, kill + a new container) and judged by the event log, as
suites/cluster/test_faults_local.py judges the local backend. One short run."""
from __future__ import annotations

import contextlib
import inspect

import pytest

from harness import eventlog, injector as injector_mod, runner
from harness.docker_cluster import DockerCluster
from harness.scenario import scenario_from_dict

pytestmark = [pytest.mark.docker, pytest.mark.cluster, pytest.mark.slow]


def _scenario(name, faults, *, learners=2, shards=1, steps=400, duration="30s"):
    return scenario_from_dict({
        "name": name, "seed": 1, "cluster": {"learners": learners, "slices": 1, "shards": shards, "backend": "docker"},
        "train": {"task": "markov", "steps": steps, "duration": duration, "batch_size": 16},
        "faults": faults})


@contextlib.contextmanager
def docker_backend():
    """Until the runner picks the cluster class from `cluster.backend` itself (and the
    Injector prefers `cluster.set_speed` for slow_unit), put both in place here."""
    with pytest.MonkeyPatch.context() as mp:
        if "docker" not in inspect.getsource(runner):
            mp.setattr(runner, "LocalCluster", DockerCluster)
        if "set_speed" not in inspect.getsource(injector_mod.Injector):
            start, end = injector_mod.Injector._start_slow_unit, injector_mod.Injector._end_slow_unit

            def _start(self, n, f):
                if hasattr(self.cluster, "set_speed"):
                    return self.cluster.set_speed(f.target, f.speed)
                return start(self, n, f)

            def _end(self, n, f, final):
                if hasattr(self.cluster, "set_speed"):
                    return self.cluster.set_speed(f.target, 1.0)
                return end(self, n, f, final)

            mp.setattr(injector_mod.Injector, "_start_slow_unit", _start)
            mp.setattr(injector_mod.Injector, "_end_slow_unit", _end)
        yield


def _steps(log, src, t0, t1):
    return [e for e in log.of("step", src=src) if t0 <= e["t"] < t1]


def _window(log, fault_kind):
    start = next(e for e in log.of("fault_start") if e["fault"]["kind"] == fault_kind)
    end = next(e for e in log.of("fault_end") if e["id"] == start["id"])
    return start["t"], end["t"]


@pytest.fixture(scope="module")
def container_faults(tmp_path_factory, docker_engine):
    s = _scenario("docker-faults", [
        {"kind": "pause_unit", "target": "learner-1", "at": "4s", "duration": "3s"},
        {"kind": "kill_syncer", "target": "syncer-0", "at": "4s", "down_for": "3s"},
        # a quota of 0.1 core: on 2 busy shared cores a unit may get only ~0.3 core anyway
        {"kind": "slow_unit", "target": "learner-0", "at": "9s", "duration": "5s", "speed": 0.1},
        {"kind": "kill_unit", "target": "learner-1", "at": "15s", "down_for": "3s"},
    ], steps=1000, duration="25s")  # the token budget must outlast the faults on an idle machine
    out = tmp_path_factory.mktemp("runs")
    with docker_backend():
        result = runner.run_scenario(s, out, live=False)
    return eventlog.read(result.run_dir), result


def test_every_unit_ran_in_a_container_and_none_is_left(container_faults, docker_engine):
    log, result = container_faults
    import json

    run = json.loads((result.run_dir / "run.json").read_text())
    assert run["backend"]["name"] == "docker"
    assert not docker_engine.containers.list(all=True, filters={"label": f"diloco-chaos.run={run['topology']['run_id']}"})
    assert not log.header.get("crashes"), log.header.get("crashes")


def test_docker_pause_stops_steps_then_resumes(container_faults):
    log, _ = container_faults
    t0, t1 = _window(log, "pause_unit")
    # frozen: no step finished (the ends allow for the engine's pause/unpause calls)
    assert not _steps(log, "learner-1", t0 + 0.3, t1 - 0.3)
    assert _steps(log, "learner-1", t1, t1 + 3)


def test_cpu_quota_slows_the_unit(container_faults):
    log, _ = container_faults
    t0, t1 = _window(log, "slow_unit")
    slow = len(_steps(log, "learner-0", t0 + 0.5, t1)) / (t1 - t0 - 0.5)
    # its normal speed, on whichever side of the window the busy machine let it run
    normal = max(len(_steps(log, "learner-0", t0 - 3.0, t0)) / 3.0,
                 len(_steps(log, "learner-0", t1 + 0.5, t1 + 2.0)) / 1.5)
    assert slow < 0.6 * normal, (slow, normal)


def test_docker_kill_unit_restarts_and_contributes_again(container_faults):
    log, _ = container_faults
    t0, t1 = _window(log, "kill_unit")
    assert not _steps(log, "learner-1", t0 + 0.3, t1)
    ups = [e for e in log.of("unit_up", src="learner-1") if "incarnation" in e]
    assert [e["incarnation"] for e in ups] == [0, 1]
    assert any(m["learner"] == "learner-1" and m["incarnation"] == 1 for m in log.of("merge"))


def test_docker_kill_syncer_restores_from_checkpoint(container_faults):
    log, _ = container_faults
    assert len(log.of("checkpoint_restored", src="syncer-0")) == 1
    t0, t1 = _window(log, "kill_syncer")
    assert [e for e in log.of("round_commit", src="syncer-0") if e["t"] > t1]
