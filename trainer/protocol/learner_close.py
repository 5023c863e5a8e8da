"""The closing contribution: a learner unit's last progress, into Θ before it leaves.

A fragment goes to its shard once per H inner steps, so when a learner unit runs its last
inner step every fragment holds up to H steps of progress that is in no Δ: Θ at the end
misses all of it, and each learner's own model misses the others'. At H = 64 (the paper
preset) that is a sixth of a 400-step run. So (decoupled mode, a unit that ends by itself
at its step cap or that the harness stops at the run's end) `finish` sends every fragment's remaining
progress as its closing Δ, flagged `closing`, and the unit waits for the answers before
its final evaluation: Θ then holds every learner's last steps, each at one learner's share
of the fleet (the shard keeps a learner that closed in its count once it has left), and
the learner's own final model is Θ as its closing rounds left it (docs/PROTOCOL.md
"Closing contributions"). Bounded staleness still holds: a fragment whose Δ is in flight
at `finish` closes once that Δ is answered; one that awaits its fetch (its shard down or
restarting, its link cut) closes once the fetch is in, if the fetch kept its progress:
a learner that spends its budget while a shard is down closes into it when it is back
(within the closing wait), instead of leaving with that progress.
"""
from __future__ import annotations

from dataclasses import replace
from typing import Callable

from diloco_chaos.trainer.protocol.learner_types import LearnerConfig, LearnerState
from diloco_chaos.trainer.protocol.protocol_base import Log


class LearnerClose:
    """LearnerCore's closing: `finish`, `closed`, and `close_ready` (called on every take). A
    collaborator the core calls, with its config and the one step it needs from the core:
    `contribute(state, now, p) -> (state, actions)`, fragment p's Δ sent as the core sends any."""

    def __init__(self, config: LearnerConfig, contribute: Callable[[LearnerState, float, int], tuple]):
        self.config, self.contribute = config, contribute

    def finish(self, state: LearnerState, now: float):
        """The unit's last inner step is done: every fragment with progress closes, its Δ
        sent now, when the one in flight is answered, or when its pending fetch is in."""
        if self.config.mode != "decoupled" or state.closing is not None:
            return state, []
        want = frozenset(p for p in range(len(self.config.owners)) if state.c_steps[p] >= 1)
        log = Log("closing", {"step": state.step, "fragments": sorted(want),
                              "waiting": sorted(p for p in want if p in state.in_flight or p in state.awaiting)})
        state, sends = self.close_ready(replace(state, closing=want), now)
        return state, [log] + sends

    def close_ready(self, state: LearnerState, now: float):
        """The closing Δ of each closing fragment that is no longer in flight nor awaiting
        its fetch (a fetch that threw the progress away leaves nothing to close)."""
        actions: list = []
        for p in sorted(state.closing or ()):
            if p in state.in_flight or p in state.awaiting:
                continue
            state = replace(state, closing=state.closing - {p})
            if state.c_steps[p] >= 1 and p not in state.awaiting:
                state, more = self.contribute(state, now, p)
                actions += more
        return state, actions

    @staticmethod
    def closed(state: LearnerState) -> bool:
        """Every closing Δ sent and answered (True at once when none was due)."""
        return state.closing is not None and not state.closing and not state.in_flight
