"""Only the run's own units get in (trainer/wire/auth.py), on real processes through Toxiproxy:
while two learners train, an intruder that speaks our frame format well — a Hello and a
well-formed Contribution signed as learner-0 — connects straight to the shard, and a
link with the wrong secret comes in through learner-1's proxy. Both are refused and
logged (`auth_refused`); nothing they sent reaches the shard's core; the learners' own
links (through their proxies) prove themselves and train; the secret is in no file of
the run."""
from __future__ import annotations

import queue
import socket

import numpy as np
import pytest

from diloco_chaos.harness import eventlog
from suites.cluster.unit_logs import events, wait_for
from diloco_chaos.harness.backends.cluster import LocalCluster
from diloco_chaos.trainer.config import DilocoConfig, InnerOptConfig, RunConfig
from diloco_chaos.trainer.protocol.messages import Contribution, Hello
from diloco_chaos.trainer.wire import auth
from diloco_chaos.trainer.wire.codec import encode_frame
from diloco_chaos.trainer.wire.shard_link import ShardLink
from diloco_chaos.trainer.wire.transport import parse_addr

pytestmark = [pytest.mark.cluster, pytest.mark.slow]

STEPS = 60
INTRUDER_INCARNATION = 7  # no real learner-0 incarnation has it in this run


def _forged(run_id: str) -> bytes:
    """A Hello and a Contribution as learner-0 would frame them, for the right run."""
    delta = [np.full(8, 0.5, np.float32)]
    msgs = [Hello("learner-0", INTRUDER_INCARNATION),
            Contribution("learner-0", INTRUDER_INCARNATION, 1, 0, 0, 6, 6144, 0.02, None, delta)]
    return b"".join(encode_frame(m, run_id=run_id, sender="learner-0") for m in msgs)


def test_an_intruder_without_the_run_secret_is_refused_and_merges_nothing(tmp_path):
    cfg = RunConfig(name="membership", seed=5, steps=STEPS, diloco=DilocoConfig(learners=2, fragments=2),
                    inner=InnerOptConfig(total_steps=STEPS))
    run_dir = tmp_path / "run"
    cluster = LocalCluster(run_dir, cfg.to_dict(), shards=1, seed=cfg.seed)
    inbox: queue.Queue = queue.Queue()
    with cluster:
        topo = cluster.topology
        wait_for(lambda: any(e["kind"] == "step" for e in events(run_dir, "learner-0")), 120, "a first step")
        # 1. straight to the shard: our frames, no proof
        with socket.create_connection(parse_addr(topo["shard_addrs"]["syncer-0"]), timeout=5) as rogue:
            rogue.sendall(_forged(topo["run_id"]))
            rogue.settimeout(5)
            assert rogue.recv(auth.CHALLENGE_BYTES)[:4] == auth.MAGIC
            wait_for(lambda: rogue.recv(64) == b"", 15, "the shard to cut the intruder")
        # 2. through learner-1's proxy, with a secret of its own
        wrong = ShardLink("learner-1", "syncer-0", topo["links"]["learner-1"]["syncer-0"], topo["run_id"], inbox,
                          secret=bytes(32), backoff_s=(0.2, 0.5)).start()
        try:
            wait_for(lambda: len([e for e in events(run_dir, "syncer-0") if e["kind"] == "auth_refused"]) >= 2,
                      30, "two refusals")
            assert not wrong.up and wrong.send(Hello("learner-1", INTRUDER_INCARNATION)) == 0
        finally:
            wrong.close()
        # a give-up timeout (the units end at their step budget), not the property
        assert cluster.wait_exit(["learner-0", "learner-1"], timeout_s=240)
        secret = cluster.secret
    eventlog.merge(run_dir, {"seed": cfg.seed, "config": cfg.to_dict(), "topology": topo})
    log = eventlog.read(run_dir)

    refused = log.of("auth_refused", src="syncer-0")
    reasons = " | ".join(e["reason"] for e in refused)
    assert "did not open with a run-membership proof" in reasons and "wrong run-membership proof" in reasons
    # nothing the intruders sent reached the core: no line about their incarnation
    assert not [e for e in log.events if e.get("incarnation") == INTRUDER_INCARNATION], reasons
    assert not [e for e in log.of("recv", src="syncer-0") if e.get("incarnation") not in (0, None)]
    # the run's own learners proved themselves through their proxies and trained
    assert {e["src"] for e in log.of("link_up") if e["src"].startswith("learner")} == {"learner-0", "learner-1"}
    assert log.of("merge") and {e["src"]: e["finished"] for e in log.of("done") if "finished" in e} == \
        {"learner-0": True, "learner-1": True}
    assert not log.of("auth_refused", src="learner-0") and not log.of("auth_refused", src="learner-1")
    # the secret is in the units' environment only
    for f in run_dir.rglob("*"):
        if f.is_file() and f.suffix in (".json", ".jsonl", ".log", ".txt"):
            assert secret not in f.read_text(errors="replace"), f
