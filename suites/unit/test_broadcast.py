"""Compressed broadcasts (diloco.broadcast_compression): Θ[p] comes back to a learner as a
compressed delta against the copy it holds, with error feedback (trainer/protocol/compression.py,
FragmentDelta). Numbers by hand, then the cores over the in-memory link: the learner's
copy equals the shard's record of it bit for bit, stays close to Θ, and a delta lost
with a link is detected and repaired by a fresh fetch."""
from __future__ import annotations

import numpy as np
import pytest
from protocol_link import MemNet, arr, learner_math, syncer_math

from diloco_chaos.trainer.protocol import compression
from diloco_chaos.trainer.protocol.learner_core import LearnerCore
from diloco_chaos.trainer.protocol.learner_types import LearnerConfig
from diloco_chaos.trainer.protocol.messages import Contribution, FragmentDelta, FragmentUpdate
from diloco_chaos.trainer.protocol.syncer_core import SyncerCore
from diloco_chaos.trainer.protocol.syncer_types import SyncerConfig

P, H = 1, 2


def test_int8_delta_by_hand_and_the_error_it_leaves_goes_into_the_next_one():
    theta, held = [np.array([1.0, -0.5], np.float32)], [np.zeros(2, np.float32)]
    payload, copy = compression.broadcast_delta(theta, held, "int8")
    # scale = max|Θ − copy| / 127 = 1/127; -0.5·127 = -63.5 rounds to -64 (half to even)
    assert payload[0].data.tolist() == [127, -64] and payload[0].scale == pytest.approx(1 / 127)
    assert copy[0].tolist() == pytest.approx([1.0, -64 / 127])
    # Θ did not move, but the next delta is what the first one lost: 0.5 - 64/127
    payload2, copy2 = compression.broadcast_delta(theta, copy, "int8")
    assert payload2[0].data.tolist() == [0, 127]
    assert np.abs(copy2[0] - theta[0]).max() < 1e-7
    # the learner's side rebuilds the same copy, bit for bit
    assert compression.apply_delta(copy, payload2)[0].tobytes() == copy2[0].tobytes()


@pytest.mark.parametrize("kind", ["bf16", "int8", "int4"])
def test_error_feedback_keeps_the_copy_within_one_steps_quantisation_error(kind):
    """Θ walks 200 random steps; the copy built from deltas never drifts: its error stays
    below one delta's quantisation step, where copies built from Θ_new − Θ_old would
    add up every step's error."""
    rng = np.random.default_rng(0)
    theta = [rng.normal(size=64).astype(np.float32)]
    held = naive = prev = [theta[0].copy()]  # as after the Hello's whole fragment
    worst = 0.0
    for _ in range(200):
        theta = [theta[0] + rng.normal(scale=0.01, size=64).astype(np.float32)]
        payload, held = compression.broadcast_delta(theta, held, kind)
        step = [theta[0] - prev[0]]
        naive = compression.apply_delta(naive, compression.encode(step, kind))
        prev = theta
        worst = max(worst, float(np.abs(theta[0] - held[0]).max()))
    drift = float(np.abs(theta[0] - naive[0]).max())
    # max|residual| ≈ 3σ of one move ≈ 0.03: int8's half step 0.03/254 ≈ 1.2e-4; bf16's
    # 2^-9 relative of that; int4 (E3M0, powers of two) a good part of it.
    # Measured: bf16 1.2e-4, int8 1.5e-4, int4 9.1e-3; without feedback 7e-4, 2e-3, 5.8e-2
    assert worst < {"bf16": 3e-4, "int8": 3e-4, "int4": 0.02}[kind], worst
    assert worst < drift, (worst, drift)


def shard_and_learners(learners=("A", "B"), kind="int8", bugs=frozenset()) -> MemNet:
    net = MemNet(latency_s=0.1)
    math = syncer_math()
    math = type(math)(**{**math.__dict__, "decode": compression.decode,
                         "broadcast_delta": lambda t, h: compression.broadcast_delta(t, h, kind)})
    core = SyncerCore(SyncerConfig("s0", (0,), learners, bugs=bugs), math)
    net.add("s0", core, core.init({0: [np.array([0.3, -0.7, 0.1], np.float32)]}))
    lmath = learner_math(H, P)
    lmath = type(lmath)(**{**lmath.__dict__, "apply_delta": compression.apply_delta,
                           "pseudo_grad_payload": lambda b, x: compression.encode(
                               [np.asarray(b[0], np.float32) - np.asarray(x[0], np.float32)], "fp32")})
    for name in learners:
        lc = LearnerCore(LearnerConfig(name, 0, ("s0",)), lmath)
        net.add(name, lc, lc.init([np.zeros(3, np.float32)]))
        net.connect(name, ["s0"])
    return net


