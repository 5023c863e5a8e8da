"""Bounded buffers on the transport: the Outbox (newest supersedes, Δs combined), the
buffer log, the delivery window on real sockets (127.0.0.1 only), and the simulator's links
following the same supersede rule. Every wait is on a predicate with a one-sided time bound;
every socket and thread is closed."""
from __future__ import annotations

import queue
import socket
import threading
import time

import numpy as np
import pytest

from diloco_chaos.harness.sim.net import Net
from diloco_chaos.harness.sim.world import Clock
from diloco_chaos.harness.links import toxic_spec
from diloco_chaos.trainer.protocol import compression
from diloco_chaos.trainer.protocol.messages import Contribution, FragmentDelta, FragmentUpdate, GradMean, GradStep, Hello, Received, SliceControl
from diloco_chaos.trainer.protocol.outbox import Outbox, outbox_key
from diloco_chaos.trainer.wire import auth, flow, transport
from diloco_chaos.trainer.wire.codec import encode_frame
from diloco_chaos.trainer.wire.flow import BufferLog, BufferState
from diloco_chaos.trainer.wire.shard_link import ShardLink
from diloco_chaos.trainer.wire.transport import ShardServer, wait_until

RUN = "run-transport"
SECRET = bytes(range(32))  # the run secret every link here proves (trainer/wire/auth.py)


# --- (a) the Outbox ---------------------------------------------------------------------------

def test_a_keyed_frame_supersedes_the_waiting_one_in_place():
    box = Outbox()
    assert box.put(b"a1", ("frag", 0)) is False
    assert box.put(b"b", None) is False
    assert box.put(b"c1", ("frag", 1)) is False
    assert box.put(b"a2-longer", ("frag", 0)) is True     # replaces a1 where a1 was
    assert (box.frames, box.unsent_bytes) == (3, len(b"a2-longer") + 1 + 2)
    assert (box.superseded, box.superseded_bytes) == (1, 2)
    assert [box.take() for _ in range(4)] == [b"a2-longer", b"b", b"c1", None]
    assert (box.frames, box.unsent_bytes) == (0, 0)


def test_a_frame_without_a_key_is_never_superseded():
    box = Outbox()
    for i in range(5):
        assert box.put(b"x%d" % i) is False
    assert box.frames == 5 and box.superseded == 0
    assert [box.take() for _ in range(5)] == [b"x%d" % i for i in range(5)]


def test_a_taken_frame_is_no_longer_superseded():
    box = Outbox()
    box.put(b"v1", ("frag", 0))
    assert box.take() == b"v1"                            # being written now
    assert box.put(b"v2", ("frag", 0)) is False           # queued behind it, not replacing it
    assert box.put(b"v3", ("frag", 0)) is True
    assert box.take() == b"v3" and box.take() is None
    assert box.superseded == 1


def test_clear_drops_every_waiting_frame_and_keeps_the_counters():
    box = Outbox()
    box.put(b"a", ("hello",))
    box.put(b"bb", ("hello",))
    box.put(b"c")
    assert box.clear() == 2
    assert (box.frames, box.unsent_bytes, box.superseded) == (0, 0, 1)
    assert box.put(b"d", ("hello",)) is False             # the old key is gone with its frame


def test_outbox_keys_follow_the_message_kind():
    theta = [np.zeros(3, np.float32)]
    assert outbox_key(FragmentUpdate(2, 5, False, theta)) == ("frag", 2)
    assert outbox_key(FragmentUpdate(2, 6, True, theta)) == ("frag", 2)
    assert outbox_key(FragmentDelta(2, 6, 5, theta)) == ("frag", 2)  # superseded only as a whole Θ[p]
    assert outbox_key(Hello("learner-0", 1)) == ("hello",)
    assert outbox_key(Contribution("learner-0", 0, 1, 2, 0, 1, 8, 0.1, None, theta)) == ("contrib", 2)
    for msg in [GradStep("learner-0", 0, 1, 2, 3, 8, theta),
                GradMean(2, 3, 1, 2, theta), SliceControl(1)]:
        assert outbox_key(msg) is None


