"""Two hosts on one machine: each engine answers over TCP on its namespace's address, a
host-network container on it is in that namespace and reaches the hub in the root
namespace; down() leaves nothing (after an engine crash too), leftovers() sees what a
session left, and an `up` interrupted by Ctrl-C removes what it made.

The image is built here without a registry: bash and ip with the libraries ldd names.
The tests that run their own up()/down() come first: the module's `two_hosts` is set up
only by the last test, so they never tear it down under it."""
from __future__ import annotations

import hashlib
import io
import os
import shutil
import signal
import socket
import subprocess
import sys
import tarfile
import time
from pathlib import Path

import pytest

from suites.multihost import hosts

pytestmark = [pytest.mark.multihost, pytest.mark.docker, pytest.mark.slow]

REPO = Path(__file__).resolve().parents[2]


def _probe_tar() -> bytes:
    """A root filesystem with /bin/bash, /bin/ip and the libraries they load."""
    binaries = [shutil.which("bash"), shutil.which("ip")]
    r = subprocess.run(["ldd", *binaries], capture_output=True, text=True, check=True)
    libs = {w for w in r.stdout.split() if w.startswith("/") and not w.endswith(":")}  # not "/bin/bash:"
    buf = io.BytesIO()
    with tarfile.open(fileobj=buf, mode="w") as tar:
        for d in ("proc", "sys", "dev", "etc", "tmp"):
            ti = tarfile.TarInfo(d)
            ti.type, ti.mode = tarfile.DIRTYPE, 0o755
            tar.addfile(ti)
        for src, dst in [*((b, f"/bin/{Path(b).name}") for b in binaries), *((lib, lib) for lib in sorted(libs))]:
            tar.add(os.path.realpath(src), arcname=dst.lstrip("/"))
    return buf.getvalue()


def _probe_image(client) -> str:
    tar = _probe_tar()
    tag = hashlib.sha256(tar).hexdigest()[:12]
    client.api.import_image_from_data(tar, repository="dch-probe", tag=tag)
    return f"dch-probe:{tag}"


def _listening(pid: int) -> set[tuple[str, int]]:
    """(address, port) of every TCP socket listening in that process's network namespace."""
    out = set()
    for name in ("tcp", "tcp6"):
        for line in Path(f"/proc/{pid}/net/{name}").read_text().splitlines()[1:]:
            local, state = line.split()[1], line.split()[3]
            if state == "0A":
                addr, port = local.split(":")
                ip = socket.inet_ntoa(bytes.fromhex(addr)[::-1]) if len(addr) == 8 else addr
                out.add((ip, int(port, 16)))
    return out


def _alive(pid: int) -> bool:
    try:
        stat = Path(f"/proc/{pid}/stat").read_text()
    except OSError:
        return False
    return stat[stat.rfind(")") + 2] not in "ZX"


def test_leftovers_sees_what_a_session_left(hosts_available):
    """A planted leftover: a namespace, a link, our directory and a process in it."""
    hosts.down()
    subprocess.run(["ip", "netns", "add", "dc-host-a"], check=True)
    subprocess.run(["ip", "link", "add", "dch-planted", "type", "veth", "peer", "name", "dch-planted-p"], check=True)
    hosts.ROOT.mkdir()
    sleeper = subprocess.Popen(["sleep", "600"], cwd=hosts.ROOT)
    try:
        left = hosts.leftovers()
        for line in ("netns dc-host-a", "link dch-planted", "link dch-planted-p", f"directory {hosts.ROOT}",
                     f"process {sleeper.pid}: sleep 600"):
            assert line in left, left
        assert hosts.down() == []
        assert sleeper.wait(timeout=10) == -signal.SIGKILL
    finally:
        sleeper.kill()
        hosts.down()


def test_down_leaves_nothing_even_after_an_engine_crash(hosts_available):
    import docker

    with hosts.TwoHosts() as desc:
        pids = {}
        for name, h in desc["hosts"].items():
            client = docker.DockerClient(base_url=h["url"], timeout=60)
            try:
                c = client.containers.run(_probe_image(client), ["/bin/bash", "-c", "read -t 600"],
                                          network_mode="host", stdin_open=True, detach=True)
                c.reload()
                pids[name] = c.attrs["State"]["Pid"]
            finally:
                client.close()
            assert f":/dch-{name}/{c.id}" in Path(f"/proc/{pids[name]}/cgroup").read_text()
        # engine a crashes: its containerd dies with it (parent-death signal); the
        # shim and the container do not
        dockerd_a = int((hosts.HOSTS[0].dir / "dockerd.pid").read_text())
        os.kill(dockerd_a, signal.SIGKILL)
        deadline = time.monotonic() + 10  # a give-up timeout: the property is that it dies at all
        while _alive(dockerd_a) and time.monotonic() < deadline:
            time.sleep(0.05)
        assert not _alive(dockerd_a)
        assert _alive(pids["a"])
    assert hosts.leftovers() == []
    assert not any(_alive(p) for p in pids.values())


def test_an_interrupted_up_leaves_nothing(hosts_available):
    """Ctrl-C while the dockerds start (both started, neither answering yet)."""
    hosts.down()
    # Python turns SIGINT into KeyboardInterrupt only if it starts with the default action:
    # a runner that ignores SIGINT (a nohup'd or backgrounded job) would pass SIG_IGN on
    p = subprocess.Popen([sys.executable, "-m", "suites.multihost.hosts", "up"], cwd=REPO,
                         stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True,
                         preexec_fn=lambda: signal.signal(signal.SIGINT, signal.SIG_DFL))
    try:
        last = hosts.HOSTS[-1]
        deadline = time.monotonic() + 60  # a give-up timeout, not the property
        while not (last.dir / "dockerd.pid").exists() and p.poll() is None and time.monotonic() < deadline:
            time.sleep(0.01)
        assert p.poll() is None, f"up ended before it could be interrupted: {p.communicate()}"
        assert not hosts._answers(last)
        assert "netns dc-host-a" in hosts.leftovers()
        p.send_signal(signal.SIGINT)
        out, err = p.communicate(timeout=90)
    finally:
        if p.poll() is None:
            p.kill()
            p.wait()
    assert p.returncode == 130, (out, err)
    assert "interrupted" in err
    assert hosts.leftovers() == []


def test_engines_answer_in_their_namespaces_and_reach_the_hub(two_hosts):
    hub = two_hosts["hub"]
    for name, h in two_hosts["hosts"].items():
        client = h["client"]
        assert client.ping()
        assert h["url"] == f"tcp://{h['addr']}:2375"
        dockerd = int((hosts.ROOT / name / "dockerd.pid").read_text())
        assert _listening(dockerd) == {(h["addr"], 2375)}  # nothing else in that namespace listens

        image = _probe_image(client)
        with socket.create_server((hub, 0)) as srv:
            srv.settimeout(30)
            port = srv.getsockname()[1]
            script = f"ip -4 -o addr show dev eth0; exec 3<>/dev/tcp/{hub}/{port}; ip -4 -o addr show dev eth0 >&3"
            logs = client.containers.run(image, ["/bin/bash", "-c", script], network_mode="host", remove=True)
            conn, (peer, _) = srv.accept()  # the container connected and wrote before it exited
            with conn:
                conn.settimeout(10)
                said = b""
                while chunk := conn.recv(4096):
                    said += chunk
        assert f"eth0    inet {h['addr']}/24" in logs.decode(), logs
        assert peer == h["addr"]
        assert f"inet {h['addr']}/24".encode() in said, said
        assert not client.containers.list(all=True)