def test_learners_take_compressed_deltas_and_hold_what_the_shard_thinks_they_hold():
    net = shard_and_learners()
    for name in ("A", "B"):
        net.stepper(name, 1.0, until=20.0)
    net.run(25)
    s = net.states["s0"]
    deltas = net.sent_msgs(FragmentDelta, src="s0")
    assert s.version[0] >= 10 and len(deltas) >= 2 * (s.version[0] - 1)
    # whole fragments only for the Hello's answer: every commit went out as a delta
    assert [m.rejoin for m in net.sent_msgs(FragmentUpdate, src="s0")] == [True, True]
    for name in ("A", "B"):
        learner = net.states[name]
        version, copy = s.held[(name, 0)]
        assert learner.base_version[0] == version == s.version[0]
        assert learner.base[0][0].tobytes() == copy[0].tobytes()  # bit for bit
        assert np.abs(learner.base[0][0] - s.theta[0][0]).max() < 0.05  # int8 of one step's move
    # int8 deltas are ~4x smaller than fp32 fragments (3 floats: 12 bytes vs 3 + scale)
    assert all(sum(t.nbytes for t in m.payload) == 3 for m in deltas)


def test_an_answer_lost_with_the_link_starves_the_learner_which_fetches_afresh():
    net = shard_and_learners()
    net.stepper("B", 1.0, until=40.0)           # A is idle: no other commit reaches B
    net.at(5.05, lambda: net.cut.add("B"))      # B's contribution or its answer is lost
    net.at(7.05, lambda: net.cut.discard("B"))
    net.run(45)
    starved = net.log("starved", "B")
    assert starved and starved[0]["shard"] == "s0" and starved[0]["silent_cycles"] >= 4
    hellos = [t for t, s, to, m in net.sent if s == "B" and type(m).__name__ == "Hello"]
    assert len(hellos) == 2 and hellos[1] > 7.05
    s, b = net.states["s0"], net.states["B"]
    assert b.base_version[0] == s.held[("B", 0)][0] and b.base[0][0].tobytes() == s.held[("B", 0)][1][0].tobytes()
    assert max(t for t, _, k, f in net.logs if k == "merge" and f["learner"] == "B") > starved[0]["step"]  # again


def test_a_delta_lost_with_the_link_is_dropped_as_a_base_mismatch_and_fetched_afresh():
    net = shard_and_learners()
    net.stepper("A", 1.0, until=20.0)
    net.at(5.05, lambda: net.cut.add("B"))      # B misses what is sent meanwhile
    net.at(7.05, lambda: net.cut.discard("B"))
    net.run(25)
    drops = [f for f in net.log("drop", "B") if f["what"] == "FragmentDelta"]
    assert drops and drops[0]["reason"] == "base_mismatch"
    # B asked again (Hello) and got the whole fragment, then deltas again
    hellos = [t for t, s, to, m in net.sent if s == "B" and type(m).__name__ == "Hello"]
    assert len(hellos) == 2 and hellos[1] > 7.05  # at the first delta after the cut
    s, b = net.states["s0"], net.states["B"]
    assert b.base_version[0] == s.version[0] and s.held[("B", 0)][0] == s.version[0]
    assert b.base[0][0].tobytes() == s.held[("B", 0)][1][0].tobytes()


def test_a_delta_while_the_fetch_is_awaited_is_dropped_and_the_fetch_still_lands():
    net = shard_and_learners(learners=("A",))
    net.run(1)  # A has its whole Θ (version 0)
    a = net.states["A"]
    a = type(a)(**{**a.__dict__, "awaiting": frozenset({0})})
    net.states["A"] = a
    net.do("A", "receive", "s0", FragmentDelta(0, 1, 0, compression.encode([np.ones(3, np.float32)], "int8")))
    assert net.log("drop", "A")[-1]["reason"] == "awaiting_fetch" and net.states["A"].base_version[0] == 0
    net.do("A", "receive", "s0", FragmentUpdate(0, 1, False, [np.ones(3, np.float32)]))
    assert net.states["A"].base_version[0] == 1 and not net.states["A"].awaiting


