"""The global model's held-out loss, evaluated by the harness after a run, from the
checkpoints on disk (so nothing is taken from the run while it trains).

- `final(run_dir, cfg, topology)`: Θ at the end, assembled from every syncer shard's
  latest checkpoint (DiLoCo modes), or learner-0's last checkpoint (dp modes, where
  every learner holds the global model), evaluated on `task.final_eval_batches`
  held-out batches (64: the learners' 4 and more), each batch's loss kept so that the
  parity with a reference run gets a paired confidence interval (harness/judging/losses.py).
- `over_time(run_dir, cfg, topology, t0, t1)`: Θ along the run. Each syncer shard keeps,
  besides its latest checkpoints, the first one it saved in each `trainer.syncer.
  KEEP_EVERY_S` of clock time (the same moments on every shard), stamped with the wall
  time it was taken (`saved_at`); once per interval Θ is every shard's newest checkpoint
  by then, over Θ0 for a shard that has none yet (a crashed shard: the one it had).
  DiLoCo modes only: in dp modes the learners' own evals are already the global model's.

Both return what they could not do as an error string instead of raising: a missing
or corrupt checkpoint must not lose the rest of the run.
"""
from __future__ import annotations

import dataclasses
import functools
from pathlib import Path

import numpy as np

MAX_POINTS = 40  # evaluations along one run, at most (each ~10-50 ms on the tiny model)


@functools.lru_cache(maxsize=2)
def _model(cfg):
    """The task, Θ0 and the inner loop (its compiled eval) of a run's config, once per
    process: the harness evaluates a run along the way and at the end. Θ0 eagerly: the
    first time in a process 2.3 s, then 0.01 s (op by op, each op's program cached in
    memory), where one jitted program is compiled again for every new task (2 s)."""
    import jax

    from diloco_chaos.trainer.numerics.inner import make_inner
    from diloco_chaos.trainer.numerics.tasks import task_for_run

    task = task_for_run(cfg)
    # on one device: a unit's slices split its batch over its devices, the loss of a batch
    # is the same, and the harness's process has one (a run with slices = 2 was not evaluated)
    one = dataclasses.replace(cfg, diloco=dataclasses.replace(cfg.diloco, slices=1))
    return task, task.init_params(jax.random.PRNGKey(cfg.seed)), make_inner(one, task.loss_fn)


def _setup(cfg, n: int | None = None):
    from diloco_chaos.trainer.numerics.wiring import fragmenter_for

    task, params, inner = _model(cfg)
    batches = task.eval_batches(n)
    return params, fragmenter_for(cfg, params), lambda p: inner.batch_losses(p, batches)


def final(run_dir: Path, cfg, topology: dict) -> tuple[list[float] | None, str | None]:
    """(each held-out batch's loss under the final global model, None) or (None, what went wrong)."""
    from diloco_chaos.trainer.numerics.checkpoint import Checkpointer
    from diloco_chaos.trainer.units.shell import from_ckpt

    try:
        params, frag, evaluate = _setup(cfg, cfg.task.final_eval_batches)
        if cfg.diloco.mode in ("dp", "elastic_dp"):
            with Checkpointer(run_dir / "ckpt" / topology["learners"][0]) as ck:
                saved = ck.restore()
            if saved is None:
                return None, "learner-0 left no checkpoint"
            return evaluate(saved["params"]), None
        for shard in topology["shards"]:
            with Checkpointer(run_dir / "ckpt" / shard) as ck:
                # the newest save that matches its manifest (a storage fault may have damaged
                # the newest on disk); a folder from before manifests: its newest as it is
                saved = ck.restore_verified()[1] if ck.sealed_steps() else ck.restore()
            if saved is not None:
                for p, f in from_ckpt(saved)["fragments"].items():
                    params = frag.set(params, int(p), f["theta"])
        return evaluate(params), None
    except Exception as e:  # noqa: BLE001 - reported, never raised
        return None, repr(e)


def _snapshots(run_dir: Path, shard: str, errors: list[str]) -> list[tuple[float, dict]]:
    """(saved_at, {fragment: Θ[p]}) of every checkpoint the shard kept, oldest first. One
    without its manifest (the shard was killed before it: never durable) is left out; one
    that cannot be read, or does not match its manifest (a storage fault damaged it), is
    skipped and named in `errors`: it must not cost the other points of the curve, nor pass
    for Θ."""
    from diloco_chaos.trainer.numerics.checkpoint import Checkpointer
    from diloco_chaos.trainer.units.shell import from_ckpt

    out = []
    if not (run_dir / "ckpt" / shard).exists():
        return out
    with Checkpointer(run_dir / "ckpt" / shard) as ck:
        steps = ck.steps()
        sealed = set(ck.sealed_steps())
        checked = bool(sealed)  # (a folder from before manifests: read as it is)
        for step in steps:
            if checked and step not in sealed:
                continue  # finalized as its shard was killed, before its manifest: never durable
            try:
                saved = ck.restore_checked(step, listed=steps) if checked else ck.restore(step, listed=steps)
                if "saved_at" in saved:  # checkpoints written before the stamp existed have none
                    out.append((float(saved["saved_at"]),
                                {int(p): f["theta"] for p, f in from_ckpt(saved)["fragments"].items()}))
            except Exception as e:  # noqa: BLE001 - reported, never raised
                errors.append(f"{shard} checkpoint {step}: {e!r}")
    return sorted(out, key=lambda x: x[0])


def thin(times: list[float], n: int) -> list[float]:
    """At most `n` of the sorted `times`, evenly spread over their index, first and last kept."""
    if len(times) <= n:
        return list(times)
    if n < 2:
        return times[-1:]
    return [times[round(i * (len(times) - 1) / (n - 1))] for i in range(n)]


def over_time(run_dir: Path, cfg, topology: dict, t0: float, t1: float) -> tuple[list[dict], str | None]:
    """([{t, loss}], error or None): the global model along [t0, t1] (wall times)."""
    if cfg.diloco.mode in ("dp", "elastic_dp"):
        return [], None
    try:
        from diloco_chaos.trainer.units.syncer import KEEP_EVERY_S

        errors: list[str] = []
        snaps = {shard: _snapshots(run_dir, shard, errors) for shard in topology["shards"]}
        # shards keep the first save of each KEEP_EVERY_S of clock time: evaluate once per
        # interval, when every shard's snapshot of it exists (not in between, where one
        # shard's Θ would be up to an interval older than another's)
        last: dict[int, float] = {}
        for s in snaps.values():
            for at, _ in s:
                b = int(at // KEEP_EVERY_S)
                last[b] = max(last.get(b, at), at)
        times = thin(sorted(t for t in last.values() if t0 <= t <= t1), MAX_POINTS)
        why = "; ".join(errors) or None
        if not times:
            return [], why
        params0, frag, evaluate = _setup(cfg)
        points = []
        for t in times:
            params = params0
            for shard, s in snaps.items():
                taken = [fr for at, fr in s if at <= t]
                for p, theta in (taken[-1] if taken else {}).items():
                    params = frag.set(params, p, theta)
            points.append({"t": t, "loss": float(np.mean(evaluate(params)))})
        return points, why
    except Exception as e:  # noqa: BLE001 - reported, never raised
        return [], repr(e)
