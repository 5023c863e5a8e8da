"""Learner and syncer cores joined by the in-memory link: blocking per mode, rejoin,
the data-parallel baseline, and the planted learner bug."""
from __future__ import annotations

from dataclasses import replace

import numpy as np
import pytest
from protocol_link import MemNet, arr, due_fragment, learner_math, syncer_math

from diloco_chaos.trainer.protocol.learner_core import LearnerCore
from diloco_chaos.trainer.protocol.learner_types import InFlight, LearnerConfig
from diloco_chaos.trainer.protocol.messages import Contribution, FragmentUpdate
from diloco_chaos.trainer.protocol.protocol_base import ApplyGrads, Block, IllegalTransition, Unblock
from diloco_chaos.trainer.protocol.syncer_core import SyncerCore
from diloco_chaos.trainer.protocol.syncer_types import SyncerConfig

P, H = 2, 4
SHARDS = ("s0", "s1")  # s0 owns fragment 0, s1 fragment 1


def cluster(learners=("A", "B"), mode="decoupled", latency_s=0.1, K=1, gamma=0.5, **learner_kw) -> MemNet:
    net = MemNet(latency_s)
    for p, name in enumerate(SHARDS):
        core = SyncerCore(SyncerConfig(name, (p,), learners, mode=mode, quorum=K, grace_gamma=gamma),
                          syncer_math())
        net.add(name, core, core.init({p: [arr(0, 0)]}))
    for learner in learners:
        add_learner(net, learner, 0, mode=mode, **learner_kw)
    return net


def add_learner(net: MemNet, name: str, incarnation: int, start_at: float = 0.0, **kw) -> None:
    core = LearnerCore(LearnerConfig(name, incarnation, SHARDS, **kw), learner_math(H, P))

    def boot():  # a (re)started process: fresh core and state, then connect and start
        net.add(name, core, core.init([arr(0, 0) for _ in range(P)]))
        net.connect(name, list(SHARDS))
    net.at(start_at, boot)


def blocks(net: MemNet, learner: str) -> list:
    return [(t, type(a).__name__) for t, src, a in net.other if src == learner and isinstance(a, (Block, Unblock))]


def applied(net: MemNet, learner: str) -> list:
    return [(t, [g.tolist() for g in a.grads]) for t, src, a in net.other if src == learner and isinstance(a, ApplyGrads)]


# --- blocking per mode ---------------------------------------------------------------------

@pytest.mark.parametrize("mode", ["decoupled", "streaming"])
def test_decoupled_never_blocks_streaming_blocks_after_tau(mode):
    net = cluster(learners=("A",), mode=mode, tau=2)
    net.at(0.5, lambda: net.cut.update(SHARDS))  # the shards go silent after the fetch
    net.stepper("A", 1.0, until=30)
    net.run(30)
    if mode == "decoupled":
        assert blocks(net, "A") == [] and net.states["A"].step == 30
        due = [s for s in range(1, 31) if due_fragment(s, H, P) is not None]
        assert len(due) == 15
        # one contribution per fragment, then nothing into the void: each waits for its answer
        assert [m.fragment for m in net.sent_msgs(Contribution, src="A")] == [1, 0]
        # after starve_cycles = 4 cycles (16 steps) of silence it says so and asks again
        assert {f["shard"]: f["step"] for f in net.log("starved", "A")} == {"s0": 16, "s1": 18}
        hellos = [(t, to) for t, src, to, m in net.sent if src == "A" and type(m).__name__ == "Hello"]
        assert [to for t, to in hellos if t > 1] == ["s0", "s1"]
    else:  # fragment 1 goes out at step 2 (offset (1·4)//2 = 2); τ = 2 steps later the learner waits
        assert blocks(net, "A") == [(4.0, "Block")] and net.states["A"].step == 4


def test_streaming_blocks_on_a_step_with_nothing_due():
    """τ = 1: fragment 1 leaves at step 2; step 3 sends nothing, yet τ has run out: the
    learner must say it blocks there (the metrics count its waiting from that line)."""
    net = cluster(learners=("A",), mode="streaming", tau=1)
    net.at(0.5, lambda: net.cut.update(SHARDS))
    net.stepper("A", 1.0, until=10)
    net.run(10)
    assert due_fragment(3, H, P) is None
    assert blocks(net, "A") == [(3.0, "Block")] and net.states["A"].step == 3


