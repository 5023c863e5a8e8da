"""Repair from the learners (docs/PROTOCOL.md): a shard restarted from a checkpoint older
than its last commits asks a learner whose Hello names a newer copy for it, and takes it
only if its digest is the one its journal holds. By hand: one number per fragment, each
commit of fragment 0 a Δ of 0.5 at outer lr 1, so Θ[0] at version v is 1 − 0.5 v."""
from __future__ import annotations

from dataclasses import replace

from protocol_link import arr, learner_math, syncer_math

from diloco_chaos.trainer.numerics.wiring import digest
from diloco_chaos.trainer.protocol.learner_core import LearnerCore
from diloco_chaos.trainer.protocol.learner_types import LearnerConfig
from diloco_chaos.trainer.protocol.messages import (Contribution, FragmentUpdate, Hello, Repair, RepairRequest,
                                                    held_copies, held_field)
from diloco_chaos.trainer.protocol.protocol_base import Journal, Log, SaveCheckpoint, Send, SetTimer
from diloco_chaos.trainer.protocol.syncer_core import SyncerCore
from diloco_chaos.trainer.protocol.syncer_core import REPAIR_WAIT_S, RESTART_HOLD_S
from diloco_chaos.trainer.protocol.syncer_types import SyncerConfig

THETA0 = {0: [arr(1.0)], 1: [arr(2.0)]}


def _core(bugs=frozenset()):
    return SyncerCore(SyncerConfig("s0", (0, 1), ("A", "B"), grace_gamma=0.0, bugs=bugs),
                      replace(syncer_math(), digest=digest))


def _crashed_after_three_commits(bugs=frozenset()):
    """Three commits of fragment 0; the checkpoint holds version 1; the journal all three.
    Returns the core, the restarted state (A and B connected) and the journal's entries."""
    core = _core(bugs)
    state, _ = core.learner_connected(core.init(THETA0), 0.0, "A")
    journal, snap = [], None
    for v in (1, 2, 3):
        state, acts = core.receive(state, float(v), "A", Contribution("A", 0, v, 0, v - 1, 2, 20, 1.0, None,
                                                                        [arr(0.5)]))
        journal += [(a.fragment, a.version, a.digest) for a in acts if isinstance(a, Journal)]
        snap = snap or core.snapshot(state)  # the save after the first commit landed; the others did not
    assert [float(state.theta[0][0][0])] == [-0.5] and journal == [(0, v, digest([arr(1 - 0.5 * v)])) for v in (1, 2, 3)]
    restarted = core.remember(core.restore(snap), journal)
    for learner in ("A", "B"):
        restarted, _ = core.learner_connected(restarted, 10.0, learner)
    return core, restarted, journal


def _sends(acts):
    return [(a.to, type(a.msg).__name__, a.msg.fragment, a.msg.version) for a in acts if isinstance(a, Send)]


def _hello(learner, held):
    return Hello(learner, 0, "", held_field({p: (v, digest([arr(x)])) for p, (v, x) in held.items()}))


def test_the_journal_holds_the_versions_past_the_restore():
    core, state, _ = _crashed_after_three_commits()
    assert state.version == {0: 1, 1: 0}
    assert state.journal == {0: {2: digest([arr(0.0)]), 3: digest([arr(-0.5)])}}
    # a version written again (the shard forked there) drops the history after it
    forked = core.remember(core.restore(core.snapshot(state)), [(0, 2, "a"), (0, 3, "b"), (0, 2, "c"), (1, 1, "d")])
    assert forked.journal == {0: {2: "c"}, 1: {1: "d"}}
    assert held_copies("0:3:ab,1:2:cd") == {0: (3, "ab"), 1: (2, "cd")} and held_copies("") == {}


def test_a_learners_newer_copy_repairs_the_shard():
    core, state, _ = _crashed_after_three_commits()
    state, acts = core.receive(state, 11.0, "A", _hello("A", {0: (3, -0.5)}))
    # fragment 1 answered at once; fragment 0 asked for, its answer held back
    assert _sends(acts) == [("A", "RepairRequest", 0, 3), ("A", "FragmentUpdate", 1, 0)]
    assert SetTimer("repair:0", 11.0 + REPAIR_WAIT_S) in acts
    state, acts = core.receive(state, 11.1, "B", _hello("B", {0: (2, 0.0)}))
    assert _sends(acts) == [("B", "FragmentUpdate", 1, 0)]  # B waits for the repair too
    state, acts = core.receive(state, 11.2, "A", Repair("A", 0, 0, 3, [arr(-0.5)]))
    assert (state.version[0], float(state.theta[0][0][0])) == (3, -0.5)
    assert _sends(acts) == [("A", "FragmentUpdate", 0, 3), ("B", "FragmentUpdate", 0, 3)]
    assert [a.kind for a in acts if isinstance(a, Log)] == ["repaired"] and any(isinstance(a, SaveCheckpoint)
                                                                                for a in acts)
    # the first round after the restart holds (RESTART_HOLD_S) until every learner is back and in;
    # it goes on from version 3: Θ[0] = −0.5 − 0.5 = −1.0 at version 4 (two Δs of 0.5, merged)
    state, acts = core.receive(state, 12.0, "B", Contribution("B", 0, 1, 0, 3, 2, 20, 1.0, None, [arr(0.5)]))
    assert state.version[0] == 3 and SetTimer("grace:0", 12.0 + RESTART_HOLD_S) in acts
    state, acts = core.receive(state, 12.1, "A", Contribution("A", 0, 10, 0, 3, 2, 20, 1.0, None, [arr(0.5)]))
    assert (state.version[0], float(state.theta[0][0][0])) == (4, -1.0) and state.journal == {}
    assert state.rejoining == {1}  # fragment 1 has not committed since the restart


