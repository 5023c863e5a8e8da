"""trainer/config.py: validation messages and exact JSON round trips."""
from __future__ import annotations

import json

import pytest

from diloco_chaos.trainer.config import (DilocoConfig, InnerOptConfig, ModelConfig, OuterOptConfig,
                                         RunConfig, TaskConfig)


def test_defaults_are_the_documented_ones():
    cfg = RunConfig()
    assert (cfg.model.n_layers, cfg.model.d_model, cfg.model.n_heads, cfg.model.d_ff,
            cfg.model.context, cfg.model.vocab) == (2, 64, 4, 256, 64, 256)
    assert (cfg.inner.lr, cfg.inner.b1, cfg.inner.b2, cfg.inner.weight_decay,
            cfg.inner.warmup_steps, cfg.inner.total_steps, cfg.inner.clip_norm) == (
        3e-3, 0.9, 0.95, 0.1, 20, 400, 1.0)
    assert (cfg.outer.lr, cfg.outer.momentum, cfg.outer.nesterov, cfg.outer.warmup) == (1.3, 0.0, True, 40)
    d = cfg.diloco
    assert (d.learners, d.slices, d.fragments, d.sync_every, d.overlap, d.mixing,
            d.quorum, d.grace_factor) == (4, 1, 3, 6, 1, 0.0, 1, 0.5)
    assert (d.merge, d.weighting, d.staleness_discount, d.compression, d.fragmentation,
            d.mode) == ("rda", "tokens", True, "fp32", "balanced", "decoupled")
    assert (cfg.task.kind, cfg.task.batch_size, cfg.task.seq_len) == ("markov", 16, 64)


def test_fragments_zero_means_one_per_layer_plus_one():
    cfg = RunConfig(model=ModelConfig(n_layers=3), diloco=DilocoConfig(fragments=0))
    assert cfg.n_fragments == 4
    assert RunConfig().n_fragments == 3


@pytest.mark.parametrize("make, field, valid", [
    (lambda: ModelConfig(n_layers=0), "ModelConfig.n_layers", "[1, 64]"),
    (lambda: ModelConfig(d_model=65), "ModelConfig.d_model", "divisible"),
    (lambda: InnerOptConfig(lr=0), "InnerOptConfig.lr", "(0.0, 10.0]"),
    (lambda: InnerOptConfig(b2=1.0), "InnerOptConfig.b2", "[0.0, 1.0)"),
    (lambda: InnerOptConfig(warmup_steps=400), "InnerOptConfig.warmup_steps", "[0, 399]"),
    (lambda: OuterOptConfig(momentum=1.0), "OuterOptConfig.momentum", "[0.0, 1.0)"),
    (lambda: OuterOptConfig(nesterov=1), "OuterOptConfig.nesterov", "true or false"),
    (lambda: DilocoConfig(quorum=5), "DilocoConfig.quorum", "[1, 4]"),
    (lambda: DilocoConfig(mixing=1.0), "DilocoConfig.mixing", "[0.0, 1.0)"),
    (lambda: DilocoConfig(grace_factor=-0.1), "DilocoConfig.grace_factor", "[0.0, 1.0)"),
    (lambda: DilocoConfig(merge="median"), "DilocoConfig.merge", "'rda', 'mean'"),
    (lambda: DilocoConfig(compression="int2"), "DilocoConfig.compression", "'int4'"),
    (lambda: DilocoConfig(mode="async"), "DilocoConfig.mode", "'sync_diloco'"),
    (lambda: DilocoConfig(share_by="all"), "DilocoConfig.share_by", "'quorum', 'merged'"),
    (lambda: DilocoConfig(align="yes"), "DilocoConfig.align", "true or false"),
    (lambda: TaskConfig(kind="images"), "TaskConfig.kind", "'quadratic'"),
    (lambda: TaskConfig(markov_states=32, markov_order=3), "markov_order", "1024"),
    (lambda: RunConfig(task=TaskConfig(batch_size=6), diloco=DilocoConfig(slices=4)),
     "TaskConfig.batch_size", "DilocoConfig.slices = 4"),
    (lambda: RunConfig(task=TaskConfig(seq_len=65)), "TaskConfig.seq_len", "[1, 64]"),
    (lambda: RunConfig(seed=-1), "RunConfig.seed", "[0, 4294967295]"),
    (lambda: RunConfig(diloco=DilocoConfig(fragments=8, sync_every=6)), "DilocoConfig.sync_every", "sync_every >= 8"),
    (lambda: RunConfig(diloco=DilocoConfig(mode="sync_diloco")), "DilocoConfig.fragments", "fragments = 1"),
    (lambda: RunConfig(diloco=DilocoConfig(mode="sync_diloco", fragments=1, sync_every=1)),
     "DilocoConfig.sync_every", "valid: sync_every > overlap (e.g. overlap = 0)"),
    (lambda: RunConfig(diloco=DilocoConfig(mode="streaming", fragments=3, sync_every=3, overlap=3)),
     "DilocoConfig.overlap = 3", "sync_every > overlap"),
])
def test_bad_values_name_the_field_and_the_valid_range(make, field, valid):
    with pytest.raises(ValueError) as err:
        make()
    assert field in str(err.value) and valid in str(err.value)


def test_bool_is_not_accepted_as_an_int():
    with pytest.raises(ValueError, match="DilocoConfig.learners must be an int"):
        DilocoConfig(learners=True)


def test_json_round_trip_is_exact():
    cfg = RunConfig(
        name="wan-brownout", seed=7, steps=120,
        model=ModelConfig(n_layers=3, d_model=32, n_heads=2, d_ff=64, context=32),
        inner=InnerOptConfig(lr=1e-3, warmup_steps=5, total_steps=120),
        outer=OuterOptConfig(lr=0.5, momentum=0.0, nesterov=False),
        diloco=DilocoConfig(learners=3, slices=2, fragments=0, quorum=2, mixing=0.5,
                            merge="mean", weighting="uniform", staleness_discount=False,
                            compression="int4", fragmentation="strided", mode="streaming"),
        task=TaskConfig(kind="corpus", batch_size=8, seq_len=32))
    text = json.dumps(cfg.to_dict(), sort_keys=True)
    back = RunConfig.from_dict(json.loads(text))
    assert back == cfg
    assert json.dumps(back.to_dict(), sort_keys=True) == text


def test_ints_given_for_floats_round_trip_as_floats():
    cfg = RunConfig(outer=OuterOptConfig(lr=1))
    assert isinstance(cfg.outer.lr, float)
    assert RunConfig.from_dict(json.loads(json.dumps(cfg.to_dict()))) == cfg


def test_missing_keys_take_defaults():
    assert RunConfig.from_dict({"seed": 3, "diloco": {"learners": 2}}) == RunConfig(
        seed=3, diloco=DilocoConfig(learners=2))


def test_unknown_keys_name_the_key_and_the_valid_ones():
    with pytest.raises(ValueError, match=r"unknown key RunConfig\.diloco\.learner;"
                                         r" valid keys: learners, slices"):
        RunConfig.from_dict({"diloco": {"learner": 2}})
    with pytest.raises(ValueError, match=r"unknown key RunConfig\.stepz; valid keys: "
                                         r"name, seed, model"):
        RunConfig.from_dict({"stepz": 3})


def test_configs_are_frozen_and_hashable():
    cfg = RunConfig()
    with pytest.raises(AttributeError):
        cfg.seed = 1  # type: ignore[misc]
    assert hash(cfg) == hash(RunConfig())
