"""Adam whose second moment is the fleet's: a learner unit normalises its steps as if it
saw the whole fleet's batch (`InnerOptConfig.second_moment = "fleet"`, docs/TRAINER_MATH.md).

Why. Adam divides each coordinate's momentum by √v, v ≈ E[g²] = μ² + σ²/B for a batch
of B rows (μ the true gradient, σ² the per-row noise). Data-parallel computes one
gradient over the M learners' batches, so its v holds σ²/(M·B); a DiLoCo learner unit
sees only its own B rows, and where noise dominates its steps are √M times shorter
along μ. Averaging M such learners (the outer step) cancels their noise, not that
shrink: fault-free on the corpus task, 4 learners averaging their parameters after
*every* inner step (no local drift at all) still end 10.4 % above data-parallel, and
the gap falls to 3 % with 4× larger learner batches.

What. Each step's gradient is computed on two equal groups of the batch's rows (the
same rows, the same compute, one vmapped call); their spread, (g_a − g_b)²/4, estimates
σ²/B per coordinate, kept as an EMA `s` with Adam's b2 and bias correction. The learner
then divides by

    v_fleet = max(v̂ − (1 − 1/M)·ŝ,  v̂ / M)

i.e. its v with (M − 1)/M of its own batch noise taken out: the v of a batch M times
larger (the floor v̂/M is a fully noise-dominated coordinate's). With M = 1, or without
the `noise` argument (the data-parallel baseline, whose mean gradient already has the
fleet's batch), it is Adam exactly (tested against optax.adamw). The loss must be a mean
over the batch's rows (the gradient of the batch is then the mean of its groups'), as
every built-in task's is; a plug-in whose loss is not sets `second_moment = "own"`.

Measured with parameters averaged after every inner step: on Markov (every learner draws
from one chain) 1.7268 against data-parallel's 1.7270 (plain Adam 1.7287); on the corpus
+2.2 % remains (plain +10.4 %): the global-norm clip, judged on the learner's own noisier
norm (68 % of its steps clipped, DP's 41 %). Judged on the fleet's norm, estimated from
the same two groups, it ends at −0.07 %, but between syncs the larger steps drift more
and at H = 6 the protocol is no better (docs/BENCHMARKS.md "parity"), so it is not built.
The estimate is per coordinate and noisy, so its E[1/√v] exceeds DP's: on rows dealt
i.i.d. to every learner the same reference ends 2.2 % *below* data-parallel.
"""
from __future__ import annotations

from typing import Any, NamedTuple

import jax
import jax.numpy as jnp
import optax


class FleetAdamState(NamedTuple):
    count: jax.Array
    mu: Any
    nu: Any
    noise: Any  # EMA of the per-step estimate of σ²/B


def scale_by_fleet_adam(fleet: float, b1: float, b2: float, eps: float = 1e-8) -> optax.GradientTransformationExtraArgs:
    """optax.scale_by_adam with the second moment corrected to a batch `fleet` times larger;
    `update(..., noise=tree)` takes the step's noise estimate (same tree as the gradient)."""

    def init(params):
        zeros = jax.tree.map(jnp.zeros_like, params)
        return FleetAdamState(jnp.zeros([], jnp.int32), zeros, zeros, zeros)

    def update(updates, state, params=None, *, noise=None, **_):
        del params
        if noise is None:
            noise = jax.tree.map(jnp.zeros_like, updates)
        count = optax.safe_increment(state.count)
        mu = jax.tree.map(lambda m, g: b1 * m + (1 - b1) * g, state.mu, updates)
        nu = jax.tree.map(lambda v, g: b2 * v + (1 - b2) * g * g, state.nu, updates)
        # the same decay as v's: v̂ − ŝ then removes exactly the noise that v's EMA holds
        # (a slower EMA of the noise, 0.99, measured worse: 2.1068 against 2.0820, seed 3)
        sn = jax.tree.map(lambda s, n: b2 * s + (1 - b2) * n, state.noise, noise)
        c1, c2 = 1 - b1 ** count, 1 - b2 ** count

        def step(m, v, s):
            v_hat = v / c2
            v_fleet = jnp.maximum(v_hat - (1 - 1 / fleet) * (s / c2), v_hat / fleet)
            return (m / c1) / (jnp.sqrt(v_fleet) + eps)

        return jax.tree.map(step, mu, nu, sn), FleetAdamState(count, mu, nu, sn)

    return optax.GradientTransformationExtraArgs(init, update)


def split_grad(loss_fn, params, batch, clip_norm: float, groups: int = 2):
    """(loss, gradient, noise): the gradient of the whole batch as the mean of `groups`
    equal groups of its rows, and from their spread the unbiased estimate of its
    per-coordinate noise variance σ²/B, Σ_j (g_j − ḡ)² / (k(k − 1)), scaled by the square
    of the factor global-norm clipping will apply to the gradient (so `noise` is in the
    clipped gradient's units). A batch whose rows do not split into `groups` equal groups
    of at least one row is split into as many as it can (one: no estimate, zero noise)."""
    n = batch.shape[0]
    k = max(d for d in range(1, min(groups, n) + 1) if n % d == 0)
    if k == 1:
        loss, grads = jax.value_and_grad(loss_fn)(params, batch)
        return loss, grads, jax.tree.map(jnp.zeros_like, grads)
    parts = batch.reshape((k, n // k) + batch.shape[1:])
    losses, per = jax.vmap(jax.value_and_grad(loss_fn), in_axes=(None, 0))(params, parts)
    grads = jax.tree.map(lambda g: g.mean(0), per)
    clip = jnp.minimum(1.0, clip_norm / jnp.maximum(optax.tree.norm(grads), 1e-12))
    noise = jax.tree.map(lambda g, m: (clip * clip) * ((g - m[None]) ** 2).sum(0) / (k * (k - 1)), per, grads)
    return losses.mean(), grads, noise
