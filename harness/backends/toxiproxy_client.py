"""The one adapter over `toxiproxy-python`.

That client keeps the server's host and port in class-level globals
(`APIConsumer.host/port`), so two servers in one process would talk over each
other. `ToxiproxyClient` holds its own address and points the globals at it
under a lock for the duration of each call; callers never see the globals.
The client has no toxic update, so `update_toxic` uses the HTTP API directly
(`POST /proxies/{proxy}/toxics/{toxic}`).

Link profiles and toxic specs (pure data) live in harness/links.py.
"""
from __future__ import annotations

import threading
from contextlib import contextmanager
from typing import Iterator

import requests
from toxiproxy.api import APIConsumer
from toxiproxy.server import Toxiproxy


_GLOBALS_LOCK = threading.RLock()

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

    def _request(self, method: str, path: str, **kw) -> requests.Response:
        r = requests.request(method, self.url + path, timeout=5, **kw)
        if not r.ok:
            raise ToxiproxyError(f"{method.upper()} {path} -> {r.status_code}: {r.text.strip()}")
        return r
