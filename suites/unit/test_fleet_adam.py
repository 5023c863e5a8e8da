"""trainer/numerics/fleet_adam.py: Adam whose second moment is the fleet's. Checked against
optax.adamw (no noise: the same steps), by hand (one step, the floor), on the row-group
split (a gradient and its noise a person can work out), and statistically: on gradients
with known mean and noise, a learner's corrected v is data-parallel's over M learners'
batches (planted bugs: no correction, all of the noise removed, both fail)."""
from __future__ import annotations

import dataclasses

import jax
import jax.numpy as jnp
import numpy as np
import optax
import pytest

from diloco_chaos.trainer.config import InnerOptConfig, ModelConfig, RunConfig, TaskConfig
from diloco_chaos.trainer.numerics import tasks
from diloco_chaos.trainer.numerics.fleet_adam import scale_by_fleet_adam, split_grad
from diloco_chaos.trainer.numerics.inner import fleet_of, make_inner, make_optimizer

TINY = ModelConfig(n_layers=1, d_model=16, n_heads=2, d_ff=32, context=8, vocab=32)


def tiny_run(mode="decoupled", **inner) -> RunConfig:
    cfg = RunConfig(model=TINY, task=TaskConfig(batch_size=4, seq_len=8),
                    inner=InnerOptConfig(**{"warmup_steps": 2, "total_steps": 50, **inner}))
    return dataclasses.replace(cfg, diloco=dataclasses.replace(cfg.diloco, mode=mode,
                                                           fragments=1 if mode == "sync_diloco" else cfg.diloco.fragments))


def test_fleet_applies_to_diloco_modes_only():
    assert fleet_of(tiny_run()) == 4  # M learners, the default
    assert fleet_of(tiny_run("sync_diloco")) == 4
    assert fleet_of(tiny_run("dp")) == 1 and fleet_of(tiny_run("elastic_dp")) == 1
    assert fleet_of(tiny_run(second_moment="own")) == 1
    with pytest.raises(ValueError, match="InnerOptConfig.second_moment.*valid: 'fleet', 'own'"):
        InnerOptConfig(second_moment="shared")


def test_without_noise_it_is_adamw():
    """No noise argument (the dp path), or fleet 1: bit for bit the optax chain it replaces."""
    cfg = tiny_run()
    task = tasks.task_for_run(cfg)
    params = task.init_params(jax.random.key(0))
    plain, fleet = make_optimizer(cfg.inner), make_optimizer(cfg.inner, 4)
    one = optax.chain(optax.clip_by_global_norm(1.0), scale_by_fleet_adam(1, 0.9, 0.95), optax.scale(-1e-2))
    ref = optax.chain(optax.clip_by_global_norm(1.0), optax.scale_by_adam(0.9, 0.95), optax.scale(-1e-2))
    sp, sf, s1, sr = plain.init(params), fleet.init(params), one.init(params), ref.init(params)
    pp = pf = p1 = pr = params
    # each chain's update jitted (op by op it took 18-50 s of a CI worker; the same arithmetic)
    grad = jax.jit(jax.grad(task.loss_fn))
    plain_u, fleet_u, ref_u = (jax.jit(o.update) for o in (plain, fleet, ref))
    one_u = jax.jit(lambda g, s, p, n: one.update(g, s, p, noise=n))
    for step in range(4):
        g = grad(pp, task.batch(0, step))
        up, sp = plain_u(g, sp, pp)
        uf, sf = fleet_u(g, sf, pp)  # same params, so the same gradient
        pp, pf = optax.apply_updates(pp, up), optax.apply_updates(pp, uf)
        noise = jax.tree.map(lambda x: jnp.full_like(x, 0.3), g)  # fleet 1 ignores the noise
        u1, s1 = one_u(g, s1, p1, noise)
        ur, sr = ref_u(g, sr, pr)
        p1, pr = optax.apply_updates(p1, u1), optax.apply_updates(pr, ur)
        for a, b in zip(jax.tree.leaves((pp, p1)), jax.tree.leaves((pf, pr))):
            np.testing.assert_allclose(np.asarray(a), np.asarray(b), rtol=1e-6, atol=1e-8)


@pytest.mark.parametrize("noise, want", [(0.2, 0.5 / np.sqrt(0.25 - 0.75 * 0.2)),  # v̂ − ¾ŝ = 0.1
                                         (0.3, 0.5 / np.sqrt(0.25 / 4))])          # floor v̂/M: 2.0
def test_one_step_by_hand(noise, want):
    """Step 1 (bias-corrected): m̂ = g = 0.5, v̂ = 0.25, ŝ = the noise; M = 4."""
    tx = scale_by_fleet_adam(4, 0.9, 0.95, eps=0.0)
    u, state = tx.update(jnp.array([0.5]), tx.init(jnp.zeros(1)), noise=jnp.array([noise]))
    assert float(u[0]) == pytest.approx(want, rel=1e-5)
    assert int(state.count) == 1


