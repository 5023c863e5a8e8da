"""trainer/numerics/model.py and trainer/numerics/tasks.py: shapes, hand-checked losses and entropies,
deterministic disjoint data."""
from __future__ import annotations

import math

import jax
import jax.numpy as jnp
import numpy as np
import pytest

from diloco_chaos.trainer.config import ModelConfig, TaskConfig
from diloco_chaos.trainer.numerics import model, tasks

SMALL = ModelConfig(n_layers=2, d_model=16, n_heads=2, d_ff=32, context=8, vocab=256)


# ---------------------------------------------------------------- model

def test_param_names_and_shapes():
    params = model.init_params(SMALL, jax.random.key(0))
    shapes = jax.tree.map(lambda x: x.shape, params)
    layer = {"ln1": (16,), "qkv": (16, 3, 2, 8), "attn_out": (2, 8, 16), "ln2": (16,),
             "mlp_up": (16, 32), "mlp_down": (32, 16)}
    assert shapes == {"embed": {"tok": (256, 16), "pos": (8, 16)},
                      "final": {"ln": (16,), "unembed": (16, 256)},
                      "layer_0": layer, "layer_1": layer}
    assert all(x.dtype == jnp.float32 for x in jax.tree.leaves(params))


def test_initial_loss_is_close_to_uniform_over_the_vocab():
    params = model.init_params(SMALL, jax.random.key(0))
    tokens = jax.random.randint(jax.random.key(1), (4, 9), 0, 256)
    assert model.apply(params, tokens[:, :-1]).shape == (4, 8, 256)
    assert abs(float(model.loss(params, tokens)) - math.log(256)) < 0.05


def test_loss_is_the_mean_next_token_cross_entropy():
    params = model.init_params(SMALL, jax.random.key(0))
    tokens = np.array([[1, 2, 3, 4], [5, 5, 5, 5]], np.int32)
    logits = np.asarray(model.apply(params, tokens[:, :-1]), np.float64)
    logp = logits - np.log(np.exp(logits).sum(-1, keepdims=True))
    nll = [-logp[b, t, tokens[b, t + 1]] for b in range(2) for t in range(3)]
    assert float(model.loss(params, tokens)) == pytest.approx(np.mean(nll), rel=1e-5)


def test_attention_is_causal():
    params = model.init_params(SMALL, jax.random.key(0))
    a = np.array([[3, 1, 4, 1, 5, 9, 2, 6]], np.int32)
    b = a.copy()
    b[0, 5] = 7  # change position 5: logits before it must not move
    la, lb = model.apply(params, a), model.apply(params, b)
    np.testing.assert_array_equal(la[:, :5], lb[:, :5])
    assert not np.allclose(la[:, 5:], lb[:, 5:])


# ---------------------------------------------------------------- Markov source

def test_entropy_rate_of_a_two_state_chain_by_hand():
    # P = [[.9, .1], [.5, .5]]: π = (5/6, 1/6), H = 5/6·h(.1) + 1/6·ln 2.
    T = np.array([[0.9, 0.1], [0.5, 0.5]])
    h01 = -(0.9 * math.log(0.9) + 0.1 * math.log(0.1))
    np.testing.assert_allclose(tasks.markov_stationary(T, 1), [5 / 6, 1 / 6], rtol=1e-12)
    assert tasks.markov_entropy_rate(T, 1) == pytest.approx(5 / 6 * h01 + math.log(2) / 6,
                                                            rel=1e-12)


def test_order_two_chain_that_ignores_the_older_token_has_the_order_one_rate():
    T1 = np.array([[0.9, 0.1], [0.5, 0.5]])
    T2 = T1[np.arange(4) % 2]  # context c = 2·x_{t-1} + x_t: only x_t (c % 2) matters
    assert tasks.markov_entropy_rate(T2, 2) == pytest.approx(
        tasks.markov_entropy_rate(T1, 1), rel=1e-10)


@pytest.mark.parametrize("order", [1, 2])
def test_sampled_sequences_score_the_entropy_rate_under_the_true_chain(order):
    task = tasks.make_task(TaskConfig(markov_order=order, seq_len=32), SMALL, seed=3)
    pi, T, V = task.pi_C, task.T_CxV, task.states
    nxt = (np.arange(len(pi))[:, None] * V + np.arange(V)[None, :]) % len(pi)
    pi_next = np.zeros_like(pi)
    np.add.at(pi_next, nxt.ravel(), (pi[:, None] * T).ravel())
    np.testing.assert_allclose(pi_next, pi, atol=1e-12)  # π is stationary
    tokens = np.concatenate([task.batch(0, s) for s in range(300)])
    assert abs(task.nll_under_chain(tokens) - task.entropy_rate()) < 0.02
    assert 0.5 < task.loss_floor() < math.log(V) - 0.5  # peaked, well below uniform


