"""Simulated links for the sim tier: one Toxiproxy-like proxy per learner↔shard link.

The simulator's injector is the cluster tier's own `Injector`; it shapes links through
`SimProxies` (harness/sim/proxies.py, which says what each toxic does to the traffic), and
`Net` carries that out on the link's connections and frames (their state, `Link`, `Conn`,
`Wire`, `Frame`, and the transport's constants: harness/sim/wire.py).

Connections follow trainer/wire/shard_link.py: the learner side (`ShardLink`) connects,
reconnects after a loss (at once if the connection lasted > 1 s, else after a
backoff doubling from 50 ms to 1 s). Each connection first runs the run-membership
exchange (trainer/wire/auth.py) as three small frames through the same toxics: the shard's
challenge down, the learner's proof up — the shard sees the learner once it arrives
(`ShardServer._adopt`) — and the shard's answer down, after which the learner's link
is up (`connected`). An exchange not done within AUTH_TIMEOUT_S (a partitioned
stream) is cut, and the learner retries after its backoff, as a connection to a shard
that is down (accepted by the proxy and hung up at once) is: the learner sees neither.

Bounded buffers (docs/PROTOCOL.md): each end of a connection has an outbox
(trainer/protocol/outbox.py). A frame leaves it for the wire once what the kernel's send queue
and the proxy hold ahead of it (frames handed over, not yet serialised) is at most
`Net.held_bytes` (HELD_BYTES); until then a newer frame with the same `outbox_key`
(a whole Θ[p], a Hello) replaces it in place, as the transport does. With no
bandwidth toxic nothing waits. The planted bug `unbounded_outbox` (in the world's learner or syncer bug set)
makes that end plain FIFO: every frame goes to the wire at once, as before.
Counters: `Link.stats` (the learner end, as ShardLink's) and `Link.shard_stats` (only
`superseded` and `unsent_max` of the shard end, over the whole run; the shard's byte
counters are SimSyncer's); unsent = the outbox + what is handed over but not yet
serialised (the proxy's share included, which the transport's own count does not see).
"""
from __future__ import annotations

from diloco_chaos.harness.sim.proxies import SimProxies
from diloco_chaos.harness.sim.wire import (ANSWER, BACKOFF_S, CHALLENGE, HELD_BYTES, LASTED_S, PROOF, STREAM, STREAM_OF, Conn,
                                             Exchange, Frame, Link, proof_bytes)
from diloco_chaos.trainer.protocol.outbox import outbox_key
from diloco_chaos.trainer.wire import auth
from diloco_chaos.trainer.wire.codec import encode_frame
from diloco_chaos.trainer.wire.transport import LinkStats


