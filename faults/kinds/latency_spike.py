"""latency_spike: every frame on a link waits longer, on top of the base profile."""
from __future__ import annotations

from dataclasses import dataclass
from typing import ClassVar

from diloco_chaos.faults.fields import check_number
from diloco_chaos.faults.kinds.base import STREAMS, Fault


@dataclass(frozen=True)
class LatencySpike(Fault):
    """For `duration_s` every frame on the link waits `latency_ms` (± `jitter_ms`) more in
    each direction, on top of the scenario's base WAN profile (a route change, a congested
    hop): a Toxiproxy `latency` toxic added beside the base profile's, where a `wan` fault
    replaces the profile. The worked example of docs/ARCHITECTURE.md "Adding a fault kind"."""

    kind: ClassVar[str] = "latency_spike"
    # drawn only where a property names it: the uniform draws stay the ones CI has explored
    drawn_by_default: ClassVar[bool] = False
    roles: ClassVar[tuple[str, ...]] = ("link",)
    mechanism: ClassVar[str] = "Toxiproxy latency toxic, added to the base profile"
    link_state: ClassVar[str] = "slow"
    duration_s: float
    latency_ms: float = 250.0
    jitter_ms: float = 0.0

    def _check(self) -> None:
        super()._check()
        check_number(self, "latency_ms", "(0, 60000] ms", lambda v: 0 < v <= 60_000)
        check_number(self, "jitter_ms", f"[0, latency_ms = {self.latency_ms}]", lambda v: 0 <= v <= self.latency_ms)

    def toxics(self):
        return [("latency", STREAMS, {"latency": round(self.latency_ms), "jitter": round(self.jitter_ms)})]
