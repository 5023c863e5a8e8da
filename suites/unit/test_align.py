"""Aligned rounds (`diloco.align`, docs/PROTOCOL.md "Aligned rounds"): a shard tells the other
live learners when a round of p opens; a learner behind the opener joins it at once and skips
the turn it replaced. Values checked by hand; each test names what it would catch."""
from __future__ import annotations

import pytest
from protocol_link import MemNet, arr, learner_math, syncer_math

from diloco_chaos.trainer.protocol.learner_core import LearnerCore
from diloco_chaos.trainer.protocol.learner_types import LearnerConfig
from diloco_chaos.trainer.protocol.messages import Contribution, FragmentUpdate, RoundOpen
from diloco_chaos.trainer.protocol.protocol_base import Log, Send
from diloco_chaos.trainer.protocol.syncer_core import SyncerCore
from diloco_chaos.trainer.protocol.syncer_core import ALIGN_WAIT_STEPS
from diloco_chaos.trainer.protocol.syncer_types import SyncerConfig

H, P = 8, 2  # fragment 1 is due at steps 4, 12, 20...; fragment 0 at 8, 16, 24...


def _learner(align: bool = True):
    """Θ0 = 0 fetched at version 0; one shard s0 owns both fragments."""
    core = LearnerCore(LearnerConfig("B", 0, ("s0", "s0"), keep_local=True, align=align), learner_math(H, P))
    state, _ = core.start(core.init([arr(0.0), arr(0.0)]), 0.0)
    for p in range(P):
        state, _ = core.receive(state, 0.0, "s0", FragmentUpdate(p, 0, True, [arr(0.0)]))
    return core, state


def _steps(core, state, n: int):
    """n inner steps (θ += 1 each); the fragments contributed, in order."""
    sent = []
    for _ in range(n):
        params = [x + 1.0 for x in core.params(state)]
        state, acts = core.after_inner_step(state, 0.0, params, 10, 1.0)
        sent += [a.msg.fragment for a in acts if isinstance(a, Send) and isinstance(a.msg, Contribution)]
    return state, sent


def _contributions(acts) -> list:
    return [a.msg for a in acts if isinstance(a, Send) and isinstance(a.msg, Contribution)]


def test_a_learner_behind_the_opener_joins_at_once_and_skips_the_turn_it_replaced():
    core, s = _learner()
    s, sent = _steps(core, s, 2)                 # step 2: fragment 1's turn is at step 4, 2 away
    assert sent == []
    s, acts = core.receive(s, 0.0, "s0", RoundOpen(1, 0))
    [c] = _contributions(acts)                   # joined now: Δ of the 2 steps made
    assert (c.fragment, c.c_steps, float(c.payload[0][0])) == (1, 2, -2.0)
    assert [a.fields for a in acts if isinstance(a, Log) and a.kind == "join"] == [
        {"fragment": 1, "version": 0, "step": 2, "early": 2}]
    s, _ = core.receive(s, 0.0, "s0", FragmentUpdate(1, 1, False, [arr(-1.0)]))  # the round's answer
    s, sent = _steps(core, s, 10)                # steps 3-12: the turn at 4 is skipped, 8 and 12 are not
    assert sent == [0, 1]
    assert s.joined == frozenset()


@pytest.mark.parametrize("why", ["ahead", "in_flight", "joined", "off", "no_progress"])
def test_a_round_open_is_ignored_by_a_learner_that_should_not_join(why):
    core, s = _learner(align=why != "off")
    steps = {"ahead": 5, "in_flight": 9, "joined": 2, "off": 2, "no_progress": 0}[why]
    s, _ = _steps(core, s, steps)  # ahead: fragment 1 went out at step 4; in flight: and is
    assert (1 in s.in_flight) == (why in ("ahead", "in_flight"))  # unanswered 5 steps later, its turn 3 away
    if why == "joined":
        s, acts = core.receive(s, 0.0, "s0", RoundOpen(1, 0))  # joins once...
        assert len(_contributions(acts)) == 1
        s, _ = core.receive(s, 0.0, "s0", FragmentUpdate(1, 1, False, [arr(-1.0)]))  # ...is answered...
        s, _ = _steps(core, s, 1)                               # ...steps on (its turn 1 away)...
    s, acts = core.receive(s, 0.0, "s0", RoundOpen(1, 0))      # ...but does not join again before its turn
    assert acts == []


