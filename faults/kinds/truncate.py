"""truncate: each connection on a link is closed after a number of bytes."""
from __future__ import annotations

from dataclasses import dataclass
from typing import ClassVar

from diloco_chaos.faults.fields import check_number
from diloco_chaos.faults.kinds.base import Fault


@dataclass(frozen=True)
class Truncate(Fault):
    """Each connection on the link is closed after `bytes` bytes (Toxiproxy
    `limit_data`) during `duration_s`: a message is cut mid-stream."""

    kind: ClassVar[str] = "truncate"
    severity: ClassVar[int] = 4
    roles: ClassVar[tuple[str, ...]] = ("link",)
    mechanism: ClassVar[str] = "Toxiproxy limit_data toxic"
    cuts_link: ClassVar[bool] = True
    link_state: ClassVar[str] = "truncated"
    colour: ClassVar[str] = "#ce1256"
    duration_s: float
    bytes: int

    def _check(self) -> None:
        super()._check()
        check_number(self, "bytes", ">= 1 byte", lambda v: v >= 1, integer=True)

    def toxics(self):
        return [("limit_data", ("downstream", "upstream"), {"bytes": self.bytes})]

    @classmethod
    def draw(cls, draw, shape, target, at, length, *, never=False):
        from hypothesis import strategies as st

        return cls(target, at, duration_s=length, bytes=2 ** (16 - draw(st.integers(0, 8))))  # toward 64 KiB
