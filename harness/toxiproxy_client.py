"""The one adapter over `toxiproxy-python`.

That client keeps the server's host and port in class-level globals
(`APIConsumer.host/port`), so two servers in one process would talk over each
other. `ToxiproxyClient` holds its own address and points the globals at it
under a lock for the duration of each call; callers never see the globals.
The client has no toxic update, so `update_toxic` uses the HTTP API directly
(`POST /proxies/{proxy}/toxics/{toxic}`).

Link profiles are small frozen dataclasses with units in their field names.
Toxiproxy's `bandwidth` toxic takes a rate in KB/s (kilobytes); our profiles
speak kilobits per second (`bandwidth_kbps`), the unit WAN links are sold in.
"""
from __future__ import annotations

import threading
from contextlib import contextmanager
from dataclasses import dataclass
from typing import Iterator

import requests
from toxiproxy.api import APIConsumer
from toxiproxy.server import Toxiproxy

_GLOBALS_LOCK = threading.RLock()

STREAMS = ("upstream", "downstream")  # upstream = client -> server, downstream = server -> client


@dataclass(frozen=True)
class LinkProfile:
    """A WAN link's shape, applied to both directions of a proxy."""

    bandwidth_kbps: float | None = None  # kilobits per second; None = unlimited
    latency_ms: float = 0.0
    jitter_ms: float = 0.0

    def __post_init__(self):
        if self.bandwidth_kbps is not None and not self.bandwidth_kbps >= 8:
            raise ValueError(f"bandwidth_kbps must be >= 8 (1 KB/s, Toxiproxy's resolution) or None, got {self.bandwidth_kbps}")
        if not self.latency_ms >= 0:
            raise ValueError(f"latency_ms must be >= 0, got {self.latency_ms}")
        if not 0 <= self.jitter_ms <= self.latency_ms:
            raise ValueError(f"jitter_ms must be in [0, latency_ms={self.latency_ms}], got {self.jitter_ms}")

    def toxics(self) -> list[dict]:
        """The Toxiproxy toxics (as API dicts) that realise this profile, per direction."""
        out = []
        for stream in STREAMS:
            if self.bandwidth_kbps is not None:
                out.append(toxic_spec("bandwidth", stream, rate=max(1, round(self.bandwidth_kbps / 8))))
            if self.latency_ms:
                # Toxiproxy adds the full latency on each direction; a profile's
                # latency_ms is one-way, so a round trip costs 2 * latency_ms.
                out.append(toxic_spec("latency", stream, latency=round(self.latency_ms), jitter=round(self.jitter_ms)))
        return out


def toxic_spec(kind: str, stream: str, *, name: str | None = None, toxicity: float = 1.0, **attributes) -> dict:
    if stream not in STREAMS:
        raise ValueError(f"stream must be one of {STREAMS}, got {stream!r}")
    return {"name": name or f"{kind}_{stream}", "type": kind, "stream": stream,
            "toxicity": toxicity, "attributes": attributes}


class ToxiproxyError(RuntimeError):
    pass


class ToxiproxyClient:
    """Talks to one Toxiproxy server at (host, port)."""

    def __init__(self, host: str, port: int):
        self.host, self.port = host, port
        self.url = f"http://{host}:{port}"

    @contextmanager
    def _api(self) -> Iterator[Toxiproxy]:
        with _GLOBALS_LOCK:
            saved = (APIConsumer.host, APIConsumer.port)
            APIConsumer.host, APIConsumer.port = self.host, self.port
            try:
                yield Toxiproxy()
            finally:
                APIConsumer.host, APIConsumer.port = saved

    # proxies -------------------------------------------------------------
    def create_proxy(self, name: str, upstream: str, listen: str = "127.0.0.1:0") -> str:
        """Creates a proxy and returns the address it listens on ("host:port")."""
        with self._api() as api:
            proxy = api.create(upstream=upstream, name=name, listen=listen, enabled=True)
        return proxy.listen

    def proxies(self) -> dict[str, dict]:
        return self._request("get", "/proxies").json()

    def delete_proxy(self, name: str) -> None:
        with self._api() as api:
            proxy = api.get_proxy(name)
            if proxy is not None:
                proxy.destroy()

    def delete_all(self) -> None:
        with self._api() as api:
            api.destroy_all()

    def set_enabled(self, name: str, enabled: bool) -> None:
        """A disabled proxy drops its connections and stops listening."""
        with self._api() as api:
            proxy = api.get_proxy(name)
            if proxy is None:
                raise ToxiproxyError(f"no proxy named {name!r}")
            proxy.enable() if enabled else proxy.disable()

    def reset(self) -> None:
        """Re-enables every proxy and removes every toxic."""
        with self._api() as api:
            api.reset()

    # toxics --------------------------------------------------------------
    def add_toxic(self, proxy: str, spec: dict) -> None:
        with self._api() as api:
            p = api.get_proxy(proxy)
            if p is None:
                raise ToxiproxyError(f"no proxy named {proxy!r}")
            p.add_toxic(**spec)

    def update_toxic(self, proxy: str, toxic: str, *, toxicity: float | None = None, **attributes) -> None:
        body: dict = {"attributes": attributes}
        if toxicity is not None:
            body["toxicity"] = toxicity
        self._request("post", f"/proxies/{proxy}/toxics/{toxic}", json=body)

    def remove_toxic(self, proxy: str, toxic: str) -> None:
        with self._api() as api:
            p = api.get_proxy(proxy)
            if p is not None and toxic in p.toxics():
                p.destroy_toxic(toxic)

    def toxics(self, proxy: str) -> list[dict]:
        return self._request("get", f"/proxies/{proxy}/toxics").json()

    def apply_profile(self, proxy: str, profile: LinkProfile, *, prefix: str = "wan") -> list[str]:
        """Adds the toxics of `profile` to `proxy`, named `{prefix}_{type}_{stream}`; returns their names."""
        names = []
        for spec in profile.toxics():
            spec = {**spec, "name": f"{prefix}_{spec['name']}"}
            self.add_toxic(proxy, spec)
            names.append(spec["name"])
        return names

    def _request(self, method: str, path: str, **kw) -> requests.Response:
        r = requests.request(method, self.url + path, timeout=5, **kw)
        if not r.ok:
            raise ToxiproxyError(f"{method.upper()} {path} -> {r.status_code}: {r.text.strip()}")
        return r
