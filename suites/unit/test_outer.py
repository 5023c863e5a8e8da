"""trainer/numerics/outer.py: numbers checked by hand and against optax directly."""
from __future__ import annotations

import math

import numpy as np
import optax
import pytest

from diloco_chaos.trainer.config import OuterOptConfig
from diloco_chaos.trainer.numerics.outer import (OuterOptimizer, contribution_weight, fragment_norm, merge, mix,
                                                 pseudo_grad)


def f32(*xs):
    return [np.array(x, np.float32) for x in xs]


def test_pseudo_grad_is_global_minus_local():
    d = pseudo_grad(f32([1, 2], [[3.0]]), f32([0.5, 2.5], [[1.0]]))
    np.testing.assert_array_equal(d[0], [0.5, -0.5])
    np.testing.assert_array_equal(d[1], [[2.0]])
    assert all(x.dtype == np.float32 for x in d)


def test_nesterov_steps_on_a_two_vector_by_hand():
    # optax.sgd nesterov: trace ← g + μ·trace; update = g + μ·trace; Θ ← Θ − lr·update.
    # Θ=(1,2), Δ=(.1,−.2), lr=.7, μ=.9:
    #   step 1: trace = Δ;         Θ = Θ − .7·1.9Δ = (0.867, 2.266)
    #   step 2: trace = 1.9Δ;      update = Δ + .9·1.9Δ = 2.71Δ; Θ = (0.6773, 2.6454)
    opt = OuterOptimizer(OuterOptConfig(lr=0.7, momentum=0.9, nesterov=True))
    theta, delta = f32([1.0, 2.0]), f32([0.1, -0.2])
    state = opt.init(theta)
    np.testing.assert_array_equal(state[0], [0, 0])
    theta, state = opt.step(theta, state, delta)
    np.testing.assert_allclose(theta[0], [0.867, 2.266], rtol=1e-6)
    np.testing.assert_allclose(state[0], [0.1, -0.2], rtol=1e-6)
    theta, state = opt.step(theta, state, delta)
    np.testing.assert_allclose(theta[0], [0.6773, 2.6454], rtol=1e-6)
    np.testing.assert_allclose(state[0], [0.19, -0.38], rtol=1e-6)
    assert theta[0].dtype == np.float32


def test_outer_step_matches_optax_sgd_directly():
    rng = np.random.default_rng(0)
    theta = f32(rng.normal(size=(3, 2)), rng.normal(size=5))
    tx = optax.sgd(0.7, momentum=0.9, nesterov=True)
    ref_params, ref_state = list(theta), tx.init(list(theta))
    opt = OuterOptimizer(OuterOptConfig(lr=0.7, momentum=0.9, nesterov=True))
    state = opt.init(theta)
    for _ in range(4):
        delta = f32(rng.normal(size=(3, 2)), rng.normal(size=5))
        theta, state = opt.step(theta, state, delta)
        updates, ref_state = tx.update(delta, ref_state, ref_params)
        ref_params = optax.apply_updates(ref_params, updates)
    for got, want in zip(theta, ref_params):
        np.testing.assert_allclose(got, want, rtol=1e-6, atol=1e-7)


def test_plain_sgd_without_momentum_has_an_empty_state():
    opt = OuterOptimizer(OuterOptConfig(lr=0.5, momentum=0.0, nesterov=False))
    theta, state = opt.step(f32([1.0, 1.0]), opt.init(f32([1.0, 1.0])), f32([2.0, -2.0]))
    np.testing.assert_allclose(theta[0], [0.0, 2.0])
    assert state == []


def test_rda_of_two_orthogonal_unit_vectors_is_unit_length_at_45_degrees():
    out = merge([f32([1.0, 0.0]), f32([0.0, 1.0])], [1.0, 1.0], "rda")
    np.testing.assert_allclose(out[0], [math.sqrt(0.5), math.sqrt(0.5)], rtol=1e-6)
    mean = merge([f32([1.0, 0.0]), f32([0.0, 1.0])], [1.0, 1.0], "mean")
    np.testing.assert_allclose(mean[0], [0.5, 0.5])  # the mean shrinks to length 0.707


