"""What the sim tier's links are made of, as state: a `Link` per learner↔shard pair (its
counters and reconnect backoff), the `Conn` through its proxy, one `Wire` per direction
(the sender's outbox, the frames handed over to the kernel and the proxy, latency), the
`Frame`s on it and the run-membership exchange's three messages (`Exchange`), with the
transport's constants the model keeps (ShardLink's backoff, HELD_BYTES). `Net`
(harness/sim/net.py) moves frames through them; it re-exports these names.
"""
from __future__ import annotations

from collections import deque
from dataclasses import dataclass, field

from diloco_chaos.trainer.protocol.outbox import Outbox
from diloco_chaos.trainer.wire import auth
from diloco_chaos.trainer.wire.transport import LinkStats

BACKOFF_S = (0.05, 1.0)  # ShardLink's default backoff_s
LASTED_S = 1.0  # a connection that lasted longer resets the backoff (ShardLink._run)
STREAM_OF = {"upstream": "up", "downstream": "down"}  # upstream = learner → shard
STREAM = {way: stream for stream, way in STREAM_OF.items()}
# What the kernel's send queue (SO_SNDBUF 64 KiB, trainer/wire/transport.py) and Toxiproxy
# hold beyond a sender's outbox on a thin link: measured 359 KB through a 16 kbit/s
# bandwidth toxic (174 KB in the kernel, 185 KB in the proxy; docs/PROTOCOL.md). On a
# faster link the proxy's autotuned buffer can hold more, up to the transport's delivery
# window (WINDOW_BYTES, 1 MiB) and a frame; this model keeps the thin link's figure.
HELD_BYTES = 352 * 1024


class Exchange:
    """One of the run-membership exchange's three messages (trainer/wire/auth.py), by size."""

    __slots__ = ("stage",)

    def __init__(self, stage: str):
        self.stage = stage  # "challenge" (down), "proof" (up), "answer" (down)


CHALLENGE, PROOF, ANSWER = Exchange("challenge"), Exchange("proof"), Exchange("answer")


def proof_bytes(learner: str) -> int:
    return len(auth.MAGIC) + 1 + len(learner.encode()) + auth.NONCE_BYTES + auth.MAC_BYTES


class Frame:
    """A message on a simulated link (an `Outbox` needs only its len(): the frame size)."""

    __slots__ = ("msg", "nbytes", "delay", "cut")

    def __init__(self, msg, nbytes: int):
        self.msg, self.nbytes = msg, nbytes
        self.delay = 0.0  # latency after serialisation, drawn when it is handed over
        self.cut = False  # crosses a limit_data toxic: the connection closes when it arrives

    def __len__(self) -> int:
        return self.nbytes


class Wire:
    """One direction of a connection: the sender's outbox, then what it handed over (the
    kernel's send queue and the proxy: FIFO, serialised at the stream's rate, the first
    frame of `pipe` now), then latency."""

    __slots__ = ("outbox", "pipe", "queued", "left", "since", "rate", "done", "wake", "last_arrival", "passed")

    def __init__(self):
        self.outbox = Outbox()
        self.pipe: deque[Frame] = deque()
        self.queued = 0  # bytes in the pipe behind its first frame
        self.left = 0.0  # bytes of the first frame still to serialise at `since`, at `rate` (B/s, None: at once)
        self.since = 0.0
        self.rate: float | None = None
        self.done = None  # clock handle: the first frame is serialised
        self.wake = None  # clock handle: the next frame may leave the outbox
        self.last_arrival = 0.0
        self.passed = 0  # bytes under limit_data

    def unserialised(self, now: float) -> float:
        if not self.pipe:
            return 0.0
        gone = (now - self.since) * self.rate if self.rate is not None else self.left
        return max(0.0, self.left - gone) + self.queued


@dataclass(eq=False)
class Conn:
    """One TCP connection through a link's proxy."""

    link: "Link"
    opened_at: float
    adopted: bool = False  # the shard has the learner's proof
    up: bool = False  # the learner has the shard's answer: its link is up
    closed: bool = False
    deadline: object = None  # clock handle: the exchange's AUTH_TIMEOUT_S
    wire: dict = field(default_factory=lambda: {"up": Wire(), "down": Wire()})


@dataclass(eq=False)
class Link:
    name: str
    learner: str
    shard: str
    conn: Conn | None = None
    stats: LinkStats = field(default_factory=LinkStats)  # the learner side's counters
    shard_stats: LinkStats = field(default_factory=LinkStats)  # the shard side's superseded, unsent_max
    delay_s: float = BACKOFF_S[0]
    attempt: object = None  # the pending reconnect (a clock handle)
