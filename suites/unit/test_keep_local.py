"""Keeping local progress (learner, `keep_local`) and the fleet share of an outer step
(syncer, `fleet_share`), by hand: one fragment of one number, values checked on paper."""
from __future__ import annotations

import dataclasses

import pytest
from protocol_link import MemNet, arr, learner_math, syncer_math

from diloco_chaos.trainer.config import RunConfig
from diloco_chaos.trainer.numerics.wiring import learner_config
from diloco_chaos.trainer.protocol.learner_core import LearnerCore
from diloco_chaos.trainer.protocol.learner_types import LearnerConfig
from diloco_chaos.trainer.protocol.messages import Contribution, FragmentUpdate
from diloco_chaos.trainer.protocol.protocol_base import Log, Send
from diloco_chaos.trainer.protocol.syncer_core import SyncerCore
from diloco_chaos.trainer.protocol.syncer_types import SyncerConfig


def _learner(keep_local: bool, bugs=frozenset()):
    """H = 2, P = 1: fragment 0 is due every 2nd step; Θ0 = 0, fetched at version 0."""
    core = LearnerCore(LearnerConfig("A", 0, ("s0",), keep_local=keep_local, bugs=bugs), learner_math(2, 1))
    state, _ = core.start(core.init([arr(0.0)]), 0.0)
    state, _ = core.receive(state, 0.0, "s0", FragmentUpdate(0, 0, True, [arr(0.0)]))
    return core, state


def _step(core, state, x: float):
    """An inner step that leaves θ = x; returns (state, the Δ sent if any, contribute logs)."""
    state, acts = core.after_inner_step(state, 0.0, [arr(x)], 10, 1.0)
    sent = [a.msg for a in acts if isinstance(a, Send) and isinstance(a.msg, Contribution)]
    logs = [a.fields for a in acts if isinstance(a, Log) and a.kind == "contribute"]
    return state, (float(sent[0].payload[0][0]) if sent else None), logs


@pytest.mark.parametrize("keep", [True, False])
def test_an_update_keeps_the_progress_no_delta_holds_yet(keep):
    core, s = _learner(keep)
    s, d, _ = _step(core, s, 1.0)          # step 1: θ = 1
    s, d, _ = _step(core, s, 2.0)          # step 2: due, Δ = Θ − θ = 0 − 2 = −2 sent from θ = 2
    assert d == -2.0
    s, _, _ = _step(core, s, 3.0)          # step 3: θ = 3, one step past the send
    # another learner's commit (or the answer): Θ = 10
    s, _ = core.receive(s, 0.0, "s0", FragmentUpdate(0, 1, False, [arr(10.0)]))
    # keep: θ = Θ + (θ − θ at the send) = 10 + (3 − 2) = 11; without: θ = Θ = 10
    assert float(s.params[0][0]) == (11.0 if keep else 10.0)
    s, d, logs = _step(core, s, float(s.params[0][0]) + 1)   # step 4: one more step, due again
    # keep: Δ = 10 − 12 = −2, the two steps since the send; without: −1, step 3 was lost
    assert d == (-2.0 if keep else -1.0)
    assert logs[0]["from_step"] == (2 if keep else 3) and logs[0]["to_step"] == 4
    assert s.c_steps[0] == 0