def test_a_copy_that_is_not_the_journals_is_refused():
    core, state, _ = _crashed_after_three_commits()
    # a Hello naming a digest the journal does not hold: answered with the restored Θ[0] (0.5 at version 1)
    _, acts = core.receive(state, 11.0, "A", _hello("A", {0: (3, -0.4)}))
    assert _sends(acts) == [("A", "FragmentUpdate", 0, 1), ("A", "FragmentUpdate", 1, 0)]
    # a Repair whose params are not what its Hello named: given up, everyone gets the restore
    state, _ = core.receive(state, 11.0, "A", _hello("A", {0: (3, -0.5)}))
    state, acts = core.receive(state, 11.2, "A", Repair("A", 0, 0, 3, [arr(-0.4)]))
    assert state.version[0] == 1 and float(state.theta[0][0][0]) == 0.5 and state.journal == {}
    assert [a.fields["reason"] for a in acts if isinstance(a, Log) and a.kind == "drop"] == ["repair_mismatch"]
    assert _sends(acts) == [("A", "FragmentUpdate", 0, 1), ("B", "FragmentUpdate", 0, 1)]


def test_no_answer_gives_up_at_the_deadline_and_a_leaving_learner_passes_the_ask_on():
    core, state, _ = _crashed_after_three_commits()
    state, _ = core.receive(state, 11.0, "A", _hello("A", {0: (3, -0.5)}))
    state, _ = core.receive(state, 11.1, "B", _hello("B", {0: (2, 0.0)}))
    # A leaves before answering: B, which holds version 2, is asked
    left, acts = core.learner_disconnected(state, 11.5, "A")
    assert _sends(acts) == [("B", "RepairRequest", 0, 2)]
    left, acts = core.receive(left, 11.6, "B", Repair("B", 0, 0, 2, [arr(0.0)]))
    assert left.version[0] == 2 and _sends(acts) == [("B", "FragmentUpdate", 0, 2)]
    # nobody answers: at the deadline the shard goes on from its restore
    assert core.timer(state, 12.0, "repair:0") == (state, [])
    state, acts = core.timer(state, 11.0 + REPAIR_WAIT_S, "repair:0")
    assert [a.kind for a in acts if isinstance(a, Log)] == ["repair_failed"] and state.version[0] == 1
    assert _sends(acts) == [("A", "FragmentUpdate", 0, 1), ("B", "FragmentUpdate", 0, 1)]


def test_a_restarted_shards_first_round_waits_for_the_learners_to_be_back():
    """A restart without a repair too: B is back, A not yet; B's Δ alone waits RESTART_HOLD_S
    (the learners' reconnects spread over their backoff) before it commits; then rounds
    commit as before."""
    core, state, _ = _crashed_after_three_commits()
    state, _ = core.learner_disconnected(state, 10.5, "A")
    state, acts = core.receive(state, 11.0, "B", Contribution("B", 0, 1, 1, 0, 2, 20, 1.0, None, [arr(0.5)]))
    assert state.version[1] == 0 and SetTimer("grace:1", 11.0 + RESTART_HOLD_S) in acts
    state, acts = core.timer(state, 11.0 + RESTART_HOLD_S, "grace:1")
    assert state.version[1] == 1 and 1 not in state.rejoining
    state, _ = core.receive(state, 13.0, "B", Contribution("B", 0, 2, 1, 1, 2, 20, 1.0, None, [arr(0.5)]))
    assert state.version[1] == 2  # no hold once the fragment committed


def test_no_repair_rolls_the_learners_back():
    core, state, _ = _crashed_after_three_commits(frozenset({"no_repair"}))
    _, acts = core.receive(state, 11.0, "A", _hello("A", {0: (3, -0.5)}))
    assert _sends(acts) == [("A", "FragmentUpdate", 0, 1), ("A", "FragmentUpdate", 1, 0)]


def test_the_learner_names_its_copies_and_sends_the_one_asked_for():
    core = LearnerCore(LearnerConfig("A", 0, ("s0", "s0")), replace(learner_math(2, 2), digest=digest))
    state, _ = core.start(core.init([arr(1.0), arr(2.0)]), 0.0)
    for p in (0, 1):
        state, _ = core.receive(state, 0.0, "s0", FragmentUpdate(p, 0, True, []))
    state, _ = core.receive(state, 1.0, "s0", FragmentUpdate(0, 3, False, [arr(-0.5)]))
    state, acts = core.shard_connected(state, 2.0, "s0")
    assert acts[0].msg.held == f"0:3:{digest([arr(-0.5)])}"  # fragment 1 is at version 0: not named
    _, acts = core.receive(state, 2.1, "s0", RepairRequest(0, 3))
    [send] = acts
    assert send.to == "s0" and isinstance(send.msg, Repair)
    assert (send.msg.learner, send.msg.fragment, send.msg.version, float(send.msg.params[0][0])) == ("A", 0, 3, -0.5)
    _, acts = core.receive(state, 2.1, "s0", RepairRequest(0, 2))
    assert [a.fields["reason"] for a in acts if isinstance(a, Log)] == ["not_held"]
