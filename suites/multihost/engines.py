"""Each host's Docker engine: starting dockerd in its network namespace, waiting until it
answers on its address, checking that it started its own containerd there; on the way
down, killing its containers, signalling pids and waiting until they are gone; and
finding our dockerd's pid (`up()`, `down()` and `leftovers()` in hosts.py use these).

Each dockerd is started with `nsenter --net=...` (not `ip netns exec`, which remounts
/sys in a new mount namespace and loses the cgroup mounts), so only its network
namespace differs: the containerd it starts (its own: config, socket and state under its
--exec-root / --data-root), the shims and every `network_mode="host"` container live in
that namespace. Everything else lives under /tmp/diloco-hosts/<a|b>/: data root (vfs),
exec root, pid files, log, an empty daemon.json (so /etc/docker/daemon.json does not
apply). Containers go in cgroup /dch-<a|b>/<id>. `--tls=false` says that plain TCP is
meant: without it dockerd 20.10 sleeps 15 s at start to show its warning."""
from __future__ import annotations

import contextlib
import http.client
import json
import os
import shutil
import subprocess
import time

from suites.multihost.machine import PORT, Host, _cmdline, _comm, _procs, _stat

_started: list[subprocess.Popen] = []  # dockerds this process started, reaped in down()


# ------------------------------------------------------------------ up
def _start_dockerd(h: Host) -> subprocess.Popen:
    d = h.dir
    (d / "data").mkdir(parents=True)
    (d / "exec").mkdir()
    (d / "daemon.json").write_text("{}\n")
    cmd = [shutil.which("nsenter"), f"--net={h.netns_path}", "--", shutil.which("dockerd"),
           "--iptables=false", "--ip-masq=false", "--bridge=none", "--storage-driver=vfs",
           "--data-root", str(d / "data"), "--exec-root", str(d / "exec"),
           "--pidfile", str(d / "dockerd.pidfile"), "--config-file", str(d / "daemon.json"),
           "--cgroup-parent", f"/{h.link}", "-H", h.url, "--tls=false"]
    with open(d / "dockerd.log", "wb") as log:
        # own session: a Ctrl-C at the terminal reaches us, and we stop it in order.
        # nsenter execs dockerd, so this pid is dockerd's.
        p = subprocess.Popen(cmd, stdin=subprocess.DEVNULL, stdout=log, stderr=subprocess.STDOUT,
                             cwd=d, start_new_session=True)
    _started.append(p)
    (d / "dockerd.pid").write_text(f"{p.pid}\n")
    return p


def _wait_answers(h: Host, proc: subprocess.Popen, timeout_s: float = 60.0) -> None:
    """Until the engine answers. Whether it exited is the process's own exit status (nsenter
    execs dockerd, so `proc` is dockerd), not /proc's view of it: a CI run once reported all
    five starts of one session "exited" with an empty log, which the cmdline check can say of
    a live process caught between nsenter and dockerd's exec; not reproduced since."""
    deadline = time.monotonic() + timeout_s
    while time.monotonic() < deadline:
        if _answers(h):
            return
        if proc.poll() is not None:
            raise RuntimeError(f"dockerd of {h.netns} exited with status {proc.returncode}; log:\n{_log_tail(h)}")
        time.sleep(0.2)
    raise RuntimeError(f"dockerd of {h.netns} did not answer at {h.url} in {timeout_s:.0f} s; log:\n{_log_tail(h)}")


def _answers(h: Host) -> bool:
    conn = http.client.HTTPConnection(h.addr, PORT, timeout=2)
    try:
        conn.request("GET", "/_ping")
        return conn.getresponse().status == 200
    except (OSError, http.client.HTTPException):
        return False
    finally:
        conn.close()


def _check_own_containerd(h: Host) -> None:
    """dockerd must have started its own containerd, in the namespace (not shared)."""
    pid = _dockerd_pid(h)
    ns = os.stat(h.netns_path)
    for child, (ppid, _state) in _procs().items():
        if ppid == pid and _comm(child) == "containerd":
            own = str(h.dir / "exec") in _cmdline(child)
            st = _stat(f"/proc/{child}/ns/net")
            if own and st is not None and (st.st_dev, st.st_ino) == (ns.st_dev, ns.st_ino):
                return
    raise RuntimeError(f"dockerd of {h.netns} did not start its own containerd in the namespace; "
                       f"log:\n{_log_tail(h)}")


def _log_tail(h: Host, n: int = 20) -> str:
    try:
        return "\n".join((h.dir / "dockerd.log").read_text(errors="replace").splitlines()[-n:])
    except OSError:
        return "(no log)"


# ------------------------------------------------------------------ down
def _kill_containers(h: Host) -> None:
    conn = http.client.HTTPConnection(h.addr, PORT, timeout=5)
    try:
        conn.request("GET", "/containers/json")
        ids = [c["Id"] for c in json.loads(conn.getresponse().read())]
        for cid in ids:
            conn.request("POST", f"/containers/{cid}/kill")
            conn.getresponse().read()
    except (OSError, ValueError, KeyError, TypeError, http.client.HTTPException):
        pass
    finally:
        conn.close()


def _signal(pid: int, sig: int) -> None:
    with contextlib.suppress(ProcessLookupError):
        os.kill(pid, sig)


def _wait_gone(pids: list[int], timeout_s: float) -> None:
    deadline = time.monotonic() + timeout_s
    while time.monotonic() < deadline:
        for p in _started:
            p.poll()  # reap our own children
        procs = _procs()
        if not any(pid in procs for pid in pids):
            return
        time.sleep(0.1)


# ------------------------------------------------------------------ what exists
def _dockerd_pid(h: Host) -> int | None:
    """The pid in our pid file (or dockerd's), if that process is still our dockerd."""
    for name in ("dockerd.pid", "dockerd.pidfile"):
        try:
            pid = int((h.dir / name).read_text().strip())
        except (OSError, ValueError):
            continue
        cmd = _cmdline(pid)
        if pid in _procs() and "dockerd" in cmd and str(h.dir) in cmd:
            return pid
    return None