def test_a_delta_chain_waits_until_it_would_outweigh_the_whole_copy_it_builds():
    """A FragmentDelta builds on the copy the frame before it left: laid over a waiting
    Θ[p] it would break the chain. It queues behind the waiting frames of its fragment while
    they and it come to fewer bytes than Θ[p] whole (what `combine` gives, the shard's
    Send.whole), then that whole replaces them all, in the first one's place."""
    theta = [np.zeros(3, np.float32)]
    whole = {v: FragmentUpdate(0, v, False, [np.full(3, v, np.float32)]) for v in range(9)}

    def as_whole(old, new):
        return whole[new.version], b"W%d" % new.version + b"-" * 8  # 10 bytes

    box = Outbox()
    box.put(b"v1", ("frag", 0), msg=whole[1])
    box.put(b"x", None)
    with pytest.raises(ValueError, match="combined, not replaced"):
        box.put(b"d2", ("frag", 0), msg=FragmentDelta(0, 2, 1, theta))  # no whole to put in its place
    for v in (2, 3, 4):  # v1 and the deltas: 2 + 2 + 2 + 2 < 10 bytes, a chain
        assert box.put(b"d%d" % v, ("frag", 0), msg=FragmentDelta(0, v, v - 1, theta), combine=as_whole) is False
    assert (box.frames, box.unsent_bytes, box.superseded) == (5, 9, 0)
    # 8 + 2 ≥ 10: the whole v5 replaces v1 and the three deltas, where v1 was
    assert box.put(b"d5", ("frag", 0), msg=FragmentDelta(0, 5, 4, theta), combine=as_whole) is True
    assert (box.frames, box.unsent_bytes, box.superseded, box.superseded_bytes) == (2, 11, 4, 8)
    # behind a waiting whole, a delta's own whole takes its place (never more bytes than one whole)
    assert box.put(b"d6", ("frag", 0), msg=FragmentDelta(0, 6, 5, theta), combine=as_whole) is True
    assert box.put(b"v7", ("frag", 0), msg=whole[7]) is True     # a whole replaces what waits outright
    assert [box.take(), box.take(), box.take()] == [b"v7", b"x", None]
    assert box.put(b"d8", ("frag", 0), msg=FragmentDelta(0, 8, 7, theta), combine=as_whole) is False  # nothing waits


def test_two_unsent_contributions_of_a_fragment_are_combined_into_one():
    """A Δ of p waiting unsent is summed with the newer one (their steps are disjoint), never
    replaced: the sum of the payloads, counters added, the older base_version, the newer seq."""
    from diloco_chaos.trainer.config import RunConfig
    from diloco_chaos.trainer.numerics.wiring import contribution_combiner
    from diloco_chaos.trainer.protocol import compression
    combine = contribution_combiner(RunConfig())  # fp32 pseudo-gradients
    one = Contribution("learner-0", 0, 1, 2, 4, 6, 48, 0.1, None, compression.encode([np.full(3, 1.0)], "fp32"))
    two = Contribution("learner-0", 0, 3, 2, 7, 5, 40, 0.2, 0.5, compression.encode([np.full(3, 0.5)], "fp32"))
    box = Outbox()
    box.put(b"x" * 10, outbox_key(one), msg=one, combine=lambda o, n: (combine(o, n), b"y" * 12))
    assert box.put(b"z" * 10, outbox_key(two), msg=two, combine=lambda o, n: (combine(o, n), b"y" * 12)) is True
    assert (box.frames, box.unsent_bytes, box.take()) == (1, 12, b"y" * 12)
    got = combine(one, two)
    assert (got.seq, got.base_version, got.c_steps, got.c_tokens, got.last_sync_s) == (3, 4, 11, 88, 0.5)
    assert compression.decode(got.payload)[0].tolist() == [1.5, 1.5, 1.5]
    with pytest.raises(ValueError, match="combined, not replaced"):
        box.put(b"a", ("contrib", 2), msg=one)
        box.put(b"b", ("contrib", 2), msg=two)  # no combine: would lose the first Δ's progress


