"""preempt: a learner unit is preempted with notice, and a replacement starts later."""
from __future__ import annotations

from dataclasses import dataclass
from typing import ClassVar

from diloco_chaos.faults.fields import check_number
from diloco_chaos.faults.kinds.base import POSITIVE_S, Fault


@dataclass(frozen=True)
class Preempt(Fault):
    """A learner unit is preempted with notice (SIGTERM, as a cloud scheduler's eviction or
    a maintenance event gives): it closes, sending the progress no Δ holds yet, and
    leaves; a replacement starts after `down_for_s`. Where kill_unit loses that progress,
    a unit that heeds the notice keeps it in Θ."""

    kind: ClassVar[str] = "preempt"
    # drawn only where a property names it: the uniform draws stay the ones CI has explored
    drawn_by_default: ClassVar[bool] = False
    length_field: ClassVar[str] = "down_for_s"
    mechanism: ClassVar[str] = "SIGTERM (the unit closes and leaves); a new process after down_for"
    colour: ClassVar[str] = "#6a3d9a"
    downs_target: ClassVar[bool] = True
    restarts: ClassVar[bool] = True
    conflicts: ClassVar[dict[str, str]] = {
        "preempt": "the unit is already leaving",
        "kill_unit": "the unit is already down",
        "pause_unit": "a paused unit cannot act on its notice",
        "slow_unit": "a unit cannot be slowed while it is down (the duty cycle signals its process)",
        "kill_slice": "a unit that is down has no slices to lose",
        "corrupt": "a unit that is down sends nothing to corrupt",
    }
    down_for_s: float

    def _check(self) -> None:
        check_number(self, "down_for_s", POSITIVE_S, lambda v: v > 0)

    def start(self, nemesis, n) -> None:
        nemesis.down(self.target, "preempted", act=nemesis.control.terminate)

    def heal(self, nemesis, n, final) -> None:
        if final:
            return
        if nemesis.control.running(self.target):  # it overstayed its notice
            nemesis.control.kill(self.target)
        nemesis.up(self.target)
