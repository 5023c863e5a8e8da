"""Bounded send queues: the newest Θ[p] supersedes an unsent older one.

A learner needs the newest global fragment Θ[p], not every version of it. On a thin
link (8-16 kbit/s) a shard commits faster than the link carries a fragment; a FIFO
queue then grows without bound, and when the link recovers the backlog of stale
versions lands at once. `Outbox` is the queue both ends of a link use
(trainer/wire/transport.py) and the simulator models (harness/sim/net.py): a frame put
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
it can neither replace an unsent Θ[p] nor be replaced by one alone: it shares their key
and queues behind them as a chain while the chain comes to fewer bytes than Θ[p] whole;
then what it is put with (`combine`, the shard's Send.whole: Θ[p] whole, the exact copy
the learner would have rebuilt) replaces the chain. A newer Θ[p] whole replaces a waiting
chain. So on a thin link at most about one Θ[p]'s bytes per fragment wait there too,
whatever the kind (before, a chain of deltas, 1/8 of Θ[p] each at int4, grew without
bound). Replacing a chain at once by the whole (8× its first delta's bytes at int4) was
tried first: on a link only briefly behind (a learner descheduled), every delta then went
whole, the link stayed behind, and the run's merges went stale (docs/PROTOCOL.md). Every
other message keeps FIFO order and is never dropped: the data-parallel `GradStep` /
`GradMean` each answer one step.

Pure: no I/O, no threads, no clock; the caller does the locking.
"""
from __future__ import annotations

from collections import deque
from typing import Hashable

from diloco_chaos.trainer.protocol.messages import Contribution, FragmentDelta, FragmentUpdate, Hello, Repair, RepairRequest, RoundOpen

COMBINED = "contrib"  # keys of this kind are combined, never replaced: put() needs `combine`


def outbox_key(msg) -> Hashable | None:
    """The key under which `msg` supersedes (or, a Contribution, is combined with) an unsent
    older message on the same link, or None."""
    if isinstance(msg, (FragmentUpdate, FragmentDelta)):
        return ("frag", msg.fragment)
    if isinstance(msg, Hello):
        return ("hello",)
    if isinstance(msg, (RepairRequest, Repair)):  # only the newest version asked is worth sending
        return ("repair", msg.fragment)
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

    `put(frame, key)` replaces the waiting frames with the same non-None key (the first in
    place: it keeps its position in the queue) and returns True, else appends and returns
    False. A FragmentDelta is the exception: it joins the waiting frames of its key (a chain
    of deltas) while they and it come to fewer bytes than Θ[p] whole (what `combine` gives),
    and only then replaces them with that whole. `take()` pops the oldest frame; a taken
    frame can no longer be superseded. Counters: `unsent_bytes` and `frames` (waiting now),
    `superseded` and `superseded_bytes` (frames replaced so far, and their bytes).
    """

    def __init__(self):
        self._q: deque[_Entry] = deque()
        self._by_key: dict = {}  # key -> its waiting entries, oldest first (several only for deltas)
        self.unsent_bytes = 0
        self.superseded = 0
        self.superseded_bytes = 0

    @property
    def frames(self) -> int:
        return len(self._q)

    def __len__(self) -> int:
        return len(self._q)

    def put(self, frame, key: Hashable | None = None, *, msg=None, combine=None) -> bool:
        """`combine(old_msg, msg) -> (msg, frame)`: for COMBINED keys, what replaces the two;
        for a FragmentDelta `msg`, Θ[p] whole, which replaces the chain once it is smaller."""
        waiting = self._by_key.get(key) if key is not None else None
        if waiting:
            waiting_bytes = sum(len(e.frame) for e in waiting)
            if key[0] == COMBINED or isinstance(msg, FragmentDelta):
                if combine is None or waiting[0].msg is None or msg is None:
                    raise ValueError(f"outbox key {key!r} with {type(msg).__name__} is combined, not replaced: "
                                     f"put() needs msg and combine")
                whole, whole_frame = combine(waiting[0].msg, msg)
                if key[0] != COMBINED and waiting_bytes + len(frame) < len(whole_frame):
                    self._append(_Entry(key, frame, msg))  # the chain is still cheaper than Θ[p] whole
                    return False
                msg, frame = whole, whole_frame
            first = waiting[0]
            for e in waiting[1:]:
                self._q.remove(e)
            self.superseded += len(waiting)
            self.superseded_bytes += waiting_bytes
            self.unsent_bytes += len(frame) - waiting_bytes
            first.frame, first.msg = frame, msg
            self._by_key[key] = [first]
            return True
        self._append(_Entry(key, frame, msg))
        return False

    def _append(self, entry: _Entry) -> None:
        self._q.append(entry)
        if entry.key is not None:
            self._by_key.setdefault(entry.key, []).append(entry)
        self.unsent_bytes += len(entry.frame)

    def take(self) -> bytes | None:
        if not self._q:
            return None
        entry = self._q.popleft()
        if entry.key is not None:
            waiting = self._by_key[entry.key]
            waiting.pop(0)  # the oldest of its key: the queue is in order
            if not waiting:
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