@pytest.mark.parametrize("keep", [True, False])
def test_a_synchronous_round_keeps_the_steps_made_while_it_was_in_flight(keep):
    """sync_diloco, τ = 1: the learner steps once more while its Δ is in flight, then
    blocks; the round's Θ comes back. Keeping: that step moves onto Θ and goes out in the
    next Δ; overwriting (the behaviour before: τ/H of every unit's progress lost, sim corpus
    sync_diloco at H = 6 2.0487 against 1.9180 kept) drops it, and the next Δ claims only
    the step it holds (it claimed both until deltas_reexecuted rebuilt it from its steps)."""
    core = LearnerCore(LearnerConfig("A", 0, ("s0",), mode="sync_diloco", tau=1, keep_local=keep), learner_math(2, 1))
    s, _ = core.start(core.init([arr(0.0)]), 0.0)
    s, _ = core.receive(s, 0.0, "s0", FragmentUpdate(0, 0, True, [arr(0.0)]))
    s, _, _ = _step(core, s, 1.0)
    s, d, _ = _step(core, s, 2.0)          # step 2: Δ = −2 out, from θ = 2
    assert d == -2.0
    s, _, _ = _step(core, s, 3.0)          # step 3, in flight; τ = 1 ran out: blocked
    assert core.must_wait(s)
    s, _ = core.receive(s, 0.0, "s0", FragmentUpdate(0, 1, False, [arr(10.0)]))
    assert not core.must_wait(s)
    assert float(s.params[0][0]) == (11.0 if keep else 10.0)
    s, d, logs = _step(core, s, float(s.params[0][0]) + 1)   # step 4: due again
    assert d == (-2.0 if keep else -1.0) and logs[0]["steps"] == (2 if keep else 1)


def test_every_diloco_mode_keeps_local_progress_when_asked():
    for mode, kept in (("decoupled", True), ("streaming", True), ("sync_diloco", True), ("dp", False)):
        P = 1 if mode == "sync_diloco" else 3
        cfg = RunConfig()
        cfg = dataclasses.replace(cfg, diloco=dataclasses.replace(cfg.diloco, mode=mode, learners=1, fragments=P))
        topo = {"learners": ["learner-0"], "shards": {"syncer-0": list(range(P))}}
        assert learner_config(cfg, topo, "learner-0", 0).keep_local is kept, mode


def test_keep_local_counts_the_steps_of_a_skipped_turn():
    """A turn skipped while the Δ is unanswered: its steps stay in θ and in the next Δ."""
    core, s = _learner(True)
    s, _, _ = _step(core, s, 1.0)
    s, d, _ = _step(core, s, 2.0)          # sent −2 at step 2
    s, _, _ = _step(core, s, 3.0)
    s, d, _ = _step(core, s, 4.0)          # step 4 due, unanswered: skipped
    assert d is None and s.c_steps[0] == 2
    s, _ = core.receive(s, 0.0, "s0", FragmentUpdate(0, 1, False, [arr(-2.0)]))   # the answer: Θ = −2
    assert float(s.params[0][0]) == -2.0 + (4.0 - 2.0)   # steps 3 and 4 kept
    s, _, _ = _step(core, s, 1.0)
    s, d, logs = _step(core, s, 2.0)       # step 6: Δ = −2 − 2 = −4 covers steps 2..6
    assert d == -4.0 and (logs[0]["from_step"], logs[0]["to_step"]) == (2, 6) and s.c_steps[0] == 0


def _shard(fleet_share: bool, live=("A", "B", "C", "D"), K=1) -> MemNet:
    cfg = SyncerConfig("s0", (0,), ("A", "B", "C", "D"), quorum=K, grace_gamma=0.0, fleet_share=fleet_share)
    core = SyncerCore(cfg, syncer_math())
    net = MemNet()
    net.add("s0", core, core.init({0: [arr(0.0)]}))
    for learner in live:
        net.do("s0", "learner_connected", learner)
    return net


@pytest.mark.parametrize("share,live,expect", [(True, "ABCD", -1.0), (True, "AB", -2.0), (False, "ABCD", -4.0)])
def test_fleet_share_moves_theta_by_one_learners_share(share, live, expect):
    """K = 1, a round of one Δ = 4 (Θ ← Θ − lr·share·Δ, lr 1, share = K / live): 4 live
    learners → a quarter of it, 2 → half; without the share, all of it."""
    net = _shard(share, tuple(live))
    msg = Contribution("A", 0, 1, 0, 0, 2, 20, 1.0, None, [arr(4.0)])
    net.at(1.0, lambda: net.do("s0", "receive", "A", msg))
    net.run(5)
    assert net.states["s0"].theta[0][0].tolist() == [expect]


