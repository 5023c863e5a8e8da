"""TCP transport: length-prefixed frames (trainer/wire/codec.py) between learner units and
syncer shards. With trainer/wire/shard_link.py, the only networking code in trainer/; the
bookkeeping both ends share (the window, the counters, `link_buffer` lines) is in
trainer/wire/flow.py.

- `ShardServer` (a syncer shard): a single-threaded selector loop. `poll(timeout_s)`
  returns what happened — connections, decoded messages, disconnections — and
  `send(peer, msg, key)` queues a frame that later polls flush. The shard process
  drives its sans-IO core from these.
- `ShardLink` (trainer/wire/shard_link.py, a learner unit's link to one shard): a background thread that
  connects to the address it was given (the harness puts a Toxiproxy proxy there),
  reconnects with exponential backoff, and hands what it reads to an inbox queue.
  `send(msg, key)` never blocks the learner: frames go to an outbox a writer thread
  drains. A link going down is not a learner dying: the learner keeps stepping.

Bounded buffers: both ends queue frames in an `Outbox` (trainer/protocol/outbox.py), where a
frame with a key (`outbox_key`: a whole Θ[p], a Hello) replaces a waiting one with
the same key; a frame is taken from it only once the previous one is fully written,
so only the frame being written and the kernel's send buffer (`SNDBUF_BYTES`) are
beyond reach. `unsent_bytes()` = bytes waiting in the outbox + the rest of the frame
being written + the kernel's unsent bytes on the socket (SIOCOUTQ).

Delivery window: past the socket, bytes the kernel accepted can still wait a long time
in buffers the sender cannot see or replace — a proxy's receive buffer, autotuned to
megabytes (a probe kept 2.8 MB, 2.2 s, ahead of a 10 Mbit/s Toxiproxy bandwidth toxic;
in a `partition` run a learner's updates arrived 2.3 s late, 14 versions stale on
average), or a router's queue on a real WAN. So
each end acknowledges what it read (`Received`, every ACK_EVERY_BYTES of the stream,
consumed by the transport and never passed on; `Flow`), and a sender takes a new frame from its outbox only
while what it wrote and the peer has not read is under WINDOW_BYTES: at most the window
and one frame are ever past the outbox (an acknowledgement goes first and never waits
for the window, and a frame once started is written whole, so the two ends can never
wait on each other).

Run membership (trainer/wire/auth.py): every connection opens with a mutual HMAC challenge
keyed by the run secret. The shard adopts a connection as learner X only once X proved
it, and cuts one whose frames then claim another sender; what fails is a `refused`
event and never reaches a core. The learner's link is up only once the shard proved
itself in turn.

Bytes are counted per link and direction, at the socket, as `LinkStats`.
"""
from __future__ import annotations

import fcntl
import selectors
import socket
import struct
import termios
import time
from dataclasses import dataclass

from diloco_chaos.trainer.protocol.messages import Received
from diloco_chaos.trainer.protocol.outbox import Outbox
from diloco_chaos.trainer.wire import auth
from diloco_chaos.trainer.wire.codec import FrameDecoder, ProtocolError, encode_frame
from diloco_chaos.trainer.wire.flow import BufferState, Flow, LinkStats

# The kernel send buffer of every link socket, set on both ends (Linux doubles it for
# its bookkeeping). Fixed, so that the kernel cannot hide a large backlog on a slow
# link where the outbox could still supersede it; docs/PROTOCOL.md "Bounded buffers"
# has the measurement that chose it. None: the kernel's default (autotuned).
SNDBUF_BYTES: int | None = 64 * 1024

_TIOCOUTQ = getattr(termios, "TIOCOUTQ", None)  # = SIOCOUTQ on a TCP socket (Linux)



@dataclass(frozen=True)
class NetEvent:
    """What a transport observed: kind is 'connected', 'message' or 'disconnected'."""

    kind: str
    peer: str
    msg: object = None
    nbytes: int = 0  # frame size, for 'message'
    # when the link saw it (wall clock): a learner's link stamps it in its read thread, so
    # the recv / link_down line says when the frame arrived or the connection was cut, not
    # when the busy main loop got to it (trainer/wire/shard_link.py)
    at: float | None = None


def parse_addr(addr: str) -> tuple[str, int]:
    host, port = addr.rsplit(":", 1)
    return host, int(port)


def kernel_unsent(sock: socket.socket | None) -> int:
    """Bytes in the socket's kernel send queue (not yet acknowledged); 0 without a socket."""
    if sock is None or _TIOCOUTQ is None:
        return 0
    try:
        return struct.unpack("i", fcntl.ioctl(sock.fileno(), _TIOCOUTQ, b"\0\0\0\0"))[0]
    except (OSError, ValueError):
        return 0


def _tune(sock: socket.socket) -> None:
    sock.setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)
    if SNDBUF_BYTES is not None:
        sock.setsockopt(socket.SOL_SOCKET, socket.SO_SNDBUF, SNDBUF_BYTES)


