"""Bounded send queues: the newest Θ[p] supersedes an unsent older one.

A learner needs the newest global fragment Θ[p], not every version of it. On a thin
link (8-16 kbit/s) a shard commits faster than the link carries a fragment; a FIFO
queue then grows without bound, and when the link recovers the backlog of stale
versions lands at once. `Outbox` is the queue both ends of a link use
(trainer/transport.py) and the simulator models (harness/sim/net.py): a frame put
with a key replaces, in place, a waiting frame with the same key, so at most one
unsent frame per key waits, and the bytes waiting on a link stay bounded by a few
fragments whatever its speed. A frame already taken for writing is never replaced
(the transport keeps its partial write apart).

Which messages may be superseded is `outbox_key(msg)`: a whole `FragmentUpdate`
(the newest Θ[p] makes an older one useless; the queue is per connection, so the
key is per learner), a `Hello` (a second Hello asks for the same thing) and a
`RoundOpen` of p (a learner joins the newest open round of p, not an older one). A
`Contribution` of p waiting unsent is not replaced but *combined* with the newer one
(`combine`, given with the put: the sum of the two Δs, counters added, the older
base_version; the two hold disjoint steps, see docs/PROTOCOL.md), so at most one
unsent contribution per (learner, fragment) waits and no progress is lost. A
`FragmentDelta` (a compressed broadcast) builds on the copy the one before it left, so
it can neither replace an unsent Θ[p] nor be replaced by one alone: it shares their key,
and where it would supersede, what it is put with (`combine`, the shard's Send.whole) takes
the place: Θ[p] whole, the exact copy the learner would have rebuilt. A newer Θ[p] whole
simply replaces an unsent delta. So on a thin link at most one Θ[p] per fragment waits
there too, whatever its kind (a chain of deltas, 1/8 of Θ[p] each at int4, grew without
bound). Every other message keeps FIFO order and is never dropped: the data-parallel
`GradStep` / `GradMean` each answer one step.

Pure: no I/O, no threads, no clock; the caller does the locking.
"""
from __future__ import annotations

from collections import deque
from typing import Hashable

from trainer.messages import Contribution, FragmentDelta, FragmentUpdate, Hello, RoundOpen

COMBINED = "contrib"  # keys of this kind are combined, never replaced: put() needs `combine`


def outbox_key(msg) -> Hashable | None:
    """The key under which `msg` supersedes (or, a Contribution, is combined with) an unsent
    older message on the same link, or None."""
    if isinstance(msg, (FragmentUpdate, FragmentDelta)):
        return ("frag", msg.fragment)
    if isinstance(msg, Hello):
        return ("hello",)
    if isinstance(msg, RoundOpen):  # only the newest open round of p is worth joining
        return ("open", msg.fragment)
    if isinstance(msg, Contribution):
        return (COMBINED, msg.fragment)
    return None


class _Entry:
    __slots__ = ("key", "frame", "msg")

    def __init__(self, key, frame, msg=None):
        self.key, self.frame, self.msg = key, frame, msg


class Outbox:
    """An ordered queue of encoded frames, each with an optional key.

    `put(frame, key)` replaces a waiting frame with the same non-None key in place (it
    keeps its position in the queue) and returns True, else appends and returns False.
    `take()` pops the oldest frame; a taken frame can no longer be superseded.
    Counters: `unsent_bytes` and `frames` (waiting now), `superseded` and
    `superseded_bytes` (frames replaced so far, and the bytes that saved).
    """

    def __init__(self):
        self._q: deque[_Entry] = deque()
        self._by_key: dict = {}
        self.unsent_bytes = 0
        self.superseded = 0
        self.superseded_bytes = 0

    @property
    def frames(self) -> int:
        return len(self._q)

    def __len__(self) -> int:
        return len(self._q)

    def put(self, frame, key: Hashable | None = None, *, msg=None, combine=None) -> bool:
        """`combine(old_msg, msg) -> (msg, frame)`: for COMBINED keys and a FragmentDelta
        `msg`, what replaces the two."""
        if key is not None and (old := self._by_key.get(key)) is not None:
            if key[0] == COMBINED or isinstance(msg, FragmentDelta):
                if combine is None or old.msg is None or msg is None:
                    raise ValueError(f"outbox key {key!r} with {type(msg).__name__} is combined, not replaced: "
                                     f"put() needs msg and combine")
                msg, frame = combine(old.msg, msg)
            self.unsent_bytes += len(frame) - len(old.frame)
            self.superseded += 1
            self.superseded_bytes += len(old.frame)
            old.frame, old.msg = frame, msg
            return True
        entry = _Entry(key, frame, msg)
        self._q.append(entry)
        if key is not None:
            self._by_key[key] = entry
        self.unsent_bytes += len(frame)
        return False

    def take(self) -> bytes | None:
        if not self._q:
            return None
        entry = self._q.popleft()
        if entry.key is not None:
            del self._by_key[entry.key]
        self.unsent_bytes -= len(entry.frame)
        return entry.frame

    def clear(self) -> int:
        """Drops every waiting frame; returns how many there were."""
        n = len(self._q)
        self._q.clear()
        self._by_key.clear()
        self.unsent_bytes = 0
        return n
