"""trainer/numerics/fragments.py: hand-checked bin packing, strided layout, get/set, schedule."""
from __future__ import annotations

import jax
import numpy as np
import pytest

from diloco_chaos.trainer.config import ModelConfig
from diloco_chaos.trainer.numerics import model
from diloco_chaos.trainer.numerics.fragments import Fragmenter, due_fragment, due_fragments, flatten_with_paths

CFG = ModelConfig(n_layers=2, d_model=16, n_heads=2, d_ff=32, context=8, vocab=64)


def toy():
    z = np.zeros
    return {"a": z(10, np.float32), "b": z(7, np.float32),
            "g": {"c": z(5, np.float32), "d": z((5, 1), np.float32)}, "e": z(3, np.float32)}


def test_balanced_packing_by_hand():
    # Largest first into the lightest bin, ties to the lower bin:
    # a10→0, b7→1, g/c5→1 (10 vs 7), g/d5→0 (10 vs 12), e3→1 (15 vs 12).
    f = Fragmenter(toy(), 2, "balanced")
    assert f.leaf_paths(0) == ["a", "g/d"]
    assert f.leaf_paths(1) == ["b", "e", "g/c"]  # tree (sorted path) order inside
    assert f.sizes() == [15, 15]


def test_balanced_model_fragments_partition_the_leaves_evenly():
    params = model.init_params(CFG, jax.random.key(0))
    f = Fragmenter(params, 3, "balanced")
    paths = [p for p, _ in flatten_with_paths(params)]
    assigned = sum((f.leaf_paths(p) for p in range(3)), [])
    assert sorted(assigned) == sorted(paths) and len(assigned) == len(set(assigned))
    sizes = [int(np.size(x)) for _, x in flatten_with_paths(params)]
    assert sum(f.sizes()) == sum(sizes)
    assert max(f.sizes()) - min(f.sizes()) <= max(sizes)
    assert f.sizes() == Fragmenter(params, 3, "balanced").sizes()  # deterministic


def test_strided_layers_go_round_robin_and_embed_final_share_one():
    params = model.init_params(CFG, jax.random.key(0))
    f3 = Fragmenter(params, 3, "strided")  # P = n_layers + 1
    assert {p.split("/")[0] for p in f3.leaf_paths(0)} == {"layer_0"}
    assert {p.split("/")[0] for p in f3.leaf_paths(1)} == {"layer_1"}
    assert {p.split("/")[0] for p in f3.leaf_paths(2)} == {"embed", "final"}
    assert [f3.is_embedding(p) for p in range(3)] == [False, False, True]
    f2 = Fragmenter(params, 2, "strided")  # embed/final go to n_layers % P = 0
    assert {p.split("/")[0] for p in f2.leaf_paths(0)} == {"embed", "final", "layer_0"}
    assert {p.split("/")[0] for p in f2.leaf_paths(1)} == {"layer_1"}


def test_a_layout_with_an_empty_fragment_is_rejected():
    params = model.init_params(CFG, jax.random.key(0))
    with pytest.raises(ValueError, match=r"fragment\(s\) \[3\] empty .*2 layers"):
        Fragmenter(params, 4, "strided")
    with pytest.raises(ValueError, match="empty"):
        Fragmenter(toy(), 6, "balanced")
    with pytest.raises(ValueError, match="valid: balanced, strided"):
        Fragmenter(toy(), 2, "random")


def test_get_and_set_round_trip_and_leave_other_fragments_alone():
    params = model.init_params(CFG, jax.random.key(0))
    f = Fragmenter(params, 3, "balanced")
    frag = f.get(params, 1)
    assert all(x.dtype == np.float32 and isinstance(x, np.ndarray) for x in frag)
    new = f.set(params, 1, [2 * x + 1 for x in frag])
    for got, want in zip(f.get(new, 1), frag):
        np.testing.assert_array_equal(got, 2 * want + 1)
    for p in (0, 2):
        for got, want in zip(f.get(new, p), f.get(params, p)):
            np.testing.assert_array_equal(got, want)
    np.testing.assert_array_equal(f.get(params, 1)[0], frag[0])  # the input is not mutated
    frag[0][...] = 99  # get returns copies
    assert not np.any(f.get(params, 1)[0] == 99)
    with pytest.raises(ValueError, match="has shape"):
        f.set(params, 1, [x[..., :1] for x in frag])
    with pytest.raises(ValueError, match="leaves, got"):
        f.set(params, 1, frag[:-1])


def test_schedule_for_h6_p3_by_hand():
    # offsets (p·H)//P = 0, 2, 4; fragment p due when (s − offset) % 6 == 0, s >= 1.
    table = [due_fragment(s, 6, 3) for s in range(0, 19)]
    assert table == [None, None, 1, None, 2, None, 0, None, 1, None, 2, None, 0,
                     None, 1, None, 2, None, 0]


def test_schedule_each_fragment_every_h_steps_one_at_a_time():
    for H, P in [(6, 3), (4, 4), (8, 3), (24, 24), (5, 1)]:
        seen = {p: [] for p in range(P)}
        for s in range(1, 6 * H + 1):
            due = due_fragments(s, H, P)
            assert len(due) <= 1
            for p in due:
                seen[p].append(s)
        for p in range(P):
            assert np.all(np.diff(seen[p]) == H) and len(seen[p]) == 6


def test_schedule_with_h_below_p():
    assert due_fragments(2, 2, 3) == [0, 1]  # offsets 0, 0, 1
    with pytest.raises(ValueError, match="H = 2 < fragments P = 3"):
        due_fragment(2, 2, 3)


def test_rebase_moves_a_fragment_onto_new_values_keeping_its_drift():
    """leaf ← new + (leaf − ref), fragment p only: a = 5, ref 2, new 10 -> 13."""
    params = {"a": jax.numpy.full((2,), 5.0), "b": jax.numpy.full((3,), 7.0)}
    fr = Fragmenter(params, 2)
    p = fr.fragment_of("a")
    out = fr.rebase(params, p, [np.full((2,), 10.0, np.float32)], [np.full((2,), 2.0, np.float32)])
    assert np.asarray(out["a"]).tolist() == [13.0, 13.0] and out["b"] is params["b"]
