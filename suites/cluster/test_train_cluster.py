"""Decoupled DiLoCo as real processes over real TCP through real Toxiproxy proxies:
a syncer sharded in two and three learner units train the Markov task while one
learner and one syncer shard are SIGKILLed mid-run and restarted. Everything is
judged from the event log."""
from __future__ import annotations

import collections
import json
import math

import pytest

from diloco_chaos.harness import eventlog
from suites.cluster.unit_logs import events, last_step, wait_for

from diloco_chaos.harness.run import global_eval
from diloco_chaos.harness.backends.cluster import LocalCluster
from diloco_chaos.harness.backends.procs import pid_alive
from diloco_chaos.trainer.config import DilocoConfig, InnerOptConfig, OuterOptConfig, RunConfig
from diloco_chaos.trainer.numerics.tasks import task_for_run

pytestmark = [pytest.mark.cluster, pytest.mark.slow]

STEPS = 150


# sparse (36 s) in `make nightly`: CI's sparse restarts are the simulator's (test_safety's
# sparse pseudo-gradients under any schedule)
@pytest.mark.parametrize("broadcast", ["fp32", pytest.param("sparse", marks=pytest.mark.nightly)])
def test_kill_and_restart_learner_and_syncer_shard(tmp_path, broadcast):
    """`broadcast`: how Θ and the Δs travel (fp32 whole fragments, or sparse both ways:
    Θ as deltas against the learner's copy, which a restarted learner or shard must
    re-anchor on a whole fragment, and sparse Δs whose error feedback a kill throws away
    with the rest of the learner's local progress; int4 deltas take the same path)."""
    cfg = RunConfig(name="it", seed=3, steps=STEPS,
                    diloco=DilocoConfig(learners=3, fragments=3, broadcast_compression=broadcast,
                                        compression="sparse" if broadcast == "sparse" else "fp32"),
                    inner=InnerOptConfig(total_steps=STEPS), outer=OuterOptConfig(lr=0.7, momentum=0.0))
    run_dir = tmp_path / "run"
    cluster = LocalCluster(run_dir, cfg.to_dict(), shards=2, seed=cfg.seed)
    with cluster:
        pids = {n: cluster.pid(n) for n in cluster.members}
        wait_for(lambda: last_step(run_dir, "learner-1") >= 40, 120, "learner-1 at step 40")
        cluster.kill("learner-1")
        killed_learner_at = last_step(run_dir, "learner-1")
        wait_for(lambda: any(e["kind"] == "checkpoint_saved" for e in events(run_dir, "syncer-1")), 60,
                  "a durable checkpoint of syncer-1")
        cluster.kill("syncer-1")
        # the learners keep stepping with one shard gone (10 steps of theirs, whatever the
        # pace), then wait, stopped, while its new process boots: how many steps they have
        # left when it is back is the machine's pace otherwise (in a loaded CI run two of
        # them finished before it was back, and the global model ended 0.27 above the floor).
        # What a late return loses is issue 54's recovery at any pace, not this test's.
        at_kill = last_step(run_dir, "learner-0")
        wait_for(lambda: last_step(run_dir, "learner-0") >= min(at_kill + 10, STEPS - 40), 60,
                 "learner-0 stepping without syncer-1")
        held = ["learner-0", "learner-2"]
        for name in held:
            cluster.pause(name)
        cluster.spawn("syncer-1")
        wait_for(lambda: any(e["kind"] == "unit_up" and e.get("incarnation") == 1
                             for e in events(run_dir, "syncer-1")), 120, "syncer-1 back")
        for name in held:
            cluster.resume(name)
        cluster.spawn("learner-1")
        # a give-up timeout (the units end at their step budget), not the property
        assert cluster.wait_exit(["learner-0", "learner-1", "learner-2"], timeout_s=240)
        run = json.loads((run_dir / "run.json").read_text())
    # every process and proxy is gone once the cluster is closed
    assert not any(pid_alive(p) for p in pids.values())
    assert cluster.toxiproxy is None

    eventlog.merge(run_dir, {"seed": cfg.seed, "config": run["config"], "topology": run["topology"]})
    log = eventlog.read(run_dir)
    merges = log.of("merge")

    # training continued: every learner finished all its steps, rounds kept committing
    done = {e["src"]: e for e in log.of("done") if e["src"].startswith("learner")}
    assert {s: e["finished"] for s, e in done.items()} == {f"learner-{i}": True for i in range(3)}
    restart_t = min(e["t"] for e in log.of("unit_up", src="syncer-1") if e["incarnation"] == 1)
    after = [e for e in log.of("round_commit", src="syncer-1") if e["t"] > restart_t]
    # How many rounds it can commit after its restart is decided by how many steps the
    # learners had left by then (quorum 1: each Δ of one of its fragments is a round), which
    # the machine's pace decides (its restart took 7 s in one loaded CI run; in another its
    # links came up at step 143 of 150). So: 5, or half of what the learners' own steps after
    # its restart could have offered it (a Δ per fragment it owns every H steps), if fewer.
    owned = len(run["topology"]["shards"]["syncer-1"])
    steps_after = sum(1 for e in log.of("step") if e["src"].startswith("learner") and e["t"] > restart_t)
    offered = steps_after // cfg.diloco.sync_every * owned
    assert len(after) >= min(5, offered // 2), \
        f"the restarted syncer shard committed too few rounds: {len(after)} of {offered} offered"

    # the restarted shard resumed from a durable checkpoint, not from scratch
    restored = log.of("checkpoint_restored", src="syncer-1")
    assert len(restored) == 1 and max(restored[0]["versions"].values()) >= 1

    # the learner rejoined (fresh or from its checkpoint) and contributed again
    ups = [e for e in log.of("unit_up", src="learner-1")]
    assert [e["incarnation"] for e in ups] == [0, 1]
    assert ups[1]["step"] <= killed_learner_at
    rejoined = [m for m in merges if m["learner"] == "learner-1" and m["incarnation"] == 1]
    assert len(rejoined) >= 10
    assert {m["fragment"] for m in rejoined} == {0, 1, 2}

    # no contribution was merged twice, even across the shard's restart
    ids = collections.Counter((m["learner"], m["incarnation"], m["seq"], m["fragment"]) for m in merges)
    assert max(ids.values()) == 1

    # and the model learned: the global model (Θ from the shards' last checkpoints) is near
    # the floor and above it. Each learner's own last eval depends on when its shard came
    # back: a fetch overwrites θ[p] with the restored, older Θ[p]. In one CI run the
    # restarted shard took 7 s (a loaded machine) and learners 0 and 2 fetched Θ[1] with 50
    # of their 150 steps left, ending at 2.31 and 2.58; in another its links came up only at
    # step 143 and they ended at 3.82 and 3.54 (their evals at step 100: 1.77, 1.75), the
    # global model at 1.745. So a learner's own last eval is only bounded by Θ0's level
    # (ln 256 = 5.55, the byte vocabulary: it learned), and none may be NaN.
    floor = task_for_run(cfg).loss_floor()
    final = [[e["loss"] for e in log.of("eval", src=f"learner-{i}")][-1] for i in range(3)]
    assert all(floor < loss < math.log(256) for loss in final), (final, floor)
    global_losses, why = global_eval.final(run_dir, cfg, run["topology"])
    assert why is None and len(global_losses) == cfg.task.final_eval_batches, (global_losses, why)
    global_loss = sum(global_losses) / len(global_losses)
    assert floor < global_loss < floor + 0.25, (global_loss, why, final, floor)

    # how Θ came back: whole fragments only, or deltas after each (re)fetch
    deltas = {e["src"] for e in log.of("recv") if e["msg"] == "FragmentDelta"}
    if broadcast == "fp32":
        assert not deltas
    else:
        assert deltas == {"learner-0", "learner-1", "learner-2"}
        # the restarted learner fetched whole fragments, then took deltas again
        ups = sorted(e["t"] for e in log.of("unit_up", src="learner-1") if e.get("incarnation") == 1)
        late = [e["msg"] for e in log.of("recv", src="learner-1") if e["t"] > ups[0]]
        assert late.count("FragmentUpdate") >= 3 and late.count("FragmentDelta") >= 10, collections.Counter(late)
