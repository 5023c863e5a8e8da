"""The outer warm-up (`outer.warmup`, docs/PROTOCOL.md "Outer warm-up"), by hand: a
fragment's first outer steps move Θ[p] by the fleet's average step, not past it."""
from __future__ import annotations

import pytest
from protocol_link import MemNet, arr, syncer_math

from diloco_chaos.harness.scenarios.scenario import ScenarioError, scenario_from_dict
from diloco_chaos.trainer.numerics.wiring import syncer_config
from diloco_chaos.trainer.protocol.messages import Contribution
from diloco_chaos.trainer.protocol.syncer_core import SyncerCore
from diloco_chaos.trainer.protocol.syncer_types import SyncerConfig

TOPOLOGY = {"learners": ["learner-0"], "shards": {"syncer-0": [0, 1, 2]}}


def _thetas(mode: str = "decoupled", warmup: int = 2, scale: float = 0.5) -> list[float]:
    """K = 1, four live learners, fleet share 1/4, outer lr 1: A sends Δ = 4 three times,
    each against the version before; Θ[0] after each commit."""
    cfg = SyncerConfig("s0", (0,), ("A", "B", "C", "D"), mode=mode, grace_gamma=0.0, fleet_share=True,
                       outer_warmup=warmup, warmup_scale=scale)
    core = SyncerCore(cfg, syncer_math())
    net = MemNet()
    net.add("s0", core, core.init({0: [arr(0.0)]}))
    for learner in "ABCD":
        net.do("s0", "learner_connected", learner)
    out = []
    for v in range(3):
        msg = Contribution("A", 0, v + 1, 0, v, 2, 20, 1.0, None, [arr(4.0)])
        net.at(1.0 + v, lambda m=msg: net.do("s0", "receive", "A", m))
        net.run(1.5 + v)
        out.append(float(net.states["s0"].theta[0][0][0]))
    return out


def test_the_first_outer_steps_of_a_fragment_are_scaled():
    """Θ ← Θ − lr · share · scale · Δ: 0 − 1 · ¼ · ½ · 4 = −0.5 at versions 1 and 2
    (warm-up 2), then the full quarter: −1 − 1 = −2."""
    assert _thetas() == [-0.5, -1.0, -2.0]
    assert _thetas(warmup=0) == [-1.0, -2.0, -3.0]      # off: every step in full
    assert _thetas(scale=1.0) == [-1.0, -2.0, -3.0]     # outer lr ≤ 1: nothing to hold back


def test_the_warm_up_is_decoupled_only():
    """streaming keeps its outer lr from the start (its rounds hold every learner)."""
    assert _thetas(mode="streaming", warmup=2) != _thetas(mode="decoupled", warmup=2)


@pytest.mark.parametrize("lr,scale", [(1.3, 1 / 1.3), (1.0, 1.0), (0.7, 1.0)])
def test_the_scale_brings_the_outer_lr_to_the_fleet_average(lr, scale):
    d = {"name": "x", "seed": 1, "train": {"steps": 10, "duration": 5, "outer_lr": lr, "outer_warmup": 7}}
    cfg = syncer_config(scenario_from_dict(d).run_config(), TOPOLOGY, "syncer-0")
    assert (cfg.outer_warmup, cfg.warmup_scale) == (7, pytest.approx(scale))


def test_a_bad_warm_up_names_the_scenario_key():
    d = {"name": "x", "seed": 1, "train": {"steps": 10, "duration": 5, "outer_warmup": -1}}
    with pytest.raises(ScenarioError, match="train.outer_warmup"):
        scenario_from_dict(d).run_config()
