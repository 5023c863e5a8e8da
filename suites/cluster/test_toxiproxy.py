"""The real Toxiproxy server between real loopback sockets: measured effects, not calls."""
from __future__ import annotations

import signal
import socket
import subprocess
import sys
import threading
import time

import pytest

from harness.backends.procs import pid_alive
from harness.links import LinkProfile, toxic_spec
from harness.backends.toxiproxy_server import ToxiproxyServer

pytestmark = pytest.mark.cluster


class EchoServer:
    """A loopback TCP server that echoes every byte back, one thread per connection."""

    def __init__(self):
        self.sock = socket.create_server(("127.0.0.1", 0))
        self.addr = "127.0.0.1:%d" % self.sock.getsockname()[1]
        self.stopped = False
        threading.Thread(target=self._accept, daemon=True).start()

    def _accept(self):
        while not self.stopped:
            try:
                conn, _ = self.sock.accept()
            except OSError:
                return
            threading.Thread(target=self._echo, args=(conn,), daemon=True).start()

    @staticmethod
    def _echo(conn):
        with conn:
            while data := conn.recv(65536):
                conn.sendall(data)

    def close(self):
        self.stopped = True
        self.sock.close()


@pytest.fixture
def echo():
    server = EchoServer()
    yield server
    server.close()


def _connect(addr: str, timeout: float = 5.0) -> socket.socket:
    host, port = addr.rsplit(":", 1)
    return socket.create_connection((host, int(port)), timeout=timeout)


