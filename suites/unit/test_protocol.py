"""SyncerCore by hand: quorum, grace window, versions, at-most-once merging, planted bugs,
snapshots, and the transitions it refuses. Learners in the loop: test_protocol_loop.py."""
from __future__ import annotations

import pickle

import numpy as np
import pytest
from hypothesis import given
from hypothesis import strategies as st
from protocol_link import MemNet, arr, learner_math, syncer_math

from diloco_chaos.trainer.protocol.learner_core import LearnerCore
from diloco_chaos.trainer.protocol.learner_types import LearnerConfig
from diloco_chaos.trainer.protocol.messages import Contribution, FragmentUpdate, GradStep, Hello, SliceControl
from diloco_chaos.trainer.protocol.protocol_base import (IllegalTransition, NotStarted, SaveCheckpoint,
                                                         SetSlices, UnexpectedMessage, UnknownFragment,
                                                         UnknownPeer)
from diloco_chaos.trainer.protocol.syncer_core import SyncerCore
from diloco_chaos.trainer.protocol.syncer_types import SyncerConfig

LEARNERS = ("A", "B", "C")


def shard(K=1, gamma=0.5, tau=2, bugs=frozenset(), mode="decoupled", fragments=(0,), live=LEARNERS) -> MemNet:
    """One shard "s0" with Θ[p] = [0, 0]; ema_weight 1 so every ξ is its latest observation."""
    cfg = SyncerConfig("s0", fragments, LEARNERS, mode=mode, quorum=K, tau=tau, grace_gamma=gamma,
                       ema_weight=1.0, bugs=bugs)
    core = SyncerCore(cfg, syncer_math())
    net = MemNet()
    net.add("s0", core, core.init({p: [arr(0, 0)] for p in fragments}))
    for learner in live:
        net.do("s0", "learner_connected", learner)
    return net


def contrib(learner, seq, delta=1.0, base=0, steps=1, tokens=10, step_time=1.0, last_sync=None, inc=0, p=0):
    return Contribution(learner, inc, seq, p, base, steps, tokens, step_time, last_sync, [arr(delta, -delta)])


def send(net: MemNet, t: float, msg) -> None:
    net.at(t, lambda: net.do("s0", "receive", msg.learner, msg))


def theta(net: MemNet, p: int = 0) -> list:
    return net.states["s0"].theta[p][0].tolist()


# --- quorum and grace window ------------------------------------------------------------

def test_quorum_2_of_3_waits_for_the_second_learner_then_grace_lets_the_third_in():
    net = shard(K=2)
    send(net, 1.0, contrib("A", 1, delta=1))
    send(net, 2.0, contrib("B", 1, delta=3, last_sync=0.2))
    send(net, 2.3, contrib("C", 1, delta=5))
    net.run(1.99)
    assert net.log("round_open") == [{"fragment": 0, "version": 0, "learner": "A"}]
    assert net.log("round_commit") == [] and net.states["s0"].version[0] == 0
    net.run(2.0)
    # ξ_step = 1.0, ξ_quorum = 2.0 − 1.0, ξ_sync = 0.2: grace = 0.5·(2·1.0 − 1.0 − 0.2) = 0.4
    assert net.states["s0"].rounds[0].deadline == pytest.approx(2.4)
    net.run(10)
    (commit,) = net.log("round_commit")
    assert commit["n"] == 3 and commit["opened_at"] == 1.0 and commit["quorum_at"] == 2.0
    assert commit["grace_s"] == pytest.approx(0.4)
    assert [t for t, _, k, _ in net.logs if k == "round_commit"] == [2.3]  # C in: no need to wait
    assert theta(net) == [-3.0, 3.0]  # Θ − mean(1, 3, 5), equal weights


def test_grace_window_closes_at_the_computed_time():
    net = shard(K=2)
    send(net, 1.0, contrib("A", 1, delta=1))
    send(net, 2.0, contrib("B", 1, delta=3, last_sync=0.2))
    send(net, 2.7, contrib("C", 1, delta=5))  # after the window
    net.run(10)
    commit_times = [t for t, _, k, _ in net.logs if k == "round_commit"]
    assert commit_times == [pytest.approx(2.4)]
    assert net.log("round_commit")[0]["n"] == 2 and theta(net) == [-2.0, 2.0]
    # C opened the next round, where it waits for a second learner
    assert net.log("round_open")[-1] == {"fragment": 0, "version": 1, "learner": "C"}
    assert net.states["s0"].rounds[0].pending.keys() == {"C"}