def test_split_grad_by_hand():
    """loss = mean over rows of w·x: the gradient is the rows' mean, 4. Two groups' means
    2 and 6: noise Σ(g_j − ḡ)²/(k(k−1)) = (4 + 4)/2 = 4, times the clip factor squared."""
    loss = lambda w, b: jnp.mean(w * b)  # noqa: E731
    rows = jnp.array([1.0, 3.0, 5.0, 7.0])
    value, g, n = split_grad(loss, jnp.array(2.0), rows, clip_norm=100.0)
    assert float(value) == pytest.approx(8.0) and float(g) == pytest.approx(4.0) and float(n) == pytest.approx(4.0)
    _, g, n = split_grad(loss, jnp.array(2.0), rows, clip_norm=1.0)  # clipping will scale g by 1/4
    assert float(g) == pytest.approx(4.0) and float(n) == pytest.approx(4.0 / 16)
    _, g, n = split_grad(loss, jnp.array(2.0), rows[:3], clip_norm=100.0)  # 3 rows: no 2 equal groups
    assert float(g) == pytest.approx(3.0) and float(n) == 0.0
    six = jnp.arange(6.0)
    _, g, n = split_grad(loss, jnp.array(2.0), six, clip_norm=100.0, groups=4)  # 3 groups of 2 rows
    means = np.array([0.5, 2.5, 4.5])
    assert float(n) == pytest.approx(((means - means.mean()) ** 2).sum() / 6)


def _mean_v(fleet, B=16, mu=0.3, sigma=2.0, coords=512, steps=600, seed=0):
    """The v a learner's step divides by, read back from scale_by_fleet_adam's own update
    (u = m̂/√v at eps 0), averaged over coordinates and the last half of the steps, on
    per-row gradients μ + σ·ε (i.i.d. rows) at a fixed point."""
    rng = np.random.default_rng(seed)
    loss = lambda w, r: jnp.mean(jnp.sum(w[None, :] * r, axis=1))  # noqa: E731  gradient: the rows' mean
    grad = jax.jit(lambda r: split_grad(loss, jnp.zeros(coords), r, clip_norm=1e9))
    tx = scale_by_fleet_adam(fleet, 0.9, 0.95, eps=0.0)
    update = jax.jit(lambda g, st, n: tx.update(g, st, noise=n))
    state, out = tx.init(jnp.zeros(coords)), []
    for t in range(1, steps + 1):
        _, g, n = grad(jnp.asarray(mu + sigma * rng.standard_normal((B, coords)), jnp.float32))
        u, state = update(g, state, n)
        if t > steps // 2:
            m_hat, u = np.asarray(state.mu) / (1 - 0.9 ** t), np.asarray(u)
            ok = np.abs(u) > 1e-9
            out.append(np.mean((m_hat[ok] / u[ok]) ** 2))
    return float(np.mean(out))


def test_corrected_v_is_data_parallels():
    """Data-parallel's v over M·B rows: μ² + σ²/(M·B) = 0.09 + 4/64 = 0.1525; a learner's own
    (plain Adam, M = 1), 0.09 + 4/16 = 0.34. (Planted: without the correction the first
    assert sees 0.34; with all of the noise taken out, (1 − 1/M) → 1, it sees ≈ 0.09.)"""
    assert _mean_v(4) == pytest.approx(0.1525, rel=0.08)
    assert _mean_v(1) == pytest.approx(0.34, rel=0.08)


def test_fleet_step_uses_the_noise_of_its_batch():
    """The learner's step (fleet) differs from plain AdamW's on the same batch, the dp
    path's apply_grads does not, and a restored state has the fleet state's shape."""
    cfg = tiny_run()
    task = tasks.task_for_run(cfg)
    loop, plain = make_inner(cfg, task.loss_fn), make_inner(tiny_run(second_moment="own"), task.loss_fn)
    params = task.init_params(jax.random.key(0))
    _, _, mf = loop.step(params, loop.init(params), task.batch(0, 0))
    _, _, mp = plain.step(params, plain.init(params), task.batch(0, 0))
    assert float(mf["loss"]) == pytest.approx(float(mp["loss"]), rel=1e-5)  # the loss of the whole batch
    assert float(mf["grad_norm"]) == pytest.approx(float(mp["grad_norm"]), rel=1e-5)
    pf, sf, pp, sp = params, loop.init(params), params, plain.init(params)
    for step in range(3):  # step 0's lr is 0 (warm-up)
        pf, sf, _ = loop.step(pf, sf, task.batch(0, step))
        pp, sp, _ = plain.step(pp, sp, task.batch(0, step))
    diff = max(float(jnp.max(jnp.abs(a - b))) for a, b in zip(jax.tree.leaves(pf), jax.tree.leaves(pp)))
    assert diff > 1e-6
    leaves = [np.asarray(x) for x in jax.tree.leaves(sf)]
    back = loop.opt_state_from_tree(pf, leaves)
    assert jax.tree.structure(back) == jax.tree.structure(sf)
