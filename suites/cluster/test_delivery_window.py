"""The transport's delivery window through a real Toxiproxy (trainer/transport.py).

A ShardServer sends Θ[0] to a ShardLink through a proxy: first as fast as it can on an
open link, so that the proxy's socket buffer is autotuned to megabytes, then with a
10 Mbit/s bandwidth toxic and a new version every 20 ms (the shard commits faster than
the link carries). The outbox keeps only the newest waiting version, but without the
window everything the proxy's buffer took still had to cross first: measured here,
updates arrived 3.9 s old (4.5–5.1 s at worst; in the `partition` scenario such a delay
made a learner's Δs 14 versions stale on average, many past the bound). With the window no more than it and one frame are ahead of an
update: (1 MiB + 2 × 180 KB) / 1.25 MB/s ≈ 1.1 s (measured 0.96 s), at the same rate
of updates."""
from __future__ import annotations

import queue
import statistics
import time

import numpy as np
import pytest

from harness.backends.toxiproxy_server import ToxiproxyServer
from harness.links import toxic_spec
from trainer import transport
from trainer.messages import FragmentUpdate
from trainer.outbox import outbox_key
from trainer.shard_link import ShardLink
from trainer.transport import ShardServer, wait_until

pytestmark = [pytest.mark.cluster]

RUN, SECRET = "run-window", bytes(range(32))
RATE_KB_S = 1250  # Toxiproxy's bandwidth toxic: KB/s, i.e. 10 Mbit/s


def update(version: int) -> FragmentUpdate:
    return FragmentUpdate(0, version, False, [np.full(45000, version, np.float32)])  # 180 KB


def test_an_update_is_never_more_than_the_window_behind_on_a_bloated_link():
    with ToxiproxyServer() as proxies:
        client = proxies.client()
        server = ShardServer("syncer-0", RUN, secret=SECRET)
        inbox: queue.Queue = queue.Queue()
        link = None
        try:
            addr = client.create_proxy("learner-0", server.addr)
            link = ShardLink("learner-0", "syncer-0", addr, RUN, inbox, secret=SECRET).start()
            assert wait_until(lambda: server.poll(0.01) is not None and link.up, 10)
            sent: dict[int, float] = {}
            ages: list[tuple[float, float]] = []  # (arrival, age)

            def pump(seconds: float, every_s: float) -> None:
                end = time.monotonic() + seconds
                while time.monotonic() < end:
                    v = len(sent) + 1
                    sent[v] = time.monotonic()
                    server.send("learner-0", update(v), key=outbox_key(update(v)))
                    if not every_s:  # back to back, as fast as the socket takes them
                        continue
                    until = time.monotonic() + every_s
                    while True:
                        server.poll(0.002)
                        while not inbox.empty():
                            ev = inbox.get_nowait()
                            if ev.kind == "message":
                                now = time.monotonic()
                                ages.append((now, now - sent[ev.msg.version]))
                        if time.monotonic() >= until:
                            break

            pump(2.0, 0.0)
            client.add_toxic("learner-0", toxic_spec("bandwidth", "downstream", rate=RATE_KB_S))
            throttled = time.monotonic()
            pump(6.0, 0.02)
        finally:
            if link is not None:
                link.close()
            server.close()
    late = [age for at, age in ages if at > throttled + 3.0]  # the last 3 s: the queue has settled
    frame = len(transport.encode_frame(update(1), RUN, "syncer-0"))
    bound = (transport.WINDOW_BYTES + 2 * frame) / (RATE_KB_S * 1000) + 0.25
    assert len(late) >= 15, ages  # the link still carried ~7 updates a second
    assert statistics.median(late) <= bound, (statistics.median(late), bound, late)