def test_a_round_open_is_not_an_answer_a_cut_uplink_still_starves():
    """A learner whose uplink is cut hears the shard's RoundOpens (the downlink works): they
    must not count as hearing from it, or it would never call the shard starved and
    re-fetch (the one-way-cut scenario)."""
    core, s = _learner()
    s, _ = _steps(core, s, 3)
    heard, asked = dict(s.heard), dict(s.asked)
    s, acts = core.receive(s, 0.0, "s0", RoundOpen(0, 0))   # fragment 0's turn is 5 steps away: no join
    assert (acts, s.heard, s.asked) == ([], heard, asked)


def _net(align: bool, lag_s: float, steps_s: float = 1.0, until: float = 200.0) -> MemNet:
    """Shard s0 (K = 1, share by merged) and learners A, B, C stepping every second, B and
    C starting lag_s and 2 · lag_s later: out of phase by lag_s steps all run long."""
    net = MemNet(latency_s=0.01)
    shard = SyncerCore(SyncerConfig("s0", (0, 1), ("A", "B", "C"), tau=2, grace_gamma=0.5, fleet_share=True,
                                   share_by="merged", align=align), syncer_math())
    net.add("s0", shard, shard.init({0: [arr(0.0)], 1: [arr(0.0)]}))
    for i, name in enumerate("ABC"):
        core = LearnerCore(LearnerConfig(name, 0, ("s0", "s0"), keep_local=True, align=align), learner_math(H, P))
        net.add(name, core, core.init([arr(0.0), arr(0.0)]))
        net.connect(name, ["s0"])
        net.stepper(name, steps_s, until, first_s=1.0 + i * lag_s)
    net.run(until + 20)
    return net


def test_aligned_rounds_gather_learners_out_of_phase_without_more_contributions():
    """Three learners 1.5 steps apart: unaligned, every round holds one learner (the grace
    window, 0.5 · (2 − ...) steps, closes before the next is due); aligned, all but the
    first rounds hold all three, and each learner sends as many Δs (one per fragment per
    H steps: a join replaces a turn, it does not add one)."""
    off, on = _net(False, 1.5), _net(True, 1.5)
    n_off = [f["n"] for f in off.log("round_commit")]
    n_on = [f["n"] for f in on.log("round_commit")]
    assert set(n_off) == {1}
    assert n_on[-20:] == [3] * 20
    sent_off = [len(off.sent_msgs(Contribution, src=x)) for x in "ABC"]
    sent_on = [len(on.sent_msgs(Contribution, src=x)) for x in "ABC"]
    assert all(abs(a - b) <= 1 for a, b in zip(sent_off, sent_on)), (sent_off, sent_on)


def test_the_shard_announces_a_round_to_the_other_live_learners_and_waits_for_them():
    cfg = dict(tau=2, grace_gamma=0.5, fleet_share=True, share_by="merged")
    for align in (False, True):
        core = SyncerCore(SyncerConfig("s0", (0,), ("A", "B", "C"), align=align, **cfg), syncer_math())
        s = core.init({0: [arr(0.0)]})
        for x in "AB":  # C is not connected: not live
            s, _ = core.learner_connected(s, 0.0, x)
        s, acts = core.receive(s, 1.0, "A", Contribution("A", 0, 1, 0, 0, 8, 80, 0.5, None, [arr(1.0)]))
        opens = [(a.to, a.msg) for a in acts if isinstance(a, Send) and isinstance(a.msg, RoundOpen)]
        assert opens == ([("B", RoundOpen(0, 0))] if align else [])
        # ξ_step = 0.5 s from A's report: the window is ≥ ALIGN_WAIT_STEPS steps when aligned
        # (unaligned: 0.5 · (2 · 0.5 − 0) = 0.5 s)
        assert core.grace_s(s) == (ALIGN_WAIT_STEPS * 0.5 if align else 0.5)
