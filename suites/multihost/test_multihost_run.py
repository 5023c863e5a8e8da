"""A run across two hosts with nothing shared but the network (issue 18), on two network
namespaces of this machine, each with its own Docker engine reached over TCP
(suites/multihost/hosts.py): learner-0 and the syncer shard on host a, learner-1 on host
b, the link proxies in Toxiproxy on the harness's side (the hub address both hosts
route to). The units get the code from the runtime the harness ships to each engine and
keep their run directory in volumes of their own host; their event lines come home over
the engines' log streams, slice control as messages on their stdin
(harness/backends/docker_remote.py). What this file shows:

- the run, through the `chaos` fixture, with a kill_unit, a pause_unit, a kill_slice and
  a partition on units of both hosts, judged and reported as on one host, the report
  saying which engine ran which unit;
- no container of the run bind-mounts anything (asserted from every container's mounts
  while the run goes on);
- intruders without the run's secret, one straight to the shard across the namespaces,
  one from host b through a learner's proxy, are refused and merge nothing;
- an exception inside the cluster's `with`, and a Ctrl-C (SIGINT) of `diloco-chaos run`,
  leave no container and no volume of the run on either engine (the namespaces, veths
  and engines themselves: test_hosts.py, and the `two_hosts` fixture fails on any left)."""
from __future__ import annotations

import json
import os
import signal
import socket
import subprocess
import sys
import threading
import time
from pathlib import Path

import pytest

from diloco_chaos.harness import eventlog
from diloco_chaos.harness.backends.docker_engine import LABEL
from diloco_chaos.harness.scenarios.scenario import scenario_from_dict

pytestmark = [pytest.mark.multihost, pytest.mark.docker, pytest.mark.slow]

REPO = Path(__file__).resolve().parents[2]
INTRUDER_INCARNATION = 7


def _scenario(two_hosts, name: str, faults: list, duration: str = "40s") -> dict:
    return {"name": name, "seed": 4,
            "cluster": {"learners": 2, "shards": 1, "slices": 2, "backend": "docker",
                        "engines": [two_hosts["hosts"]["a"]["url"], two_hosts["hosts"]["b"]["url"]],
                        "listen": two_hosts["hub"]},
            "train": {"task": "markov", "steps": 2000, "duration": duration, "end_grace": "0s", "batch_size": 16},
            "faults": faults}


class Watch(threading.Thread):
    """Every container of a run on both engines, with its mounts, while the run goes on."""

    def __init__(self, clients):
        super().__init__(daemon=True)
        self.clients, self.seen, self.done = clients, {}, threading.Event()

    def run(self) -> None:
        while not self.done.is_set():
            for which, client in self.clients.items():
                try:
                    for c in client.containers.list(filters={"label": LABEL}):
                        self.seen[(which, c.name)] = [(m["Type"], m.get("Source", ""), m["Destination"])
                                                      for m in c.attrs["Mounts"]]
                except Exception:  # noqa: BLE001 - a container removed between list and inspect
                    pass
            self.done.wait(0.5)


def _forged(run_id: str) -> bytes:
    import numpy as np

    from diloco_chaos.trainer.protocol.messages import Contribution, Hello
    from diloco_chaos.trainer.wire.codec import encode_frame

    msgs = [Hello("learner-0", INTRUDER_INCARNATION),
            Contribution("learner-0", INTRUDER_INCARNATION, 1, 0, 0, 6, 6144, 0.02, None, [np.full(8, 0.5, np.float32)])]
    return b"".join(encode_frame(m, run_id=run_id, sender="learner-0") for m in msgs)


# run from host b's namespace: a learner's link with a secret of its own, through a proxy
FROM_HOST_B = """
import queue, sys, time
from diloco_chaos.trainer.wire.shard_link import ShardLink
from diloco_chaos.trainer.protocol.messages import Hello
link = ShardLink("learner-1", "syncer-0", sys.argv[1], sys.argv[2], queue.Queue(), secret=bytes(32),
                 backoff_s=(0.2, 0.5)).start()
time.sleep(6)
print("up" if link.up else "refused", link.send(Hello("learner-1", 7)), flush=True)
link.close()
"""