def test_markov_batches_are_deterministic_disjoint_streams():
    task = tasks.make_task(TaskConfig(batch_size=4, seq_len=16), SMALL, seed=1)
    b = task.batch(2, 5)
    assert b.shape == (4, 17) and b.dtype == np.int32
    assert b.min() >= 0 and b.max() < 16
    np.testing.assert_array_equal(b, task.batch(2, 5))
    np.testing.assert_array_equal(b, tasks.make_task(TaskConfig(batch_size=4, seq_len=16),
                                                     SMALL, seed=1).batch(2, 5))
    assert not np.array_equal(b, task.batch(3, 5))
    assert not np.array_equal(b, task.batch(2, 6))
    assert not np.array_equal(b, tasks.make_task(TaskConfig(batch_size=4, seq_len=16),
                                                 SMALL, seed=2).batch(2, 5))
    evals = task.eval_batches()
    assert len(evals) == 4 and all(e.shape == (4, 17) for e in evals)
    assert not any(np.array_equal(e, task.batch(0, 0)) for e in evals)
    assert task.tokens_per_batch == 4 * 16


# ---------------------------------------------------------------- corpus

def _as_bytes(region) -> list[bytes]:
    return [c.astype(np.uint8).tobytes() for c in region]


def test_contiguous_corpus_shards_are_disjoint_regions_of_python_source():
    cfg = TaskConfig(kind="corpus", batch_size=4, seq_len=16, corpus_mb=0.3, corpus_split="contiguous")
    task = tasks.make_task(cfg, SMALL, seed=0, learners=3)
    raw, _ = tasks.stdlib_corpus(300_000)
    assert len(raw) == 300_000 and b"def " in raw and b"import " in raw
    regions = task.shards + [task.eval_region]
    assert sum(r.size for r in regions) == 300_000
    joined = b"".join(b for r in regions for b in _as_bytes(r))
    assert joined == raw  # contiguous, in order, nothing dropped or repeated
    for m in range(3):
        shard = _as_bytes(task.shards[m])[0]
        for row in task.batch(m, 7):
            assert row.astype(np.uint8).tobytes() in shard
    for e in task.eval_batches():
        for row in e:
            assert row.astype(np.uint8).tobytes() in _as_bytes(task.eval_region)[0]
    np.testing.assert_array_equal(task.batch(1, 7), task.batch(1, 7))
    with pytest.raises(ValueError, match="learner index 3 out of range"):
        task.batch(3, 0)
    assert task.loss_floor() is None and len(task.describe()["corpus_sha256"]) == 64


def test_shuffled_corpus_deals_disjoint_chunks_from_the_whole_library():
    cfg = TaskConfig(kind="corpus", batch_size=4, seq_len=16, corpus_mb=0.3, corpus_chunk=1000)
    task = tasks.make_task(cfg, SMALL, seed=0, learners=3)
    raw, _ = tasks.stdlib_corpus(300_000)
    # 300 chunks of 1,000 bytes: 15 held out (5 %), 285 dealt 95 / 95 / 95
    assert [s.shape for s in task.shards] == [(95, 1000)] * 3 and task.eval_region.shape == (15, 1000)
    chunks = [raw[i:i + 1000] for i in range(0, 300_000, 1000)]
    held = [_as_bytes(r) for r in task.shards + [task.eval_region]]
    assert sorted(b for h in held for b in h) == sorted(chunks)  # every chunk once
    # each shard samples the whole library: chunks from every third of it
    for shard in held[:3]:
        where = sorted(chunks.index(c) * 3 // 300 for c in shard)
        assert set(where) == {0, 1, 2}
    for m in range(3):
        for row in task.batch(m, 7):  # a window lies inside one of its own chunks
            assert any(row.astype(np.uint8).tobytes() in c for c in held[m])
    for row in task.eval_batches()[0]:
        assert any(row.astype(np.uint8).tobytes() in c for c in held[3])
    # the split is the run seed's: another seed deals other chunks
    other = tasks.make_task(cfg, SMALL, seed=1, learners=3)
    assert _as_bytes(other.shards[0]) != held[0]
    with pytest.raises(ValueError, match="corpus_chunk = 10 is shorter than a batch row"):
        TaskConfig(kind="corpus", seq_len=16, corpus_chunk=10)


# ---------------------------------------------------------------- quadratic

def test_quadratic_optimum_attains_the_floor_and_has_zero_global_gradient():
    task = tasks.make_task(TaskConfig(kind="quadratic", dim=4, quad_blocks=3,
                                      batch_size=8), SMALL, seed=5, learners=4)
    opt = task.optimum()
    assert sorted(opt) == ["layer_0", "layer_1", "layer_2"] and opt["layer_0"]["w"].shape == (4,)

    def global_loss(p):
        return sum(task.loss_fn(p, e) for e in task.eval_batches()) / 4

    assert float(global_loss(opt)) == pytest.approx(task.loss_floor(), rel=1e-5)
    grads = jax.grad(global_loss)(opt)
    assert max(float(jnp.max(jnp.abs(g))) for g in jax.tree.leaves(grads)) < 1e-5
    start = task.init_params(jax.random.key(0))
    assert float(global_loss(start)) > task.loss_floor() + 0.1
    y = task.batch(1, 0)
    assert y.shape == (8, 12) and y.dtype == np.float32
    assert np.std(y - task.b_MxN[1][None, :]) == pytest.approx(0.1, rel=0.3)
    np.testing.assert_array_equal(y, task.batch(1, 0))
    assert task.tokens_per_batch == 8
