"""Silent data corruption: the learner's corruption (trainer/protocol/sdc.py), the shard's guard
(SyncerCore._guard: non-finite Δs and norm outliers dropped `reason=corrupt`), its planted
bug `trust_payloads`, and the `corrupt` fault's validation. Values worked out by hand."""
from __future__ import annotations

import dataclasses
import math

import numpy as np
import pytest
from protocol_link import MemNet, arr, syncer_math

from diloco_chaos.faults.fields import FieldError
from diloco_chaos.faults.overlaps import conflict
from diloco_chaos.faults.kinds import Corrupt, KillUnit
from diloco_chaos.trainer.protocol import compression, sdc
from diloco_chaos.trainer.protocol.messages import Contribution
from diloco_chaos.trainer.protocol.syncer_core import SyncerCore
from diloco_chaos.trainer.protocol.syncer_types import SyncerConfig

# the guard's size of a Δ: here the L2 norm (the trainer's is the rms, trainer/numerics/wiring.py), so
# the figures below are lengths a person can check by hand
NORM = dataclasses.replace(syncer_math(), rms=lambda arrays: float(np.sqrt(sum(np.sum(np.square(a)) for a in arrays))))


def shard(bugs=frozenset(), factor=10.0, theta=(100.0, 0.0)) -> MemNet:
    """One shard, fragment 0 starting at Θ = `theta`; K = 1, every contribution commits."""
    cfg = SyncerConfig("s0", (0,), ("A", "B"), quorum=1, grace_gamma=0.0, ema_weight=1.0,
                       guard_factor=factor, bugs=bugs)
    core = SyncerCore(cfg, NORM)
    net = MemNet()
    net.add("s0", core, core.init({0: [arr(*theta)]}))
    for learner in ("A", "B"):
        net.do("s0", "learner_connected", learner)
    return net


def delta(seq: int, d, steps: int = 1, base: int | None = None) -> Contribution:
    return Contribution("A", 0, seq, 0, seq - 1 if base is None else base, steps, 10 * steps, 1.0, None,
                        [np.asarray(d, np.float64)])


def feed(net: MemNet, *deltas) -> list[str]:
    for c in deltas:
        net.do("s0", "receive", c.learner, c)
    return [d["reason"] for d in net.log("drop")]


def test_the_guard_drops_a_norm_outlier_once_it_has_four_norms():
    # norms per step 5 (|(3, 4)| = 5) four times: the largest is 5, the bound 10 × 5 = 50
    net = shard()
    feed(net, *[delta(s, [3.0, 4.0]) for s in range(1, 5)])
    assert feed(net, delta(5, [36.0, 48.0])) == ["corrupt"]    # 60 > 50
    assert feed(net, delta(6, [30.0, 40.0], base=4)) == ["corrupt"]  # 50: at the bound, kept (no new drop)
    d = net.log("drop")[0]
    assert (d["rms_per_step"], d["recent_max"], d["guard_factor"]) == (60.0, 5.0, 10.0)
    assert [m["seq"] for m in net.log("merge")] == [1, 2, 3, 4, 6]


def test_the_guards_reference_is_the_largest_recent_size_so_warm_up_growth_passes():
    # sizes per step 0.1, 0.5, 1, 2 (an lr warm-up): the median would be 1 (bound 10: 15
    # dropped), the largest is 2 (bound 20: 15 kept); 25 is over 10 × 2 and dropped
    net = shard(theta=(1e6, 0.0))
    feed(net, *[delta(s, [x, 0.0]) for s, x in enumerate([0.1, 0.5, 1.0, 2.0], 1)])
    assert feed(net, delta(5, [15.0, 0.0])) == []
    assert feed(net, delta(6, [160.0, 0.0])) == ["corrupt"]   # 160 > 10 × 15, the largest now
    assert net.log("drop")[0]["recent_max"] == 15.0


