"""kill_unit: a learner unit dies and comes back after `down_for_s` (or never)."""
from __future__ import annotations

import math
from dataclasses import dataclass, field
from typing import ClassVar

from diloco_chaos.faults.fields import check_number
from diloco_chaos.faults.kinds.base import NEVER, Fault


@dataclass(frozen=True)
class KillUnit(Fault):
    """A learner unit dies (SIGKILL) and is restarted after `down_for_s`; None = never."""

    kind: ClassVar[str] = "kill_unit"
    severity: ClassVar[int] = 8
    length_field: ClassVar[str] = "down_for_s"
    colour: ClassVar[str] = "#a50f15"
    downs_target: ClassVar[bool] = True
    restarts: ClassVar[bool] = True
    conflicts: ClassVar[dict[str, str]] = {"kill_unit": "the unit is already down"}
    down_for_s: float | None = field(metadata=NEVER)

    def _check(self) -> None:
        check_number(self, "down_for_s", "> 0 seconds, or None (never returns)", lambda v: v > 0,
                     optional=True)

    def start(self, nemesis, n) -> None:
        if nemesis.dp_rollback:  # a synchronous job cannot go on without one of its members
            for u in nemesis.shape.units:
                if nemesis.control.running(u):
                    nemesis.down(u, "killed" if u == self.target else "rollback")
            return
        nemesis.down(self.target, "killed")

    def heal(self, nemesis, n, final) -> None:
        if final:
            return  # the run is over: nothing to restart
        for u in (nemesis.shape.units if nemesis.dp_rollback else [self.target]):
            if nemesis.is_down(u) and not nemesis.control.running(u):
                nemesis.up(u)

    @classmethod
    def draw(cls, draw, shape, target, at, length, *, never=False):
        from hypothesis import strategies as st

        gone = never and draw(st.booleans())
        return cls(target, at, down_for_s=None if gone else length)

    def fleet_ddl(self, fleet, at, end) -> None:
        """Down for `down_for_s`, then a replacement boots; `rejoin_s` more to its first merge."""
        back = fleet.job_s if self.down_for_s is None else min(fleet.job_s, at + self.down_for_s + fleet.boot_s)
        fleet.charge("dead", at, back)
        fleet.charge("recovery", back, min(fleet.job_s, back + fleet.rejoin_s))

    def fleet_dp(self, fleet, at, end) -> None:
        """Every member restarts when the dead one's replacement is up, from its checkpoint."""
        down = math.inf if self.down_for_s is None else self.down_for_s
        fleet.stall(at, min(fleet.job_s, at + fleet.detect_s + down + fleet.boot_s), restart=True)
