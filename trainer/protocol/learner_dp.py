"""The data-parallel baselines' side of LearnerCore (modes "dp" and "elastic_dp"): each step's
gradient goes out as one GradStep per fragment, and the step waits for every fragment's
token-weighted mean (GradMean) before the optimizer applies it. A collaborator the core
(trainer/protocol/learner_core.py) calls, with the core's config and math; the core checks that
it started, which fragment a message names, and whether the unit blocks.
"""
from __future__ import annotations

from dataclasses import replace

from diloco_chaos.trainer.protocol.learner_types import LearnerConfig, LearnerMath, LearnerState
from diloco_chaos.trainer.protocol.messages import GradMean, GradStep
from diloco_chaos.trainer.protocol.protocol_base import DP_MODES, ApplyGrads, IllegalTransition, Log, Send, UnexpectedMessage


class LearnerDP:
    def __init__(self, config: LearnerConfig, math: LearnerMath):
        self.config, self.math = config, math

    def grads_ready(self, state: LearnerState, grads, tokens: int) -> tuple[LearnerState, list]:
        """dp modes: this step's gradient, one GradStep per fragment (sent; the means awaited)."""
        if self.config.mode not in DP_MODES:
            raise UnexpectedMessage(f"grads_ready is for the dp modes, not {self.config.mode!r}")
        if state.dp_wait:
            raise IllegalTransition(f"{self.config.learner}: step {state.step} is still being averaged")
        wait, seq = {}, state.seq
        for p, owner in enumerate(self.config.owners):
            seq += 1
            wait[p] = GradStep(self.config.learner, self.config.incarnation, seq, p, state.step, tokens,
                               self.math.grad_payload(self.math.get_fragment(grads, p)))
        state = replace(state, seq=seq, dp_wait=wait, dp_grads=grads)
        return state, [Send(self.config.owners[p], m) for p, m in wait.items()]

    def on_grad_mean(self, state: LearnerState, p: int, msg: GradMean) -> tuple[LearnerState, list, bool]:
        """Fragment p's mean: (state, actions, whether it was awaited). The last one awaited
        applies the step's gradient."""
        sent = state.dp_wait.get(p)
        if sent is None or sent.seq != msg.seq:
            return state, [Log("drop", {"what": "GradMean", "fragment": p, "seq": msg.seq,
                                        "reason": "not_awaited"})], False
        grads = self.math.set_fragment(state.dp_grads, p, list(msg.grads))
        wait = {q: m for q, m in state.dp_wait.items() if q != p}
        state = replace(state, dp_wait=wait, dp_grads=grads if wait else None)
        return state, [] if wait else [ApplyGrads(state.step, grads)], True
