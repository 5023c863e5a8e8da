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

Each dockerd runs in its namespace through `nsenter --net=...`, with its own containerd,
data root and exec root under /tmp/diloco-hosts/<a|b>/ (why, and the flags:
suites/multihost/engines.py). The layout, the `ip` plumbing and the scans of what
exists: suites/multihost/machine.py.

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
import json
import os
import shutil
import signal
import subprocess
import sys
import threading
from pathlib import Path

from suites.multihost.engines import (_answers, _check_own_containerd, _dockerd_pid, _kill_containers, _signal,
                                      _start_dockerd, _started, _wait_answers, _wait_gone)
from suites.multihost.machine import (HOSTS, HUB_ADDR, ROOT, _cgroups, _hub_up, _ip, _links, _mounts, _namespaces,
                                      _netns_up, _our_processes, _procs)

SYSTEM_CONTAINERD = Path("/run/containerd/containerd.sock")


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
