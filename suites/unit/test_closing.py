"""The closing contribution (trainer/protocol/learner_close.py): after a learner unit's last inner
step its remaining progress goes to Θ, and the shard keeps a learner that closed in the
fleet's count once it leaves. One fragment of one number, values checked on paper."""
from __future__ import annotations

import dataclasses
import math

import numpy as np
import pytest
from protocol_link import arr, learner_math, syncer_math

from diloco_chaos.trainer.config import RunConfig
from diloco_chaos.trainer.numerics import outer
from diloco_chaos.trainer.numerics.fragments import Fragmenter
from diloco_chaos.trainer.numerics.wiring import syncer_math as run_math
from diloco_chaos.trainer.protocol.learner_core import LearnerCore
from diloco_chaos.trainer.protocol.learner_types import LearnerConfig
from diloco_chaos.trainer.protocol.messages import Contribution, FragmentUpdate
from diloco_chaos.trainer.protocol.protocol_base import Log, Send, SetTimer
from diloco_chaos.trainer.protocol.syncer_core import SyncerCore
from diloco_chaos.trainer.protocol.syncer_core import CLOSE_HOLD_S, RESTART_HOLD_S
from diloco_chaos.trainer.protocol.syncer_types import SyncerConfig


def _learner(mode: str = "decoupled"):
    """H = 2, P = 1: fragment 0 is due every 2nd step; Θ0 = 0, fetched at version 0."""
    core = LearnerCore(LearnerConfig("A", 0, ("s0",), mode=mode, keep_local=True), learner_math(2, 1))
    state, _ = core.start(core.init([arr(0.0)]), 0.0)
    state, _ = core.receive(state, 0.0, "s0", FragmentUpdate(0, 0, True, [arr(0.0)]))
    return core, state


def _sent(acts) -> list[Contribution]:
    return [a.msg for a in acts if isinstance(a, Send) and isinstance(a.msg, Contribution)]


def _theta(state) -> float:
    return float(state.params[0][0])


def test_finish_sends_the_progress_no_delta_holds_and_waits_for_its_answer():
    core, s = _learner()
    s, _ = core.after_inner_step(s, 0.0, [arr(1.0)], 10, 1.0)   # step 1: θ = 1, not due
    assert not core.closed(s)                                     # not finished yet
    s, acts = core.finish(s, 1.0)
    (c,) = _sent(acts)
    # Δ = Θ_base − θ = 0 − 1 over the one step since the fetch, flagged closing
    assert float(c.payload[0][0]) == -1.0 and c.closing and (c.c_steps, c.c_tokens) == (1, 10)
    assert [a.fields for a in acts if isinstance(a, Log) and a.kind == "closing"] == [
        {"step": 1, "fragments": [0], "waiting": []}]
    assert not core.closed(s)                                     # its answer is still to come
    s, acts = core.receive(s, 2.0, "s0", FragmentUpdate(0, 1, False, [arr(5.0)]))
    assert core.closed(s) and _theta(s) == 5.0 and not _sent(acts)  # θ = Θ: no step since the send


def test_a_fragment_in_flight_closes_once_its_answer_comes():
    core, s = _learner()
    for x in (1.0, 2.0, 3.0):                                     # Δ = −2 out at step 2; θ = 3
        s, _ = core.after_inner_step(s, 0.0, [arr(x)], 10, 1.0)
    s, acts = core.finish(s, 1.0)
    assert not _sent(acts)                                        # bounded staleness: one Δ in flight
    assert [a.fields["waiting"] for a in acts if isinstance(a, Log) and a.kind == "closing"] == [[0]]
    s, acts = core.receive(s, 2.0, "s0", FragmentUpdate(0, 1, False, [arr(10.0)]))
    (c,) = _sent(acts)
    # the answer: θ = 10 + (3 − 2) = 11; the closing Δ = 10 − 11 = −1, step 3 alone
    assert _theta(s) == 11.0 and float(c.payload[0][0]) == -1.0 and c.closing and c.c_steps == 1
    assert not core.closed(s)
    s, _ = core.receive(s, 3.0, "s0", FragmentUpdate(0, 2, False, [arr(12.0)]))
    assert core.closed(s) and _theta(s) == 12.0


def test_nothing_to_close_is_closed_at_once_and_other_modes_do_not_close():
    core, s = _learner()
    s, acts = core.finish(s, 0.0)                                 # no step since the fetch
    assert core.closed(s) and not _sent(acts)
    core, s = _learner("sync_diloco")
    s, _ = core.after_inner_step(s, 0.0, [arr(1.0)], 10, 1.0)
    s, acts = core.finish(s, 0.0)                                 # a round of every unit: no extra Δ
    assert acts == [] and s.closing is None and not core.closed(s)