def test_rda_by_hand_with_weights_and_lengths():
    # Δ1 = (3, 0) w=1, Δ2 = (0, 1) w=3: radius = (1·3 + 3·1)/4 = 1.5;
    # direction ∝ (1·(1,0) + 3·(0,1))/4 = (.25, .75) → unit (1, 3)/√10.
    out = merge([f32([3.0, 0.0]), f32([0.0, 1.0])], [1.0, 3.0], "rda")
    np.testing.assert_allclose(out[0], 1.5 * np.array([1, 3]) / math.sqrt(10), rtol=1e-6)


def test_rda_norm_is_over_the_whole_fragment():
    # One learner, two tensors: RDA of a single Δ is Δ itself (per-fragment norms keep
    # its shape; per-tensor norms would not).
    d = f32([3.0, 4.0], [[0.01]])
    out = merge([d], [2.0], "rda")
    for got, want in zip(out, d):
        np.testing.assert_allclose(got, want, rtol=1e-6)
    assert fragment_norm(d) == pytest.approx(math.sqrt(25.0001))


def test_rda_guards_zero_norms():
    zero, x = f32([0.0, 0.0]), f32([0.0, 2.0])
    np.testing.assert_allclose(merge([zero, x], [1.0, 1.0], "rda")[0], [0.0, 1.0])
    np.testing.assert_array_equal(merge([zero, zero], [1.0, 1.0], "rda")[0], [0, 0])
    cancel = merge([f32([1.0, 0.0]), f32([-1.0, 0.0])], [1.0, 1.0], "rda")
    np.testing.assert_array_equal(cancel[0], [0.0, 0.0])


def test_weighted_mean_by_hand():
    out = merge([f32([1.0, 0.0], [2.0]), f32([0.0, 4.0], [6.0])], [1.0, 3.0], "mean")
    np.testing.assert_allclose(out[0], [0.25, 3.0])
    np.testing.assert_allclose(out[1], [5.0])


def test_zero_weight_contributions_are_ignored_and_all_zero_is_an_error():
    out = merge([f32([1.0]), f32([100.0])], [1.0, 0.0], "mean")
    np.testing.assert_allclose(out[0], [1.0])
    with pytest.raises(ValueError, match="every weight is zero"):
        merge([f32([1.0])], [0.0], "rda")
    with pytest.raises(ValueError, match="one weight per delta"):
        merge([f32([1.0])], [1.0, 1.0], "rda")


def test_token_weights_are_tokens_squared_over_steps():
    # 6 steps of 1024 tokens: 6144² / 6 = 6,291,456 = 1024 · 6144.
    assert contribution_weight(6144, 6, 0, "tokens", False) == 6144 ** 2 / 6 == 1024 * 6144
    # Same tokens over more (smaller) steps weigh less.
    assert contribution_weight(6144, 12, 0, "tokens", False) == 6144 ** 2 / 12
    assert contribution_weight(6144, 6, 0, "uniform", False) == 1.0
    assert contribution_weight(0, 0, 0, "tokens", True) == 0.0
    assert contribution_weight(5, 0, 0, "uniform", False) == 0.0


def test_staleness_discount():
    assert contribution_weight(10, 1, 3, "tokens", True) == pytest.approx(100 * 0.5)
    assert contribution_weight(10, 1, 0, "tokens", True) == 100.0
    assert contribution_weight(10, 1, 8, "uniform", True) == pytest.approx(1 / 3)
    assert contribution_weight(10, 1, 8, "uniform", False) == 1.0


def test_mixing():
    local, glob = f32([1.0, 3.0]), f32([3.0, 5.0])
    np.testing.assert_allclose(mix(local, glob, 0.0)[0], [3.0, 5.0])
    np.testing.assert_allclose(mix(local, glob, 0.5)[0], [2.0, 4.0])
    np.testing.assert_allclose(mix(local, glob, 0.25)[0], [2.5, 4.5])
    with pytest.raises(ValueError, match="valid: \\[0, 1\\)"):
        mix(local, glob, 1.0)