def test_a_delta_of_size_0_is_not_remembered_so_it_cannot_make_a_bound_of_0():
    # H = P: a fragment's first Δs cover steps at lr 0 (size 0). Remembered, four of them
    # made the bound 10 × 0 = 0 and every later Δ was dropped (the corpus run at H = 3)
    net = shard()
    feed(net, *[delta(s, [0.0, 0.0]) for s in range(1, 5)])
    assert feed(net, delta(5, [3.0, 4.0])) == []
    assert [m["seq"] for m in net.log("merge")] == [1, 2, 3, 4, 5]


def test_a_learner_takes_the_shards_answer_to_a_dropped_delta_and_contributes_again():
    """The shard drops a Δ and answers with Θ[p] at the version the Δ was taken against:
    the learner takes it as the answer (the Δ's progress gone, the steps since kept) and
    contributes p on its next turn. (It used to drop it as `old_version` and skip p's
    turns for the rest of the run.)"""
    from protocol_link import learner_math

    from diloco_chaos.trainer.protocol.learner_core import LearnerCore
    from diloco_chaos.trainer.protocol.learner_types import LearnerConfig
    from diloco_chaos.trainer.protocol.messages import FragmentUpdate
    from diloco_chaos.trainer.protocol.protocol_base import Send
    core = LearnerCore(LearnerConfig("A", 0, ("s0",), keep_local=True), learner_math(2, 1))
    s, _ = core.start(core.init([arr(0.0)]), 0.0)
    s, _ = core.receive(s, 0.0, "s0", FragmentUpdate(0, 0, True, [arr(0.0)]))

    def step(s, x):
        s, acts = core.after_inner_step(s, 0.0, [arr(x)], 10, 1.0)
        return s, [float(a.msg.payload[0][0]) for a in acts if isinstance(a, Send)]
    s, _ = step(s, 1.0)
    s, sent = step(s, 2.0)                      # Δ = 0 − 2 sent at version 0: dropped by the shard
    assert sent == [-2.0]
    s, _ = step(s, 3.0)                         # one step past the send
    s, acts = core.receive(s, 0.0, "s0", FragmentUpdate(0, 0, False, [arr(0.0)]))  # the answer: Θ still 0
    assert not [a for a in acts if getattr(a, "kind", None) == "drop"] and not s.in_flight
    assert float(s.params[0][0]) == 0.0 + (3.0 - 2.0)   # the dropped Δ's 2 gone, step 3 kept
    s, sent = step(s, 2.0)                      # step 4: due, and contributed (it was skipped forever)
    assert sent == [-2.0]
    s, _ = core.receive(s, 0.0, "s0", FragmentUpdate(0, 1, False, [arr(-1.0)]))  # merged: version 1
    # the same version again, nothing in flight: an old update, as before
    s, acts = core.receive(s, 0.0, "s0", FragmentUpdate(0, 1, False, [arr(-1.0)]))
    assert [a.fields["reason"] for a in acts if getattr(a, "kind", None) == "drop"] == ["old_version"]


def test_the_guard_compares_norms_per_inner_step():
    net = shard()
    feed(net, *[delta(s, [3.0, 4.0]) for s in range(1, 5)])  # 5 per step, the largest
    assert feed(net, delta(5, [300.0, 400.0], steps=8)) == ["corrupt"]  # 500 / 8 = 62.5 per step > 50
    assert feed(net, delta(6, [240.0, 320.0], steps=8, base=4)) == ["corrupt"]  # 50 per step: kept


def test_with_no_history_one_step_never_moves_a_fragment_by_its_own_norm():
    # Θ = (6, 8): |Θ| = 10, the bound before four norms are known (and after: both hold)
    net = shard(theta=(6.0, 8.0))
    assert feed(net, delta(1, [0.6, 0.8])) == []                 # 1 per step: kept; Θ = (5.4, 7.2), |Θ| 9
    assert feed(net, delta(2, [6.0, 8.0])) == ["corrupt"]        # 10 > 9
    assert net.log("drop")[0]["theta_rms"] == pytest.approx(9.0)
    assert feed(shard(theta=(0.0, 0.0)), delta(1, [300.0, 400.0])) == []  # Θ = 0: no bound to hold


