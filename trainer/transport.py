"""TCP transport: length-prefixed frames (trainer/codec.py) between learner units and
syncer shards. The only networking code in trainer/.

- `ShardServer` (a syncer shard): a single-threaded selector loop. `poll(timeout_s)`
  returns what happened — connections, decoded messages, disconnections — and
  `send(peer, msg)` queues bytes that later polls flush. The shard process drives
  its sans-IO core from these.
- `ShardLink` (a learner unit's link to one shard): a background thread that
  connects to the address it was given (the harness puts a Toxiproxy proxy there),
  reconnects with exponential backoff, and hands what it reads to an inbox queue.
  `send` never blocks the learner: frames go to an outbox a writer thread drains.
  A link going down is not a learner dying: the learner keeps stepping.

Bytes are counted per link and direction, at the socket, as `LinkStats`.
"""
from __future__ import annotations

import queue
import selectors
import socket
import threading
import time
from dataclasses import dataclass, field

from trainer.codec import FrameDecoder, ProtocolError, encode_frame


@dataclass
class LinkStats:
    bytes_sent: int = 0
    bytes_recv: int = 0
    frames_sent: int = 0
    frames_recv: int = 0
    connects: int = 0


@dataclass(frozen=True)
class NetEvent:
    """What a transport observed: kind is 'connected', 'message' or 'disconnected'."""

    kind: str
    peer: str
    msg: object = None
    nbytes: int = 0  # frame size, for 'message'


def parse_addr(addr: str) -> tuple[str, int]:
    host, port = addr.rsplit(":", 1)
    return host, int(port)


@dataclass
class _Conn:
    sock: socket.socket
    decoder: FrameDecoder
    peer: str | None = None
    out: bytearray = field(default_factory=bytearray)


class ShardServer:
    """The syncer shard's end: listens on loopback, one connection per learner unit."""

    def __init__(self, name: str, run_id: str, host: str = "127.0.0.1", port: int = 0):
        self.name, self.run_id = name, run_id
        self.sel = selectors.DefaultSelector()
        self.listener = socket.create_server((host, port))
        self.listener.setblocking(False)
        self.addr = "%s:%d" % self.listener.getsockname()[:2]
        self.sel.register(self.listener, selectors.EVENT_READ, None)
        self.by_peer: dict[str, _Conn] = {}
        self.stats: dict[str, LinkStats] = {}

    def poll(self, timeout_s: float) -> list[NetEvent]:
        events: list[NetEvent] = []
        for key, mask in self.sel.select(timeout=max(0.0, timeout_s)):
            if key.data is None:
                self._accept()
                continue
            conn: _Conn = key.data
            if mask & selectors.EVENT_READ:
                self._read(conn, events)
            if mask & selectors.EVENT_WRITE and conn.sock.fileno() != -1:
                self._flush(conn, events)
        return events

    def send(self, peer: str, msg) -> int:
        """Queues `msg` for `peer`; returns the frame size, 0 if the peer is not connected."""
        conn = self.by_peer.get(peer)
        if conn is None:
            return 0
        frame = encode_frame(msg, run_id=self.run_id, sender=self.name)
        conn.out += frame
        self.stats[peer].frames_sent += 1
        self._flush(conn, [])
        return len(frame)

    def connected(self) -> list[str]:
        return sorted(self.by_peer)

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
        sock.setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)
        conn = _Conn(sock, FrameDecoder(expected_run_id=self.run_id))
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
        if conn.peer:
            self.stats[conn.peer].bytes_recv += len(data)
        try:
            conn.decoder.feed(data)
            while (item := conn.decoder.next()) is not None:
                header, msg = item
                if conn.peer is None:
                    self._adopt(conn, header["sender"], len(data), events)
                self.stats[conn.peer].frames_recv += 1
                events.append(NetEvent("message", conn.peer, msg, header.get("frame_bytes", 0)))
        except ProtocolError:
            self._drop(conn, events)  # a malformed stream is cut; the learner reconnects

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
        try:
            while conn.out:
                n = conn.sock.send(conn.out)
                self.stats[conn.peer].bytes_sent += n
                del conn.out[:n]
        except BlockingIOError:
            pass
        except OSError:
            self._drop(conn, events)
            return
        self.sel.modify(conn.sock, selectors.EVENT_READ | (selectors.EVENT_WRITE if conn.out else 0), conn)

    def _drop(self, conn: _Conn, events: list[NetEvent]) -> None:
        try:
            self.sel.unregister(conn.sock)
        except (KeyError, ValueError):
            pass
        conn.sock.close()
        if conn.peer and self.by_peer.get(conn.peer) is conn:
            del self.by_peer[conn.peer]
            events.append(NetEvent("disconnected", conn.peer))


