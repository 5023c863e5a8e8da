"""corrupt: a learner unit's outgoing contributions are silently wrong."""
from __future__ import annotations

import math
from dataclasses import dataclass
from typing import ClassVar

from diloco_chaos.faults.fields import FieldError, check_number
from diloco_chaos.faults.kinds.base import Fault

CORRUPT_MODES = ("scale", "bitflip", "nonfinite")  # trainer/protocol/sdc.py MODES
DRAWN_MODES = ("scale", "nonfinite", "bitflip")    # how strategies draw a mode (toward scale)
# scale factors a corrupt fault draws: far outside the shards' guard bound (30× a
# learner's recent Δ norms) both ways. Nearer it (×100 got in on a CI draw, where the
# recent norms were large), or inside it (×10, a plain sign flip), the guard cannot tell
# a corrupt Δ from a large honest one: suites/properties/test_safety.py shows that the
# ledger names those (the verdict holds), docs/PROTOCOL.md the defence's gap; those sizes
# are drawn by faults/strategies.py `near_bound_sdc`, with a property of their own
SDC_FACTORS = (1000.0, -1000.0)


@dataclass(frozen=True)
class Corrupt(Fault):
    """Silent data corruption: for `duration_s` the unit's outgoing contributions are wrong,
    not absent (trainer/protocol/sdc.py): `mode` scale (× `factor`), bitflip (`flips` exponent
    bits) or nonfinite (a NaN / inf per tensor)."""

    kind: ClassVar[str] = "corrupt"
    # drawn only where asked for: the shard's guard has no history right after a shard
    # restart, so a corruption then can get in (docs/PROTOCOL.md "Corrupt contributions")
    drawn_by_default: ClassVar[bool] = False
    severity: ClassVar[int] = 11
    conflicts: ClassVar[dict[str, str]] = {
        "corrupt": "the unit's contributions are already corrupted",
        "kill_unit": "a unit that is down sends nothing to corrupt",
    }
    duration_s: float
    mode: str = "scale"
    factor: float = 1000.0
    flips: int = 8

    def _check(self) -> None:
        super()._check()
        if self.mode not in CORRUPT_MODES:
            raise FieldError(type(self).__name__, "mode", f"unknown corrupt mode {self.mode!r}",
                             ", ".join(CORRUPT_MODES))
        check_number(self, "factor", "a finite number other than 1", lambda v: math.isfinite(v) and v != 1)
        check_number(self, "flips", ">= 1", lambda v: v >= 1, integer=True)

    def start(self, nemesis, n) -> None:
        nemesis.control.set_fault(self.target, self.kind, mode=self.mode, factor=self.factor, flips=self.flips)

    def heal(self, nemesis, n, final) -> None:
        nemesis.control.clear_fault(self.target, self.kind)

    @classmethod
    def draw(cls, draw, shape, target, at, length, *, never=False):
        from hypothesis import strategies as st

        return cls(target, at, duration_s=length, mode=draw(st.sampled_from(DRAWN_MODES)),
                   factor=draw(st.sampled_from(SDC_FACTORS)))

    def fleet_ddl(self, fleet, at, end) -> None:
        """The shards' guard drops its contributions: its steps reach no merge meanwhile."""
        fleet.lost(at, end, self.target)

    def fleet_dp(self, fleet, at, end) -> None:
        """Not priced: corrupt gradients cost quality, not time."""
