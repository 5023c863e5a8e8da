"""lost_writes: a syncer shard's host crashes; what it wrote and did not fsync is gone."""
from __future__ import annotations

from dataclasses import dataclass
from typing import ClassVar

from diloco_chaos.faults.fields import check_number
from diloco_chaos.faults.kinds.base import POSITIVE_S, Fault


@dataclass(frozen=True)
class LostWrites(Fault):
    """A host crash: the shard dies (SIGKILL) and every write it made that no fsync made
    durable is lost, in its checkpoint folder and its commit journal alike (a file never
    fsynced is gone, one written past its last fsync is cut back to it); it restarts after
    `down_for_s`. On processes and containers its checkpoint folder and the journals'
    folder are a FUSE layer of the harness's (harness/backends/ckptfs, as Jepsen's LazyFS: root only);
    in the simulator the shard's un-synced journal lines and the save it was writing are
    dropped. It must restore the newest intact checkpoint (restore_latest_intact) and keep
    every committed round (committed_rounds_kept): only what it made durable may it count on."""

    kind: ClassVar[str] = "lost_writes"
    # drawn only where a property names it: the uniform draws stay the ones CI has explored
    drawn_by_default: ClassVar[bool] = False
    roles: ClassVar[tuple[str, ...]] = ("syncer",)
    length_field: ClassVar[str] = "down_for_s"
    colour: ClassVar[str] = "#3f007d"
    downs_target: ClassVar[bool] = True
    restarts: ClassVar[bool] = True
    mechanism: ClassVar[str] = "killed; its un-fsynced writes dropped (a FUSE layer); restarted"
    conflicts: ClassVar[dict[str, str]] = {"kill_syncer": "the shard is already down",
                                           "corrupt_checkpoint": "the shard is already down",
                                           "lost_writes": "the shard is already down"}
    down_for_s: float

    def _check(self) -> None:
        check_number(self, "down_for_s", POSITIVE_S, lambda v: v > 0)

    def start(self, nemesis, n) -> None:
        nemesis.down(self.target, "killed")
        done = nemesis.control.lose_writes(self.target)  # what the crash took, then the folder
        nemesis.emit("writes_lost", "harness", id=n, unit=self.target, **done,
                     **nemesis.control.checkpoints(self.target))

    def heal(self, nemesis, n, final) -> None:
        if not final:
            nemesis.up(self.target)
