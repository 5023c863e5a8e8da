"""partition: a link drops all traffic in one direction or both (a black hole)."""
from __future__ import annotations

from dataclasses import dataclass
from typing import ClassVar

from diloco_chaos.faults.fields import check_choice
from diloco_chaos.faults.kinds.base import STREAMS, Fault

DIRECTIONS = ("both", "upstream", "downstream")  # upstream = learner → syncer
MILDEST_FIRST = ("upstream", "downstream", "both")  # how strategies draw a direction
_STREAMS_OF = {"both": STREAMS, "upstream": ("upstream",), "downstream": ("downstream",)}


@dataclass(frozen=True)
class Partition(Fault):
    """The link drops all traffic in `direction` for `duration_s` (Toxiproxy `timeout`)."""

    kind: ClassVar[str] = "partition"
    severity: ClassVar[int] = 5
    roles: ClassVar[tuple[str, ...]] = ("link",)
    mechanism: ClassVar[str] = "Toxiproxy timeout toxic (black hole)"
    cuts_link: ClassVar[bool] = True
    link_state: ClassVar[str] = "partitioned"
    colour: ClassVar[str] = "#54278f"
    duration_s: float
    direction: str = "both"

    def _check(self) -> None:
        super()._check()
        check_choice(self, "direction", DIRECTIONS)

    def toxics(self):
        # a timeout toxic with timeout 0 holds every byte forever: a black hole, as
        # a partition looks to TCP (no reset, no refusal)
        return [("timeout", _STREAMS_OF[self.direction], {"timeout": 0})]

    @classmethod
    def draw(cls, draw, shape, target, at, length, *, never=False):
        from hypothesis import strategies as st

        return cls(target, at, duration_s=length, direction=draw(st.sampled_from(MILDEST_FIRST)))