def test_no_grace_when_budget_is_spent_and_outside_decoupled_mode():
    net = shard(K=1)
    send(net, 1.0, contrib("A", 1, step_time=0.1, last_sync=5.0))  # τ·ξ_step < ξ_sync
    net.run(1.0)
    assert [t for t, _, k, _ in net.logs if k == "round_commit"] == [1.0]
    net = shard(mode="streaming", gamma=0.9)  # K = M = 3, commits the moment the third is in
    for t, learner in ((1.0, "A"), (2.0, "B"), (9.0, "C")):
        send(net, t, contrib(learner, 1))
    net.run(8.9)
    assert net.log("round_commit") == []
    net.run(9.0)
    assert net.log("round_commit")[0]["grace_s"] == 0.0


def test_disconnect_of_the_last_missing_learner_commits_the_round():
    net = shard(K=1, gamma=0.5)
    send(net, 1.0, contrib("A", 1, step_time=10.0))  # grace 0.5·(20 − 0) = 10 s
    net.at(2.0, lambda: net.do("s0", "learner_disconnected", "B"))
    net.at(3.0, lambda: net.do("s0", "learner_disconnected", "C"))
    net.run(5.0)
    assert [t for t, _, k, _ in net.logs if k == "round_commit"] == [3.0]
    assert {to for _, _, to, m in net.sent if isinstance(m, FragmentUpdate)} == {"A"}  # live only


def test_versions_increase_by_exactly_one_per_commit():
    net = shard(K=1, gamma=0.0)
    for v in range(4):
        send(net, 1.0 + v, contrib("A", v + 1, base=v))
    net.run(10)
    updates = net.sent_msgs(FragmentUpdate)
    assert [u.version for u in updates] == [1, 1, 1, 2, 2, 2, 3, 3, 3, 4, 4, 4]
    assert [a.versions for _, _, a in net.other if isinstance(a, SaveCheckpoint)] == [{0: v} for v in (1, 2, 3, 4)]
    assert net.states["s0"].outer[0] == 4  # one outer step per commit


def test_hello_gets_every_owned_fragment_as_rejoin():
    net = shard(fragments=(0, 2))
    net.do("s0", "receive", "B", Hello("B", 3))
    assert [(to, m.fragment, m.version, m.rejoin) for _, _, to, m in net.sent] == [("B", 0, 0, True), ("B", 2, 0, True)]


# --- at most once -----------------------------------------------------------------------

def dedup_scenario(bugs=frozenset()) -> MemNet:
    net = shard(K=2, gamma=0.0, bugs=bugs)
    send(net, 1.0, contrib("A", 5))
    send(net, 1.5, contrib("A", 5))          # retransmission while pending
    send(net, 1.6, contrib("A", 4))          # older seq
    send(net, 2.0, contrib("B", 1))          # quorum: commit (γ = 0)
    send(net, 5.0, contrib("A", 5))          # retransmission after the merge
    send(net, 6.0, contrib("B", 2, base=1))
    net.run(10)
    return net


def test_duplicate_and_old_contributions_are_dropped_and_logged():
    net = dedup_scenario()
    assert [(d["seq"], d["reason"]) for d in net.log("drop")] == [(5, "duplicate"), (4, "old_seq"), (5, "duplicate")]
    assert net.merged_ids() == [("A", 0, 5), ("B", 0, 1)]
    assert net.states["s0"].last_merged == {("A", 0): (0, 5), ("B", 0): (0, 1)}


def test_planted_bug_merge_twice_merges_a_duplicate_again():
    ids = dedup_scenario(frozenset({"merge_twice"})).merged_ids()
    assert ids.count(("A", 0, 5)) == 2


