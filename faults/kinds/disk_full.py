"""disk_full: a syncer shard's checkpoint disk has no space left."""
from __future__ import annotations

from dataclasses import dataclass
from typing import ClassVar

from diloco_chaos.faults.fields import check_number
from diloco_chaos.faults.kinds.base import POSITIVE_S, Fault


@dataclass(frozen=True)
class DiskFull(Fault):
    """The shard's checkpoint disk is full for `duration_s`: every save it starts or
    finishes then fails (ENOSPC), including inside orbax's asynchronous write. On processes
    and containers the disk is a small filesystem of the shard's own (a tmpfs the harness
    mounts on its checkpoint folder: root only), filled by the harness to its last byte and
    emptied at the heal; in the simulator its saves fail while the fault lasts. The shard
    must go on committing, report nothing of a failed save durable, and save again after."""

    kind: ClassVar[str] = "disk_full"
    # drawn only where a property names it: the uniform draws stay the ones CI has explored
    drawn_by_default: ClassVar[bool] = False
    roles: ClassVar[tuple[str, ...]] = ("syncer",)
    colour: ClassVar[str] = "#8c6d31"
    mechanism: ClassVar[str] = "its checkpoint filesystem filled to the last byte (ENOSPC)"
    conflicts: ClassVar[dict[str, str]] = {"disk_full": "the shard's disk is already full"}
    duration_s: float

    def _check(self) -> None:
        check_number(self, "duration_s", POSITIVE_S, lambda v: v > 0)

    def start(self, nemesis, n) -> None:
        nemesis.control.set_fault(self.target, self.kind)

    def heal(self, nemesis, n, final) -> None:
        nemesis.control.clear_fault(self.target, self.kind)
