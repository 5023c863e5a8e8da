"""The sim tier's Toxiproxy client: the proxies of the run's links and their toxics, in memory.

The injector (harness/run/injector.py) shapes links by adding and removing toxics
through a `LinkControl` (harness/run/control.py). `SimProxies` is the simulator's, with
the toxics kept in memory, and `Net` turns the toxics present on a link into what its
traffic sees, the way Toxiproxy would:

  bandwidth (rate KB/s)      frames are serialised on the stream at rate × 1000 B/s;
                             a new rate (or none) applies to what is not yet serialised
                             (frames wait in the sender's outbox: harness/sim/net.py)
  latency (latency, jitter)  + latency ± uniform jitter (ms) per frame; FIFO kept
  timeout (timeout 0)        the stream black-holes everything; removing it closes
                             the link's connections (the transport reconnects)
  reset_peer                 connections are reset at once, and every new one too
  limit_data (bytes)         a connection is closed once a stream passed `bytes`;
                             the frame that crossed the limit is lost
"""
from __future__ import annotations

from typing import TYPE_CHECKING

if TYPE_CHECKING:
    from diloco_chaos.harness.sim.net import Net
    from diloco_chaos.harness.sim.wire import Link


class SimProxies:
    """The links' toxics the injector shapes (a `LinkControl`), with proxies and toxics in memory."""

    def __init__(self, net: "Net"):
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
