"""reset: a link's connections are reset while it lasts."""
from __future__ import annotations

from dataclasses import dataclass
from typing import ClassVar

from diloco_chaos.faults.kinds.base import STREAMS, Fault


@dataclass(frozen=True)
class Reset(Fault):
    """Connections on the link are reset (Toxiproxy `reset_peer`) during `duration_s`."""

    kind: ClassVar[str] = "reset"
    severity: ClassVar[int] = 3
    roles: ClassVar[tuple[str, ...]] = ("link",)
    mechanism: ClassVar[str] = "Toxiproxy reset_peer toxic"
    cuts_link: ClassVar[bool] = True
    link_state: ClassVar[str] = "reset"
    colour: ClassVar[str] = "#e7298a"
    duration_s: float

    def toxics(self):
        return [("reset_peer", STREAMS, {"timeout": 0})]
