"""The outer math for one fragment: a fragment is a list of float32 arrays.

    pseudo_grad          Δ_m = Θ[p] − θ_m[p]
    contribution_weight  w_m = c_tokens² / c_steps   (× (1 + staleness)^-0.5)
    merge                weighted mean, or radial-directional averaging (RDA)
    OuterOptimizer       optax.sgd(lr, momentum, nesterov) with the merged Δ as gradient
    mix                  θ[p] ← α·θ[p] + (1 − α)·Θ[p] when Θ[p] arrives

RDA norms are taken over the *whole fragment* (all its leaves concatenated), not
per tensor. Why: RDA should average the learners' update *directions* in the
fragment's parameter space and their *lengths* separately. Normalising each tensor
on its own would change the relative sizes of the tensors inside one learner's
update (a 64-number norm-scale delta would be blown up to the same length as a
16k-number matrix delta), so the merged step would no longer be a combination of
directions any learner actually took. Per-fragment norms keep each Δ_m's shape and
only rescale it. (A fragment is also the unit that is sent and versioned.)

Everything is float32 numpy in and out; accumulation is float32 (float64 for the
scalar weights).
"""
from __future__ import annotations

from typing import Any, Sequence

import jax
import numpy as np
import optax

from diloco_chaos.trainer.config import OuterOptConfig

Fragment = list  # list[np.ndarray], float32, one entry per leaf

EPS = 1e-12  # norms below this count as zero (a zero Δ has no direction)


def _f32(frag: Sequence[Any]) -> list[np.ndarray]:
    return [np.asarray(x, dtype=np.float32) for x in frag]


def pseudo_grad(global_frag: Sequence[Any], local_frag: Sequence[Any]) -> Fragment:
    """Δ = Θ[p] − θ_m[p]: pointing from the learner's parameters back to the global
    ones, so that Θ ← Θ − lr·Δ moves the global model the way the learner went."""
    if len(global_frag) != len(local_frag):
        raise ValueError(f"fragments differ in length: {len(global_frag)} vs "
                         f"{len(local_frag)}")
    return [g - x for g, x in zip(_f32(global_frag), _f32(local_frag))]


def contribution_weight(c_tokens: float, c_steps: int, staleness: float = 0.0,
                        weighting: str = "tokens",
                        staleness_discount: bool = True, bugs: frozenset = frozenset()) -> float:
    """w = c_tokens² / c_steps ("tokens") or 1 ("uniform"); times (1 + staleness)^-0.5
    when the discount is on; 0 for a learner that made no step (c_steps == 0).

    c_tokens²/c_steps = (tokens per step) × tokens: a contribution counts in
    proportion to the data behind it and to its batch size, so a learner that lost
    a slice (smaller batches, noisier steps) weighs less per step."""
    if weighting not in ("tokens", "uniform"):
        raise ValueError(f"weighting {weighting!r} is not valid; valid: 'tokens', 'uniform'")
    if c_steps < 0 or c_tokens < 0 or staleness < 0:
        raise ValueError(f"c_steps = {c_steps}, c_tokens = {c_tokens}, staleness = "
                         f"{staleness}: all must be >= 0")
    if c_steps == 0:
        return 0.0
    w = float(c_tokens) ** 2 / c_steps if weighting == "tokens" else 1.0
    if staleness_discount:  # (planted bug steep_discount: the exponent −1, a stale Δ weighs far less)
        w *= (1.0 + staleness) ** (-1.0 if "steep_discount" in bugs else -0.5)
    return w


def fragment_norm(frag: Sequence[np.ndarray]) -> float:
    """L2 norm of all of the fragment's numbers together."""
    return float(np.sqrt(sum(np.sum(np.square(x, dtype=np.float64)) for x in frag)))