def _echo_transfer(addr: str, nbytes: int) -> float:
    """Sends nbytes through the echo and returns seconds until all came back."""
    payload = bytes(range(256)) * (nbytes // 256)
    with _connect(addr, timeout=30) as s:
        threading.Thread(target=s.sendall, args=(payload,), daemon=True).start()
        got, t0 = 0, time.monotonic()
        while got < len(payload):
            chunk = s.recv(65536)
            assert chunk, "connection closed early"
            got += len(chunk)
        return time.monotonic() - t0


def test_bandwidth_toxic_limits_throughput(toxiproxy, echo):
    listen = toxiproxy.create_proxy("bw", echo.addr)
    rate_kBps = 200
    toxiproxy.add_toxic("bw", toxic_spec("bandwidth", "downstream", rate=rate_kBps))
    nbytes = 400 * 1024
    seconds = _echo_transfer(listen, nbytes)
    measured_kBps = nbytes / 1024 / seconds
    assert rate_kBps * 0.75 <= measured_kBps <= rate_kBps * 1.25, f"measured {measured_kBps:.0f} KB/s"


def test_unthrottled_is_much_faster(toxiproxy, echo):
    listen = toxiproxy.create_proxy("fast", echo.addr)
    seconds = _echo_transfer(listen, 400 * 1024)
    assert 400 / seconds > 2000, f"unthrottled loopback only {400 / seconds:.0f} KB/s"


def test_latency_toxic_delays_round_trip(toxiproxy, echo):
    listen = toxiproxy.create_proxy("lat", echo.addr)
    latency_ms = 120
    toxiproxy.add_toxic("lat", toxic_spec("latency", "downstream", latency=latency_ms, jitter=0))
    with _connect(listen) as s:
        rtts = []
        for _ in range(3):
            t0 = time.monotonic()
            s.sendall(b"ping")
            assert s.recv(16) == b"ping"
            rtts.append((time.monotonic() - t0) * 1000)
    assert min(rtts) >= latency_ms, rtts
    assert max(rtts) < latency_ms + 200, rtts


def test_link_profile_applies_both_directions(toxiproxy, echo):
    listen = toxiproxy.create_proxy("wan", echo.addr)
    names = toxiproxy.apply_profile("wan", LinkProfile(bandwidth_kbps=1600, latency_ms=30))
    assert sorted(names) == sorted(["wan_bandwidth_upstream", "wan_bandwidth_downstream",
                                    "wan_latency_upstream", "wan_latency_downstream"])
    got = {t["name"]: t["attributes"] for t in toxiproxy.toxics("wan")}
    assert got["wan_bandwidth_upstream"]["rate"] == 200  # 1600 kbit/s = 200 KB/s
    with _connect(listen) as s:
        t0 = time.monotonic()
        s.sendall(b"x")
        assert s.recv(1) == b"x"
        assert (time.monotonic() - t0) * 1000 >= 60  # 30 ms each way


def test_update_toxic_changes_latency(toxiproxy, echo):
    listen = toxiproxy.create_proxy("upd", echo.addr)
    toxiproxy.add_toxic("upd", toxic_spec("latency", "downstream", latency=0))
    toxiproxy.update_toxic("upd", "latency_downstream", latency=150)
    with _connect(listen) as s:
        t0 = time.monotonic()
        s.sendall(b"y")
        assert s.recv(1) == b"y"
        assert (time.monotonic() - t0) * 1000 >= 150


def test_disabled_proxy_refuses_connections(toxiproxy, echo):
    listen = toxiproxy.create_proxy("cut", echo.addr)
    toxiproxy.set_enabled("cut", False)
    with pytest.raises(OSError):
        _connect(listen, timeout=1).close()
    toxiproxy.set_enabled("cut", True)
    with _connect(listen) as s:
        s.sendall(b"z")
        assert s.recv(1) == b"z"


def test_link_profile_validation():
    with pytest.raises(ValueError, match="jitter_ms"):
        LinkProfile(latency_ms=10, jitter_ms=20)
    with pytest.raises(ValueError, match="bandwidth_kbps"):
        LinkProfile(bandwidth_kbps=0)
    with pytest.raises(ValueError, match="stream"):
        toxic_spec("latency", "sideways")


def test_stop_leaves_no_process():
    with ToxiproxyServer() as server:
        pid = server.pid
        assert pid_alive(pid)
    assert not pid_alive(pid)


def test_stop_on_exception_leaves_no_process():
    pid = None
    with pytest.raises(RuntimeError, match="boom"):
        with ToxiproxyServer() as server:
            pid = server.pid
            raise RuntimeError("boom")
    assert pid is not None and not pid_alive(pid)


def test_harness_killed_takes_server_with_it(tmp_path):
    """Even a SIGKILL of the process that started the server leaves no server behind."""
    script = ("from harness.backends.toxiproxy_server import ToxiproxyServer\n"
              "import time\ns = ToxiproxyServer().start()\nprint(s.pid, flush=True)\ntime.sleep(60)\n")
    parent = subprocess.Popen([sys.executable, "-c", script], stdout=subprocess.PIPE, text=True)
    try:
        pid = int(parent.stdout.readline())
        assert pid_alive(pid)
        parent.send_signal(signal.SIGKILL)
        parent.wait()
        deadline = time.monotonic() + 5
        while pid_alive(pid) and time.monotonic() < deadline:
            time.sleep(0.05)
        assert not pid_alive(pid)
    finally:
        parent.kill()


def test_two_servers_in_one_process_stay_apart():
    with ToxiproxyServer() as a, ToxiproxyServer() as b:
        assert a.port != b.port
        ca, cb = a.client(), b.client()
        ca.create_proxy("only_on_a", "127.0.0.1:9")
        cb.create_proxy("only_on_b", "127.0.0.1:9")
        assert set(ca.proxies()) == {"only_on_a"}
        assert set(cb.proxies()) == {"only_on_b"}
        cb.set_enabled("only_on_b", False)
        assert ca.proxies()["only_on_a"]["enabled"] is True
        assert cb.proxies()["only_on_b"]["enabled"] is False


def test_a_free_port_is_one_no_connection_can_take_before_its_server_binds_it():
    # a shard binds its port seconds after the harness picked it; a port from bind(0) lies in the
    # kernel's ephemeral range, from which every connection and bind(0) in between draws (once a
    # Docker unit-loss run's shard found its port taken); one below that range is never handed out
    from harness.backends.toxiproxy_server import ephemeral_range, free_port

    lo, hi = ephemeral_range()
    ports = {free_port() for _ in range(50)}
    assert all(1024 <= p < lo for p in ports) and len(ports) > 40  # drawn at random, not one fixed port
    with socket.socket() as s:  # and each is free: it binds
        s.bind(("127.0.0.1", ports.pop()))
    with socket.socket() as s:  # what the kernel hands out lies in [lo, hi]
        s.bind(("127.0.0.1", 0))
        assert lo <= s.getsockname()[1] <= hi