class ShardLink:
    """A learner unit's link to one syncer shard, kept up by a background thread."""

    def __init__(self, name: str, shard: str, addr: str, run_id: str, inbox: "queue.Queue[NetEvent]",
                 *, backoff_s: tuple[float, float] = (0.05, 1.0)):
        self.name, self.shard, self.addr, self.run_id = name, shard, addr, run_id
        self.inbox = inbox
        self.backoff_s = backoff_s
        self.stats = LinkStats()
        self.outbox: "queue.Queue[bytes | None]" = queue.Queue()
        self._sock: socket.socket | None = None
        self._up = threading.Event()
        self._closed = threading.Event()
        self._lock = threading.Lock()
        self._thread = threading.Thread(target=self._run, name=f"link-{shard}", daemon=True)
        self._writer = threading.Thread(target=self._write_loop, name=f"write-{shard}", daemon=True)

    def start(self) -> "ShardLink":
        self._thread.start()
        self._writer.start()
        return self

    @property
    def up(self) -> bool:
        return self._up.is_set()

    def send(self, msg) -> int:
        """Queues `msg`; returns the frame size, or 0 (dropped) while the link is down."""
        if not self._up.is_set():
            return 0
        frame = encode_frame(msg, run_id=self.run_id, sender=self.name)
        self.outbox.put(frame)
        return len(frame)

    def close(self) -> None:
        self._closed.set()
        self.outbox.put(None)
        with self._lock:
            if self._sock is not None:
                try:
                    self._sock.shutdown(socket.SHUT_RDWR)
                except OSError:
                    pass
        self._thread.join(timeout=2)
        self._writer.join(timeout=2)

    def _run(self) -> None:
        delay = self.backoff_s[0]
        while not self._closed.is_set():
            try:
                sock = socket.create_connection(parse_addr(self.addr), timeout=2.0)
            except OSError:
                self._closed.wait(delay)
                delay = min(delay * 2, self.backoff_s[1])
                continue
            sock.settimeout(None)
            sock.setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)
            connected_at = time.monotonic()
            with self._lock:
                self._sock = sock
            self.stats.connects += 1
            self._drain_outbox()  # nothing from a previous connection leaks into this one
            self._up.set()
            self.inbox.put(NetEvent("connected", self.shard))
            self._read_loop(sock)
            self._up.clear()
            with self._lock:
                self._sock = None
            sock.close()
            self.inbox.put(NetEvent("disconnected", self.shard))
            # Through a proxy, connect succeeds even when the shard behind it is down
            # and the proxy hangs up at once: only a connection that lasted resets
            # the backoff, so a dead shard is retried ever more slowly.
            if time.monotonic() - connected_at > 1.0:
                delay = self.backoff_s[0]
            else:
                self._closed.wait(delay)
                delay = min(delay * 2, self.backoff_s[1])

    def _read_loop(self, sock: socket.socket) -> None:
        decoder = FrameDecoder(expected_run_id=self.run_id)
        while not self._closed.is_set():
            try:
                data = sock.recv(1 << 20)
            except OSError:
                return
            if not data:
                return
            self.stats.bytes_recv += len(data)
            try:
                decoder.feed(data)
                while (item := decoder.next()) is not None:
                    header, msg = item
                    self.stats.frames_recv += 1
                    self.inbox.put(NetEvent("message", self.shard, msg, header.get("frame_bytes", 0)))
            except ProtocolError:
                return

    def _drain_outbox(self) -> None:
        try:
            while True:
                self.outbox.get_nowait()
        except queue.Empty:
            pass

    def _write_loop(self) -> None:
        while (frame := self.outbox.get()) is not None:
            with self._lock:
                sock = self._sock
            if sock is None:
                continue  # the link went down after send() queued it: the frame is lost
            try:
                sock.sendall(frame)
            except OSError:
                try:
                    sock.shutdown(socket.SHUT_RDWR)  # wakes the reader, which reconnects
                except OSError:
                    pass
                continue
            self.stats.bytes_sent += len(frame)
            self.stats.frames_sent += 1


def wait_until(pred, timeout_s: float, interval_s: float = 0.01) -> bool:
    deadline = time.monotonic() + timeout_s
    while not pred():
        if time.monotonic() > deadline:
            return False
        time.sleep(interval_s)
    return True
