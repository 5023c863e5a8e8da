"""wan: a link's profile (bandwidth, latency) changes for a while."""
from __future__ import annotations

from dataclasses import dataclass, field
from typing import ClassVar

from diloco_chaos.faults.fields import FieldError, check_number
from diloco_chaos.faults.kinds.base import Fault


@dataclass(frozen=True)
class Wan(Fault):
    """The link's profile becomes this for `duration_s` (None = to the end of the run),
    then returns to the scenario's base profile. Toxiproxy `bandwidth` and `latency`
    toxics; latency is one-way, on both streams."""

    kind: ClassVar[str] = "wan"
    severity: ClassVar[int] = 1
    roles: ClassVar[tuple[str, ...]] = ("link",)
    mechanism: ClassVar[str] = "Toxiproxy bandwidth/latency toxics"
    link_state: ClassVar[str] = "slow"  # "throttled" when it limits the bandwidth (reports/timeline.py)
    colour: ClassVar[str] = "#f16913"
    duration_s: float | None = field(default=None, metadata={"none_word": "end"})
    bandwidth_kbps: float | None = None  # kilobits per second; None = unlimited
    latency_ms: float = 0.0
    jitter_ms: float = 0.0

    def _check(self) -> None:
        check_number(self, "duration_s", "> 0 seconds, or None (to the end)", lambda v: v > 0, optional=True)
        check_number(self, "bandwidth_kbps", ">= 8 kbps (1 KB/s, Toxiproxy's resolution), or None",
                     lambda v: v >= 8, optional=True)
        check_number(self, "latency_ms", ">= 0 ms", lambda v: v >= 0)
        check_number(self, "jitter_ms", f"[0, latency_ms = {self.latency_ms}]",
                     lambda v: 0 <= v <= self.latency_ms)
        if self.bandwidth_kbps is None and self.latency_ms == 0:
            raise FieldError("Wan", "bandwidth_kbps", "a wan fault with no bandwidth limit and no "
                             "latency changes nothing", "set bandwidth_kbps and/or latency_ms")

    def start(self, nemesis, n) -> None:
        """It replaces the base WAN profile on its links while it lasts."""
        for link in nemesis.links(self):
            nemesis.strip(link, "wan_")  # the base profile steps aside
            nemesis.shape_link(link, f"f{n}", bandwidth_kbps=self.bandwidth_kbps, latency_ms=self.latency_ms,
                               jitter_ms=self.jitter_ms)

    def heal(self, nemesis, n, final) -> None:
        nemesis.remove_toxics(n, self)
        if not final:
            for link in nemesis.links(self):
                nemesis.base_profile(link)

    @classmethod
    def draw(cls, draw, shape, target, at, length, *, never=False):
        from diloco_chaos.faults.strategies import wan_settings

        return cls(target, at, duration_s=length, **draw(wan_settings()))

    def learner_seconds(self, span, shape) -> float:
        return 0.0  # it slows traffic, not learners

