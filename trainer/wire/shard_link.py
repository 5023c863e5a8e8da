"""A learner unit's end of a link to one syncer shard (`ShardLink`): a background thread
connects to the address it was given (the harness puts a Toxiproxy proxy there), runs
the run-membership exchange, reconnects with exponential backoff, and hands what it
reads to an inbox queue; `send(msg, key)` never blocks the learner: frames go to an
outbox a writer thread drains, within the delivery window. A link going down is not a
learner dying: the learner keeps stepping. The wire, the window and the shard's end
are in trainer/wire/transport.py and trainer/wire/flow.py."""
from __future__ import annotations

import queue
import socket
import threading
import time

from diloco_chaos.trainer.protocol.messages import Received
from diloco_chaos.trainer.protocol.outbox import Outbox
from diloco_chaos.trainer.wire import auth
from diloco_chaos.trainer.wire.codec import FrameDecoder, ProtocolError, encode_frame
from diloco_chaos.trainer.wire.flow import BufferState, Flow, LinkStats
from diloco_chaos.trainer.wire.transport import NetEvent, _recv_exact, _tune, kernel_unsent, parse_addr


class ShardLink:
    """A learner unit's link to one syncer shard, kept up by a background thread."""

    def __init__(self, name: str, shard: str, addr: str, run_id: str, inbox: "queue.Queue[NetEvent]",
                 *, secret: bytes, backoff_s: tuple[float, float] = (0.05, 1.0)):
        self.name, self.shard, self.addr, self.run_id, self.secret = name, shard, addr, run_id, secret
        self.inbox = inbox
        self.backoff_s = backoff_s
        self.stats = LinkStats()
        # Guarded by _cv: the outbox, _sock, and _up's transitions to down. A frame in the
        # outbox always belongs to the current connection (it is emptied on each change).
        self._outbox = Outbox()
        self._cv = threading.Condition()
        self._sock: socket.socket | None = None
        self._proving: socket.socket | None = None  # a connection in the run-membership exchange
        self._partial = 0  # bytes of the frame being written not yet handed to the kernel
        self._flow = Flow()  # the current connection's delivery window (a new one per connection)
        self._up = threading.Event()
        self._go = threading.Event()  # set: a proven connection may count as up (`start(hold=...)`)
        self._closed = threading.Event()
        self._leaving = False  # set by drain(): the link ends with its connection
        self._thread = threading.Thread(target=self._run, name=f"link-{shard}", daemon=True)
        self._writer = threading.Thread(target=self._write_loop, name=f"write-{shard}", daemon=True)

    def start(self, hold: bool = False) -> "ShardLink":
        """Connect (and prove run membership) in the background and keep the link up. With
        `hold`, the first proven connection waits for `release()` before it counts as up:
        a restarting unit connects while it restores its checkpoint, and its core sees
        the link only once it is ready for it."""
        if not hold:
            self._go.set()
        self._thread.start()
        self._writer.start()
        return self

    @property
    def up(self) -> bool:
        return self._up.is_set()

    def send(self, msg, key=None, combine=None) -> int:
        """Queues `msg`, superseding a waiting frame with the same key (None: never; a
        Contribution's key: combined with it by `combine(old, new) -> msg`); returns the
        frame size, or 0 (dropped) while the link is down."""
        if not self._up.is_set():
            return 0
        frame = encode_frame(msg, run_id=self.run_id, sender=self.name)

        def merged(old, new):
            m = combine(old, new)
            return m, encode_frame(m, run_id=self.run_id, sender=self.name)

        with self._cv:
            if self._sock is None or not self._up.is_set():
                return 0
            if self._outbox.put(frame, key, msg=msg, combine=None if combine is None else merged):
                self.stats.superseded += 1
            self._cv.notify()
            self.stats.unsent_max = max(self.stats.unsent_max, self._unsent_locked())
        return len(frame)

    def unsent_bytes(self) -> int:
        with self._cv:
            return self._unsent_locked()

    def buffer(self) -> BufferState:
        with self._cv:
            return BufferState(self._unsent_locked(), self._outbox.frames, self.stats.superseded,
                               self._flow.unread() if self._sock is not None else 0)

    def release(self) -> None:
        self._go.set()

    def drain(self, deadline: float) -> bool:
        """Leaving: waits, until `deadline` (time.monotonic()), for every queued frame to
        reach the shard, then lets the link go down for good. A unit that leaves closes
        its links right after its last sends (the closing Δs); closed at once, the frames
        still in the outbox are lost, and a socket closed with unread data in it resets
        the connection, which discards what the kernel still held (a busy run lost three
        closing Δs of 180 KB this way). So: the writer hands the outbox to the kernel,
        then our end of the stream is shut (FIN after the last byte) and the reader reads
        on until the shard, having read to that end, hangs up. True: the shard read to
        the end; False: the deadline came first, or the link was down."""
        with self._cv:
            while self._up.is_set() and self._sock is not None and (self._outbox.frames or self._partial):
                left = deadline - time.monotonic()
                if left <= 0:
                    return False
                self._cv.wait(min(left, 0.05))
            sock = self._sock if self._up.is_set() else None
            self._leaving = True  # no reconnect once this connection ends
        if sock is None:
            return False
        try:
            sock.shutdown(socket.SHUT_WR)
        except OSError:
            return False
        while self._up.is_set():
            if time.monotonic() >= deadline:
                return False
            self._closed.wait(0.01)
        return True

    def close(self) -> None:
        self._closed.set()
        self._go.set()
        with self._cv:
            self._cv.notify_all()
            for sock in (self._sock, self._proving):
                if sock is not None:
                    try:
                        sock.shutdown(socket.SHUT_RDWR)
                    except OSError:
                        pass
        self._thread.join(timeout=2)
        self._writer.join(timeout=2)

    def _unsent_locked(self) -> int:
        return self._outbox.unsent_bytes + self._partial + kernel_unsent(self._sock)

    def _run(self) -> None:
        delay = self.backoff_s[0]
        while not self._closed.is_set() and not self._leaving:
            try:
                sock = socket.create_connection(parse_addr(self.addr), timeout=2.0)
            except OSError:
                self._closed.wait(delay)
                delay = min(delay * 2, self.backoff_s[1])
                continue
            _tune(sock)
            connected_at = time.monotonic()
            self._proving = sock  # close() wakes a blocked exchange through it
            try:
                if self._closed.is_set():
                    raise ConnectionError("closed")
                self._prove(sock)
            except (auth.AuthError, OSError) as e:  # OSError: a cut link or a shard gone; retried
                if isinstance(e, auth.AuthError):
                    self.inbox.put(NetEvent("refused", self.shard, str(e)))
                sock.close()
                self._closed.wait(delay)
                delay = min(delay * 2, self.backoff_s[1])
                continue
            finally:
                self._proving = None
            self._go.wait()
            if self._closed.is_set():
                sock.close()
                return
            sock.settimeout(None)
            with self._cv:
                self._sock, self._flow = sock, Flow()
                self._outbox.clear()  # nothing from a previous connection leaks into this one
            self.stats.connects += 1
            self._up.set()
            self.inbox.put(NetEvent("connected", self.shard))
            self._read_loop(sock)
            with self._cv:
                self._up.clear()
                self._sock = None
                self._outbox.clear()
            try:
                sock.shutdown(socket.SHUT_RDWR)  # wakes a writer blocked on this socket
            except OSError:
                pass
            sock.close()
            self.inbox.put(NetEvent("disconnected", self.shard, at=round(time.time(), 6)))
            # Through a proxy, connect succeeds even when the shard behind it is down
            # and the proxy hangs up at once: only a connection that lasted resets
            # the backoff, so a dead shard is retried ever more slowly.
            if time.monotonic() - connected_at > 1.0:
                delay = self.backoff_s[0]
            else:
                self._closed.wait(delay)
                delay = min(delay * 2, self.backoff_s[1])

    def _prove(self, sock: socket.socket) -> None:
        """The learner's half of the run-membership exchange (trainer/wire/auth.py), blocking, at
        most AUTH_TIMEOUT_S per read: the shard's challenge, our proof, its answer."""
        sock.settimeout(auth.AUTH_TIMEOUT_S)
        n_shard = auth.read_challenge(_recv_exact(sock, auth.CHALLENGE_BYTES))
        n_learner = auth.nonce()
        mine = auth.proof(self.secret, self.run_id, self.name, self.shard, n_shard, n_learner)
        sock.sendall(mine)
        auth.check_answer(_recv_exact(sock, auth.ANSWER_BYTES), self.secret, self.run_id, self.name, self.shard,
                          n_shard, n_learner)
        self.stats.bytes_recv += auth.CHALLENGE_BYTES + auth.ANSWER_BYTES
        self.stats.bytes_sent += len(mine)

    def _read_loop(self, sock: socket.socket) -> None:
        decoder, flow = FrameDecoder(expected_run_id=self.run_id), self._flow
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
                    if header["sender"] != self.shard:
                        return  # only the proven shard speaks on this connection
                    if isinstance(msg, Received):
                        with self._cv:
                            flow.took(msg)
                            self._cv.notify()
                        continue
                    self.stats.frames_recv += 1
                    self.inbox.put(NetEvent("message", self.shard, msg, header.get("frame_bytes", 0),
                                            at=round(time.time(), 6)))
            except ProtocolError:
                return
            with self._cv:
                flow.rx += len(data)
                if flow.ack_due():
                    self._cv.notify()

    def _write_loop(self) -> None:
        """One frame at a time: an acknowledgement when one is due, else the next frame from
        the outbox while the window is open (it leaves the outbox only once the previous
        one is written)."""
        while True:
            with self._cv:
                while not self._closed.is_set() and not (
                        self._sock is not None and (self._flow.ack_due() or (self._outbox and self._flow.open()))):
                    self._cv.wait()
                if self._closed.is_set():
                    return
                sock, flow = self._sock, self._flow
                ack = flow.ack_due()
                frame = encode_frame(flow.ack(), run_id=self.run_id, sender=self.name) if ack else self._outbox.take()
                self._partial = 0 if ack else len(frame)
            view = memoryview(frame)
            try:
                while view:
                    n = sock.send(view)
                    view = view[n:]
                    flow.tx += n
                    if not ack:
                        self._partial = len(view)
            except OSError:
                self._partial = 0
                try:
                    sock.shutdown(socket.SHUT_RDWR)  # wakes the reader, which reconnects
                except OSError:
                    pass
                continue
            self.stats.bytes_sent += len(frame)
            self.stats.unread_max = max(self.stats.unread_max, flow.unread())
            if not ack:
                self.stats.frames_sent += 1
