"""slow_unit: a learner unit runs at a fraction of its speed."""
from __future__ import annotations

from dataclasses import dataclass
from typing import ClassVar

from diloco_chaos.faults.fields import check_number
from diloco_chaos.faults.kinds.base import Fault


@dataclass(frozen=True)
class SlowUnit(Fault):
    """A unit runs at `speed` × full speed: in every `period_ms` it is stopped for
    (1 − speed) of the period (duty-cycled SIGSTOP/SIGCONT)."""

    kind: ClassVar[str] = "slow_unit"
    severity: ClassVar[int] = 2
    colour: ClassVar[str] = "#d9a01e"
    conflicts: ClassVar[dict[str, str]] = {
        "slow_unit": "the unit is already slowed",
        "kill_unit": "a unit cannot be slowed while it is down (the duty cycle signals its process)",
        "pause_unit": "pause and slow both drive SIGSTOP/SIGCONT on one process",
    }
    duration_s: float
    speed: float
    period_ms: float = 200.0

    def _check(self) -> None:
        super()._check()
        check_number(self, "speed", "(0, 1): the fraction of full speed", lambda v: 0 < v < 1)
        check_number(self, "period_ms", "[10, 10000] ms", lambda v: 10 <= v <= 10_000)

    def start(self, nemesis, n) -> None:
        nemesis.control.set_speed(self.target, self.speed, period_s=self.period_ms / 1000)

    def heal(self, nemesis, n, final) -> None:
        nemesis.control.set_speed(self.target, 1.0)

    @classmethod
    def draw(cls, draw, shape, target, at, length, *, never=False):
        from hypothesis import strategies as st

        speed = (20 - draw(st.integers(1, 19))) / 20  # toward 0.95
        return cls(target, at, duration_s=length, speed=speed)

    def learner_seconds(self, span, shape) -> float:
        return span * (1 - self.speed)

    def fleet_ddl(self, fleet, at, end) -> None:
        """Fewer tokens, no idle time: nothing."""

    def fleet_dp(self, fleet, at, end) -> None:
        fleet.slowed(at, end, self.speed)  # the others wait on it