class Net:
    """Every link of the run. `world` gives the clock, the rng, and the units' ends:
    `learner_link_event(learner, kind, shard, msg, nbytes)` (the learner's inbox),
    `shard_listening(shard)`, `shard_event(shard, kind, learner, msg, nbytes)`."""

    def __init__(self, world, learners: list[str], shards: list[str], run_id: str, loopback_s: float):
        self.world, self.run_id, self.loopback_s = world, run_id, loopback_s
        self.links = {f"{u}~{s}": Link(f"{u}~{s}", u, s) for u in learners for s in shards}
        self.proxies = SimProxies(self)
        # newest supersedes, per end; the planted bug `unbounded_outbox` keeps that end FIFO
        self.coalesce = {"up": "unbounded_outbox" not in getattr(world, "learner_bugs", ()),
                         "down": "unbounded_outbox" not in getattr(world, "syncer_bugs", ())}
        # SimParams.held_kib; a property shrinks it to see superseding with the quadratic's small frames
        self.held_bytes = round(getattr(getattr(world, "params", None), "held_kib", HELD_BYTES / 1024) * 1024)

    def link(self, learner: str, shard: str) -> Link:
        return self.links[f"{learner}~{shard}"]

    # --- the learner side (ShardLink) ----------------------------------------------------
    def learner_started(self, learner: str) -> None:
        """A learner process came up: each of its links starts connecting."""
        for link in self._of_learner(learner):
            link.stats, link.delay_s = LinkStats(), BACKOFF_S[0]
            self._connect_at(link, self.world.now)

    def learner_stopped(self, learner: str) -> None:
        """The learner process is gone (killed or exited): its connections close."""
        for link in self._of_learner(learner):
            if link.attempt is not None:
                link.attempt.cancel()
                link.attempt = None
            if link.conn is not None:
                self._close(link.conn, learner_alive=False)

    def learner_send(self, learner: str, shard: str, msg, combine=None) -> int:
        """ShardLink.send: the frame size, or 0 while the link is down; `combine(old, new)`
        merges two unsent Contributions of one fragment (trainer/protocol/outbox.py)."""
        link = self.link(learner, shard)
        if link.conn is None or not link.conn.up:
            return 0
        nbytes = len(encode_frame(msg, run_id=self.run_id, sender=learner))

        def merged(old, new):
            m = combine(old, new)
            return m, Frame(m, len(encode_frame(m, run_id=self.run_id, sender=learner)))

        self._send(link.conn, "up", msg, nbytes, None if combine is None else merged)
        return nbytes

    def _connect_at(self, link: Link, t: float) -> None:
        link.attempt = self.world.clock.at(t, self._connect, link)

    def _connect(self, link: Link) -> None:
        link.attempt = None
        conn = link.conn = Conn(link, self.world.now)
        # The proxy accepted; it hangs up at once if the shard is down or resets are on.
        if not self.world.shard_listening(link.shard) or self.proxies.of(link, "reset_peer"):
            self._close(conn)
            return
        conn.deadline = self.world.clock.at(self.world.now + auth.AUTH_TIMEOUT_S, self._exchange_timeout, conn)
        self._hand_over(conn, "down", Frame(CHALLENGE, auth.CHALLENGE_BYTES))  # the shard writes it on accept

    def _exchange_timeout(self, conn: Conn) -> None:
        conn.deadline = None
        if not conn.up:
            self._close(conn)  # the shard cuts a connection that did not prove itself in time

    def _exchanged(self, conn: Conn, msg: Exchange) -> None:
        """A message of the run-membership exchange arrived at its end."""
        link = conn.link
        if msg is CHALLENGE:  # at the learner: its proof goes up
            link.stats.bytes_recv += auth.CHALLENGE_BYTES
            self._hand_over(conn, "up", Frame(PROOF, proof_bytes(link.learner)))
        elif msg is PROOF:  # at the shard: it adopts the learner and answers
            conn.adopted = True
            self.world.shard_event(link.shard, "connected", link.learner)
            self._hand_over(conn, "down", Frame(ANSWER, auth.ANSWER_BYTES))
        else:  # at the learner: the shard proved itself; the link is up
            link.stats.bytes_recv += auth.ANSWER_BYTES
            conn.up = True
            if conn.deadline is not None:
                conn.deadline.cancel()
                conn.deadline = None
            link.stats.connects += 1
            self.world.learner_link_event(link.learner, "connected", link.shard)

    def _close(self, conn: Conn, learner_alive: bool = True) -> None:
        if conn.closed:
            return
        conn.closed, link, now = True, conn.link, self.world.now
        for w in conn.wire.values():  # what waited in the outboxes and the pipes is lost with it
            w.outbox.clear()
            w.pipe.clear()
            for handle in (w.done, w.wake):
                if handle is not None:
                    handle.cancel()
        if conn.deadline is not None:
            conn.deadline.cancel()
            conn.deadline = None
        if link.conn is conn:
            link.conn = None
        if conn.adopted:
            self.world.shard_event(link.shard, "disconnected", link.learner)
        if not learner_alive:
            return
        if conn.up:
            self.world.learner_link_event(link.learner, "disconnected", link.shard)
        if conn.up and now - conn.opened_at > LASTED_S:
            link.delay_s = BACKOFF_S[0]
            self._connect_at(link, now)
        else:
            self._connect_at(link, now + link.delay_s)
            link.delay_s = min(link.delay_s * 2, BACKOFF_S[1])

    def _of_learner(self, learner: str) -> list[Link]:
        return [link for link in self.links.values() if link.learner == learner]

    # --- the shard side (ShardServer) ----------------------------------------------------
    def shard_send(self, shard: str, learner: str, msg, whole=None) -> int:
        """ShardServer.send: the frame size, or 0 if the learner is not connected; `whole`
        takes a FragmentDelta's place where it supersedes (Send.whole, trainer/protocol/outbox.py)."""
        conn = self.link(learner, shard).conn
        if conn is None or not conn.adopted:
            return 0
        nbytes = len(encode_frame(msg, run_id=self.run_id, sender=shard))

        def as_whole(old, new):
            return whole, Frame(whole, len(encode_frame(whole, run_id=self.run_id, sender=shard)))

        self._send(conn, "down", msg, nbytes, None if whole is None else as_whole)
        return nbytes

    def shard_stopped(self, shard: str) -> None:
        """The shard process died or exited: every connection to it closes."""
        for link in self.links.values():
            if link.shard == shard and link.conn is not None:
                self._close(link.conn)

    # --- the outboxes ----------------------------------------------------------------------
    def _send(self, conn: Conn, way: str, msg, nbytes: int, combine=None) -> None:
        """A frame from a unit: handed over if nothing waits in its outbox and at most
        `held_bytes` are handed over and not yet serialised, else into the outbox
        (superseding a waiting frame with the same key)."""
        w, now = conn.wire[way], self.world.now
        stats = conn.link.stats if way == "up" else conn.link.shard_stats
        if not self.coalesce[way] or (not w.outbox and w.unserialised(now) <= self.held_bytes):
            self._hand_over(conn, way, Frame(msg, nbytes))
        else:
            if w.outbox.put(Frame(msg, nbytes), outbox_key(msg), msg=msg, combine=combine):
                stats.superseded += 1
            if w.wake is None:
                self._wake_at(conn, way)
        stats.unsent_max = max(stats.unsent_max, w.outbox.unsent_bytes + int(w.unserialised(now)))

    def _rate(self, link: Link, way: str) -> float | None:
        """The stream's bandwidth in bytes/s, None if unlimited."""
        rates = [t["attributes"]["rate"] for t in self.proxies.of(link, "bandwidth", STREAM[way])]
        return min(rates) * 1000.0 if rates else None

    def _wake_at(self, conn: Conn, way: str) -> None:
        """Comes back when what is not yet serialised falls to `held_bytes` at the current
        rate (on an unlimited stream the pipe empties at once: `_serialised` comes back)."""
        w, now = conn.wire[way], self.world.now
        if w.wake is not None:
            w.wake.cancel()
            w.wake = None
        rate = self._rate(conn.link, way)
        if rate is None and w.pipe:
            return
        excess = w.unserialised(now) - self.held_bytes
        w.wake = self.world.clock.at(now + max(0.0, excess) / rate if rate else now, self._wake, conn, way)

    def _wake(self, conn: Conn, way: str) -> None:
        conn.wire[way].wake = None
        if not conn.closed:
            self._refill(conn, way)

    def _refill(self, conn: Conn, way: str) -> None:
        """Hands over waiting frames while there is room; else comes back when there is."""
        w = conn.wire[way]
        while w.outbox and w.unserialised(self.world.now) <= self.held_bytes + 1e-6:
            self._hand_over(conn, way, w.outbox.take())
        if w.outbox:
            self._wake_at(conn, way)

    # --- frames on the wire --------------------------------------------------------------
    def _hand_over(self, conn: Conn, way: str, frame: Frame) -> None:
        """The frame leaves the sender's outbox (ShardLink counts it as written here)."""
        link, w, now = conn.link, conn.wire[way], self.world.now
        stream = STREAM[way]
        if way == "up":
            link.stats.bytes_sent += frame.nbytes
            if not isinstance(frame.msg, Exchange):  # the transport counts the exchange's bytes, not as frames
                link.stats.frames_sent += 1
        if self.proxies.of(link, "timeout", stream):
            return  # black-holed
        limits = [t["attributes"]["bytes"] for t in self.proxies.of(link, "limit_data", stream)]
        frame.delay = self.loopback_s
        for t in self.proxies.of(link, "latency", stream):
            lat, jit = t["attributes"]["latency"], t["attributes"]["jitter"]
            frame.delay += (lat + (self.world.rng.uniform(-jit, jit) if jit else 0.0)) / 1000.0
        frame.cut = bool(limits) and w.passed + frame.nbytes > min(limits)
        if not frame.cut:
            w.passed += frame.nbytes
        rate = self._rate(link, way)
        if rate is None and not w.pipe:
            self._arrive(conn, way, frame, now)  # serialised at once
            return
        w.pipe.append(frame)
        if len(w.pipe) == 1:
            w.left = frame.nbytes
            self._serialise(conn, way)
        else:
            w.queued += frame.nbytes

    def _serialise(self, conn: Conn, way: str) -> None:
        """(Re)times the end of the first frame in the pipe at the stream's current rate."""
        w, now = conn.wire[way], self.world.now
        if w.done is not None:
            w.done.cancel()
            w.left = w.unserialised(now) - w.queued
        w.since, w.rate = now, self._rate(conn.link, way)
        w.done = self.world.clock.at(now + (w.left / w.rate if w.rate is not None else 0.0), self._serialised,
                                     conn, way)

    def _serialised(self, conn: Conn, way: str) -> None:
        w = conn.wire[way]
        w.done = None
        if conn.closed:
            return
        self._arrive(conn, way, w.pipe.popleft(), self.world.now)
        if w.pipe:
            w.queued -= w.pipe[0].nbytes
            w.left = w.pipe[0].nbytes
            self._serialise(conn, way)
        if w.outbox:
            self._refill(conn, way)

    def _arrive(self, conn: Conn, way: str, frame: Frame, serialised_at: float) -> None:
        w = conn.wire[way]
        arrival = w.last_arrival = max(serialised_at + frame.delay, w.last_arrival)  # FIFO kept
        if frame.cut:
            self.world.clock.at(arrival, self._close, conn)  # cut mid-frame: the frame is lost
        else:
            self.world.clock.at(arrival, self._deliver, conn, way, STREAM[way], frame.msg, frame.nbytes)

    def _deliver(self, conn: Conn, way: str, stream: str, msg, nbytes: int) -> None:
        link = conn.link
        if conn.closed or self.proxies.of(link, "timeout", stream):
            return
        if isinstance(msg, Exchange):
            self._exchanged(conn, msg)
            return
        if way == "down":
            link.stats.bytes_recv += nbytes
            link.stats.frames_recv += 1
            self.world.learner_link_event(link.learner, "message", link.shard, msg, nbytes)
            return
        self.world.shard_event(link.shard, "message", link.learner, msg, nbytes)  # adopted: its proof came first

    # --- toxics coming and going ---------------------------------------------------------
    def toxic_added(self, link: Link, spec: dict) -> None:
        if spec["type"] == "reset_peer" and link.conn is not None:
            self._close(link.conn)
        elif spec["type"] == "limit_data" and link.conn is not None:
            link.conn.wire[STREAM_OF[spec["stream"]]].passed = 0  # the toxic counts from now
        elif spec["type"] == "bandwidth":
            self._rate_changed(link, STREAM_OF[spec["stream"]])

    def toxic_removed(self, link: Link, spec: dict) -> None:
        if spec["type"] == "timeout" and link.conn is not None:
            self._close(link.conn)  # a stream that lost bytes is corrupt: the proxy cuts it
        elif spec["type"] == "bandwidth":
            self._rate_changed(link, STREAM_OF[spec["stream"]])

    def _rate_changed(self, link: Link, way: str) -> None:
        """A new rate applies to what is not yet serialised (Toxiproxy's bandwidth toxic, when
        removed, lets its data through at once) and moves when the outbox may send next."""
        conn = link.conn
        if conn is None:
            return
        w = conn.wire[way]
        if w.done is not None:
            self._serialise(conn, way)
        if w.outbox:
            self._wake_at(conn, way)
