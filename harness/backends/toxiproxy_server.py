"""The real Toxiproxy server as a managed component.

`ToxiproxyServer` starts Shopify's Go binary on a free loopback port, waits until
`GET /version` answers, and always stops it (context manager; also on exceptions
and Ctrl-C, since KeyboardInterrupt unwinds through `__exit__`).
"""
from __future__ import annotations

import os
import random
import shutil
import socket
import subprocess
import tempfile
import time
from pathlib import Path

import requests

from diloco_chaos.harness.backends import procs
REPO = Path(__file__).resolve().parents[2]
LOCAL_BINARY = REPO / ".tools" / "toxiproxy-server"


class ToxiproxyUnavailable(RuntimeError):
    pass


def user_tools() -> Path:
    """Where `diloco-chaos setup` puts the server for an installed package."""
    if os.environ.get("DILOCO_CHAOS_TOOLS"):
        return Path(os.environ["DILOCO_CHAOS_TOOLS"])
    data = os.environ.get("XDG_DATA_HOME") or str(Path.home() / ".local" / "share")
    return Path(data) / "diloco-chaos" / "bin"


def find_binary() -> str:
    """The checkout's build (.tools/), then the user's tools folder, then PATH."""
    for candidate in (LOCAL_BINARY, user_tools() / "toxiproxy-server"):
        if os.access(candidate, os.X_OK):
            return str(candidate)
    found = shutil.which("toxiproxy-server")
    if found:
        return found
    raise ToxiproxyUnavailable(
        f"no toxiproxy-server found (looked in {LOCAL_BINARY.parent}, {user_tools()} and PATH): run "
        "`diloco-chaos setup` (builds it with Go >= 1.23; `make setup` in a checkout), or put the "
        "release binary on PATH as toxiproxy-server, or `brew install toxiproxy`."
    )


def ephemeral_range() -> tuple[int, int]:
    """The ports the kernel hands out for bind(0) and for every outgoing connection."""
    try:
        lo, hi = map(int, Path("/proc/sys/net/ipv4/ip_local_port_range").read_text().split())
        return lo, hi
    except (OSError, ValueError):
        return 32768, 60999  # Linux's default


def free_port(host: str = "127.0.0.1") -> int:
    """A port free on `host` now, for a server that binds it seconds later (a syncer shard, the
    Toxiproxy server). Drawn below the ephemeral range: a port the kernel picked for bind(0)
    and we let go could be handed to any connection or bind(0) in between, and a shard then
    failed to start ("Address already in use", once in a Docker `unit-loss` run)."""
    lo = ephemeral_range()[0]
    rng = random.SystemRandom()
    for _ in range(100):
        port = rng.randrange(max(1024, lo - 16384), lo)
        with socket.socket() as s:
            try:
                s.bind((host, port))
            except OSError:
                continue
            return port
    with socket.socket() as s:  # (that whole span taken: the kernel's pick, as before)
        s.bind((host, 0))
        return s.getsockname()[1]


class ToxiproxyServer:
    """One Toxiproxy server process bound to loopback.

    >>> with ToxiproxyServer(seed=7) as server:
    ...     client = server.client()
    """

    def __init__(self, *, host: str = "127.0.0.1", port: int | None = None, seed: int | None = None,
                 binary: str | None = None, log_path: str | os.PathLike | None = None,
                 start_timeout_s: float = 10.0):
        self.host = host
        self.requested_port = port
        self.port: int | None = None
        self.seed = seed
        self.binary = binary or find_binary()
        self.log_path = log_path
        self.start_timeout_s = start_timeout_s
        self.proc: subprocess.Popen | None = None
        self._log = None

    @property
    def url(self) -> str:
        return f"http://{self.host}:{self.port}"

    @property
    def pid(self) -> int | None:
        return self.proc.pid if self.proc else None

    def start(self) -> "ToxiproxyServer":
        if self.proc is not None:
            raise RuntimeError("ToxiproxyServer already started")
        # A free port can be taken between our probe and the server's bind by a
        # concurrent run; the server then exits at once and we try another.
        attempts = 1 if self.requested_port else 5
        last_err = ""
        for _ in range(attempts):
            self.port = self.requested_port or free_port(self.host)
            argv = [self.binary, "-host", self.host, "-port", str(self.port)]
            if self.seed is not None:
                argv += ["-seed", str(self.seed)]
            self._log = open(self.log_path, "ab") if self.log_path else tempfile.TemporaryFile()
            self.proc = procs.spawn(argv, stdout=self._log, stderr=subprocess.STDOUT)
            if self._wait_ready():
                return self
            last_err = self._tail_log()
            self.stop()
        raise ToxiproxyUnavailable(f"toxiproxy-server did not come up on {self.host}: {last_err}")

    def _wait_ready(self) -> bool:
        deadline = time.monotonic() + self.start_timeout_s
        while time.monotonic() < deadline:
            if self.proc.poll() is not None:
                return False
            try:
                if requests.get(self.url + "/version", timeout=0.5).ok:
                    return True
            except requests.RequestException:
                pass
            time.sleep(0.02)
        return False

    def _tail_log(self) -> str:
        try:
            self._log.seek(0)
            return self._log.read()[-500:].decode(errors="replace").strip()
        except (OSError, ValueError):
            return ""

    def version(self) -> str:
        return requests.get(self.url + "/version", timeout=2).text.strip()

    def client(self):
        from diloco_chaos.harness.backends.toxiproxy_client import ToxiproxyClient

        return ToxiproxyClient(self.host, self.port)

    def stop(self) -> None:
        if self.proc is not None:
            procs.stop(self.proc, grace_s=3.0)
            self.proc = None
        if self._log is not None:
            self._log.close()
            self._log = None

    def __enter__(self) -> "ToxiproxyServer":
        return self.start()

    def __exit__(self, *exc) -> None:
        self.stop()