def test_streaming_unblocks_when_the_fragment_comes_back():
    net = cluster(learners=("A",), mode="streaming", tau=2, latency_s=1.2)
    net.stepper("A", 1.0, until=12, first_s=2.0)  # the fetch is in at 2.4
    net.run(12)
    # fragment 1 leaves at step 2 (t=3), is merged at 4.2 and back at 5.4: steps 3 and 4
    # overlap, then the learner waits until it arrives
    assert blocks(net, "A")[:2] == [(5.0, "Block"), (pytest.approx(5.4), "Unblock")]
    core, state = net.cores["A"], net.states["A"]
    stuck = replace(state, in_flight={0: InFlight(seq=1, sent_at=0.0, sent_step=state.step - 2)})
    with pytest.raises(IllegalTransition):  # the shell must honour a Block
        core.after_inner_step(stuck, 20.0, state.params, 1, 1.0)


def test_sync_diloco_with_tau_0_blocks_at_the_sync_step():
    core = LearnerCore(LearnerConfig("A", 0, ("s0",), mode="sync_diloco", tau=0), learner_math(3, 1))
    state, _ = core.start(core.init([arr(0, 0)]), 0.0)
    state, _ = core.receive(state, 0.1, "s0", FragmentUpdate(0, 0, True, [arr(0, 0)]))
    for step in (1, 2):
        state, actions = core.after_inner_step(state, step, [arr(step, step)], 10, 1.0)
        assert actions == []
    state, actions = core.after_inner_step(state, 3.0, [arr(3, 3)], 10, 1.0)
    assert [type(a).__name__ for a in actions] == ["Log", "Send", "Block", "Log"]
    assert actions[0].fields == {"fragment": 0, "seq": 1, "base_version": 0, "from_step": 0, "to_step": 3,
                                 "steps": 3, "tokens": 30}
    assert actions[1].msg.payload[0].tolist() == [-3, -3] and actions[1].msg.c_tokens == 30
    state, actions = core.receive(state, 3.5, "s0", FragmentUpdate(0, 1, False, [arr(2, 2)]))
    assert isinstance(actions[0], Unblock) and state.last_sync_s == 0.5 and state.params[0].tolist() == [2, 2]


def test_heterogeneous_learners_grace_merges_several_and_nobody_waits():
    net = cluster(learners=("A", "B", "C"), latency_s=0.05, gamma=0.9, tau=2)
    for learner, every in (("A", 1.0), ("B", 1.1), ("C", 1.6)):
        net.stepper(learner, every, until=60)
    net.run(61)
    commits = net.log("round_commit")
    assert max(c["n"] for c in commits) >= 2  # the window let slower learners in
    assert [c["version"] for c in commits if c["fragment"] == 0] == list(range(1, 1 + sum(
        c["fragment"] == 0 for c in commits)))
    ids = net.merged_ids()
    assert len(ids) == len(set(ids)) and all(blocks(net, x) == [] for x in ("A", "B", "C"))
    assert all(np.isfinite(net.states[s].theta[p][0]).all() for p, s in enumerate(SHARDS))


# --- rejoin --------------------------------------------------------------------------------

def rejoin_scenario(bugs=frozenset()) -> MemNet:
    """A and B train; B dies at 19.6 and restarts at 20.3 with fresh parameters; a message
    takes 2 s, an inner step 1 s (B's at 20.8, 21.8, ...), so Θ reaches it from 24.0 on."""
    net = cluster(latency_s=2.0, gamma=0.0, alpha=0.5)
    net.stepper("A", 1.0, until=40)
    net.stepper("B", 1.0, until=19.5)
    net.at(19.6, lambda: [net.do(s, "learner_disconnected", "B") for s in SHARDS])
    add_learner(net, "B", 1, start_at=20.3, alpha=0.5, bugs=bugs)
    net.stepper("B", 1.0, until=40, first_s=20.8)
    net.run(24.5)
    return net


def overwritten(state) -> bool:
    """θ[p] is exactly the Θ[p] last received, for every p (α = 0.5 mixing would not be)."""
    return all(x.tolist() == b[0].tolist() for x, b in zip(state.params, state.base))