class _Conn:
    __slots__ = ("sock", "decoder", "peer", "outbox", "partial", "writing", "proof", "deadline", "remote", "flow")

    def __init__(self, sock: socket.socket, decoder: FrameDecoder, proof: auth.ProofReader, deadline: float,
                 remote: str):
        self.sock, self.decoder = sock, decoder
        self.proof: auth.ProofReader | None = proof  # None once the peer proved itself
        self.deadline, self.remote = deadline, remote
        self.peer: str | None = None
        self.outbox = Outbox()
        self.partial: memoryview | None = None  # the rest of the frame being written; never replaced
        self.writing = False  # registered for EVENT_WRITE
        self.flow = Flow()


class ShardServer:
    """The syncer shard's end: listens on loopback (or the address given), one connection
    per learner unit that proved it belongs to the run."""

    def __init__(self, name: str, run_id: str, host: str = "127.0.0.1", port: int = 0, *, secret: bytes):
        self.name, self.run_id, self.secret = name, run_id, secret
        self.sel = selectors.DefaultSelector()
        self.listener = socket.create_server((host, port))
        self.listener.setblocking(False)
        self.addr = "%s:%d" % self.listener.getsockname()[:2]
        self.sel.register(self.listener, selectors.EVENT_READ, None)
        self.by_peer: dict[str, _Conn] = {}
        self.stats: dict[str, LinkStats] = {}
        self._pending: list[NetEvent] = []  # a disconnection found while sending, for the next poll
        self._unproven: set[_Conn] = set()  # accepted, no proof yet
        self.refused = 0

    def poll(self, timeout_s: float) -> list[NetEvent]:
        events, self._pending = self._pending, []
        now = time.monotonic()
        for conn in [c for c in self._unproven if c.deadline <= now]:
            self._refuse(conn, f"no run-membership proof within {auth.AUTH_TIMEOUT_S:g} s", events)
        for key, mask in self.sel.select(timeout=0.0 if events else max(0.0, timeout_s)):
            if key.data is None:
                self._accept()
                continue
            conn: _Conn = key.data
            if mask & selectors.EVENT_READ:
                self._read(conn, events)
            if mask & selectors.EVENT_WRITE and conn.sock.fileno() != -1:
                self._flush(conn, events)
        return events

    def send(self, peer: str, msg, key=None, whole=None) -> int:
        """Queues `msg` for `peer`, superseding a waiting frame with the same key (None: never;
        a FragmentDelta does so as `whole`, Send.whole); returns the frame size, 0 if the peer
        is not connected."""
        conn = self.by_peer.get(peer)
        if conn is None:
            return 0
        frame = encode_frame(msg, run_id=self.run_id, sender=self.name)

        def as_whole(old, new):
            return whole, encode_frame(whole, run_id=self.run_id, sender=self.name)

        if conn.outbox.put(frame, key, msg=msg, combine=None if whole is None else as_whole):
            self.stats[peer].superseded += 1
        self._flush(conn, self._pending)
        return len(frame)

    def connected(self) -> list[str]:
        return sorted(self.by_peer)

    def unsent_bytes(self, peer: str) -> int:
        conn = self.by_peer.get(peer)
        if conn is None:
            return 0
        return conn.outbox.unsent_bytes + (len(conn.partial) if conn.partial is not None else 0) \
            + kernel_unsent(conn.sock)

    def buffers(self) -> dict[str, BufferState]:
        """Every peer ever connected: what waits on its link now."""
        out = {}
        for peer, stats in self.stats.items():
            conn = self.by_peer.get(peer)
            out[peer] = BufferState(self.unsent_bytes(peer), conn.outbox.frames if conn else 0, stats.superseded,
                                    conn.flow.unread() if conn else 0)
        return out

    def close(self) -> None:
        for conn in list(self.by_peer.values()):
            conn.sock.close()
        for key in list(self.sel.get_map().values()):
            key.fileobj.close()
        self.sel.close()

    # internals -------------------------------------------------------------
    def _accept(self) -> None:
        try:
            sock, _ = self.listener.accept()
        except BlockingIOError:
            return
        sock.setblocking(False)
        _tune(sock)
        n_shard = auth.nonce()
        try:
            remote = "%s:%d" % sock.getpeername()[:2]
            sock.send(auth.challenge(n_shard))  # 20 bytes into an empty send buffer
        except OSError:  # gone already
            sock.close()
            return
        conn = _Conn(sock, FrameDecoder(expected_run_id=self.run_id),
                     auth.ProofReader(self.secret, self.run_id, self.name, n_shard),
                     time.monotonic() + auth.AUTH_TIMEOUT_S, remote)
        self._unproven.add(conn)
        self.sel.register(sock, selectors.EVENT_READ, conn)

    def _read(self, conn: _Conn, events: list[NetEvent]) -> None:
        try:
            data = conn.sock.recv(1 << 20)
        except BlockingIOError:
            return
        except OSError:
            data = b""
        if not data:
            self._drop(conn, events)
            return
        if conn.proof is not None:
            try:
                if not conn.proof.feed(data):
                    return
                conn.sock.send(conn.proof.answer())  # 36 bytes: the send buffer holds only the challenge
            except (auth.AuthError, OSError) as e:
                self._refuse(conn, str(e), events)
                return
            proven, rest, size = conn.proof.learner, conn.proof.rest, conn.proof.size
            conn.proof = None
            self._unproven.discard(conn)
            self._adopt(conn, proven, size, events)
            self.stats[proven].bytes_sent += auth.CHALLENGE_BYTES + auth.ANSWER_BYTES
            data = rest
        self.stats[conn.peer].bytes_recv += len(data)
        conn.flow.rx += len(data)
        acked = False
        try:
            conn.decoder.feed(data)
            while (item := conn.decoder.next()) is not None:
                header, msg = item
                if header["sender"] != conn.peer:
                    self._refuse(conn, f"a frame from {header['sender']!r} on {conn.peer!r}'s connection", events)
                    return
                if isinstance(msg, Received):
                    conn.flow.took(msg)
                    acked = True
                    continue
                self.stats[conn.peer].frames_recv += 1
                events.append(NetEvent("message", conn.peer, msg, header.get("frame_bytes", 0)))
        except ProtocolError:
            self._drop(conn, events)  # a malformed stream is cut; the learner reconnects
            return
        if acked or conn.flow.ack_due():  # the window may have opened; we owe an acknowledgement
            self._flush(conn, events)

    def _refuse(self, conn: _Conn, reason: str, events: list[NetEvent]) -> None:
        """Cuts a connection that did not prove run membership (or broke it): nothing it sent
        reaches a core; the shard's host logs the event."""
        self._unproven.discard(conn)
        self.refused += 1
        events.append(NetEvent("refused", conn.peer, f"{conn.remote}: {reason}"))
        self._drop(conn, events)

    def _adopt(self, conn: _Conn, peer: str, first_bytes: int, events: list[NetEvent]) -> None:
        old = self.by_peer.get(peer)
        if old is not None:  # the learner reconnected; its old socket is dead to us
            self._drop(old, events)
        conn.peer = peer
        self.by_peer[peer] = conn
        stats = self.stats.setdefault(peer, LinkStats())
        stats.connects += 1
        stats.bytes_recv += first_bytes
        events.append(NetEvent("connected", peer))

    def _flush(self, conn: _Conn, events: list[NetEvent]) -> None:
        """Writes what the socket takes: the partial frame first, then an acknowledgement if
        one is due; the next frame leaves the outbox only once the previous one is fully
        written (until then it can be superseded) and while the window is open."""
        stats, flow = self.stats[conn.peer], conn.flow
        try:
            while True:
                if conn.partial is None:
                    if flow.ack_due():
                        frame = encode_frame(flow.ack(), run_id=self.run_id, sender=self.name)
                    elif flow.open() and (frame := conn.outbox.take()) is not None:
                        stats.frames_sent += 1
                    else:
                        break
                    conn.partial = memoryview(frame)
                n = conn.sock.send(conn.partial)
                stats.bytes_sent += n
                flow.tx += n
                conn.partial = conn.partial[n:] if n < len(conn.partial) else None
        except BlockingIOError:
            pass
        except OSError:
            self._drop(conn, events)
            return
        stats.unsent_max = max(stats.unsent_max, self.unsent_bytes(conn.peer))
        stats.unread_max = max(stats.unread_max, flow.unread())
        writing = conn.partial is not None or (bool(conn.outbox) and flow.open())  # else a Received reopens it
        if writing != conn.writing:
            conn.writing = writing
            self.sel.modify(conn.sock, selectors.EVENT_READ | (selectors.EVENT_WRITE if writing else 0), conn)

    def _drop(self, conn: _Conn, events: list[NetEvent]) -> None:
        self._unproven.discard(conn)
        try:
            self.sel.unregister(conn.sock)
        except (KeyError, ValueError):
            pass
        conn.sock.close()
        conn.outbox.clear()
        conn.partial = None
        if conn.peer and self.by_peer.get(conn.peer) is conn:
            del self.by_peer[conn.peer]
            events.append(NetEvent("disconnected", conn.peer))


def _recv_exact(sock: socket.socket, n: int) -> bytes:
    buf = b""
    while len(buf) < n:
        chunk = sock.recv(n - len(buf))
        if not chunk:
            raise ConnectionError("closed during the run-membership exchange")
        buf += chunk
    return buf


def wait_until(pred, timeout_s: float, interval_s: float = 0.01) -> bool:
    deadline = time.monotonic() + timeout_s
    while not pred():
        if time.monotonic() > deadline:
            return False
        time.sleep(interval_s)
    return True