def _four(closing: bool, delta: float = 4.0, lr: float = 1.0, warmup_scale: float = 1.0):
    """A shard of fragment 0 (Θ0 = 0), no grace window, the merged learners' share, A, B, C
    and D live; A's Δ = `delta` arrives at t = 1. -> (core, state, A's actions)"""
    core = SyncerCore(SyncerConfig("s0", (0,), ("A", "B", "C", "D"), grace_gamma=0.0, fleet_share=True,
                                   share_by="merged", warmup_scale=warmup_scale), syncer_math(lr))
    state = core.init({0: [arr(0.0)]})
    for learner in "ABCD":
        state, _ = core.learner_connected(state, 0.0, learner)
    state, acts = core.receive(state, 1.0, "A", Contribution("A", 0, 1, 0, 0, 2, 20, 1.0, None, [arr(delta)],
                                                             closing=closing))
    return core, state, acts


def _a_left(closing: bool):
    """_four with A's Δ = 0, its round committed (after a closing round's hold), A gone."""
    core, state, _ = _four(closing, delta=0.0)
    state, _ = core.learner_disconnected(state, 2.0, "A")
    state, _ = core.timer(state, 1.0 + CLOSE_HOLD_S, "grace:0")
    assert state.version[0] == 1
    return core, state


@pytest.mark.parametrize("closing,expect", [(True, -1.0), (False, -4.0 / 3)])
def test_a_learner_that_closed_and_left_still_counts_in_the_fleet_share(closing, expect):
    """share_by "merged", K = 1, four learners: A's Δ = 0 commits (Θ stays 0; A's closing
    round after its hold, see below), then A leaves.
    B's Δ = 4: Θ ← 0 − 4 · 1/4 when A closed (its share is in Θ), 0 − 4 · 1/3 when A just
    went away (a dead learner's share is no longer the fleet's)."""
    core, state = _a_left(closing)
    state, _ = core.receive(state, 2.0 + CLOSE_HOLD_S, "B", Contribution("B", 0, 1, 0, 1, 2, 20, 1.0, None, [arr(4.0)]))
    assert state.version[0] == 2 and state.theta[0][0].tolist() == pytest.approx([expect])


def test_a_round_with_a_closing_delta_holds_for_every_live_learner():
    """No grace window (γ = 0): A's Δ alone commits at once, unless it is A's closing one;
    then the round waits for B, C and D (CLOSE_HOLD_S at most) and its one outer step
    averages all four: Θ = 0 − (4 + 0 + 0 + 4) / 4 · 4/4 = −2."""
    core, state, _ = _four(closing=False)
    assert state.version[0] == 1
    core, state, acts = _four(closing=True)
    assert state.version[0] == 0 and [a.at for a in acts if isinstance(a, SetTimer)][-1] == 1.0 + CLOSE_HOLD_S
    for t, (learner, d) in enumerate((("B", 0.0), ("C", 0.0), ("D", 4.0)), start=2):
        state, _ = core.receive(state, float(t), learner, Contribution(learner, 0, 1, 0, 0, 2, 20, 1.0, None,
                                                                       [arr(d)], closing=True))
        assert state.version[0] == (1 if learner == "D" else 0)
    assert state.theta[0][0].tolist() == [-2.0]


def test_a_learner_that_closed_holds_no_later_round():
    """A, B, C and D close together (one round, version 1) and stay connected for their
    answers. B's Δ that was in flight then closes too (base version 1): its round commits
    at once, since the others, closed, will send nothing more (before: it held
    CLOSE_HOLD_S for them, past a stopped run's wait). Θ = −2 − 4 · 1/4 = −3."""
    core, state, _ = _four(closing=True)
    for t, (learner, d) in enumerate((("B", 0.0), ("C", 0.0), ("D", 4.0)), start=2):
        state, _ = core.receive(state, float(t), learner, Contribution(learner, 0, 1, 0, 0, 2, 20, 1.0, None,
                                                                       [arr(d)], closing=True))
    assert state.version[0] == 1 and state.live == {"A", "B", "C", "D"}
    state, _ = core.receive(state, 5.0, "B", Contribution("B", 0, 2, 0, 1, 2, 20, 1.0, None, [arr(4.0)], closing=True))
    assert state.version[0] == 2 and state.theta[0][0].tolist() == [-3.0]