def test_buffer_log_reports_while_unsent_then_once_when_empty():
    log = BufferLog(interval_s=1.0)
    assert log.due(0.0)
    assert log.lines(0.0, {"a": BufferState(0, 0, 0)}) == []
    assert not log.due(0.5) and log.due(1.0)
    assert log.lines(1.0, {"a": BufferState(70, 1, 3)}) == [
        {"peer": "a", "unsent_bytes": 70, "frames": 1, "superseded": 3, "unread_bytes": 0}]
    assert log.lines(2.0, {"a": BufferState(10, 0, 3, 5)})[0]["unread_bytes"] == 5
    assert log.lines(3.0, {}) == [{"peer": "a", "unsent_bytes": 0, "frames": 0, "superseded": 0, "unread_bytes": 0}]
    assert log.lines(4.0, {"a": BufferState(0, 0, 3)}) == []


# --- (d) the delivery window -------------------------------------------------------------------

BIG = 32768  # float32 values: frames of ~128 KB


def big(version: int) -> FragmentUpdate:
    return FragmentUpdate(0, version, False, [np.full(BIG, version, np.float32)])


class Reader:
    """Reads everything a socket delivers, in a thread, and never acknowledges it: what
    reaches it is what the sender let past its window (the kernel's buffers are small
    next to the window, and this end drains them)."""

    def __init__(self, sock: socket.socket):
        self.sock, self.n = sock, 0
        self.thread = threading.Thread(target=self._run, daemon=True)
        self.thread.start()

    def _run(self) -> None:
        try:
            while data := self.sock.recv(1 << 20):
                self.n += len(data)
        except OSError:
            pass

    def settled(self, at_least: int) -> int:
        """The count once it reached `at_least` (what the window lets through: waited for,
        not assumed to arrive within some time; 20 s is a give-up timeout) and nothing more
        arrived for 0.3 s, or for twice as long as reaching `at_least` took if that is longer:
        the quiet that says "all in" is relative to this machine's pace at this transfer, so
        a busy machine's pause in the middle of the last frame is not read as its end."""
        t0 = time.monotonic()
        assert wait_until(lambda: self.n >= at_least, 20), (self.n, at_least)
        quiet = max(0.3, 2 * (time.monotonic() - t0))
        last = -1
        while last != self.n:
            last = self.n
            time.sleep(quiet)
        return self.n

    def ack(self, sender: str) -> None:
        self.sock.sendall(encode_frame(Received(self.n), run_id=RUN, sender=sender))


class Polling:
    """Polls a ShardServer in a thread while the block runs (nothing else touches it then)."""

    def __init__(self, server: ShardServer):
        self.server, self.stop = server, threading.Event()
        self.thread = threading.Thread(target=self._run, daemon=True)

    def _run(self) -> None:
        while not self.stop.is_set():
            self.server.poll(0.01)

    def __enter__(self):
        self.thread.start()

    def __exit__(self, *exc):
        self.stop.set()
        self.thread.join(timeout=5)


