"""kill_syncer: a syncer shard dies and restarts from its checkpoint."""
from __future__ import annotations

from dataclasses import dataclass
from typing import ClassVar

from diloco_chaos.faults.fields import check_number
from diloco_chaos.faults.kinds.base import POSITIVE_S, Fault


@dataclass(frozen=True)
class KillSyncer(Fault):
    """A syncer shard dies (SIGKILL) and restarts from its checkpoint after `down_for_s`."""

    kind: ClassVar[str] = "kill_syncer"
    severity: ClassVar[int] = 9
    roles: ClassVar[tuple[str, ...]] = ("syncer",)
    length_field: ClassVar[str] = "down_for_s"
    colour: ClassVar[str] = "#67000d"
    downs_target: ClassVar[bool] = True
    restarts: ClassVar[bool] = True
    conflicts: ClassVar[dict[str, str]] = {"kill_syncer": "the shard is already down"}
    down_for_s: float

    def _check(self) -> None:
        check_number(self, "down_for_s", POSITIVE_S, lambda v: v > 0)

    def start(self, nemesis, n) -> None:
        nemesis.down(self.target, "killed")
        # what its restart must restore: the newest sealed save (restore_latest_intact)
        nemesis.emit("checkpoints_listed", "harness", unit=self.target, **nemesis.control.checkpoints(self.target))

    def heal(self, nemesis, n, final) -> None:
        if not final:
            nemesis.up(self.target)
