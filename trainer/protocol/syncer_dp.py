"""The data-parallel baselines' side of SyncerCore (modes "dp" and "elastic_dp"): a round
collects one GradStep per learner and answers each with the token-weighted mean gradient
(GradMean), kept so that a mean lost with a link can be sent again. A mixin of SyncerCore
(trainer/protocol/syncer_core.py), which holds the config, the math and the round table used here.
"""
from __future__ import annotations

from dataclasses import replace

from diloco_chaos.trainer.protocol.messages import GradMean, GradStep
from diloco_chaos.trainer.protocol.protocol_base import Send
from diloco_chaos.trainer.protocol.syncer_types import Pending, SyncerState


class SyncerDP:
    def _on_grad_step(self, state: SyncerState, now: float, g: GradStep):
        p = self._owned(g.fragment)
        prev = state.rounds[p].pending.get(g.learner) if p in state.rounds else None
        why = self._seen(state, p, g, prev)
        if why:
            actions = [self._drop(g, why)]
            resend = state.dp_sent.get((g.learner, p))
            if resend is not None and resend.seq == g.seq:  # its mean was lost with the link
                actions.append(Send(g.learner, resend))
            return state, actions
        return self._add(state, now, p, g.learner, Pending(g.incarnation, g.seq, g.step, 1, g.c_tokens,
                                                           g.payload, now), prev)

    def _commit_dp(self, state: SyncerState, now: float, p: int):
        merged = sorted(state.rounds[p].pending.items())
        weights = [float(pc.c_tokens) for _, pc in merged]
        grads = self.math.average([self.math.decode(pc.payload) for _, pc in merged], weights)
        state, actions = self._close(state, now, p, weights, [0] * len(merged))
        means = {(learner, p): GradMean(p, state.version[p], pc.seq, len(merged), list(grads))
                 for learner, pc in merged}
        actions += [Send(learner, m) for (learner, _), m in means.items()]
        return replace(state, dp_sent={**state.dp_sent, **means}), actions
