"""send_stall: a unit's outgoing messages wait inside it until the fault heals."""
from __future__ import annotations

from dataclasses import dataclass
from typing import ClassVar

from diloco_chaos.faults.kinds.base import Fault


@dataclass(frozen=True)
class SendStall(Fault):
    """For `duration_s`, every message the unit's core sends waits inside the unit (a hung
    NIC queue, a send thread blocked on a lock) and leaves at the heal, in order: what the
    core decided meanwhile (a learner's contributions, a shard's answers and broadcasts) is
    late, not lost, and never reordered. The unit itself goes on: a learner steps, a shard
    merges what it receives."""

    kind: ClassVar[str] = "send_stall"
    roles: ClassVar[tuple[str, ...]] = ("learner", "syncer")
    # drawn only where a property names it: the uniform draws stay the ones CI has explored
    drawn_by_default: ClassVar[bool] = False
    colour: ClassVar[str] = "#80cdc1"
    mechanism: ClassVar[str] = "what its core sends held in the unit (set_fault), sent in order at the heal"
    conflicts: ClassVar[dict[str, str]] = {
        "send_stall": "the unit's sends are already stalled",
        "pause_unit": "a frozen unit reads no control: the stall would end at the resume, not at its heal",
    }
    duration_s: float

    def start(self, nemesis, n) -> None:
        nemesis.control.set_fault(self.target, self.kind)

    def heal(self, nemesis, n, final) -> None:
        nemesis.control.clear_fault(self.target, self.kind)