def test_the_shard_writes_no_more_than_the_window_ahead_of_what_the_learner_read(closing):
    server = ShardServer("syncer-0", RUN, secret=SECRET)
    closing(server)
    sock = socket.create_connection(transport.parse_addr(server.addr), timeout=5)  # a learner done by hand
    closing(sock)
    with Polling(server):
        n_shard = auth.read_challenge(transport._recv_exact(sock, auth.CHALLENGE_BYTES))
        sock.sendall(auth.proof(SECRET, RUN, "learner-0", "syncer-0", n_shard, bytes(16)))
        transport._recv_exact(sock, auth.ANSWER_BYTES)
        assert wait_until(lambda: "learner-0" in server.connected(), 5)
    reader = Reader(sock)
    frame = max(server.send("learner-0", big(v)) for v in range(40))  # 5 MB, no keys: nothing replaced
    with Polling(server):
        first = reader.settled(flow.WINDOW_BYTES)
    # the window, plus the frame that was being started when it filled
    assert flow.WINDOW_BYTES <= first <= flow.WINDOW_BYTES + frame, (first, frame)
    buffer = server.buffers()["learner-0"]
    assert buffer.frames >= 30  # the rest waits where it can be replaced
    assert buffer.unread_bytes == first == server.stats["learner-0"].unread_max  # what it says is past the outbox
    reader.ack("learner-0")  # read it all: the shard may write a window more
    with Polling(server):
        second = reader.settled(first + flow.WINDOW_BYTES)
    assert first + flow.WINDOW_BYTES <= second <= first + flow.WINDOW_BYTES + frame, (first, second)
    assert not [e for e in server.poll(0.05) if e.kind == "message"]  # an acknowledgement never reaches the core


def test_a_learner_writes_no_more_than_the_window_ahead_of_what_the_shard_read(closing):
    listener = socket.create_server(("127.0.0.1", 0))  # a shard done by hand
    closing(listener)
    accepted: list[socket.socket] = []

    def shard():
        conn, _ = listener.accept()
        accepted.append(conn)

    thread = threading.Thread(target=shard, daemon=True)
    thread.start()
    inbox: queue.Queue = queue.Queue()
    link = ShardLink("learner-0", "syncer-0", "127.0.0.1:%d" % listener.getsockname()[1], RUN, inbox,
                     secret=SECRET, backoff_s=(5.0, 5.0))
    closing(link)
    # the exchange is not what this test is about: the link's own check of the answer is skipped
    link._prove = lambda sock: None
    link.start()
    assert wait_until(lambda: link.up, 5)
    thread.join(timeout=5)
    conn = accepted[0]
    closing(conn)
    reader = Reader(conn)
    frame = max(link.send(big(v)) for v in range(40))
    first = reader.settled(flow.WINDOW_BYTES)
    assert flow.WINDOW_BYTES <= first <= flow.WINDOW_BYTES + frame, (first, frame)
    assert link.buffer().frames >= 30 and link.buffer().unread_bytes == first == link.stats.unread_max
    reader.ack("syncer-0")
    second = reader.settled(first + flow.WINDOW_BYTES)
    assert first + flow.WINDOW_BYTES <= second <= first + flow.WINDOW_BYTES + frame, (first, second)
    assert inbox.get(timeout=1).kind == "connected" and inbox.empty()  # the acknowledgement is the link's own


# --- the simulator's links follow the same rule -------------------------------------------

class SimWorld:
    """What harness/sim/net.py `Net` needs from the simulated world: a clock, an rng, the
    units' ends (recorded), and the planted bugs."""

    def __init__(self, bugs=frozenset()):
        self.clock = Clock()
        self.rng = np.random.default_rng(0)
        self.learner_bugs = self.syncer_bugs = frozenset(bugs)
        self.got: list = []  # (t, who, kind, msg)

    @property
    def now(self) -> float:
        return self.clock.now

    def learner_link_event(self, learner, kind, shard, msg=None, nbytes=0):
        self.got.append((self.now, learner, kind, msg))

    def shard_listening(self, shard):
        return True

    def shard_event(self, shard, kind, learner, msg=None, nbytes=0):
        self.got.append((self.now, shard, kind, msg))


def sim_link(bugs=frozenset()):
    """One simulated learner↔shard link, up, with the shard's end at 1 KB/s; nothing is
    held beyond the outbox but the frame being serialised."""
    world = SimWorld(bugs)
    net = Net(world, ["learner-0"], ["syncer-0"], RUN, loopback_s=0.0002)
    net.held_bytes = 0
    net.learner_started("learner-0")
    world.clock.run_until(0.01)
    assert net.learner_send("learner-0", "syncer-0", Hello("learner-0", 0)) > 0
    world.clock.run_until(0.02)
    net.proxies.add_toxic("learner-0~syncer-0", toxic_spec("bandwidth", "downstream", rate=1))
    return world, net