def test_fleet_share_at_full_quorum_is_the_plain_average():
    """K = M = 4: every round holds all four (Δ = 4, 8, 0, 4: mean 4) and is the fleet's
    average already: Θ ← 0 − 1 · 4 = −4, not a quarter of it."""
    net = _shard(True, K=4)
    for i, (learner, d) in enumerate(zip("ABCD", (4.0, 8.0, 0.0, 4.0))):
        msg = Contribution(learner, 0, 1, 0, 0, 2, 20, 1.0, None, [arr(d)])
        net.at(1.0 + i * 0.1, lambda m=msg: net.do("s0", "receive", m.learner, m))
    net.run(5)
    assert net.states["s0"].theta[0][0].tolist() == [-4.0]


@pytest.mark.parametrize("downlink,to", [("all", ["A", "B", "C"]), ("answer", ["A"])])
def test_downlink_answer_sends_a_commit_to_the_learners_it_merged(downlink, to):
    """K = 1, live A, B, C: A's Δ commits alone. "all": Θ[p] v1 to every live learner;
    "answer": to A only (B and C take Θ[p] when their own Δ is merged). A stale drop is
    answered (the re-anchor) either way, and the fetch on Hello is unchanged."""
    core = SyncerCore(SyncerConfig("s0", (0,), ("A", "B", "C", "D"), grace_gamma=0.0, downlink=downlink,
                                   max_staleness=1), syncer_math())
    state = core.init({0: [arr(0.0)]})
    for learner in "ABC":
        state, _ = core.learner_connected(state, 0.0, learner)
    state, acts = core.receive(state, 1.0, "A", Contribution("A", 0, 1, 0, 0, 2, 20, 1.0, None, [arr(4.0)]))
    sent = [(a.to, a.msg.version) for a in acts if isinstance(a, Send)]
    assert sent == [(learner, 1) for learner in to]
    state, acts = core.receive(state, 2.0, "A", Contribution("A", 0, 2, 0, 1, 2, 20, 1.0, None, [arr(4.0)]))
    state, acts = core.receive(state, 3.0, "B", Contribution("B", 0, 1, 0, 0, 2, 20, 1.0, None, [arr(4.0)]))
    # B's base 0 is 2 versions old (max 1): dropped, B alone gets Θ[p] v2 whole
    assert [(a.to, a.msg.version) for a in acts if isinstance(a, Send)] == [("B", 2)]
    with pytest.raises(ValueError, match="downlink"):
        SyncerConfig("s0", (0,), ("A",), downlink="some")


def _fetching(keep_on_fetch: bool, gap: int = 16):
    core = LearnerCore(LearnerConfig("A", 0, ("s0",), keep_local=True, keep_on_fetch=keep_on_fetch, keep_gap=gap),
                       learner_math(2, 1))
    s, _ = core.start(core.init([arr(0.0)]), 0.0)
    s, _ = core.receive(s, 0.0, "s0", FragmentUpdate(0, 0, True, [arr(0.0)]))
    return core, s


@pytest.mark.parametrize("keep,version,kept", [(True, 3, True), (True, 20, False), (False, 3, False)])
def test_a_fetch_keeps_the_progress_within_the_staleness_bound(keep, version, kept):
    """The link drops after a send; on reconnect the shard's fetch (Θ = 10 at `version`)
    keeps steps 3-4 (θ = 10 + (4 − 2) = 12, counters kept, no discard line) when the fetch is
    at most keep_gap (16) versions ahead; further ahead, or without keep_on_fetch, they go."""
    core, s = _fetching(keep)
    for x in (1.0, 2.0, 3.0):
        s, _, _ = _step(core, s, x)        # Δ sent at step 2 (θ = 2); step 3: θ = 3
    s, _, _ = _step(core, s, 4.0)          # step 4: due, unanswered: skipped
    s, _ = core.shard_connected(s, 0.0, "s0")   # reconnected: s0's fragments await a fetch
    s, acts = core.receive(s, 0.0, "s0", FragmentUpdate(0, version, True, [arr(10.0)]))
    discards = [a.fields for a in acts if isinstance(a, Log) and a.kind == "discard"]
    assert float(s.params[0][0]) == (12.0 if kept else 10.0)
    assert (s.c_steps[0], s.c_tokens[0]) == ((2, 20) if kept else (0, 0))
    assert discards == ([] if kept else [{"fragment": 0, "step": 4, "steps": 2, "tokens": 20, "version": version,
                                          "why": "fetch"}])
    s, _, _ = _step(core, s, float(s.params[0][0]) + 1)
    s, d, logs = _step(core, s, float(s.params[0][0]) + 1)   # step 6: due
    # kept: Δ = 10 − 14 = −4 holds steps 3-6 (from the send at 2); else −2 holds 5-6
    assert d == (-4.0 if kept else -2.0) and logs[0]["from_step"] == (2 if kept else 4)


