"""The evidence of an inner step that a learner unit leaves for the judge: `inner_audit` lines.

A learner's inner step is a function of what it holds before the step (θ, the inner AdamW
state) and of its batch, which the task draws from (seed, learner, global step). For a
sample of its steps the unit writes what it held before, and what the step made, so the
judge (harness/judging/inner_steps.py `inner_steps_reexecuted`) can redo the step in its own
arithmetic (the clip, Adam with the fleet's second moment, weight decay, the schedule:
docs/TRAINER_MATH.md) from the batch *it* draws for that step, and compare:

- `theta`: every leaf of θ before the step, whole (the gradient needs all of it);
- `count`, `lr_count`: the Adam and schedule counters before the step;
- `mu`, `nu`, `noise`: the moments before the step at `PER_LEAF` evenly spread coordinates
  of every leaf (`leaf_index`: the judge computes the same coordinates itself); `noise`
  only with the fleet's second moment;
- `after`: θ, mu, nu (and noise) after the step at those coordinates.

Sampled steps (`sampled`): each incarnation's first step with a learning rate (a restart's
first step runs on what its restore produced; a cold start's first has lr 0, so its second)
and every `AUDIT_EVERY`-th global step. On the default
LM a line is about 0.75 MB (θ is 135,488 values); the quadratic's are a few hundred bytes.

This is the unit's own account of its state; the judge recomputes from it what the step
should have made, and the batch, the counts' expected values and every formula are its own.
"""
from __future__ import annotations

from typing import Any

import jax
import numpy as np

from diloco_chaos.trainer.numerics.tally import b64

AUDIT_EVERY = 400   # global inner steps between sampled steps (besides each incarnation's first)
PER_LEAF = 16       # coordinates of each leaf whose moments and result a line carries


def sampled(step: int, first_of_incarnation: bool) -> bool:
    """Whether the inner step numbered `step` (1-based, global) leaves an inner_audit line
    (`first_of_incarnation`: the incarnation's first step with lr > 0)."""
    return first_of_incarnation or step % AUDIT_EVERY == 0


def leaf_index(n: int) -> np.ndarray:
    """The coordinates of a flattened leaf of n values an inner_audit line carries."""
    return np.unique(np.linspace(0, n - 1, min(n, PER_LEAF)).round().astype(np.int64))


def adam_view(opt_state: Any) -> dict:
    """The Adam state inside an optax chain (optax's ScaleByAdamState or FleetAdamState:
    count, mu, nu, and noise for the fleet's), and the schedule's counter
    (ScaleByScheduleState). Fails loudly on a state without them."""
    found: dict = {}

    def visit(node):
        if hasattr(node, "mu") and hasattr(node, "nu") and "adam" not in found:
            found["adam"] = node
        elif type(node).__name__ == "ScaleByScheduleState":
            found["schedule"] = node
        elif isinstance(node, (tuple, list)):
            for child in node:
                visit(child)
        elif hasattr(node, "_fields"):
            for child in node:
                visit(child)
        elif hasattr(node, "inner_state"):
            visit(node.inner_state)

    visit(opt_state)
    if "adam" not in found or "schedule" not in found:
        raise ValueError(f"no Adam or schedule state in the inner optimizer's state: {type(opt_state)}")
    adam = found["adam"]
    return {"count": int(np.asarray(adam.count)), "lr_count": int(np.asarray(found["schedule"].count)),
            "mu": jax.tree.leaves(adam.mu), "nu": jax.tree.leaves(adam.nu),
            "noise": jax.tree.leaves(adam.noise) if hasattr(adam, "noise") else None}


def _picked(leaves) -> list[dict]:
    out = []
    for x in leaves:
        flat = np.ravel(np.asarray(x, np.float32))
        out.append(b64(flat[leaf_index(flat.size)]))
    return out


def audit_fields(step: int, live_slices: int, before_params, after_params, before_opt, after_opt) -> dict:
    """The inner_audit line's fields for inner step `step` (1-based, global)."""
    was, now = adam_view(before_opt), adam_view(after_opt)
    fields = {"step": step, "live_slices": live_slices,
              "theta": [b64(np.ravel(np.asarray(x, np.float32))) for x in jax.tree.leaves(before_params)],
              "count": was["count"], "lr_count": was["lr_count"],
              "mu": _picked(was["mu"]), "nu": _picked(was["nu"]),
              "after": {"theta": _picked(jax.tree.leaves(after_params)), "mu": _picked(now["mu"]),
                        "nu": _picked(now["nu"])}}
    if was["noise"] is not None:
        fields["noise"] = _picked(was["noise"])
        fields["after"]["noise"] = _picked(now["noise"])
    return fields
