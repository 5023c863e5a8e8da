"""kill_slice: a learner unit loses some of its slices for a while."""
from __future__ import annotations

from dataclasses import dataclass
from typing import ClassVar

from diloco_chaos.faults.fields import check_number
from diloco_chaos.faults.kinds.base import Fault


@dataclass(frozen=True)
class KillSlice(Fault):
    """A unit loses `slices` of its slices for `duration_s`; its batch shrinks meanwhile."""

    kind: ClassVar[str] = "kill_slice"
    severity: ClassVar[int] = 7
    colour: ClassVar[str] = "#fd8d3c"
    conflicts: ClassVar[dict[str, str]] = {"kill_unit": "a unit that is down has no slices to lose"}
    duration_s: float
    slices: int = 1

    def _check(self) -> None:
        super()._check()
        check_number(self, "slices", ">= 1 (and fewer than the unit has)", lambda v: v >= 1, integer=True)

    def start(self, nemesis, n) -> None:
        nemesis.control.set_live_slices(self.target, max(1, nemesis.shape.slices - self.slices))

    def heal(self, nemesis, n, final) -> None:
        nemesis.control.set_live_slices(self.target, nemesis.shape.slices)

    @classmethod
    def fits(cls, shape) -> bool:
        return shape.slices >= 2

    @classmethod
    def draw(cls, draw, shape, target, at, length, *, never=False):
        from hypothesis import strategies as st

        return cls(target, at, duration_s=length, slices=1 + draw(st.integers(0, shape.slices - 2)))

    def learner_seconds(self, span, shape) -> float:
        return span * self.slices / shape.slices

    def fleet_ddl(self, fleet, at, end) -> None:
        """The unit runs on its other slices: chip time away, no learner time."""
        fleet.slices_away(at, end, self.slices)

    def fleet_dp(self, fleet, at, end) -> None:
        """Not priced."""
