"""No container outlives its run: not after an exception inside the `with`, not after
a Ctrl-C (SIGINT) of the process that holds the cluster."""
from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest

from diloco_chaos.harness.backends.docker_cluster import DockerCluster
from diloco_chaos.harness.backends.docker_engine import LABEL
from diloco_chaos.harness.scenarios.scenario import scenario_from_dict

pytestmark = [pytest.mark.docker, pytest.mark.cluster]

REPO = Path(__file__).resolve().parents[2]


def _config() -> dict:
    s = scenario_from_dict({"name": "cleanup", "seed": 1, "cluster": {"learners": 2, "backend": "docker"},
                            "train": {"task": "markov", "steps": 1000, "duration": "60s"}})
    return s.run_config().to_dict()


def _of_run(client, run_id: str) -> list:
    return client.containers.list(all=True, filters={"label": f"{LABEL}={run_id}"})


def test_an_exception_inside_the_with_removes_every_container(tmp_path, docker_engine):
    cluster = DockerCluster(tmp_path / "run", _config(), seed=1)
    with pytest.raises(RuntimeError, match="boom"):
        with cluster:
            run_id = cluster.topology["run_id"]
            names = {c.labels["diloco-chaos.unit"] for c in _of_run(docker_engine, run_id)}
            assert names == {"learner-0", "learner-1", "syncer-0"}
            assert all(cluster.pid(n) for n in names)  # running, with a host pid
            cluster.pause("learner-1")  # a paused container too
            cluster.kill("learner-0")   # and a killed one is removed at once
            assert {c.labels["diloco-chaos.unit"] for c in _of_run(docker_engine, run_id)} == {"learner-1", "syncer-0"}
            raise RuntimeError("boom")
    assert not _of_run(docker_engine, run_id)
    assert cluster.toxiproxy is None


CHILD = """
import json, sys, time
from pathlib import Path
from diloco_chaos.harness.backends.docker_cluster import DockerCluster
with DockerCluster(Path(sys.argv[1]), json.loads(sys.argv[2]), seed=1) as c:
    print(c.topology["run_id"], flush=True)
    time.sleep(300)
"""


def test_sigint_removes_every_container(tmp_path, docker_engine):
    child = subprocess.Popen([sys.executable, "-c", CHILD, str(tmp_path / "run"), json.dumps(_config())],
                             cwd=REPO, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True,
                             env={**os.environ, "PYTHONUNBUFFERED": "1"},
                             preexec_fn=lambda: signal.signal(signal.SIGINT, signal.SIG_DFL))  # see test_interrupt
    try:
        run_id = child.stdout.readline().strip()
        assert run_id, child.stderr.read()
        assert len(_of_run(docker_engine, run_id)) == 3
        child.send_signal(signal.SIGINT)
        child.wait(timeout=60)
        assert child.returncode != 0 and "KeyboardInterrupt" in child.stderr.read()
        assert not _of_run(docker_engine, run_id)
    finally:
        if child.poll() is None:
            child.kill()
            child.wait()


def test_ctrl_c_of_a_docker_run_stops_the_engine_it_started(tmp_path, docker_engine):
    """`diloco-chaos run --backend docker` with no engine answering starts a private one
    (scripts/dockerd.sh, here in its own folder); a Ctrl-C in the middle of the run
    leaves no container, no dockerd and no containerd of it behind."""
    from diloco_chaos.harness.backends.docker_engine import engine

    folder = Path("/tmp/diloco-dockerd-ctrlc")
    env = {**os.environ, "PYTHONUNBUFFERED": "1", "DILOCO_DOCKERD_DIR": str(folder),
           "DOCKER_HOST": f"unix://{tmp_path}/nothing-here.sock"}
    child = subprocess.Popen([sys.executable, "-m", "diloco_chaos", "run", "unit-loss", "--backend", "docker",
                              "--out", str(tmp_path / "runs"), "--no-live", "--reference", "none"],
                             cwd=REPO, env=env, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True,
                             preexec_fn=lambda: signal.signal(signal.SIGINT, signal.SIG_DFL))
    try:
        assert "running unit-loss" in child.stdout.readline(), child.stderr.read()
        dockerd = int((folder / "dockerd.pid").read_text())
        ours = engine(url=f"unix://{folder}/docker.sock")
        def units():  # the run's units, not its warm spare (unit-loss restarts a learner)
            return [c for c in ours.containers.list(filters={"label": LABEL})
                    if not c.labels["diloco-chaos.unit"].startswith("spare-")]

        deadline = time.time() + 120  # a give-up timeout, not the property
        while len(units()) < 5 and time.time() < deadline:
            time.sleep(0.5)  # 4 learners + 1 shard, running
        assert len(units()) == 5
        containerd = [int(p) for p in subprocess.run(["pgrep", "-P", str(dockerd)], capture_output=True,
                                                     text=True).stdout.split()]
        ours.close()
        child.send_signal(signal.SIGINT)
        # interrupted, not finished on its own (the run is 60 s long): exit 130
        assert child.wait(timeout=120) == 130, child.stderr.read()
        for pid in (dockerd, *containerd):
            assert not Path(f"/proc/{pid}").exists(), f"pid {pid} outlived the run"
        assert subprocess.run(["bash", str(REPO / "scripts" / "dockerd.sh"), "status"], env=env,
                              capture_output=True).returncode != 0
        # and no mount of it (dockerd leaves exec/netns/default mounted: the stop unmounts it)
        mounts = [line.split()[4] for line in Path("/proc/self/mountinfo").read_text().splitlines()]
        assert not [m for m in mounts if m.startswith(f"{folder}/")], mounts
    finally:
        if child.poll() is None:
            child.kill()
            child.wait()
        subprocess.run(["bash", str(REPO / "scripts" / "dockerd.sh"), "stop"], env=env, capture_output=True)
