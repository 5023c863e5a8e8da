"""harness/run/global_eval.py's choice of evaluation times (the evaluations themselves run
on real checkpoints in suites/cluster/test_cluster_faults.py)."""
from __future__ import annotations

from diloco_chaos.harness.run.global_eval import thin


def test_thin_keeps_first_and_last_and_spreads_the_rest():
    times = [float(t) for t in range(11)]             # 0 … 10
    assert thin(times, 20) == times                   # few enough: all
    assert thin(times, 3) == [0.0, 5.0, 10.0]         # index 0, 5, 10
    assert thin(times, 5) == [0.0, 2.0, 5.0, 8.0, 10.0]  # round(i × 10 / 4): 0, 2 (2.5 → 2), 5, 8 (7.5 → 8), 10
    assert thin(times, 1) == [10.0] and thin([], 5) == []


def test_an_unreadable_checkpoint_costs_only_its_own_point(tmp_path):
    """Real orbax checkpoints of one shard holding Θ0: one of three broken after the run
    (as a shard killed while orbax finalized it may leave it) is skipped and named; the
    other two are still evaluated, to the loss of Θ0."""
    import shutil
    import time

    from diloco_chaos.harness.run.global_eval import _setup, over_time
    from diloco_chaos.trainer.config import RunConfig
    from diloco_chaos.trainer.numerics.checkpoint import Checkpointer
    from diloco_chaos.trainer.units.shell import to_ckpt

    cfg = RunConfig()
    params0, frag, evaluate = _setup(cfg)
    topology = {"shards": {"syncer-0": list(range(cfg.n_fragments))}}
    t0 = time.time()
    with Checkpointer(tmp_path / "ckpt" / "syncer-0", max_to_keep=5) as ck:
        for step in (1, 2, 3):
            snap = {"fragments": {str(p): {"theta": frag.get(params0, p)} for p in range(cfg.n_fragments)}}
            ck.save(step, {**to_ckpt(snap), "saved_at": t0 + step * 10.0})  # one per interval
            ck.wait()
    shutil.rmtree(tmp_path / "ckpt" / "syncer-0" / "2" / "default")
    points, why = over_time(tmp_path, cfg, topology, t0, t0 + 60)
    assert [p["t"] for p in points] == [t0 + 10.0, t0 + 30.0], points
    assert all(abs(p["loss"] - sum(evaluate(params0)) / cfg.task.eval_batches) < 1e-6 for p in points)
    assert why and "syncer-0 checkpoint 2" in why, why
