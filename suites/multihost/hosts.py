"""Two "hosts" on one machine: two network namespaces, each with its own Docker engine
reached over TCP, and a hub address in the root namespace that both can reach.

    root namespace (the harness)
      dch-hub  10.213.0.1/32   the hub: a dummy (a bridge with no ports where the kernel
                               has no dummy driver); Linux answers for a local address
                               on any interface, so units reach it by their default route
      dch-a    10.213.1.1/24 ==veth== eth0 10.213.1.2/24   netns dc-host-a
                                        dockerd -H tcp://10.213.1.2:2375
      dch-b    10.213.2.1/24 ==veth== eth0 10.213.2.2/24   netns dc-host-b
                                        dockerd -H tcp://10.213.2.2:2375

Each namespace has lo up and a default route via its 10.213.x.1. Nothing is forwarded
between a and b, and no sysctl or iptables rule is touched. The harness, in the root
namespace, reaches both engines directly (10.213.x.0/24 is on its dch-x).

Each dockerd is started with `nsenter --net=...` (not `ip netns exec`, which remounts
/sys in a new mount namespace and loses the cgroup mounts), so only its network
namespace differs: the containerd it starts (its own: config, socket and state under its
--exec-root / --data-root), the shims and every `network_mode="host"` container live in
that namespace. Everything else lives under /tmp/diloco-hosts/<a|b>/: data root (vfs),
exec root, pid files, log, an empty daemon.json (so /etc/docker/daemon.json does not
apply). Containers go in cgroup /dch-<a|b>/<id>. `--tls=false` says that plain TCP is
meant: without it dockerd 20.10 sleeps 15 s at start to show its warning.

    up()          tears down leftovers, builds it all, returns describe(); cleans up
                  what it made when it fails or is interrupted (Ctrl-C)
    down()        stops and removes everything of ours (never raises for "already gone");
                  returns leftovers()
    leftovers()   what of ours still exists: [] after down()
    TwoHosts()    a context manager: up() on enter, down() on exit
    available()   None when this machine can do it, else why not

By hand: python -m suites.multihost.hosts up|down|status
"""
from __future__ import annotations

import argparse
import contextlib
import http.client
import json
import os
import re
import shutil
import signal
import subprocess
import sys
import threading
import time
from dataclasses import dataclass
from pathlib import Path

ROOT = Path("/tmp/diloco-hosts")
NETNS_PREFIX = "dc-host-"
LINK_PREFIX = "dch-"
HUB_LINK = "dch-hub"
HUB_ADDR = "10.213.0.1"
PORT = 2375
SYSTEM_CONTAINERD = Path("/run/containerd/containerd.sock")


@dataclass(frozen=True)
class Host:
    name: str
    netns: str    # the network namespace
    link: str     # root side of the veth pair (the namespace side is eth0)
    gateway: str  # the root side's address: the namespace's default route
    addr: str     # eth0 in the namespace; the engine listens here

    @property
    def url(self) -> str:
        return f"tcp://{self.addr}:{PORT}"

    @property
    def dir(self) -> Path:
        return ROOT / self.name

    @property
    def netns_path(self) -> str:
        return f"/var/run/netns/{self.netns}"


HOSTS = (
    Host("a", "dc-host-a", "dch-a", "10.213.1.1", "10.213.1.2"),
    Host("b", "dc-host-b", "dch-b", "10.213.2.1", "10.213.2.2"),
)

_started: list[subprocess.Popen] = []  # dockerds this process started, reaped in down()


def available() -> str | None:
    """None when this machine can run two hosts, else the reason."""
    if os.geteuid() != 0:
        return "two hosts need root (network namespaces, dockerd)"
    for tool in ("ip", "nsenter", "dockerd", "containerd"):
        if shutil.which(tool) is None:
            return f"`{tool}` is not installed"
    if os.path.lexists(SYSTEM_CONTAINERD):  # dockerd 20.10 only checks that this path exists
        return (f"a system containerd socket exists at {SYSTEM_CONTAINERD}: dockerd would use it "
                "instead of starting its own in the namespace, and containers would not be there")
    return None


def describe() -> dict:
    """{"hub": address, "hosts": {name: {"netns", "addr", "gateway", "url", "log"}}}."""
    return {"hub": HUB_ADDR,
            "hosts": {h.name: {"netns": h.netns, "addr": h.addr, "gateway": h.gateway,
                               "url": h.url, "log": str(h.dir / "dockerd.log")} for h in HOSTS}}


# ------------------------------------------------------------------ up
def up() -> dict:
    """Tears down leftovers of an earlier session, then sets everything up and returns
    describe(). On any failure or interrupt, removes what it made and re-raises."""
    why = available()
    if why is not None:
        raise RuntimeError(why)
    try:
        down()
        ROOT.mkdir(mode=0o700)
        _hub_up()
        for h in HOSTS:
            _netns_up(h)
        procs = {h.name: _start_dockerd(h) for h in HOSTS}  # both start at once, then we wait for both
        for h in HOSTS:
            _wait_answers(h, procs[h.name])
            _check_own_containerd(h)
    except BaseException:
        with _interrupts_ignored():  # a second Ctrl-C must not stop the cleanup halfway
            down()
        raise
    return describe()