def _intrude(run_dir: Path, netns_b: str) -> list[str]:
    """Once the run trains: an intruder from the harness's side straight to the shard on
    host a, and one from host b through learner-1's proxy. Returns what they saw."""
    deadline = time.time() + 240
    while time.time() < deadline:
        logs = list((run_dir / "logs").glob("learner-*.jsonl")) if (run_dir / "logs").exists() else []
        if any('"kind":"step"' in p.read_text() for p in logs):
            break
        time.sleep(0.5)
    else:
        return ["no step within 240 s"]
    topo = json.loads((run_dir / "run.json").read_text())["topology"]
    host, port = topo["shard_addrs"]["syncer-0"].rsplit(":", 1)
    seen = []
    with socket.create_connection((host, int(port)), timeout=5) as rogue:
        rogue.sendall(_forged(topo["run_id"]))
        rogue.settimeout(10)
        try:
            seen.append("challenge" if rogue.recv(4) else "closed")
            while rogue.recv(64):
                pass
            seen.append("cut")
        except OSError as e:
            seen.append(repr(e))
    r = subprocess.run(["nsenter", f"--net=/var/run/netns/{netns_b}", "--", sys.executable, "-c", FROM_HOST_B,
                        topo["links"]["learner-1"]["syncer-0"], topo["run_id"]],
                       cwd=REPO, capture_output=True, text=True, timeout=60)
    seen.append(r.stdout.strip() or r.stderr.strip()[-300:])
    return seen


def test_a_run_across_two_hosts_shares_nothing_but_the_network(two_hosts, chaos, tmp_path):
    a, b = two_hosts["hosts"]["a"], two_hosts["hosts"]["b"]
    s = scenario_from_dict(_scenario(two_hosts, "two-hosts", [
        {"kind": "kill_slice", "target": "learner-1", "at": "6s", "duration": "4s"},
        {"kind": "pause_unit", "target": "learner-0", "at": "8s", "duration": "3s"},
        {"kind": "partition", "target": "link:learner-1", "at": "12s", "duration": "4s"},
        {"kind": "kill_unit", "target": "learner-1", "at": "18s", "down_for": "3s"}]))
    watch = Watch({"a": a["client"], "b": b["client"]})
    watch.start()
    found: list = []
    runs = chaos.out_dir

    def intruders() -> None:
        while not list(runs.glob("*/run.json")):
            time.sleep(0.2)
        found.extend(_intrude(next(runs.glob("*/run.json")).parent, b["netns"]))

    t = threading.Thread(target=intruders, daemon=True)
    t.start()
    try:
        result = chaos.run(s, tier="cluster")
    finally:
        watch.done.set()
        watch.join(5)
    t.join(60)
    log = eventlog.read(result.run_dir)
    backend = log.header["topology"]["backend"]
    assert backend["placement"] == {"learner-0": a["url"], "learner-1": b["url"], "syncer-0": a["url"]}
    assert backend["shipped"] == [a["url"], b["url"]]
    topo = log.header["topology"]
    assert topo["shard_addrs"]["syncer-0"].startswith(a["addr"] + ":")
    assert all(addr.startswith(two_hosts["hub"] + ":") for links in topo["links"].values() for addr in links.values())

    # every container of the run: no bind mount (the code from the runtime volume, the run
    # directory in the unit's own volume), on both engines
    ours = {k: v for k, v in watch.seen.items() if f"dc-{topo['run_id']}-" in k[1]}
    assert {w for w, _ in ours} == {"a", "b"}, watch.seen
    assert len(ours) >= 4, sorted(ours)  # learner-0, syncer-0, learner-1 and its restart
    for key, mounts in ours.items():
        assert mounts and all(t == "volume" for t, _, _ in mounts), (key, mounts)

    # the faults, done on the remote units by their own engine / the proxies / a message
    kinds = {e["fault"]["kind"] for e in log.of("fault_start")}
    assert kinds == {"kill_slice", "pause_unit", "partition", "kill_unit"}, kinds
    assert any(e.get("live_slices") == 1 for e in log.of("slices", src="learner-1")), log.of("slices")
    # the units' lines came home over the log streams, learner-1's restart merged again
    assert any(m["learner"] == "learner-1" and m["incarnation"] == 1 for m in log.of("merge"))
    # its checkpoint stayed on host b, in its volume: the restart there restored it
    assert [e["step"] > 0 for e in log.of("checkpoint_restored", src="learner-1")] == [True]
    assert any(m["learner"] == "learner-0" for m in log.of("merge"))
    assert (result.run_dir / "ckpt" / "syncer-0").is_dir()  # brought home: the global model was evaluated
    assert not log.header.get("global_eval_errors"), log.header["global_eval_errors"]

    # the intruders: refused, nothing merged
    assert found[:2] == ["challenge", "cut"], found
    assert found[2].startswith("refused 0"), found
    reasons = " | ".join(e["reason"] for e in log.of("auth_refused", src="syncer-0"))
    assert "did not open with a run-membership proof" in reasons and "wrong run-membership proof" in reasons
    assert not [e for e in log.events if e.get("incarnation") == INTRUDER_INCARNATION]

    chaos.assert_held(result)
    from diloco_chaos.reports.render import render_run
    page = render_run(result.run_dir).read_text()  # the report: which engine ran which unit
    assert f"{a['url']}: learner-0, syncer-0" in page and f"{b['url']}: learner-1" in page

    for h in (a, b):  # nothing of the run left on either host
        assert not h["client"].containers.list(all=True, filters={"label": f"{LABEL}={topo['run_id']}"})
        assert not h["client"].volumes.list(filters={"label": f"{LABEL}={topo['run_id']}"})


