"""The two hosts' layout and what each is made of on this machine, below the engines:
`Host` and `HOSTS` (netns, veth link, addresses, directory under ROOT), the hub; the
network plumbing that `up()` runs (`ip`: the hub link, each namespace with its veth
pair, addresses and default route); and the scans that `down()` and `leftovers()` use
to find what of ours exists: namespaces, links, mounts under ROOT, the containers'
cgroups, and our processes (from /proc). The picture: suites/multihost/hosts.py."""
from __future__ import annotations

import os
import re
import subprocess
from dataclasses import dataclass
from pathlib import Path

ROOT = Path("/tmp/diloco-hosts")
NETNS_PREFIX = "dc-host-"
LINK_PREFIX = "dch-"
HUB_LINK = "dch-hub"
HUB_ADDR = "10.213.0.1"
PORT = 2375


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


# ------------------------------------------------------------------ network plumbing
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


# ------------------------------------------------------------------ what exists
def _namespaces() -> list[str]:
    r = _ip("netns", "list", check=False)
    names = [line.split()[0] for line in r.stdout.splitlines() if line.strip()]
    return [n for n in names if n.startswith(NETNS_PREFIX)]


def _links() -> list[str]:
    r = _ip("-o", "link", "show", check=False)
    names = [line.split(":")[1].strip().split("@")[0] for line in r.stdout.splitlines() if ":" in line]
    return [n for n in names if n.startswith(LINK_PREFIX)]


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
