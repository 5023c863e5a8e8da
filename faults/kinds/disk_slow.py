"""disk_slow: a syncer shard's checkpoint disk answers every write and fsync late."""
from __future__ import annotations

from dataclasses import dataclass
from typing import ClassVar

from diloco_chaos.faults.fields import check_number
from diloco_chaos.faults.kinds.base import POSITIVE_S, Fault


@dataclass(frozen=True)
class DiskSlow(Fault):
    """For `duration_s`, every write and every fsync on the shard's checkpoint disk takes
    `latency_ms` longer (a failing drive, a saturated network volume). On processes and
    containers the disk is a FUSE layer of the harness's over the shard's checkpoint folder
    (harness/backends/ckptfs: root only) that sleeps before each write and fsync; in the simulator a
    save takes `latency_ms` longer per write and fsync it makes. Saves land late and fewer
    of them start: the shard must go on committing (at most one save in flight, never a
    wait on the disk in its loop) and a crash then must still keep its committed rounds
    (repair from the learners)."""

    kind: ClassVar[str] = "disk_slow"
    # drawn only where a property names it: the uniform draws stay the ones CI has explored
    drawn_by_default: ClassVar[bool] = False
    roles: ClassVar[tuple[str, ...]] = ("syncer",)
    colour: ClassVar[str] = "#bf812d"
    mechanism: ClassVar[str] = "every write and fsync of its checkpoint disk delayed (a FUSE layer)"
    conflicts: ClassVar[dict[str, str]] = {"disk_slow": "the shard's disk is already slow"}
    duration_s: float
    latency_ms: float = 200.0

    def _check(self) -> None:
        check_number(self, "duration_s", POSITIVE_S, lambda v: v > 0)
        check_number(self, "latency_ms", "a number of milliseconds > 0 and ≤ 10000, e.g. 200",
                     lambda v: 0 < v <= 10_000)

    @classmethod
    def draw(cls, draw, shape, target, at, length, *, never=False):
        from hypothesis import strategies as st

        return cls(target, at, duration_s=length, latency_ms=draw(st.sampled_from((50.0, 200.0, 1000.0))))

    def start(self, nemesis, n) -> None:
        nemesis.control.set_fault(self.target, self.kind, latency_ms=self.latency_ms)

    def heal(self, nemesis, n, final) -> None:
        nemesis.control.clear_fault(self.target, self.kind)