def test_non_finite_is_dropped_from_the_first_contribution_and_the_bug_lets_it_in():
    net = shard()
    assert feed(net, delta(1, [math.nan, 1.0]), delta(2, [math.inf, 0.0], base=0)) == ["corrupt", "corrupt"]
    assert net.log("drop")[0]["rms"] == "nan" and net.log("merge") == []
    buggy = shard(bugs=frozenset({"trust_payloads"}))
    feed(buggy, *[delta(s, [3.0, 4.0]) for s in range(1, 5)])
    assert feed(buggy, delta(5, [3e6, 4e6]), delta(6, [math.nan, 0.0])) == []
    assert [m["seq"] for m in buggy.log("merge")] == [1, 2, 3, 4, 5, 6]


def test_guard_factor_0_checks_finiteness_only():
    net = shard(factor=0.0)
    assert feed(net, *[delta(s, [3.0, 4.0]) for s in range(1, 5)], delta(5, [3e6, 4e6])) == []
    assert feed(net, delta(6, [math.nan, 0.0])) == ["corrupt"]


def test_the_three_corruptions():
    rng = np.random.default_rng(0)
    x = [np.array([0.5, -0.25, 0.0, 1e-3], np.float32), np.array([[2e-4]], np.float32)]
    assert [a.tolist() for a in sdc.corrupt_arrays(x, "scale", rng, factor=1000.0)] == \
        [[500.0, -250.0, 0.0, 1.0], [[pytest.approx(0.2)]]]
    bad = sdc.corrupt_arrays(x, "nonfinite", rng)
    assert math.isnan(bad[0][np.isnan(bad[0])][0]) and np.isinf(bad[1]).sum() == 1
    flipped = sdc.corrupt_arrays(x, "bitflip", rng, flips=2)
    changed = np.concatenate([(a != b).ravel() for a, b in zip(x, flipped)])
    assert changed.sum() == 2 and flipped[0][2] == 0.0  # only non-zero values flip
    # the exponent's top bit: 0.5 = 2^-1 becomes 2^127, 1e-3 becomes ≈ 3.4e35
    big = np.concatenate([np.abs(b.ravel()) for b in flipped])[changed]
    assert all(v > 1e30 for v in big)
    assert x[0][0] == 0.5  # the inputs are untouched


def test_a_corrupted_contribution_keeps_its_counters_and_compression():
    c = Contribution("A", 0, 3, 1, 0, 6, 60, 1.0, None, compression.encode([np.ones(4, np.float32)], "int8"))
    bad, line = sdc.corrupt_contribution(c, {"mode": "scale", "factor": 1000.0}, np.random.default_rng(0))
    assert (bad.seq, bad.c_steps, bad.c_tokens, bad.payload[0].kind) == (3, 6, 60, "int8")
    assert compression.decode(bad.payload)[0].tolist() == [1000.0] * 4
    assert line == {"fragment": 1, "seq": 3, "incarnation": 0, "mode": "scale", "norm": 2.0, "corrupt_norm": 2000.0}
    off = sdc.Corrupter(0, 0, 0)
    assert off.apply(c) == (c, None)


def test_the_fault_validates_its_fields_and_conflicts():
    with pytest.raises(FieldError, match="mode.*valid: scale, bitflip, nonfinite"):
        Corrupt("learner-1", 1.0, duration_s=5.0, mode="zero")
    with pytest.raises(FieldError, match="factor"):
        Corrupt("learner-1", 1.0, duration_s=5.0, factor=1.0)
    with pytest.raises(FieldError, match="target"):
        Corrupt("syncer-0", 1.0, duration_s=5.0)
    a = Corrupt("learner-1", 1.0, duration_s=5.0)
    assert conflict(a, Corrupt("learner-1", 3.0, duration_s=5.0)) and conflict(a, KillUnit("learner-1", 2.0, 5.0))
    assert conflict(a, Corrupt("learner-2", 3.0, duration_s=5.0)) is None