def _hub_up() -> None:
    if _ip("link", "add", HUB_LINK, "type", "dummy", check=False).returncode != 0:
        _ip("link", "add", HUB_LINK, "type", "bridge")  # no dummy driver in this kernel
    _ip("addr", "add", f"{HUB_ADDR}/32", "dev", HUB_LINK)
    _ip("link", "set", HUB_LINK, "up")


def _netns_up(h: Host) -> None:
    _ip("netns", "add", h.netns)
    _ip("link", "add", h.link, "type", "veth", "peer", "name", "eth0", "netns", h.netns)
    _ip("addr", "add", f"{h.gateway}/24", "dev", h.link)
    _ip("link", "set", h.link, "up")
    _ip("-n", h.netns, "addr", "add", f"{h.addr}/24", "dev", "eth0")
    _ip("-n", h.netns, "link", "set", "eth0", "up")
    _ip("-n", h.netns, "link", "set", "lo", "up")
    _ip("-n", h.netns, "route", "add", "default", "via", h.gateway)


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
def down() -> list[str]:
    """Stops both engines and removes everything of ours; works after a partial up() and
    when nothing exists. Returns leftovers() (empty when all went)."""
    live = [(h, pid) for h in HOSTS if (pid := _dockerd_pid(h)) is not None]
    for h, _ in live:  # so that dockerd does not wait 10 s for each to stop
        _kill_containers(h)
    for _, pid in live:
        _signal(pid, signal.SIGTERM)
    _wait_gone([pid for _, pid in live], 30)
    alive = _procs()
    for _, pid in live:
        if pid in alive:
            _signal(pid, signal.SIGKILL)
    # a dockerd killed (by us or a crash) leaves shims and containers: containerd-shim
    # double-forks away from containerd and outlives it
    stray = list(_our_processes())
    for pid in stray:
        _signal(pid, signal.SIGKILL)
    _wait_gone([*[pid for _, pid in live], *stray], 10)
    for p in _started:
        with contextlib.suppress(subprocess.TimeoutExpired):
            p.wait(timeout=1)
    _started[:] = [p for p in _started if p.returncode is None]

    for _ in range(5):  # dockerd bind-mounts its data root and a netns under the exec root
        mounts = _mounts()
        if not mounts:
            break
        for m in sorted(mounts, key=lambda m: m.count("/"), reverse=True):
            subprocess.run(["umount", "-l", m], capture_output=True, timeout=30)
    for cg in _cgroups():
        for d, _subdirs, _files in os.walk(cg, topdown=False):
            with contextlib.suppress(OSError):
                os.rmdir(d)
    for link in _links():  # deletes both ends of a veth pair
        _ip("link", "del", link, check=False)
    for ns in _namespaces():
        _ip("netns", "del", ns, check=False)
    if ROOT.exists() and not _mounts():  # never recurse into something still mounted
        shutil.rmtree(ROOT, ignore_errors=True)
    return leftovers()


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
def leftovers() -> list[str]:
    """What of ours still exists, one line each."""
    out = [f"netns {ns}" for ns in _namespaces()]
    out += [f"link {link}" for link in _links()]
    out += [f"dockerd pid {pid} ({h.netns})" for h in HOSTS if (pid := _dockerd_pid(h)) is not None]
    out += [f"mount {m}" for m in _mounts()]
    cgroups = _cgroups()
    out += [f"cgroup /{h.link} in {n} hierarchies" for h in HOSTS
            if (n := sum(cg.endswith(f"/{h.link}") for cg in cgroups))]
    out += [f"process {pid}: {cmd[:200]}" for pid, cmd in sorted(_our_processes().items())]
    if ROOT.exists():
        out.append(f"directory {ROOT}")
    return out


def _namespaces() -> list[str]:
    r = _ip("netns", "list", check=False)
    names = [line.split()[0] for line in r.stdout.splitlines() if line.strip()]
    return [n for n in names if n.startswith(NETNS_PREFIX)]


def _links() -> list[str]:
    r = _ip("-o", "link", "show", check=False)
    names = [line.split(":")[1].strip().split("@")[0] for line in r.stdout.splitlines() if ":" in line]
    return [n for n in names if n.startswith(LINK_PREFIX)]


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


def _mounts() -> list[str]:
    out = []
    with open("/proc/self/mountinfo") as f:
        for line in f:
            mp = re.sub(r"\\([0-7]{3})", lambda m: chr(int(m.group(1), 8)), line.split()[4])
            if mp == str(ROOT) or mp.startswith(f"{ROOT}/"):
                out.append(mp)
    return out


def _cgroups() -> list[str]:
    """The containers' parent cgroups (/dch-a, /dch-b) in every cgroup hierarchy."""
    out = []
    with open("/proc/self/mountinfo") as f:
        for line in f:
            fields = line.split()
            fstype = fields[fields.index("-") + 1]
            if fstype in ("cgroup", "cgroup2"):
                out += [p for h in HOSTS if os.path.isdir(p := os.path.join(fields[4], h.link))]
    return sorted(set(out))