def small_update(version: int) -> FragmentUpdate:
    return FragmentUpdate(0, version, False, [np.full(200, version, np.float32)])  # ~1 KB: ~1 s a frame


def sim_send_20(world, net) -> None:
    for v in range(1, 21):
        assert net.shard_send("syncer-0", "learner-0", small_update(v)) > 0
        world.clock.run_until(world.now + 0.1)


def sim_versions(world) -> list[int]:
    return [msg.version for _, who, kind, msg in world.got if who == "learner-0" and kind == "message"]


def test_simulated_links_supersede_a_waiting_fragment_with_the_newest():
    world, net = sim_link()
    sim_send_20(world, net)
    world.clock.run_until(60)
    assert sim_versions(world) == [1, 11, 20]             # v1 on the wire at once; then the newest waiting
    link = net.link("learner-0", "syncer-0")
    assert link.shard_stats.superseded == 17 and link.stats.superseded == 0
    assert 1000 < link.shard_stats.unsent_max < 3000      # one frame on the wire, one waiting


def test_simulated_links_keep_every_frame_with_the_planted_bug_and_recover_when_the_rate_does():
    world, net = sim_link({"unbounded_outbox"})
    sim_send_20(world, net)
    t_lift = world.now + 1
    world.clock.run_until(t_lift)
    assert sim_versions(world) == [1, 2]                  # ~1 s a frame: a backlog of 18
    assert net.link("learner-0", "syncer-0").shard_stats.unsent_max > 15_000
    net.proxies.remove_toxic("learner-0~syncer-0", "bandwidth_downstream")
    world.clock.run_until(t_lift + 0.01)                  # the rest lands at once (the stale backlog)
    assert sim_versions(world) == list(range(1, 21))
    assert net.link("learner-0", "syncer-0").shard_stats.superseded == 0


def test_simulated_links_carry_a_chain_of_deltas_as_one_whole_copy_bit_for_bit():
    """int4 deltas (error feedback) into a 1 KB/s link: the first goes on the wire, the next
    wait as a chain until they would outweigh one whole Θ[p], then the exact copy the shard
    holds for the learner waits in their place: the learner's copy and the shard's agree bit
    for bit and what waits stays about one whole (queued behind one another, as before, all
    20 would have crossed, late)."""
    world, net = sim_link()
    rng = np.random.default_rng(0)
    theta, held = [np.zeros(400, np.float32)], [np.zeros(400, np.float32)]
    for v in range(1, 21):
        theta = [theta[0] + rng.normal(scale=0.01, size=400).astype(np.float32)]
        payload, copy = compression.broadcast_delta(theta, held, "int4")
        assert net.shard_send("syncer-0", "learner-0", FragmentDelta(0, v, v - 1, payload),
                              FragmentUpdate(0, v, False, copy)) > 0
        held = copy
        world.clock.run_until(world.now + 0.1)
    world.clock.run_until(60)
    got = [msg for _, who, kind, msg in world.got if who == "learner-0" and kind == "message"]
    # v1 on the wire at once, v2 behind it; v3..v9 chained until they outweighed Θ[p] whole
    # (~1.7 KB), which took their place; from then on each newer whole took its place: v20
    assert [(type(m).__name__, m.version) for m in got] == [("FragmentDelta", 1), ("FragmentDelta", 2),
                                                           ("FragmentUpdate", 9), ("FragmentUpdate", 20)]
    assert got[-1].params[0].tobytes() == held[0].tobytes()
    link = net.link("learner-0", "syncer-0")
    assert link.shard_stats.superseded == 10 and link.shard_stats.unsent_max < 2 * 1800  # on the wire + one
