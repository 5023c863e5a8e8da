"""Simulated links for the sim tier: one Toxiproxy-like proxy per learner↔shard link.

The simulator's injector is the cluster tier's own `Injector`; it shapes links by
adding and removing toxics through a client. `SimProxies` is that client, with the
toxics kept in memory, and `Net` turns the toxics present on a link into what its
traffic sees, the way Toxiproxy would:

  bandwidth (rate KB/s)      frames are serialised on the stream at rate × 1000 B/s
  latency (latency, jitter)  + latency ± uniform jitter (ms) per frame; FIFO kept
  timeout (timeout 0)        the stream black-holes everything; removing it closes
                             the link's connections (the transport reconnects)
  reset_peer                 connections are reset at once, and every new one too
  limit_data (bytes)         a connection is closed once a stream passed `bytes`;
                             the frame that crossed the limit is lost

Connections follow trainer/transport.py: the learner side (`ShardLink`) connects,
reconnects after a loss (at once if the connection lasted > 1 s, else after a
backoff doubling from 50 ms to 1 s), and only the first frame a shard receives on
a connection makes the shard see the learner (`ShardServer._adopt`). A connection
to a shard that is down is accepted by the proxy and hung up at once.
"""
from __future__ import annotations

from dataclasses import dataclass, field

from harness.toxiproxy_client import ToxiproxyClient
from trainer.codec import encode_frame
from trainer.transport import LinkStats

BACKOFF_S = (0.05, 1.0)  # ShardLink's default backoff_s
LASTED_S = 1.0  # a connection that lasted longer resets the backoff (ShardLink._run)
STREAM_OF = {"upstream": "up", "downstream": "down"}  # upstream = learner → shard


class SimProxies(ToxiproxyClient):
    """The Toxiproxy client the injector talks to, with proxies and toxics in memory."""

    def __init__(self, net: "Net"):
        super().__init__("sim", 0)
        self.net = net
        self.toxic: dict[str, dict[str, dict]] = {name: {} for name in net.links}

    def proxies(self) -> dict[str, dict]:
        return {name: {"name": name, "enabled": True} for name in self.toxic}

    def toxics(self, proxy: str) -> list[dict]:
        return list(self.toxic[proxy].values())

    def add_toxic(self, proxy: str, spec: dict) -> None:
        self.toxic[proxy][spec["name"]] = spec
        self.net.toxic_added(self.net.links[proxy], spec)

    def remove_toxic(self, proxy: str, toxic: str) -> None:
        spec = self.toxic[proxy].pop(toxic, None)
        if spec is not None:
            self.net.toxic_removed(self.net.links[proxy], spec)

    def set_enabled(self, name: str, enabled: bool) -> None:
        if not enabled:
            raise NotImplementedError("the sim tier's injector never disables a proxy")

    def of(self, link: "Link", kind: str, stream: str | None = None) -> list[dict]:
        return [t for t in self.toxic[link.name].values()
                if t["type"] == kind and (stream is None or t["stream"] == stream)]


@dataclass(eq=False)
class Conn:
    """One TCP connection through a link's proxy."""

    link: "Link"
    opened_at: float
    adopted: bool = False  # the shard has seen its first frame
    closed: bool = False
    busy_until: dict = field(default_factory=lambda: {"up": 0.0, "down": 0.0})
    last_arrival: dict = field(default_factory=lambda: {"up": 0.0, "down": 0.0})
    passed: dict = field(default_factory=lambda: {"up": 0, "down": 0})  # bytes under limit_data


@dataclass(eq=False)
class Link:
    name: str
    learner: str
    shard: str
    conn: Conn | None = None
    stats: LinkStats = field(default_factory=LinkStats)  # the learner side's counters
    delay_s: float = BACKOFF_S[0]
    attempt: object = None  # the pending reconnect (a clock handle)


