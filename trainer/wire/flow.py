"""What a link holds, and what it says about it: the transport's delivery window
(`Flow`), the per-link counters (`LinkStats`), what waits on a link now (`BufferState`),
and when a process writes its `link_buffer` lines (`BufferLog`). Pure bookkeeping, no
I/O: trainer/wire/transport.py (the shard's end) and trainer/wire/shard_link.py (a learner's end)
use it, and docs/PROTOCOL.md "Bounded buffers" says why the window exists."""
from __future__ import annotations

from dataclasses import dataclass

from diloco_chaos.trainer.protocol.messages import Received

# The delivery window (module docstring): bytes written and not yet read by the peer,
# beyond which no new frame leaves the outbox; and how often the reader says how far it
# read. 1 MiB keeps a 32 Mbit/s link with 40 ms round trips full and bounds the wait
# behind the window on a 10 Mbit/s one to under a second. None: no window (as before).
WINDOW_BYTES: int | None = 1 << 20
ACK_EVERY_BYTES = 64 * 1024


@dataclass
class LinkStats:
    bytes_sent: int = 0
    bytes_recv: int = 0
    frames_sent: int = 0
    frames_recv: int = 0
    connects: int = 0
    unsent_max: int = 0  # high-water mark of unsent_bytes, sampled on each send and flush
    superseded: int = 0  # frames replaced in the outbox by a newer one with the same key
    unread_max: int = 0  # high-water mark of bytes written and not yet read by the peer (≤ window + a frame)


@dataclass(frozen=True)
class BufferState:
    """What waits on one link: unsent bytes (outbox + partial frame + kernel), frames
    waiting in the outbox, frames superseded so far, and bytes written that the peer has
    not yet said it read (the kernel's, the path's and the peer's buffers; the peer says
    so every ACK_EVERY_BYTES, so up to that much more than is really unread)."""

    unsent_bytes: int
    frames: int
    superseded: int
    unread_bytes: int = 0


class Flow:
    """One connection's delivery window, both directions (counted after the membership
    exchange): `tx` bytes written, `acked` the peer's latest `Received`; `rx` bytes read,
    `rx_acked` what our latest `Received` said."""

    __slots__ = ("tx", "acked", "rx", "rx_acked")

    def __init__(self):
        self.tx = self.acked = self.rx = self.rx_acked = 0

    def unread(self) -> int:
        return self.tx - self.acked

    def open(self) -> bool:
        """May a new frame be started?"""
        return WINDOW_BYTES is None or self.unread() < WINDOW_BYTES

    def ack_due(self) -> bool:
        return self.rx - self.rx_acked >= ACK_EVERY_BYTES

    def ack(self) -> Received:
        self.rx_acked = self.rx
        return Received(self.rx)

    def took(self, msg: Received) -> None:
        self.acked = max(self.acked, msg.nbytes)


class BufferLog:
    """When a process writes `link_buffer` lines: on a time check (`due`, one clock read
    per loop), each link at most once per `interval_s` while something is unsent on it,
    and once more when it empties."""

    def __init__(self, interval_s: float = 1.0):
        self.interval_s = interval_s
        self._next = 0.0
        self._reported: set[str] = set()  # peers whose last line said something was unsent

    def due(self, now: float) -> bool:
        return now >= self._next

    def lines(self, now: float, buffers: dict[str, BufferState]) -> list[dict]:
        """The fields of each `link_buffer` line to write now."""
        self._next = now + self.interval_s
        out = []
        for peer in sorted(set(buffers) | self._reported):
            b = buffers.get(peer, BufferState(0, 0, 0))
            if b.unsent_bytes > 0:
                self._reported.add(peer)
            elif peer in self._reported:
                self._reported.discard(peer)
            else:
                continue
            out.append({"peer": peer, "unsent_bytes": b.unsent_bytes, "frames": b.frames,
                        "superseded": b.superseded, "unread_bytes": b.unread_bytes})
        return out
