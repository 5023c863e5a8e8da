"""A fresh start costs no download: a learner that has taken no update holds the run's
Θ0, says so in its Hello (a digest over the shard's fragments), and the shard answers a
fragment still at version 0 with no params. By hand, one or two fragments of one number."""
from __future__ import annotations

from dataclasses import replace

import pytest
from protocol_link import arr, learner_math, syncer_math

from diloco_chaos.trainer.numerics.wiring import digest
from diloco_chaos.trainer.protocol.learner_core import LearnerCore
from diloco_chaos.trainer.protocol.learner_types import LearnerConfig
from diloco_chaos.trainer.protocol.messages import Contribution, FragmentUpdate, Hello
from diloco_chaos.trainer.protocol.protocol_base import Send, UnexpectedMessage
from diloco_chaos.trainer.protocol.syncer_core import SyncerCore
from diloco_chaos.trainer.protocol.syncer_types import SyncerConfig

THETA0 = {0: [arr(1.0)], 1: [arr(2.0)]}


def _shard(theta0=THETA0):
    core = SyncerCore(SyncerConfig("s0", (0, 1), ("A",), grace_gamma=0.0), replace(syncer_math(), digest=digest))
    state, _ = core.learner_connected(core.init(theta0), 0.0, "A")
    return core, state


def _answers(core, state, hello):
    state, acts = core.receive(state, 0.0, "A", hello)
    return state, {a.msg.fragment: [float(x[0]) for x in a.msg.params] for a in acts if isinstance(a, Send)}


def test_a_fresh_hello_gets_no_params_for_fragments_still_at_version_0():
    core, state = _shard()
    mine = digest([THETA0[0][0], THETA0[1][0]])
    assert _answers(core, state, Hello("A", 0, mine))[1] == {0: [], 1: []}
    # after a commit of fragment 0 (Δ = 0.5 at outer lr 1: Θ[0] = 0.5), only fragment 1 is current
    state, _ = core.receive(state, 1.0, "A", Contribution("A", 0, 1, 0, 0, 2, 20, 1.0, None, [arr(0.5)]))
    assert _answers(core, state, Hello("A", 0, mine))[1] == {0: [0.5], 1: []}
    # another Θ0 (a task whose init is not reproducible), no digest, or a restored shard: whole
    assert _answers(core, state, Hello("A", 0, digest([arr(9.0), arr(2.0)])))[1] == {0: [0.5], 1: [2.0]}
    assert _answers(core, state, Hello("A", 0))[1] == {0: [0.5], 1: [2.0]}
    restored = core.restore(core.snapshot(state))
    restored, _ = core.learner_connected(restored, 0.0, "A")
    assert _answers(core, restored, Hello("A", 0, mine))[1] == {0: [0.5], 1: [2.0]}


def _learner(incarnation=0):
    core = LearnerCore(LearnerConfig("A", incarnation, ("s0", "s0")), replace(learner_math(2, 2), digest=digest))
    return core, core.init([arr(1.0), arr(2.0)])


def test_the_learner_is_fresh_until_it_steps_or_takes_an_update():
    core, state = _learner()
    state, acts = core.start(state, 0.0)
    assert acts[0].msg.fresh == digest([arr(1.0), arr(2.0)])
    restarted, rstate = _learner(incarnation=1)
    assert restarted.start(rstate, 0.0)[1][0].msg.fresh == ""   # a restart holds a checkpoint, not Θ0
    # the empty answer: its own Θ0[p] is taken as version 0; fragment 1 still awaited
    state, _ = core.receive(state, 0.0, "s0", FragmentUpdate(0, 0, True, []))
    assert (float(state.params[0][0]), state.base_version, state.awaiting) == (1.0, (0, 0), frozenset({1}))
    state, _ = core.after_inner_step(state, 0.0, [arr(1.5), arr(2.5)], 10, 1.0)
    state, acts = core.shard_connected(state, 0.0, "s0")        # a reconnect after a step: not fresh
    assert acts[0].msg == Hello("A", 0, "")
    with pytest.raises(UnexpectedMessage, match="without params"):
        core.receive(state, 0.0, "s0", FragmentUpdate(1, 3, True, []))