class Net:
    """Every link of the run. `world` gives the clock, the rng, and the units' ends:
    `learner_link_event(learner, kind, shard, msg, nbytes)` (the learner's inbox),
    `shard_listening(shard)`, `shard_event(shard, kind, learner, msg, nbytes)`."""

    def __init__(self, world, learners: list[str], shards: list[str], run_id: str, loopback_s: float):
        self.world, self.run_id, self.loopback_s = world, run_id, loopback_s
        self.links = {f"{u}~{s}": Link(f"{u}~{s}", u, s) for u in learners for s in shards}
        self.proxies = SimProxies(self)

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

    def learner_send(self, learner: str, shard: str, msg) -> int:
        """ShardLink.send: the frame size, or 0 while the link is down."""
        link = self.link(learner, shard)
        if link.conn is None:
            return 0
        nbytes = len(encode_frame(msg, run_id=self.run_id, sender=learner))
        link.stats.bytes_sent += nbytes
        link.stats.frames_sent += 1
        self._transmit(link.conn, "up", msg, nbytes)
        return nbytes

    def _connect_at(self, link: Link, t: float) -> None:
        link.attempt = self.world.clock.at(t, self._connect, link)

    def _connect(self, link: Link) -> None:
        link.attempt = None
        conn = link.conn = Conn(link, self.world.now)
        link.stats.connects += 1
        self.world.learner_link_event(link.learner, "connected", link.shard)
        # The proxy accepted; it hangs up at once if the shard is down or resets are on.
        if not self.world.shard_listening(link.shard) or self.proxies.of(link, "reset_peer"):
            self._close(conn)

    def _close(self, conn: Conn, learner_alive: bool = True) -> None:
        if conn.closed:
            return
        conn.closed, link, now = True, conn.link, self.world.now
        if link.conn is conn:
            link.conn = None
        if conn.adopted:
            self.world.shard_event(link.shard, "disconnected", link.learner)
        if not learner_alive:
            return
        self.world.learner_link_event(link.learner, "disconnected", link.shard)
        if now - conn.opened_at > LASTED_S:
            link.delay_s = BACKOFF_S[0]
            self._connect_at(link, now)
        else:
            self._connect_at(link, now + link.delay_s)
            link.delay_s = min(link.delay_s * 2, BACKOFF_S[1])

    def _of_learner(self, learner: str) -> list[Link]:
        return [link for link in self.links.values() if link.learner == learner]

    # --- the shard side (ShardServer) ----------------------------------------------------
    def shard_send(self, shard: str, learner: str, msg) -> int:
        """ShardServer.send: the frame size, or 0 if the learner is not connected."""
        conn = self.link(learner, shard).conn
        if conn is None or not conn.adopted:
            return 0
        nbytes = len(encode_frame(msg, run_id=self.run_id, sender=shard))
        self._transmit(conn, "down", msg, nbytes)
        return nbytes

    def shard_stopped(self, shard: str) -> None:
        """The shard process died or exited: every connection to it closes."""
        for link in self.links.values():
            if link.shard == shard and link.conn is not None:
                self._close(link.conn)

    # --- frames on the wire --------------------------------------------------------------
    def _transmit(self, conn: Conn, way: str, msg, nbytes: int) -> None:
        link, now = conn.link, self.world.now
        stream = "upstream" if way == "up" else "downstream"
        if self.proxies.of(link, "timeout", stream):
            return  # black-holed
        limits = [t["attributes"]["bytes"] for t in self.proxies.of(link, "limit_data", stream)]
        rates = [t["attributes"]["rate"] for t in self.proxies.of(link, "bandwidth", stream)]
        start = max(now, conn.busy_until[way])
        done = start + (nbytes / (min(rates) * 1000.0) if rates else 0.0)
        conn.busy_until[way] = done
        delay = self.loopback_s
        for t in self.proxies.of(link, "latency", stream):
            lat, jit = t["attributes"]["latency"], t["attributes"]["jitter"]
            delay += (lat + (self.world.rng.uniform(-jit, jit) if jit else 0.0)) / 1000.0
        arrival = max(done + delay, conn.last_arrival[way])
        conn.last_arrival[way] = arrival
        if limits and conn.passed[way] + nbytes > min(limits):
            self.world.clock.at(arrival, self._close, conn)  # cut mid-frame: the frame is lost
            return
        conn.passed[way] += nbytes
        self.world.clock.at(arrival, self._deliver, conn, way, stream, msg, nbytes)

    def _deliver(self, conn: Conn, way: str, stream: str, msg, nbytes: int) -> None:
        link = conn.link
        if conn.closed or self.proxies.of(link, "timeout", stream):
            return
        if way == "down":
            link.stats.bytes_recv += nbytes
            link.stats.frames_recv += 1
            self.world.learner_link_event(link.learner, "message", link.shard, msg, nbytes)
            return
        if not conn.adopted:
            conn.adopted = True
            self.world.shard_event(link.shard, "connected", link.learner)
        self.world.shard_event(link.shard, "message", link.learner, msg, nbytes)

    # --- toxics coming and going ---------------------------------------------------------
    def toxic_added(self, link: Link, spec: dict) -> None:
        if spec["type"] == "reset_peer" and link.conn is not None:
            self._close(link.conn)
        elif spec["type"] == "limit_data" and link.conn is not None:
            link.conn.passed[STREAM_OF[spec["stream"]]] = 0  # the toxic counts from now

    def toxic_removed(self, link: Link, spec: dict) -> None:
        if spec["type"] == "timeout" and link.conn is not None:
            self._close(link.conn)  # a stream that lost bytes is corrupt: the proxy cuts it
