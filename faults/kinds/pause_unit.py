"""pause_unit: a learner unit hangs, alive but silent."""
from __future__ import annotations

from dataclasses import dataclass
from typing import ClassVar

from diloco_chaos.faults.kinds.base import Fault


@dataclass(frozen=True)
class PauseUnit(Fault):
    """A unit hangs, alive but silent (SIGSTOP, then SIGCONT after `duration_s`)."""

    kind: ClassVar[str] = "pause_unit"
    severity: ClassVar[int] = 6
    colour: ClassVar[str] = "#756bb1"
    downs_target: ClassVar[bool] = True
    conflicts: ClassVar[dict[str, str]] = {
        "pause_unit": "the unit is already paused",
        "kill_unit": "a unit cannot be paused while it is down (the pause's SIGCONT would hit its restarted process)",
    }
    duration_s: float

    def start(self, nemesis, n) -> None:
        other_way = nemesis.control.pause(self.target)
        nemesis.emit("unit_down", self.target, reason="paused", **({"via": other_way} if other_way else {}))

    def heal(self, nemesis, n, final) -> None:
        nemesis.control.resume(self.target)
        nemesis.emit("unit_up", self.target, reason="resumed")

    def fleet_ddl(self, fleet, at, end) -> None:
        fleet.charge("paused", at, end)

    def fleet_dp(self, fleet, at, end) -> None:
        fleet.stall(at, end)  # the all-reduce waits on the hung replica
