"""The harness's own gradient of each sampled inner step, for `inner_steps_reexecuted`.

After a run, for every learner's `inner_audit` line (trainer/numerics/step_audit.py: θ before a
sampled inner step, the Adam state, the step's result at 16 coordinates a leaf), the harness
draws the batch that step should have used — the task's batch for (that learner, global step
− 1), its first B·live/S rows, the live slices' share — and takes the task's gradient there
with θ from the line: as the mean of two equal row groups and their spread where the
learner's second moment is the fleet's (docs/TRAINER_MATH.md "Inner step"), else over the
whole batch. It writes one harness line per audit, `inner_gradient`: the gradient's global
norm, and the mean gradient and the noise estimate at the line's coordinates (unclipped,
float32). The judge (harness/judging/inner_steps.py) redoes the rest of the step — clip,
Adam, fleet correction, weight decay, schedule — in its own arithmetic from these.

The model and data are the task's (a user's own, for a plug-in); which batch, and every
formula of the optimizer, are not the learner's: the learner's choice of batch is what this
checks. Both runners call `gradient_lines` at the end of a run, as they do the global eval
(harness/run/global_eval.py): the harness's own evidence, in the log, so judging stays
model-free.
"""
from __future__ import annotations

import dataclasses
import functools

import numpy as np

GROUPS = 2      # the fleet's second moment's row groups (trainer/numerics/inner.py GROUPS, docs/TRAINER_MATH.md)
PER_LEAF = 16   # coordinates a line carries of each leaf (trainer/numerics/step_audit.py)


def leaf_index(n: int) -> np.ndarray:
    return np.unique(np.linspace(0, n - 1, min(n, PER_LEAF)).round().astype(np.int64))


def _b64(x) -> dict:
    import base64
    x = np.ascontiguousarray(x, np.float32)
    return {"dtype": "float32", "shape": list(x.shape), "b64": base64.b64encode(x.tobytes()).decode()}


def _arrays(field: list) -> list[np.ndarray]:
    import base64
    return [np.frombuffer(base64.b64decode(a["b64"]), dtype=np.dtype(a["dtype"])).reshape(a["shape"]) for a in field]


@functools.lru_cache(maxsize=4)
def _model(cfg):
    """The run's task, its parameter tree (shapes and names, without initialising) and a
    jitted value-and-gradient of its loss: once per config and process."""
    import jax

    from diloco_chaos.trainer.numerics.tasks import task_for_run

    task = task_for_run(cfg)
    paths, tree = jax.tree_util.tree_flatten_with_path(jax.eval_shape(task.init_params, jax.random.key(0)))
    names = ["/".join(str(getattr(k, "key", k)) for k in path) for path, _ in paths]
    return task, tree, [tuple(x.shape) for _, x in paths], names, jax.jit(jax.value_and_grad(task.loss_fn))


def _fleet(cfg) -> bool:
    return cfg.inner.second_moment == "fleet" and cfg.diloco.mode in ("decoupled", "streaming", "sync_diloco") \
        and cfg.diloco.learners > 1


def gradient_lines(cfg, learners: list[str], events: list[dict]) -> list[dict]:
    """One harness `inner_gradient` line per learner `inner_audit` line in `events`."""
    audits = [e for e in events if e.get("kind") == "inner_audit" and e.get("src") in learners]
    if not audits:
        return []
    import jax

    cfg = dataclasses.replace(cfg, name="replay")
    task, tree, shapes, names, grad = _model(cfg)
    out = []
    for e in audits:
        line = {"t": e["t"], "src": "harness", "kind": "inner_gradient", "learner": e["src"], "step": e["step"],
                "audit_t": e["t"], "names": names, "shapes": [list(s) for s in shapes]}
        theta = _arrays(e["theta"])
        if len(theta) != len(shapes) or any(t.size != int(np.prod(s)) for t, s in zip(theta, shapes)):
            out.append({**line, "error": f"θ has leaves of sizes {[t.size for t in theta]}, the task's model "
                                         f"{[int(np.prod(s)) for s in shapes]}"})
            continue
        params = jax.tree.unflatten(tree, [t.reshape(s) for t, s in zip(theta, shapes)])
        batch = np.asarray(task.batch(learners.index(e["src"]), int(e["step"]) - 1))
        rows = batch.shape[0] * int(e["live_slices"]) // cfg.diloco.slices
        batch = batch[:rows]
        k = max(d for d in range(1, min(GROUPS, rows) + 1) if rows % d == 0) if _fleet(cfg) else 1
        per = [[np.asarray(g, np.float64).ravel() for g in jax.tree.leaves(grad(params, part)[1])]
               for part in np.split(batch, k)]
        mean = [sum(g[i] for g in per) / k for i in range(len(shapes))]
        norm = float(np.sqrt(sum(float((g * g).sum()) for g in mean)))
        line.update(norm=norm, groups=k, rows=rows, grad=[_b64(g[leaf_index(g.size)]) for g in mean])
        if k > 1:
            noise = [sum((g[i] - mean[i]) ** 2 for g in per) / (k * (k - 1)) for i in range(len(shapes))]
            line["noise"] = [_b64(n[leaf_index(n.size)]) for n in noise]
        out.append(line)
    return out
