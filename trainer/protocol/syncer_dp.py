"""The data-parallel baselines' side of SyncerCore (modes "dp" and "elastic_dp"): a round
collects one GradStep per learner and answers each with the token-weighted mean gradient
(GradMean), kept so that a mean lost with a link can be sent again. A collaborator the core
(trainer/protocol/syncer_core.py) calls with its math; the core keeps the round table (who is
in, when a round commits, the version) and asks this for what is dp's own.
"""
from __future__ import annotations

from dataclasses import replace

from diloco_chaos.trainer.protocol.messages import GradMean, GradStep
from diloco_chaos.trainer.protocol.protocol_base import Send
from diloco_chaos.trainer.protocol.syncer_types import Pending, SyncerMath, SyncerState


class SyncerDP:
    def __init__(self, math: SyncerMath):
        self.math = math

    @staticmethod
    def pending(g: GradStep, now: float) -> Pending:
        """A learner's gradient as its round's entry (one step, its tokens)."""
        return Pending(g.incarnation, g.seq, g.step, 1, g.c_tokens, g.payload, now)

    @staticmethod
    def resend(state: SyncerState, p: int, g: GradStep) -> list:
        """A GradStep seen before: its mean again when that was lost with the link."""
        sent = state.dp_sent.get((g.learner, p))
        return [Send(g.learner, sent)] if sent is not None and sent.seq == g.seq else []

    def mean(self, state: SyncerState, p: int) -> tuple[list, list, list]:
        """p's round: (its entries by learner, their token weights, the weighted mean gradient)."""
        merged = sorted(state.rounds[p].pending.items())
        weights = [float(pc.c_tokens) for _, pc in merged]
        return merged, weights, self.math.average([self.math.decode(pc.payload) for _, pc in merged], weights)

    @staticmethod
    def answer(state: SyncerState, p: int, merged: list, grads) -> tuple[SyncerState, list]:
        """Every learner of p's committed round gets the mean, kept to send again."""
        means = {(learner, p): GradMean(p, state.version[p], pc.seq, len(merged), list(grads))
                 for learner, pc in merged}
        sends = [Send(learner, m) for (learner, _), m in means.items()]
        return replace(state, dp_sent={**state.dp_sent, **means}), sends
