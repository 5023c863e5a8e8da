"""pause_unit the container way, when the cgroup freezer refuses.

runc answers `docker pause` with "OCI runtime pause failed: unable to freeze" when a
cgroup-v1 freeze does not settle in its retry loop (it happened in CI on 2 loaded cores)
and thaws the container before it answers. `DockerCluster.pause` asks again, then has
the engine SIGSTOP the container. The refusals are made here by the engine's own error
(the real APIError with runc's message) in front of the real container's `pause`; what
is checked is the real state afterwards: the engine's `Paused`, or the kernel's `T`
(stopped) state of the container's process, and that `resume` undoes it.
"""
from __future__ import annotations

from pathlib import Path

import pytest

from diloco_chaos.harness.backends import docker_cluster
from diloco_chaos.harness.backends.docker_cluster import DockerCluster
from diloco_chaos.harness.scenarios.scenario import scenario_from_dict

pytestmark = [pytest.mark.docker, pytest.mark.cluster]


def _config() -> dict:
    s = scenario_from_dict({"name": "pause", "seed": 1, "cluster": {"learners": 1, "backend": "docker"},
                            "train": {"task": "markov", "steps": 1000, "duration": "60s"}})
    return s.run_config().to_dict()


def _refuse_first(container, n: int) -> list[int]:
    """Makes the first `n` pause calls on `container` fail as runc does; returns a call counter."""
    import docker

    calls, real = [0], container.pause

    def pause():
        calls[0] += 1
        if calls[0] <= n:
            raise docker.errors.APIError(
                "500 Server Error", explanation=f"Cannot pause container {container.id}: "
                "OCI runtime pause failed: unable to freeze: unknown")
        return real()

    container.pause = pause
    return calls


def _proc_state(pid: int) -> str:
    for line in Path(f"/proc/{pid}/status").read_text().splitlines():
        if line.startswith("State:"):
            return line.split()[1]
    raise AssertionError(f"no State in /proc/{pid}/status")


def test_pause_retries_a_refused_freeze_then_falls_back_to_the_engines_sigstop(tmp_path, monkeypatch,
                                                                               docker_engine):
    monkeypatch.setattr(docker_cluster, "PAUSE_BACKOFF_S", 0.01)
    with DockerCluster(tmp_path / "run", _config(), seed=1) as cluster:
        m = cluster.members["learner-0"]
        c = m.proc.container

        # two refusals, then the freezer works: paused by the engine, no fallback
        calls = _refuse_first(c, 2)
        assert cluster.pause("learner-0") is None
        assert calls[0] == 3
        c.reload()
        assert c.attrs["State"]["Paused"] is True
        cluster.resume("learner-0")
        c.reload()
        assert c.attrs["State"]["Paused"] is False and c.attrs["State"]["Running"] is True

        # the freezer refuses every time: the engine SIGSTOPs the container's process
        calls = _refuse_first(c, 10**6)
        via = cluster.pause("learner-0")
        assert via == docker_cluster.PAUSE_FALLBACK and calls[0] == docker_cluster.PAUSE_TRIES
        pid = cluster.pid("learner-0")
        assert _proc_state(pid) == "T", "the container's process is not stopped"
        c.reload()
        assert c.attrs["State"]["Paused"] is False  # not frozen: stopped by a signal
        cluster.resume("learner-0")
        assert _proc_state(pid) in ("R", "S", "D"), "the container's process did not continue"
        assert m.proc.poll() is None


def test_pause_raises_what_is_not_a_refused_freeze(tmp_path, docker_engine):
    """Any other refusal of a running container is a real error, raised as is."""
    import docker

    with DockerCluster(tmp_path / "run", _config(), seed=1) as cluster:
        c = cluster.members["learner-0"].proc.container

        def pause():
            raise docker.errors.APIError("500 Server Error", explanation="something else went wrong")

        c.pause = pause
        with pytest.raises(docker.errors.APIError, match="something else"):
            cluster.pause("learner-0")