def _our_processes() -> dict[int, str]:
    """pid -> command line of every live process of ours, and their descendants: whose
    command line or cwd names ROOT (dockerd, containerd, shims), that live in one of our
    network namespaces, or in our containers' cgroups. Never this process or its parents."""
    procs = _procs()
    namespaces = {(st.st_dev, st.st_ino) for h in HOSTS if (st := _stat(h.netns_path)) is not None}
    cgroups = [f":/{h.link}" for h in HOSTS]
    ours = set()
    for pid in procs:
        cmd = _cmdline(pid)
        try:
            cwd = os.readlink(f"/proc/{pid}/cwd")
        except OSError:
            cwd = ""
        st = _stat(f"/proc/{pid}/ns/net")
        try:
            cg = Path(f"/proc/{pid}/cgroup").read_text()
        except OSError:
            cg = ""
        if (str(ROOT) in cmd or cwd == str(ROOT) or cwd.startswith(f"{ROOT}/")
                or (st is not None and (st.st_dev, st.st_ino) in namespaces)
                or any(f"{c}/" in cg or f"{c}\n" in cg for c in cgroups)):
            ours.add(pid)
    grew = True
    while grew:  # and their descendants
        more = {pid for pid, (ppid, _) in procs.items() if ppid in ours} - ours
        ours |= more
        grew = bool(more)
    me, mine = os.getpid(), set()
    while me > 1 and me not in mine:
        mine.add(me)
        me = procs.get(me, (0, ""))[0]
    return {pid: _cmdline(pid) for pid in sorted(ours - mine)}


def _procs() -> dict[int, tuple[int, str]]:
    """pid -> (ppid, state) of every process that is not a zombie."""
    out = {}
    for d in os.listdir("/proc"):
        if not d.isdigit():
            continue
        try:
            stat = Path(f"/proc/{d}/stat").read_text()
        except OSError:
            continue
        state, ppid = stat[stat.rfind(")") + 2:].split()[:2]
        if state not in ("Z", "X"):
            out[int(d)] = (int(ppid), state)
    return out


def _cmdline(pid: int) -> str:
    try:
        return Path(f"/proc/{pid}/cmdline").read_bytes().replace(b"\0", b" ").decode(errors="replace").strip()
    except OSError:
        return ""


def _comm(pid: int) -> str:
    try:
        return Path(f"/proc/{pid}/comm").read_text().strip()
    except OSError:
        return ""


def _stat(path: str) -> os.stat_result | None:
    try:
        return os.stat(path)
    except OSError:
        return None


def _ip(*args: str, check: bool = True) -> subprocess.CompletedProcess:
    r = subprocess.run(["ip", *args], capture_output=True, text=True, timeout=30)
    if check and r.returncode != 0:
        raise RuntimeError(f"ip {' '.join(args)}: {r.stderr.strip()}")
    return r


@contextlib.contextmanager
def _interrupts_ignored():
    """SIGINT and SIGTERM ignored (in the main thread: only it may change handlers)."""
    if threading.current_thread() is not threading.main_thread():
        yield
        return
    old = {sig: signal.signal(sig, signal.SIG_IGN) for sig in (signal.SIGINT, signal.SIGTERM)}
    try:
        yield
    finally:
        for sig, handler in old.items():
            signal.signal(sig, handler)


class TwoHosts:
    """`with TwoHosts() as desc:` up() on enter (desc = describe()), down() on exit."""

    def __enter__(self) -> dict:
        return up()

    def __exit__(self, *exc) -> None:
        with _interrupts_ignored():
            down()


# ------------------------------------------------------------------ CLI
def _raise_interrupt(signum, frame):
    raise KeyboardInterrupt


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(prog="python -m suites.multihost.hosts", description=__doc__.split("\n")[0])
    ap.add_argument("command", choices=["up", "down", "status"])
    cmd = ap.parse_args(argv).command
    if cmd == "up":
        if (why := available()) is not None:
            print(f"hosts: {why}", file=sys.stderr)
            return 2
        signal.signal(signal.SIGTERM, _raise_interrupt)  # cleaned up like a Ctrl-C
        try:
            desc = up()
        except KeyboardInterrupt:
            print("hosts: interrupted; removed what was set up", file=sys.stderr)
            return 130
        except RuntimeError as e:
            print(f"hosts: {e}", file=sys.stderr)
            return 1
        print(json.dumps(desc, indent=2))
        return 0
    if cmd == "down":
        left = down()
        for line in left:
            print(f"left: {line}")
        return 1 if left else 0
    answering = True
    for h in HOSTS:
        ok = _answers(h)
        answering &= ok
        print(f"{h.name}  {h.netns}  {h.url}  {'answers' if ok else 'not answering'}")
    print(f"hub  {HUB_ADDR}")
    for line in leftovers():
        print(f"exists: {line}")
    return 0 if answering else 1


if __name__ == "__main__":
    sys.exit(main())
