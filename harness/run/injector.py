"""The nemesis: applies fault dataclasses to a run's units and links through `Control`
(harness/run/control.py), on real processes, containers or the simulator alike.

Jepsen's shape: `setup` heals (a clean slate), `start(fault)` / `end(fault)` invoke,
`teardown` heals everything that is still broken — on success, failure and Ctrl-C.
Every action returns and records a record of what it did (harness events
`fault_start` / `fault_end`, `unit_down` / `unit_up` with the unit as src).

Toxics a fault adds are named `f<id>_<type>_<stream>`, so faults never touch each
other's toxics; a `wan` fault replaces the base WAN profile on its links while it
lasts and puts it back at its end. A fault kind with no `_start_<kind>` here is a link
fault made of the toxics its class declares (faults/model.py `toxics`): added at its
start, removed at its end.
"""
from __future__ import annotations

import time

from faults.model import Fault
from faults.schedule import RunShape, expand_links
from harness.links import LinkProfile, toxic_spec
from harness.run.control import Control, apply_profile


class Injector:
    def __init__(self, cluster: Control, shape: RunShape, emit, *, dp_rollback: bool = False, clock=time.time):
        """`emit(kind, src, **fields)` records a harness event; `clock()` is the host's time
        (wall seconds, or the simulator's virtual ones). `dp_rollback`: data-parallel
        without elasticity — a dead learner stops every learner until it returns, and all
        restart from their checkpoints."""
        self.cluster, self.shape, self.emit, self.clock = cluster, shape, emit, clock
        self.dp_rollback = dp_rollback
        self.active: dict[int, Fault] = {}
        self.ids: dict[int, int] = {}  # id(fault) -> fault number
        self.down: set[str] = set()  # units the injector took down

    # --- lifecycle ------------------------------------------------------------------------
    def setup(self) -> None:
        self._heal_links()

    def teardown(self) -> None:
        """Heals every fault still active (no toxic left, no process left stopped)."""
        for n in list(self.active):
            try:
                self.end(self.active[n], final=True)
            except Exception as e:  # keep healing the others
                self.emit("fault_end", "harness", id=n, error=str(e))

    def _heal_links(self) -> None:
        for proxy in list(self.cluster.client.proxies()):
            for t in self.cluster.client.toxics(proxy):
                if t["name"].startswith("f"):
                    self.cluster.client.remove_toxic(proxy, t["name"])
            self.cluster.client.set_enabled(proxy, True)

    # --- invoke ---------------------------------------------------------------------------
    def start(self, fault: Fault) -> None:
        n = self.ids.setdefault(id(fault), len(self.ids))
        self.active[n] = fault
        self.emit("fault_start", "harness", id=n, fault=fault.to_dict(), via=self._via(fault.kind))
        start = getattr(self, f"_start_{fault.kind}", None)
        start(n, fault) if start is not None else self._add_toxics(n, fault)

    def _via(self, kind: str) -> str:
        return self.cluster.mechanism(kind)

    def end(self, fault: Fault, final: bool = False) -> None:
        n = self.ids[id(fault)]
        if self.active.pop(n, None) is None:
            return
        # stamped as the undo is issued, before it: a paused unit resumed (or a link healed)
        # acts at once, and what it does must not precede the fault's end in the log (a
        # step logged 2 ms before a `fault_end` written after SIGCONT returned)
        self.emit("fault_end", "harness", id=n, fault=fault.to_dict(), healed_at_teardown=final)
        end = getattr(self, f"_end_{fault.kind}", None)
        end(n, fault, final) if end is not None else self._remove(n, fault)

    # units -------------------------------------------------------------------------------
    def _down(self, unit: str, reason: str) -> None:
        self.cluster.kill(unit)
        self.down.add(unit)
        self.emit("unit_down", unit, reason=reason)

    def _up(self, unit: str) -> None:
        self.down.discard(unit)
        # stamped as the respawn is issued, before it (as fault_end is): a warm spare restores
        # and logs within ~50 ms, and none of its lines may precede its restart in the log
        t = round(self.clock(), 6)
        spawned = self.cluster.spawn(unit)  # "cold", or "spare": a warm spare took the identity
        self.emit("unit_up", unit, reason="restarted", pid=spawned.pid, start=spawned.start, t=t)

    def _start_kill_unit(self, n, f) -> None:
        if self.dp_rollback:  # a synchronous job cannot go on without one of its members
            for u in self.shape.units:
                if self.cluster.running(u):
                    self._down(u, "killed" if u == f.target else "rollback")
            return
        self._down(f.target, "killed")

    def _end_kill_unit(self, n, f, final) -> None:
        if final:
            return  # the run is over: nothing to restart
        for u in (self.shape.units if self.dp_rollback else [f.target]):
            if u in self.down and not self.cluster.running(u):
                self._up(u)

    def _start_kill_syncer(self, n, f) -> None:
        self._down(f.target, "killed")

    def _end_kill_syncer(self, n, f, final) -> None:
        if not final:
            self._up(f.target)

    def _start_pause_unit(self, n, f) -> None:
        other_way = self.cluster.pause(f.target)
        self.emit("unit_down", f.target, reason="paused", **({"via": other_way} if other_way else {}))

    def _end_pause_unit(self, n, f, final) -> None:
        self.cluster.resume(f.target)
        self.emit("unit_up", f.target, reason="resumed")

    def _start_slow_unit(self, n, f) -> None:
        self.cluster.set_speed(f.target, f.speed, period_s=f.period_ms / 1000)

    def _end_slow_unit(self, n, f, final) -> None:
        self.cluster.set_speed(f.target, 1.0)

    def _start_kill_slice(self, n, f) -> None:
        self.cluster.set_live_slices(f.target, max(1, self.shape.slices - f.slices))

    def _end_kill_slice(self, n, f, final) -> None:
        self.cluster.set_live_slices(f.target, self.shape.slices)

    def _start_corrupt(self, n, f) -> None:
        self.cluster.set_corrupt(f.target, {"mode": f.mode, "factor": f.factor, "flips": f.flips})

    def _end_corrupt(self, n, f, final) -> None:
        self.cluster.set_corrupt(f.target, None)

    # links -------------------------------------------------------------------------------
    def _links(self, f) -> list[str]:
        return expand_links(f.target, self.shape)

    def _add_toxics(self, n: int, f) -> None:
        """A link fault that is Toxiproxy toxics (faults/model.py `toxics`), on each of its links."""
        if not f.toxics():
            raise ValueError(f"fault kind {f.kind!r} has no toxics and the injector no _start_{f.kind}")
        for link in self._links(f):
            for kind, streams, attrs in f.toxics():
                for stream in streams:
                    self.cluster.client.add_toxic(link, toxic_spec(kind, stream, name=f"f{n}_{kind}_{stream}", **attrs))

    def _remove(self, n: int, f) -> None:
        prefix = f"f{n}_"
        for link in self._links(f):
            for t in self.cluster.client.toxics(link):
                if t["name"].startswith(prefix):
                    self.cluster.client.remove_toxic(link, t["name"])

    def _start_wan(self, n, f) -> None:
        profile = LinkProfile(bandwidth_kbps=f.bandwidth_kbps, latency_ms=f.latency_ms, jitter_ms=f.jitter_ms)
        for link in self._links(f):
            for t in self.cluster.client.toxics(link):
                if t["name"].startswith("wan_"):  # the base profile steps aside
                    self.cluster.client.remove_toxic(link, t["name"])
            apply_profile(self.cluster.client, link, profile, prefix=f"f{n}")

    def _end_wan(self, n, f, final) -> None:
        self._remove(n, f)
        if self.cluster.wan is not None and not final:
            for link in self._links(f):
                apply_profile(self.cluster.client, link, self.cluster.wan)