def test_rejoin_fetch_overwrites_and_contributions_resume_within_a_cycle():
    net = rejoin_scenario()
    b = net.states["B"]
    assert overwritten(b) and all(v > 0 for v in b.base_version)
    # fragment 0 came with a commit at 24.0 (which satisfies the fetch), fragment 1 with the
    # Hello's rejoin reply at 24.3; the rejoin reply for 0 was then old news
    assert [f for t, src, k, f in net.logs if src == "B" and k == "drop" and t >= 20] == [
        {"what": "Contribution", "fragment": 1, "reason": "awaiting_fetch"},  # step 2, t=21.8
        {"what": "Contribution", "fragment": 0, "reason": "awaiting_fetch"},  # step 4, t=23.8
        {"what": "FragmentUpdate", "fragment": 0, "version": b.base_version[0], "reason": "old_version"}]
    net.run(40)
    mine = [(t, m) for t, s, _, m in net.sent if s == "B" and isinstance(m, Contribution) and m.incarnation == 1]
    # the fetch was in at 24.3: fragment 1, due soonest (at step 6), goes out after the next
    # step instead (step 5, 24.8; `phase` 1): a restarted unit contributes one step after its fetch
    assert mine[0][0] == pytest.approx(24.8) and mine[0][1].base_version == b.base_version[1]
    assert [f["phase"] for t, src, k, f in net.logs if src == "B" and k == "phase"] == [1]
    first_merge = min(t for t, _, k, f in net.logs if k == "merge" and f["learner"] == "B" and f["incarnation"] == 1)
    assert first_merge == pytest.approx(26.8)  # restart + fetch + one step + the trip


def test_planted_bug_rejoin_without_fetch_contributes_first_and_never_overwrites():
    net = rejoin_scenario(frozenset({"rejoin_without_fetch"}))
    early = [(t, m) for t, s, _, m in net.sent if s == "B" and isinstance(m, Contribution) and m.incarnation == 1]
    assert early[0][0] == pytest.approx(21.8) and early[0][1].base_version == 0  # before any Θ reached it
    assert not overwritten(net.states["B"])


# --- data-parallel baselines ---------------------------------------------------------------

def dp(mode: str) -> MemNet:
    net = cluster(mode=mode)
    net.at(1.0, lambda: net.do("A", "grads_ready", [arr(1, 0), arr(2, 0)], 10))
    return net


def test_dp_averages_by_tokens_and_blocks_until_every_fragment_is_back():
    net = dp("dp")
    net.at(1.0, lambda: net.do("B", "grads_ready", [arr(5, 0), arr(6, 0)], 30))
    net.run(5)
    # (10·1 + 30·5)/40 = 4 and (10·2 + 30·6)/40 = 5, applied once both shards answered
    assert applied(net, "A") == applied(net, "B") == [(pytest.approx(1.2), [[4.0, 0.0], [5.0, 0.0]])]
    assert blocks(net, "A") == [(1.0, "Block"), (pytest.approx(1.2), "Unblock")]
    assert net.cores["A"].must_wait(net.states["A"]) is False


@pytest.mark.parametrize("mode,answered", [("elastic_dp", True), ("dp", False)])
def test_a_dead_learner_stalls_dp_but_not_elastic_dp(mode, answered):
    net = dp(mode)
    net.at(2.0, lambda: [net.do(s, "learner_disconnected", "B") for s in SHARDS])
    net.run(5)
    assert applied(net, "A") == ([(pytest.approx(2.1), [[1.0, 0.0], [2.0, 0.0]])] if answered else [])
    assert net.cores["A"].must_wait(net.states["A"]) is not answered


def test_dp_mean_lost_with_the_link_is_sent_again_on_reconnect():
    net = dp("dp")
    net.at(1.0, lambda: net.do("B", "grads_ready", [arr(5, 0), arr(6, 0)], 30))
    net.at(1.15, lambda: net.cut.add("A"))  # the means to A are on the wire: lost
    net.at(2.0, lambda: (net.cut.discard("A"), net.connect("A", list(SHARDS), start=False)))
    net.run(5)
    assert applied(net, "A") == [(pytest.approx(2.2), [[4.0, 0.0], [5.0, 0.0]])]
    assert sorted(net.merged_ids()) == sorted(set(net.merged_ids()))  # each gradient averaged once
    assert [d["reason"] for d in net.log("drop", src="s0")] == ["duplicate"]


# --- streaming: what keeps rounds of every unit (K = M) from deadlocking -----------------------
# H = 4, P = 2: fragment 1 is due at steps 2, 6, …; fragment 0 at 4, 8, … (offset (p·4)//2).

def _streaming(incarnation=0, mode="streaming"):
    core = LearnerCore(LearnerConfig("B", incarnation, SHARDS, mode=mode, tau=2), learner_math(H, P))
    state, _ = core.start(core.init([arr(0, 0), arr(0, 0)]), 0.0)
    return core, state