def merge(deltas: Sequence[Sequence[Any]], weights: Sequence[float],
          kind: str = "rda") -> Fragment:
    """Combine M pseudo-gradients of one fragment.

    "mean": Σ w_m·Δ_m / Σ w_m.
    "rda":  (Σ w_m‖Δ_m‖ / Σ w_m) · normalize(Σ w_m·normalize(Δ_m) / Σ w_m), with
            norms over the whole fragment; normalize(0) = 0, so a zero Δ adds length 0
            and no direction, and directions that cancel exactly give a zero update.
    Zero-weight entries are ignored; all weights zero is an error (nothing to merge).
    A non-finite Δ (NaN, ±inf) makes the result non-finite in both kinds: keeping it out
    is the SDC screen's job (trainer/protocol/guard.py), and a merge that quietly turned it into a
    zero update would hide from the checks that a corrupt Δ got in.
    """
    if kind not in ("rda", "mean"):
        raise ValueError(f"merge kind {kind!r} is not valid; valid: 'rda', 'mean'")
    if len(deltas) != len(weights) or not deltas:
        raise ValueError(f"merge needs one weight per delta and at least one delta; got "
                         f"{len(deltas)} deltas, {len(weights)} weights")
    if any(w < 0 or w != w for w in weights):
        raise ValueError(f"merge weights must be >= 0, got {list(weights)}")
    total = float(sum(weights))
    if total <= 0.0:
        raise ValueError("merge: every weight is zero; nothing to merge")
    pairs = [(float(w) / total, _f32(d)) for w, d in zip(weights, deltas) if w > 0]
    shapes = [x.shape for x in pairs[0][1]]
    for _, d in pairs:
        if [x.shape for x in d] != shapes:
            raise ValueError(f"merge: deltas differ in shapes: {shapes} vs "
                             f"{[x.shape for x in d]}")

    def weighted_sum(items: list[tuple[float, list[np.ndarray]]]) -> list[np.ndarray]:
        return [sum((np.float32(w) * d[i] for w, d in items),
                    np.zeros(shapes[i], np.float32)) for i in range(len(shapes))]

    if kind == "mean":
        return weighted_sum(pairs)
    norms = [fragment_norm(d) for _, d in pairs]
    radius = sum(w * n for (w, _), n in zip(pairs, norms))
    units = [(w, [x / np.float32(n) for x in d]) for (w, d), n in zip(pairs, norms)
             if not n <= EPS]  # (a NaN norm is not "zero": a non-finite Δ makes the merge non-finite)
    if not units:
        return [np.zeros(s, np.float32) for s in shapes]
    direction = weighted_sum(units)
    dnorm = fragment_norm(direction)
    if dnorm <= EPS:
        return [np.zeros(s, np.float32) for s in shapes]
    return [(x * np.float32(radius / dnorm)).astype(np.float32) for x in direction]


def mix(local_frag: Sequence[Any], global_frag: Sequence[Any], alpha: float) -> Fragment:
    """θ[p] ← α·θ[p] + (1 − α)·Θ[p]; α = 0 overwrites with the global fragment."""
    if not 0.0 <= alpha < 1.0:
        raise ValueError(f"mixing alpha = {alpha} out of range; valid: [0, 1)")
    if alpha == 0.0:
        return _f32(global_frag)
    a = np.float32(alpha)
    return [a * x + (np.float32(1) - a) * g
            for x, g in zip(_f32(local_frag), _f32(global_frag))]


class OuterOptimizer:
    """Nesterov SGD on one fragment, `optax.sgd(lr, momentum, nesterov)` itself:
    Θ ← Θ + optax_update(Δ), i.e. the merged Δ is the gradient and Θ moves against it.

    The state is the list of optax's state leaves (for momentum > 0: the momentum
    trace, one float32 array per fragment leaf; for momentum 0: empty), so it
    checkpoints and restores as plain arrays with no template."""

    def __init__(self, cfg: OuterOptConfig):
        self.cfg = cfg
        self.tx = optax.sgd(cfg.lr, momentum=cfg.momentum or None, nesterov=cfg.nesterov)
        self._step = jax.jit(self._step_impl)

    def init(self, frag: Sequence[Any]) -> list[np.ndarray]:
        return [np.asarray(x, np.float32) for x in jax.tree.leaves(self.tx.init(_f32(frag)))]

    def _step_impl(self, frag, state_leaves, delta):
        opt_state = jax.tree.unflatten(jax.tree.structure(self.tx.init(frag)), state_leaves)
        updates, opt_state = self.tx.update(delta, opt_state, frag)
        return optax.apply_updates(frag, updates), jax.tree.leaves(opt_state)

    def step(self, frag: Sequence[Any], state: Sequence[Any],
             merged_delta: Sequence[Any]) -> tuple[Fragment, list[np.ndarray]]:
        frag, delta = _f32(frag), _f32(merged_delta)
        if [x.shape for x in frag] != [x.shape for x in delta]:
            raise ValueError(f"outer step: fragment shapes {[x.shape for x in frag]} differ "
                             f"from merged delta shapes {[x.shape for x in delta]}")
        new_frag, new_state = self._step(frag, _f32(state), delta)
        return ([np.asarray(x, np.float32) for x in new_frag],
                [np.asarray(x, np.float32) for x in new_state])