def test_newer_contribution_with_same_base_replaces_and_sums_counters():
    net = shard(K=2, gamma=0.0)
    send(net, 1.0, contrib("A", 1, delta=1, steps=3, tokens=30))
    send(net, 1.5, contrib("A", 2, delta=2, steps=2, tokens=20))
    send(net, 2.0, contrib("B", 1, delta=3, tokens=10))
    net.run(3)
    assert net.log("drop") == [{"what": "contribution", "fragment": 0, "learner": "A", "incarnation": 0, "seq": 1,
                                "reason": "superseded", "by_seq": 2}]
    a = net.log("merge")[0]
    assert (a["seq"], a["c_steps"], a["c_tokens"]) == (2, 5, 50)
    assert theta(net) == pytest.approx([-(50 * 2 + 10 * 3) / 60, (50 * 2 + 10 * 3) / 60])
    # a newer base: only the newest counts
    send(net, 4.0, contrib("A", 3, base=0, tokens=10))
    send(net, 4.5, contrib("A", 4, base=1, tokens=7))
    send(net, 5.0, contrib("B", 2, base=1))
    net.run(6)
    assert net.log("merge")[-2]["c_tokens"] == 7


def test_contributions_that_cannot_be_merged_are_dropped():
    net = shard(K=1, gamma=0.0)
    net.do("s0", "receive", "A", contrib("A", 1, steps=0))
    net.do("s0", "receive", "A", contrib("A", 2, base=3))
    assert [d["reason"] for d in net.log("drop")] == ["empty", "future_base"]
    assert net.states["s0"].rounds == {}


# --- planted bugs in the weighting and quorum ---------------------------------------------

def staleness_scenario(bugs=frozenset()) -> MemNet:
    net = shard(K=2, gamma=0.0, bugs=bugs)
    send(net, 1.0, contrib("A", 1, delta=1))
    send(net, 1.0, contrib("B", 1, delta=1))  # commit v1
    send(net, 2.0, contrib("A", 2, delta=2, base=1))  # fresh
    send(net, 2.0, contrib("C", 1, delta=4, base=0))  # one round stale
    net.run(3)
    return net


def test_staleness_discounts_the_weight_and_planted_bug_stale_as_fresh_does_not():
    good, bad = staleness_scenario(), staleness_scenario(frozenset({"stale_as_fresh"}))
    w = 10 / np.sqrt(2)
    assert [m["weight"] for m in good.log("merge")[2:]] == pytest.approx([10, w])
    assert [m["staleness"] for m in good.log("merge")[2:]] == [0, 1]
    assert theta(good)[0] == pytest.approx(-1 - (10 * 2 + w * 4) / (10 + w))
    assert [m["weight"] for m in bad.log("merge")[2:]] == [10, 10]
    assert theta(bad)[0] == pytest.approx(-1 - 3) != theta(good)[0]


def test_planted_bug_ignore_quorum_commits_below_k():
    for bugs, commits in ((frozenset(), []), (frozenset({"ignore_quorum"}), [1])):
        net = shard(K=2, gamma=0.0, bugs=bugs)
        send(net, 1.0, contrib("A", 1))
        net.run(5)
        assert [c["n"] for c in net.log("round_commit")] == commits


# --- durability --------------------------------------------------------------------------

def test_snapshot_restore_keeps_theta_versions_and_merged_seqs():
    net = shard(K=1, gamma=0.0)
    send(net, 1.0, contrib("A", 1, delta=2))
    net.run(2)
    core, state = net.cores["s0"], net.states["s0"]
    snap = core.snapshot(state)
    net.do("s0", "durable", {0: 1})
    assert net.log("checkpoint_saved") == [{"versions": {0: 1}}] and net.states["s0"].durable == {0: 1}
    restored = core.restore(pickle.loads(pickle.dumps(snap)))  # as if read back from disk
    assert restored.version == {0: 1} and restored.durable == {0: 1} and restored.outer == {0: 1}
    assert restored.theta[0][0].tolist() == [-2.0, 2.0] and restored.live == frozenset()
    again, actions = core.receive(restored, 3.0, "A", contrib("A", 1, delta=2))
    assert again.rounds == {} and actions[0].fields["reason"] == "duplicate"
    with pytest.raises(IllegalTransition):
        core.durable(state, 3.0, {0: 2})  # never committed
    with pytest.raises(ValueError, match="shard"):
        SyncerCore(SyncerConfig("s1", (0,), LEARNERS), syncer_math()).restore(snap)