def _update(p, version, *xs):
    return FragmentUpdate(p, version, True, [arr(*xs)])


def _step(core, state, t, x=1.0):
    return core.after_inner_step(state, t, [arr(x, x), arr(x, x)], 10, 0.1)


def test_a_restarted_streaming_unit_is_put_in_phase_with_the_round_the_others_wait_on():
    # versions (5, 6): fragment 1 committed this cycle, fragment 0's round is open (the
    # others wait on it): the restarted unit's next due is fragment 0, at its first step
    core, state = _streaming(incarnation=1)
    state, _ = core.receive(state, 0.1, "s0", _update(0, 5, 0, 0))
    state, logs = core.receive(state, 0.1, "s1", _update(1, 6, 0, 0))
    assert state.phase == 3  # offset 4 − (0 + 1) steps, mod the period 4
    assert [a.fields for a in logs if getattr(a, "kind", None) == "phase"] == [
        {"phase": 3, "next_fragment": 0, "step": 0, "versions": [5, 6]}]
    state, actions = _step(core, state, 0.2)
    assert [(a.to, a.msg.fragment, a.msg.c_steps) for a in actions if hasattr(a, "msg")] == [("s0", 0, 1)]
    # a first incarnation starts in phase with everyone (all start at step 0): no shift
    core, state = _streaming(incarnation=0)
    state, _ = core.receive(state, 0.1, "s0", _update(0, 0, 0, 0))
    state, _ = core.receive(state, 0.1, "s1", _update(1, 0, 0, 0))
    assert state.phase == 0 and not [a for a in _step(core, state, 0.2)[1] if hasattr(a, "msg")]


def test_streaming_sends_what_was_in_flight_again_after_a_reconnect():
    core, state = _streaming()
    for p in (0, 1):
        state, _ = core.receive(state, 0.1, SHARDS[p], _update(p, 0, 0, 0))
    state, _ = _step(core, state, 1.0)
    state, actions = _step(core, state, 2.0)  # step 2: fragment 1 goes to s1
    (sent,) = [a.msg for a in actions if isinstance(a.msg if hasattr(a, "msg") else None, Contribution)]
    state, actions = core.shard_connected(state, 2.5, "s1")  # the old connection may have lost it
    assert [type(a.msg).__name__ for a in actions] == ["Hello", "Contribution"] and actions[1].msg == sent
    core_d, state_d = _streaming(mode="decoupled")  # decoupled: a lost contribution is only lost work
    for p in (0, 1):
        state_d, _ = core_d.receive(state_d, 0.1, SHARDS[p], _update(p, 0, 0, 0))
    state_d, _ = _step(core_d, state_d, 1.0)
    state_d, _ = _step(core_d, state_d, 2.0)
    assert [type(a.msg).__name__ for a in core_d.shard_connected(state_d, 2.5, "s1")[1]] == ["Hello"]


def test_a_streaming_turn_that_came_while_awaiting_the_fetch_goes_out_with_the_fetch():
    # fragment 1's fetch is late; its turn (step 2) is deferred, not dropped, and the
    # fetch at the same version as the base sends the 2 steps of progress against it
    core, state = _streaming()
    state, _ = core.receive(state, 0.1, "s0", _update(0, 0, 0, 0))
    state, _ = _step(core, state, 1.0, x=1.0)
    state, actions = _step(core, state, 2.0, x=3.0)
    assert actions == [] and state.deferred == {1}
    state, actions = core.receive(state, 2.5, "s1", _update(1, 0, 0, 0))
    (msg,) = [a.msg for a in actions if hasattr(a, "msg")]
    assert (msg.fragment, msg.base_version, msg.c_steps) == (1, 0, 2)
    assert [x.tolist() for x in msg.payload] == [[-3.0, -3.0]]  # Δ = base − θ = 0 − 3
    assert state.params[1].tolist() == [0.0, 0.0] and state.deferred == set()  # then the fetch overwrote
    core_d, state_d = _streaming(mode="decoupled")  # decoupled drops the turn, as before
    state_d, _ = core_d.receive(state_d, 0.1, "s0", _update(0, 0, 0, 0))
    state_d, _ = _step(core_d, state_d, 1.0)
    state_d, actions = _step(core_d, state_d, 2.0)
    assert [a.fields["reason"] for a in actions] == ["awaiting_fetch"]
