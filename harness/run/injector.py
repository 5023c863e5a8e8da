"""The nemesis: applies a run's fault schedule through `Control` (harness/run/control.py),
on real processes, containers or the simulator alike.

Jepsen's shape: `setup` heals (a clean slate), `start(fault)` / `end(fault)` invoke,
`teardown` heals everything that is still broken — on success, failure and Ctrl-C.
What a fault does is its kind's own (faults/kinds/: `start` / `heal`); the injector is
the small interpreter around them: it numbers the faults, logs each (harness events
`fault_start` / `fault_end`, `unit_down` / `unit_up` with the unit as src) and offers
the kinds the moves they share (the `Nemesis` of faults/kinds/base.py).

Toxics a fault adds are named `f<id>_<type>_<stream>`, so faults never touch each
other's toxics; the scenario's base WAN profile's are named `wan_<type>_<stream>`.
"""
from __future__ import annotations

import time

from diloco_chaos.faults.kinds import Fault
from diloco_chaos.faults.schedule import RunShape, expand_links
from diloco_chaos.harness.links import LinkProfile, toxic_spec
from diloco_chaos.harness.run.control import Control, apply_profile


class Injector:
    """The `Nemesis` the fault kinds act through."""

    def __init__(self, cluster: Control, shape: RunShape, emit, *, dp_rollback: bool = False, clock=time.time):
        """`emit(kind, src, **fields)` records a harness event; `clock()` is the host's time
        (wall seconds, or the simulator's virtual ones). `dp_rollback`: data-parallel
        without elasticity — a dead learner stops every learner until it returns, and all
        restart from their checkpoints."""
        self.control, self.shape, self.emit, self.clock = cluster, shape, emit, clock
        self.dp_rollback = dp_rollback
        self.active: dict[int, Fault] = {}
        self.ids: dict[int, int] = {}  # id(fault) -> fault number
        self.down_units: set[str] = set()  # units the injector took down

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
        links = self.control.client
        for proxy in list(links.proxies()):
            for t in links.toxics(proxy):
                if t["name"].startswith("f"):
                    links.remove_toxic(proxy, t["name"])
            links.set_enabled(proxy, True)

    # --- invoke ---------------------------------------------------------------------------
    def start(self, fault: Fault) -> None:
        n = self.ids.setdefault(id(fault), len(self.ids))
        self.active[n] = fault
        self.emit("fault_start", "harness", id=n, fault=fault.to_dict(), via=self.control.mechanism(fault.kind))
        fault.start(self, n)

    def end(self, fault: Fault, final: bool = False) -> None:
        n = self.ids[id(fault)]
        if self.active.pop(n, None) is None:
            return
        # stamped as the undo is issued, before it: a paused unit resumed (or a link healed)
        # acts at once, and what it does must not precede the fault's end in the log (a
        # step logged 2 ms before a `fault_end` written after SIGCONT returned)
        self.emit("fault_end", "harness", id=n, fault=fault.to_dict(), healed_at_teardown=final)
        fault.heal(self, n, final)

    # --- the moves the kinds share (faults/kinds/base.py `Nemesis`) ---------------------------
    def down(self, unit: str, reason: str, act=None) -> None:
        """`unit` taken down by `act(unit)` (default: the host's kill) and logged."""
        (act or self.control.kill)(unit)
        self.down_units.add(unit)
        self.emit("unit_down", unit, reason=reason)

    def up(self, unit: str) -> None:
        self.down_units.discard(unit)
        # stamped as the respawn is issued, before it: a warm spare restores and logs
        # within ~50 ms, and none of its lines may precede its restart in the log
        t = round(self.clock(), 6)
        spawned = self.control.spawn(unit)  # "cold", or "spare": a warm spare took the identity
        self.emit("unit_up", unit, reason="restarted", pid=spawned.pid, start=spawned.start, t=t)

    def is_down(self, unit: str) -> bool:
        return unit in self.down_units

    def links(self, f: Fault) -> list[str]:
        return expand_links(f.target, self.shape)

    def add_toxics(self, n: int, f: Fault) -> None:
        for link in self.links(f):
            for kind, streams, attrs in f.toxics():
                for stream in streams:
                    self.control.client.add_toxic(link, toxic_spec(kind, stream, name=f"f{n}_{kind}_{stream}", **attrs))

    def remove_toxics(self, n: int, f: Fault) -> None:
        for link in self.links(f):
            self.strip(link, f"f{n}_")

    def strip(self, link: str, prefix: str) -> None:
        for t in self.control.client.toxics(link):
            if t["name"].startswith(prefix):
                self.control.client.remove_toxic(link, t["name"])

    def shape_link(self, link: str, prefix: str, **profile) -> None:
        apply_profile(self.control.client, link, LinkProfile(**profile), prefix=prefix)

    def base_profile(self, link: str) -> None:
        if self.control.wan is not None:
            apply_profile(self.control.client, link, self.control.wan)