def test_fp32_broadcast_sends_whole_fragments_as_before():
    net = MemNet(latency_s=0.1)
    core = SyncerCore(SyncerConfig("s0", (0,), ("A",)), syncer_math())
    net.add("s0", core, core.init({0: [arr(0, 0)]}))
    lc = LearnerCore(LearnerConfig("A", 0, ("s0",)), learner_math(H, P))
    net.add("A", lc, lc.init([arr(0, 0)]))
    net.connect("A", ["s0"])
    net.stepper("A", 1.0, until=6.0)
    net.run(10)
    assert not net.sent_msgs(FragmentDelta) and len(net.sent_msgs(FragmentUpdate)) == 4  # the fetch + 3 commits
    assert net.states["s0"].held == {}
    assert [type(m).__name__ for m in net.sent_msgs(Contribution)] == ["Contribution"] * 3


def test_theta_whole_at_the_version_held_becomes_the_copy():
    """A shard that answers a dropped Δ (stale, corrupt) with Θ[p] whole records the learner
    as holding Θ[p] exactly. When that whole crosses the delta that already brought the same
    version, the learner must take it as its copy (θ moves with it, local progress kept):
    dropped as an old version, the delta's quantisation error stayed in the copy where the
    shard's deltas, computed against Θ[p], never reached it (int4 at H = 6: up to +34 %)."""
    lmath = learner_math(H, P)
    lmath = type(lmath)(**{**lmath.__dict__, "apply_delta": compression.apply_delta})
    core = LearnerCore(LearnerConfig("A", 0, ("s0",), keep_local=True), lmath)
    s, _ = core.start(core.init([np.zeros(3, np.float32)]), 0.0)
    s, _ = core.receive(s, 0.0, "s0", FragmentUpdate(0, 0, True, [np.zeros(3, np.float32)]))
    s, _ = core.after_inner_step(s, 0.0, [np.array([0.5, 0.5, 0.5], np.float32)], 10, 1.0)  # local progress
    theta1 = [np.array([1.0, -0.3, 0.01], np.float32)]
    payload, copy = compression.broadcast_delta(theta1, [np.zeros(3, np.float32)], "int4")
    s, _ = core.receive(s, 0.0, "s0", FragmentDelta(0, 1, 0, payload))
    assert s.base_version[0] == 1 and s.base[0][0].tobytes() == copy[0].tobytes()
    assert copy[0][2] != theta1[0][2]                        # int4 rounded 0.01 (under max/128) to 0
    s, acts = core.receive(s, 0.0, "s0", FragmentUpdate(0, 1, False, theta1))   # the whole, same version
    assert s.base[0][0].tolist() == theta1[0].tolist()       # the copy is Θ[p] now, as the shard records
    assert np.allclose(s.params[0], theta1[0] + 0.5)          # and θ kept its local progress on top
    assert [a.fields["fragment"] for a in acts if getattr(a, "kind", None) == "reanchor"] == [0]


def test_learners_holding_the_same_copy_share_one_encoded_delta():
    """A commit encodes one delta per distinct copy, not per learner: A and B took the same
    deltas, so they hold the same copy and get the same payload object (encoded once); C,
    who took Θ[p] whole since, holds another copy and gets its own. Each learner's copy is
    still the shard's record of it bit for bit. (Encoding one delta per learner per commit
    made a shard fall behind its learners on a busy machine: docs/BENCHMARKS.md.)"""
    calls = []

    def counted(t, h):
        calls.append(1)
        return compression.broadcast_delta(t, h, "int4")

    math = syncer_math()
    math = type(math)(**{**math.__dict__, "decode": compression.decode, "broadcast_delta": counted})
    core = SyncerCore(SyncerConfig("s0", (0,), ("A", "B", "C")), math)
    theta0 = [np.array([0.3, -0.7, 0.1], np.float32)]
    state = core.init({0: theta0})
    for name in "ABC":
        state, _ = core.learner_connected(state, 0.0, name)
    shared, other = [np.zeros(3, np.float32)], [np.ones(3, np.float32)]
    state = type(state)(**{**state.__dict__, "version": {0: 1},  # Θ[p] at version 1; the copies at 0
                           "held": {("A", 0): (0, shared), ("B", 0): (0, shared), ("C", 0): (0, other)}})
    state, actions = core._answer(state, 0, ["A", "B", "C"])
    sends = {a.to: a.msg for a in actions if type(a).__name__ == "Send"}
    assert len(calls) == 2                                   # one per distinct copy
    assert sends["A"].payload is sends["B"].payload and sends["C"].payload is not sends["A"].payload
    assert state.held[("A", 0)][1] is state.held[("B", 0)][1]
    for name, had in (("A", shared), ("B", shared), ("C", other)):
        rebuilt = compression.apply_delta(had, sends[name].payload)
        assert rebuilt[0].tobytes() == state.held[(name, 0)][1][0].tobytes()