@pytest.mark.parametrize("keep_gap,version,kept", [(None, 4, True), (None, 16, True), (None, 17, False),
                                                  (1, 4, False)])
def test_a_re_anchoring_fetch_a_few_versions_on_keeps_the_progress_as_an_answer_does(keep_gap, version, kept):
    """The wiring's rule (trainer/numerics/wiring.py KEEP_GAP = 0, max_staleness 16): a fetch after a
    re-anchor (the learner asked: `starved` under a slow WAN, or a reconnect with no round
    missed) 4 versions on keeps steps 3-4 (θ = 10 + (4 − 2) = 12), as an answer 4 versions
    on would; so does one 16 versions past the copy the kept steps were made on (version 0,
    the send at step 2); at 17 they are too stale and go (`discard why=stale`). With the
    old keep_gap of 1 the fetch 4 versions on threw them (`why=fetch`): wan-brownout's
    starved learners threw 24 % of the run's tokens that way."""
    from diloco_chaos.trainer.numerics.wiring import KEEP_GAP

    gap = KEEP_GAP if keep_gap is None else keep_gap
    core = LearnerCore(LearnerConfig("A", 0, ("s0",), keep_local=True, keep_on_fetch=True, keep_gap=gap,
                                     max_staleness=16), learner_math(2, 1))
    s, _ = core.start(core.init([arr(0.0)]), 0.0)
    s, _ = core.receive(s, 0.0, "s0", FragmentUpdate(0, 0, True, [arr(0.0)]))
    for x in (1.0, 2.0, 3.0, 4.0):
        s, _, _ = _step(core, s, x)        # Δ sent at step 2 (θ = 2); step 4 due, unanswered: skipped
    s, _ = core.shard_connected(s, 0.0, "s0")   # s0's fragments await a fetch
    s, acts = core.receive(s, 0.0, "s0", FragmentUpdate(0, version, True, [arr(10.0)]))
    discards = [a.fields["why"] for a in acts if isinstance(a, Log) and a.kind == "discard"]
    assert float(s.params[0][0]) == (12.0 if kept else 10.0)
    assert discards == ([] if kept else ["fetch" if keep_gap else "stale"])


@pytest.mark.parametrize("bugs,version,kept", [((), 17, True), ((), 18, False),
                                              (("keep_stale_progress",), 18, True)])
