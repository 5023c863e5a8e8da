"""The numerical pieces composed into Decoupled DiLoCo's round, without any protocol:
M learners step on their own targets, fragments sync on the staggered schedule,
pseudo-gradients merge (token-weighted RDA) and the outer Nesterov step moves Θ.
On the quadratic task the global model must approach the known optimum of the
*global* objective, which no learner can reach alone.

The outer optimizer here is lr 1, no momentum (Θ becomes the merged learners'
average: FedAvg), the simplest fixed point to check. With DiLoCo's LM defaults
(lr 0.7, Nesterov 0.9) this tiny quadratic, whose learners nearly converge within
one round, overshoots and oscillates; see docs/TRAINER_MATH.md."""
from __future__ import annotations

import jax
import numpy as np

from diloco_chaos.trainer.config import (DilocoConfig, InnerOptConfig, OuterOptConfig, RunConfig,
                                         TaskConfig)
from diloco_chaos.trainer.numerics import outer, tasks
from diloco_chaos.trainer.numerics.fragments import Fragmenter, due_fragment
from diloco_chaos.trainer.numerics.inner import make_inner


def global_loss(task, params) -> float:
    return float(np.mean([task.loss_fn(params, e) for e in task.eval_batches()]))


def test_fragmented_outer_rounds_reach_the_global_optimum_of_the_quadratic():
    cfg = RunConfig(task=TaskConfig(kind="quadratic", dim=4, quad_blocks=3, batch_size=4),
                    inner=InnerOptConfig(lr=0.05, warmup_steps=5, total_steps=150,
                                         weight_decay=0.0),
                    outer=OuterOptConfig(lr=1.0, momentum=0.0, nesterov=False),
                    diloco=DilocoConfig(learners=4, fragments=3, sync_every=6))
    M, P, H = 4, cfg.n_fragments, cfg.diloco.sync_every
    task = tasks.task_for_run(cfg)
    loop = make_inner(cfg, task.loss_fn)
    theta0 = task.init_params(jax.random.key(0))
    frag = Fragmenter(theta0, P, "balanced")
    glob = [frag.get(theta0, p) for p in range(P)]
    opt = outer.OuterOptimizer(cfg.outer)
    ostate = [opt.init(g) for g in glob]
    local = [theta0] * M
    istate = [loop.init(theta0) for _ in range(M)]
    c_steps, c_tokens = np.zeros((M, P), int), np.zeros((M, P), int)
    for step in range(1, 151):
        for m in range(M):
            local[m], istate[m], met = loop.step(local[m], istate[m], task.batch(m, step))
            c_steps[m] += 1
            c_tokens[m] += met["tokens"]
        p = due_fragment(step, H, P)
        if p is None:
            continue
        deltas = [outer.pseudo_grad(glob[p], frag.get(local[m], p)) for m in range(M)]
        weights = [outer.contribution_weight(c_tokens[m, p], c_steps[m, p]) for m in range(M)]
        glob[p], ostate[p] = opt.step(glob[p], ostate[p], outer.merge(deltas, weights, "rda"))
        for m in range(M):
            local[m] = frag.set(local[m], p, outer.mix(frag.get(local[m], p), glob[p], 0.0))
        c_steps[:, p] = 0
        c_tokens[:, p] = 0
    merged = theta0
    for p in range(P):
        merged = frag.set(merged, p, glob[p])
    floor, start = task.loss_floor(), global_loss(task, theta0)
    alone = task.unflatten(np.linalg.solve(task.A_NxN, task.b_MxN[0]))  # learner 0's optimum
    assert global_loss(task, merged) - floor < 0.02 * (start - floor)
    assert global_loss(task, merged) - floor < 0.25 * (global_loss(task, alone) - floor)
    assert loop.trace_counts[("step", (0,))] == 1
