"""corrupt_checkpoint: a syncer shard's newest checkpoint is damaged at rest, and it restarts."""
from __future__ import annotations

from dataclasses import dataclass
from typing import ClassVar

from diloco_chaos.faults.fields import check_choice, check_number
from diloco_chaos.faults.kinds.base import POSITIVE_S, Fault

DAMAGES = ("flip", "truncate", "manifest")


@dataclass(frozen=True)
class CorruptCheckpoint(Fault):
    """A syncer shard dies (SIGKILL), its newest checkpoint is damaged on disk while it is down
    (`damage`: `flip` one byte of its largest data file, bit rot orbax loads without
    complaint; `truncate` that file to half, a torn write; `manifest` removes the newest
    sealed one's manifest, a lost metadata write), and it restarts after `down_for_s`: it must
    pass the damaged save over and restore the newest intact one (checkpoint_integrity,
    restore_latest_intact)."""

    kind: ClassVar[str] = "corrupt_checkpoint"
    severity: ClassVar[int] = 10
    roles: ClassVar[tuple[str, ...]] = ("syncer",)
    length_field: ClassVar[str] = "down_for_s"
    colour: ClassVar[str] = "#543005"
    downs_target: ClassVar[bool] = True
    restarts: ClassVar[bool] = True
    mechanism: ClassVar[str] = "killed; its newest checkpoint damaged on disk; restarted"
    conflicts: ClassVar[dict[str, str]] = {"kill_syncer": "the shard is already down",
                                           "corrupt_checkpoint": "the shard is already down"}
    down_for_s: float
    damage: str = "flip"

    def _check(self) -> None:
        check_number(self, "down_for_s", POSITIVE_S, lambda v: v > 0)
        check_choice(self, "damage", DAMAGES)

    @classmethod
    def draw(cls, draw, shape, target, at, length, *, never=False):
        from hypothesis import strategies as st

        return cls(target, at, down_for_s=length, damage=draw(st.sampled_from(DAMAGES)))

    def start(self, nemesis, n) -> None:
        nemesis.down(self.target, "killed")
        done = nemesis.control.damage_checkpoint(self.target, self.damage)
        nemesis.emit("checkpoint_damaged", "harness", id=n, unit=self.target, **done)

    def heal(self, nemesis, n, final) -> None:
        if not final:
            nemesis.up(self.target)
