"""The sans-IO protocol of Decoupled DiLoCo: learner and syncer cores, their actions and errors.

One import for the shells and the simulator:

    from diloco_chaos.trainer.protocol import SyncerCore, SyncerConfig, SyncerMath, LearnerCore, ...

The cores take `(state, now, event)` and return `(new_state, actions)`; no sockets,
threads or clocks inside (h11-style). docs/PROTOCOL.md has the state machines.
Layout: vocabulary in protocol_base.py, the shard in syncer_core.py (its config, math and
state in syncer_types.py), the learner unit in learner_core.py (learner_types.py).
"""
from diloco_chaos.trainer.learner_core import LearnerCore
from diloco_chaos.trainer.learner_types import InFlight, LearnerConfig, LearnerMath, LearnerState
from diloco_chaos.trainer.protocol_base import (BUGS, DILOCO_MODES, DP_MODES, LEARNER_BUGS, MODES, SYNCER_BUGS, ApplyGrads,
                                   Block, IllegalTransition, Journal, Log, NotStarted, SaveCheckpoint, Send, SetSlices,
                                   SetTimer, Unblock, UnexpectedMessage, UnknownFragment, UnknownPeer)
from diloco_chaos.trainer.syncer_core import SyncerCore
from diloco_chaos.trainer.syncer_types import Pending, Round, SyncerConfig, SyncerMath, SyncerState

__all__ = [
    "BUGS", "DILOCO_MODES", "DP_MODES", "LEARNER_BUGS", "MODES", "SYNCER_BUGS",
    "ApplyGrads", "Block", "Journal", "Log", "SaveCheckpoint", "Send", "SetSlices", "SetTimer", "Unblock",
    "IllegalTransition", "NotStarted", "UnexpectedMessage", "UnknownFragment", "UnknownPeer",
    "InFlight", "LearnerConfig", "LearnerCore", "LearnerMath", "LearnerState",
    "Pending", "Round", "SyncerConfig", "SyncerCore", "SyncerMath", "SyncerState",
]