def test_an_answer_far_past_the_progress_base_throws_it_as_stale(bugs, version, kept):
    """max_staleness 16. The Δ sent at step 2 from version 1; steps 3-4 are made on that copy.
    The answer comes at `version` (a starved link's, after other learners' rounds): at 17 (16
    past the copy) steps 3-4 move onto it (θ = 10 + (4 − 2) = 12); at 18 they are 17 versions
    stale and are thrown (`discard why=stale`, θ = 10), where keeping them would send them as
    a fresh Δ of version 18. Planted `keep_stale_progress` keeps them."""
    core = LearnerCore(LearnerConfig("A", 0, ("s0",), keep_local=True, max_staleness=16, bugs=frozenset(bugs)),
                       learner_math(2, 1))
    s, _ = core.start(core.init([arr(0.0)]), 0.0)
    s, _ = core.receive(s, 0.0, "s0", FragmentUpdate(0, 1, True, [arr(0.0)]))
    for x in (1.0, 2.0, 3.0, 4.0):
        s, _, _ = _step(core, s, x)        # Δ from version 1 at step 2; step 4 due, unanswered
    s, acts = core.receive(s, 0.0, "s0", FragmentUpdate(0, version, False, [arr(10.0)]))
    discards = [a.fields for a in acts if isinstance(a, Log) and a.kind == "discard"]
    assert float(s.params[0][0]) == (12.0 if kept else 10.0)
    assert discards == ([] if kept else [{"fragment": 0, "step": 4, "steps": 2, "tokens": 20, "version": version,
                                          "why": "stale"}])
    assert s.anchor_version[0] == (1 if kept else version)
    s, _, _ = _step(core, s, float(s.params[0][0]) + 1)
    s, d, logs = _step(core, s, float(s.params[0][0]) + 1)   # step 6: due
    # kept: Δ = 10 − 14 = −4, steps 3-6 claimed from version `version`; thrown: −2, steps 5-6
    assert d == (-4.0 if kept else -2.0)
    assert logs[0]["from_step"] == (2 if kept else 4) and logs[0]["base_version"] == version


def test_share_by_merged_counts_the_learners_a_round_merged():
    """K = 1, 4 live, a round of two (grace window long enough): Δ = 4 and 0, token-weighted
    mean 2. share_by "quorum": Θ ← 0 − 1 · (1/4) · 2 = −0.5; "merged": × 2/4 → −1."""
    from diloco_chaos.harness.scenarios.scenario import scenario_from_dict
    from diloco_chaos.trainer.numerics.wiring import syncer_config

    d = {"name": "x", "seed": 1, "train": {"steps": 10, "duration": 5, "share_by": "merged"}}
    cfg = scenario_from_dict(d).run_config()   # the scenario key reaches the shard
    assert syncer_config(cfg, {"learners": ["learner-0"], "shards": {"syncer-0": [0, 1, 2]}}, "syncer-0").share_by \
        == "merged"
    out = {}
    for by in ("quorum", "merged"):
        cfg = SyncerConfig("s0", (0,), ("A", "B", "C", "D"), grace_gamma=0.9, tau=100, fleet_share=True,
                           share_by=by)
        core = SyncerCore(cfg, syncer_math())
        net = MemNet()
        net.add("s0", core, core.init({0: [arr(0.0)]}))
        for learner in "ABCD":
            net.do("s0", "learner_connected", learner)
        for i, (learner, d) in enumerate((("A", 4.0), ("B", 0.0))):
            msg = Contribution(learner, 0, 1, 0, 0, 2, 20, 1.0, None, [arr(d)])
            net.at(1.0 + 0.01 * i, lambda m=msg: net.do("s0", "receive", m.learner, m))
        net.run(500)
        out[by] = net.states["s0"].theta[0][0].tolist()
    assert out == {"quorum": [-0.5], "merged": [-1.0]}


@pytest.mark.parametrize("version,kept", [(0, True), (1, False)])
def test_progress_made_while_the_link_was_down_is_kept_only_where_no_round_moved_on(version, kept):
    """The link breaks after the send at step 2 (θ = 2): s0's fragment awaits its fetch and
    is `cut`; steps 3-4 are made cut off (step 4's turn is skipped, its counters running).
    The reconnect's fetch brings Θ = 10: at the progress's own base version (no round
    committed: every learner was cut off) the steps stay, θ = 10 + (4 − 2) = 12; one
    version newer, a round committed without them (and with the others' like progress),
    so they go: θ = 10 and a discard of 2 steps. Without the break (a plain reconnect) the
    same fetch one version ahead keeps them (the test above)."""
    core, s = _fetching(True)
    for x in (1.0, 2.0):
        s, _, _ = _step(core, s, x)                  # Δ sent at step 2 (θ = 2), unanswered
    s, _ = core.shard_disconnected(s, 0.0, "s0")
    assert s.cut == {0} and 0 in s.awaiting
    s, _, _ = _step(core, s, 3.0)
    s, _, logs = _step(core, s, 4.0)                 # step 4: due, awaiting its fetch
    assert logs == [] or all(l.get("reason") != "unanswered" for l in logs)
    s, _ = core.shard_connected(s, 0.0, "s0")
    s, acts = core.receive(s, 0.0, "s0", FragmentUpdate(0, version, True, [arr(10.0)]))
    discards = [a.fields for a in acts if isinstance(a, Log) and a.kind == "discard"]
    assert float(s.params[0][0]) == (12.0 if kept else 10.0)
    assert (s.c_steps[0], s.c_tokens[0]) == ((2, 20) if kept else (0, 0))
    assert [d["steps"] for d in discards] == ([] if kept else [2])
    if kept:  # still cut until it is next contributed: a newer answer now overwrites
        assert s.cut == {0}
        s, acts = core.receive(s, 0.0, "s0", FragmentUpdate(0, 1, False, [arr(20.0)]))
        assert float(s.params[0][0]) == 20.0 and s.c_steps[0] == 0
    s, _, _ = _step(core, s, float(s.params[0][0]) + 1)
    s, _, logs = _step(core, s, float(s.params[0][0]) + 1)  # due: contributed, no longer cut
    assert s.cut == frozenset() and logs and logs[0]["steps"] == 2