def test_an_exception_in_a_run_across_two_hosts_leaves_nothing_there(two_hosts, tmp_path):
    from diloco_chaos.harness.backends.docker_cluster import DockerCluster

    a, b = two_hosts["hosts"]["a"], two_hosts["hosts"]["b"]
    cfg = scenario_from_dict(_scenario(two_hosts, "two-hosts-failure", [])).run_config().to_dict()
    cluster = DockerCluster(tmp_path / "run", cfg, seed=1, engines=(a["url"], b["url"]), listen=two_hosts["hub"])
    with pytest.raises(RuntimeError, match="boom"):
        with cluster:
            run_id = cluster.topology["run_id"]
            assert a["client"].volumes.list(filters={"label": f"{LABEL}={run_id}"})
            assert b["client"].containers.list(filters={"label": f"{LABEL}={run_id}"})
            cluster.pause("learner-1")  # a paused one too
            raise RuntimeError("boom")
    for h in (a, b):
        assert not h["client"].containers.list(all=True, filters={"label": f"{LABEL}={run_id}"}), h["url"]
        assert not h["client"].volumes.list(filters={"label": f"{LABEL}={run_id}"}), h["url"]


def test_ctrl_c_of_a_run_across_two_hosts_leaves_nothing_there(two_hosts, tmp_path):
    from diloco_chaos.harness.scenarios.scenario_toml import scenario_to_toml

    a, b = two_hosts["hosts"]["a"], two_hosts["hosts"]["b"]
    path = tmp_path / "two-hosts.toml"
    path.write_text(scenario_to_toml(scenario_from_dict(_scenario(two_hosts, "two-hosts-ctrl-c", [], duration="120s"))))
    child = subprocess.Popen([sys.executable, "-m", "diloco_chaos", "run", str(path), "--out", str(tmp_path / "runs"),
                              "--no-live", "--reference", "none"],
                             cwd=REPO, env={**os.environ, "PYTHONUNBUFFERED": "1"},
                             stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True,
                             preexec_fn=lambda: signal.signal(signal.SIGINT, signal.SIG_DFL))
    try:
        deadline = time.time() + 240

        def of_run(client):
            return [c for c in client.containers.list(filters={"label": LABEL})]

        while time.time() < deadline and not (of_run(a["client"]) and of_run(b["client"])):
            assert child.poll() is None, child.stderr.read()
            time.sleep(0.5)
        assert of_run(a["client"]) and of_run(b["client"]), "no units on both hosts within 240 s"
        time.sleep(2)
        child.send_signal(signal.SIGINT)
        child.wait(timeout=120)
        assert child.returncode != 0
        for h in (a, b):
            assert not h["client"].containers.list(all=True, filters={"label": LABEL}), h["url"]
            assert not [v for v in h["client"].volumes.list(filters={"label": LABEL})], h["url"]
    finally:
        if child.poll() is None:
            child.kill()
            child.wait()