def test_states_are_never_mutated():
    net = shard(K=2)
    before = pickle.dumps(net.states["s0"])
    old = net.states["s0"]
    send(net, 1.0, contrib("A", 1))
    send(net, 2.0, contrib("B", 1))
    net.run(10)
    assert pickle.dumps(old) == before and net.states["s0"] is not old


# --- refused transitions ------------------------------------------------------------------

def test_syncer_refuses_illegal_events():
    net = shard()
    core, state = net.cores["s0"], net.states["s0"]
    with pytest.raises(UnknownFragment):
        core.receive(state, 0, "A", contrib("A", 1, p=3))
    with pytest.raises(UnknownPeer):
        core.receive(state, 0, "B", contrib("A", 1))  # signed by another learner
    with pytest.raises(UnknownPeer):
        core.learner_connected(state, 0, "Z")
    with pytest.raises(UnexpectedMessage):
        core.receive(state, 0, "A", FragmentUpdate(0, 1, False, []))
    with pytest.raises(UnexpectedMessage):
        core.receive(state, 0, "A", GradStep("A", 0, 1, 0, 0, 1, []))
    with pytest.raises(IllegalTransition):
        core.timer(state, 0, "nap:0")
    dp = shard(mode="dp")
    with pytest.raises(UnexpectedMessage):
        dp.cores["s0"].receive(dp.states["s0"], 0, "A", contrib("A", 1))


def test_learner_refuses_illegal_events():
    core = LearnerCore(LearnerConfig("A", 0, ("s0", "s1")), learner_math(4, 2))
    state = core.init([arr(0, 0), arr(0, 0)])
    with pytest.raises(NotStarted):
        core.receive(state, 0, "s0", FragmentUpdate(0, 1, False, [arr(1, 1)]))
    with pytest.raises(NotStarted):
        core.after_inner_step(state, 0, state.params, 10, 1.0)
    state, _ = core.start(state, 0)
    with pytest.raises(IllegalTransition):
        core.start(state, 0)
    with pytest.raises(UnknownFragment):
        core.receive(state, 0, "s0", FragmentUpdate(2, 1, False, [arr(1, 1)]))
    with pytest.raises(UnknownPeer):
        core.receive(state, 0, "s0", FragmentUpdate(1, 1, False, [arr(1, 1)]))  # s1 owns fragment 1
    with pytest.raises(UnexpectedMessage):
        core.receive(state, 0, "s0", Hello("B", 0))
    with pytest.raises(UnexpectedMessage):
        core.grads_ready(state, 0, state.params, 10)
    state, actions = core.receive(state, 0, "harness", SliceControl(1))
    assert isinstance(actions[0], SetSlices) and actions[0].live_slices == 1 and state.live_slices == 1


def test_configs_name_the_bad_field():
    with pytest.raises(ValueError, match="quorum"):
        SyncerConfig("s0", (0,), LEARNERS, quorum=4)
    with pytest.raises(ValueError, match="bugs"):
        SyncerConfig("s0", (0,), LEARNERS, bugs=frozenset({"rejoin_without_fetch"}))
    with pytest.raises(ValueError, match="mode"):
        LearnerConfig("A", 0, ("s0",), mode="async")
    with pytest.raises(ValueError, match="P must be 1"):
        LearnerConfig("A", 0, ("s0", "s0"), mode="sync_diloco")


# --- a property over random arrival orders ----------------------------------------------

arrivals = st.lists(st.tuples(st.sampled_from(LEARNERS), st.integers(1, 4), st.floats(0, 20)), max_size=25)


@given(arrivals=arrivals, K=st.integers(1, 3), gamma=st.sampled_from([0.0, 0.3, 0.9]),
       step_time=st.sampled_from([0.1, 1.0, 5.0]))
def test_any_arrival_order_merges_each_contribution_once_and_versions_count_up(arrivals, K, gamma, step_time):
    net = shard(K=K, gamma=gamma)
    for learner, seq, t in arrivals:
        send(net, t, contrib(learner, seq, step_time=step_time))
    net.run(100)
    ids = net.merged_ids()
    assert len(ids) == len(set(ids))
    commits = net.log("round_commit")
    assert [c["version"] for c in commits] == list(range(1, len(commits) + 1))
    assert all(c["n"] >= K for c in commits)
    assert all(m["staleness"] == m["version"] - 1 for m in net.log("merge"))  # every base was 0