def test_the_hold_ends_at_its_deadline_with_who_is_in():
    core, state, _ = _four(closing=True)
    state, _ = core.receive(state, 2.0, "B", Contribution("B", 0, 1, 0, 0, 2, 20, 1.0, None, [arr(0.0)]))
    state, _ = core.timer(state, 1.0 + CLOSE_HOLD_S - 0.1, "grace:0")
    assert state.version[0] == 0
    state, _ = core.timer(state, 1.0 + CLOSE_HOLD_S, "grace:0")
    # A and B: (4 + 0) / 2 at two learners' share of four: Θ = 0 − 2 · 2/4 = −1
    assert state.version[0] == 1 and state.theta[0][0].tolist() == [-1.0]


@pytest.mark.parametrize("closing,expect", [(False, -2.0), (True, -1.0)])
def test_a_closing_round_steps_by_the_fleets_average_not_past_it(closing, expect):
    """Outer lr 2 (warmup_scale 1/2, no warm-up left): A's Δ = 4 at a quarter share moves Θ by
    2 · 4/4 = 2; a closing round by the average step, lr 1: 1 (fails if it steps past it)."""
    core, state, _ = _four(closing, lr=2.0, warmup_scale=0.5)
    state, _ = core.timer(state, 1.0 + CLOSE_HOLD_S, "grace:0")
    assert state.version[0] == 1 and state.theta[0][0].tolist() == [expect]


@pytest.mark.parametrize("keep", [True, False])
def test_a_restarted_shard_still_counts_the_learner_that_closed(keep):
    """As above, with the shard restarted from its snapshot between A's closing round and
    B's Δ = 4: Θ ← −4 · 1/4 only if the snapshot kept who closed (−4/3 if it forgot)."""
    core, state = _a_left(True)
    snap = core.snapshot(state)
    if not keep:
        snap = {k: v for k, v in snap.items() if k != "closed"}   # a snapshot from before
    state = core.restore(snap)
    for learner in "BCD":
        state, _ = core.learner_connected(state, 10.0, learner)
    state, _ = core.receive(state, 10.0, "B", Contribution("B", 0, 1, 0, 1, 2, 20, 1.0, None, [arr(4.0)]))
    # (a restarted shard's first round holds for the others' return: RESTART_HOLD_S)
    state, _ = core.timer(state, 10.0 + RESTART_HOLD_S, "grace:0")
    assert state.version[0] == 2
    assert state.theta[0][0].tolist() == pytest.approx([-1.0 if keep else -4.0 / 3])


@pytest.mark.parametrize("closing,expect", [(False, -math.sqrt(0.5)), (True, -0.5)])
def test_a_closing_round_merges_by_the_plain_mean(closing, expect):
    """RDA keeps the Δs' mean length: Δs (1, 0) and (0, 1) merge to (0.71, 0.71), their
    mean is (0.5, 0.5). A round of A and B (K = 2, both merged: share 1, lr 1) steps Θ by
    RDA's merge, a closing round by the mean: the run's last progress, mostly noise, is not
    stretched (fails if the core does not ask for the mean)."""
    def merge_and_step(theta, n, deltas, w, scale=1.0, mean=False):
        return [t - scale * m for t, m in zip(theta, outer.merge(deltas, w, "mean" if mean else "rda"))], n + 1
    core = SyncerCore(SyncerConfig("s0", (0,), ("A", "B"), quorum=2, grace_gamma=0.0, fleet_share=True,
                                   share_by="merged"), dataclasses.replace(syncer_math(), merge_and_step=merge_and_step))
    state = core.init({0: [arr(0.0, 0.0)]})
    for learner in "AB":
        state, _ = core.learner_connected(state, 0.0, learner)
    for learner, d in (("A", arr(1.0, 0.0)), ("B", arr(0.0, 1.0))):
        state, _ = core.receive(state, 1.0, learner, Contribution(learner, 0, 1, 0, 0, 2, 20, 1.0, None, [d],
                                                                  closing=closing))
    assert state.version[0] == 1 and state.theta[0][0].tolist() == pytest.approx([expect, expect])


def test_the_runs_math_merges_a_closing_round_by_the_mean():
    """trainer/numerics/wiring.py, RDA the run's merge, outer lr 1: the same two Δs step Θ by
    (0.71, 0.71) in an ordinary round, by (0.5, 0.5) where the core asks for the mean."""
    m = run_math(RunConfig.from_dict({"diloco": {"fragments": 1}, "outer": {"lr": 1.0}}),
                 Fragmenter({"w": np.zeros(2, np.float32)}, 1))
    theta, deltas = [np.zeros(2, np.float32)], [[np.array([1.0, 0.0], np.float32)], [np.array([0.0, 1.0], np.float32)]]
    for mean, expect in ((False, -math.sqrt(0.5)), (True, -0.5)):
        stepped, _ = m.merge_and_step(theta, m.outer_init(theta), deltas, [1.0, 1.0], 1.0, mean)
        assert stepped[0].tolist() == pytest.approx([expect, expect])