@pytest.mark.parametrize("unmoved,version,kept", [(True, 3, True), (False, 3, False), (True, 5, False)])
def test_a_restarted_shards_fetch_keeps_the_outage_progress_a_crash_left_behind(unmoved, version, kept):
    """The shard died after the send at step 2 (θ = 2); its last round committed as it died
    and reached other learners, not this one: it comes back (repaired) at version 3, this
    learner holding version 0. Steps 3-4 were made while it was down. Its fetch brings
    Θ = 10 at version 3, 3 versions ahead (keep_gap 1, or 0 as wired): from a restarted shard whose
    fragment has had no round since (`unmoved`), those versions are commits from before the
    crash, with none of the outage progress in them: kept, θ = 10 + (4 − 2) = 12. Not so
    marked (a link cut while the rounds went on), they go: θ = 10, 2 steps discarded; so
    they do 5 versions ahead (past RESTART_GAP = 3: cut off while rounds went on
    before the crash)."""
    core, s = _fetching(True, gap=1)
    for x in (1.0, 2.0):
        s, _, _ = _step(core, s, x)                  # Δ sent at step 2 (θ = 2), unanswered
    s, _ = core.shard_disconnected(s, 0.0, "s0")     # the shard died
    s, _, _ = _step(core, s, 3.0)
    s, _, _ = _step(core, s, 4.0)
    s, _ = core.shard_connected(s, 0.0, "s0")
    s, acts = core.receive(s, 0.0, "s0", FragmentUpdate(0, version, True, [arr(10.0)], unmoved=unmoved))
    discards = [a.fields["steps"] for a in acts if isinstance(a, Log) and a.kind == "discard"]
    assert float(s.params[0][0]) == (12.0 if kept else 10.0)
    assert (s.c_steps[0], discards) == ((2, []) if kept else (0, [2]))


def test_a_restarted_shard_says_unmoved_until_its_first_round():
    """A shard restored from its checkpoint answers Hellos with unmoved=True for a fragment
    until that fragment's first round after the restart commits; then False again."""
    from diloco_chaos.trainer.protocol.messages import Hello

    cfg = SyncerConfig("s0", (0,), ("A",), grace_gamma=0.0, tau=100)
    core = SyncerCore(cfg, syncer_math())
    restored = core.restore(core.snapshot(core.init({0: [arr(0.0)]})))
    net = MemNet()
    net.add("s0", core, restored)
    net.do("s0", "learner_connected", "A")
    _, acts = core.receive(net.states["s0"], 0.0, "A", Hello("A", 0, "", ""))
    assert [a.msg.unmoved for a in acts if isinstance(a, Send)] == [True]
    fresh = core.init({0: [arr(0.0)]})
    _, acts = core.receive(fresh, 0.0, "A", Hello("A", 0, "", ""))
    assert [a.msg.unmoved for a in acts if isinstance(a, Send)] == [False]
