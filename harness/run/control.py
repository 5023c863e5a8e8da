"""What a run's hosts offer the injector and the run loop (`Control`), and the few facts
both tiers share: the topology's names, how each fault kind is done, the stop grace and
the warm spares' delay.

`LocalCluster` (harness/backends/cluster.py: processes, or containers) and the
simulator's `World` (harness/sim/world.py) implement `Control` side by side; the
injector and the run loop reach a host only through it. The links are shaped through a
`LinkControl`: the Toxiproxy client on real hosts, the simulator's proxies in memory.
"""
from __future__ import annotations

from dataclasses import dataclass
from typing import Protocol

from diloco_chaos.faults.kinds import FAULT_KINDS
from diloco_chaos.harness.links import LinkProfile
from diloco_chaos.trainer.protocol.learner_loop import STOP_CLOSE_S

# A replacement warm spare waits this long before its boot (trainer/units/spare.py), so that
# spares started together do not compete for the CPU with the unit they stand in for.
SPARE_DELAY_S = 3.0
# SIGTERM to SIGKILL: a learner first closes (its last progress into Θ, at most
# STOP_CLOSE_S), then writes its last lines and saves; a shard makes its state durable.
GRACE_S = {"learner": STOP_CLOSE_S + 5.0, "syncer": 5.0}

# How the local backend (processes) does each unit fault kind: written into every
# fault_start line (`via`) and shown on the report's timeline. The simulator models the
# same and says so; link faults are the same Toxiproxy toxics everywhere.
LOCAL_MECHANISMS = {
    "kill_unit": "SIGKILL; a new process after down_for",
    "kill_syncer": "SIGKILL; a new process restores the checkpoint",
    "pause_unit": "SIGSTOP / SIGCONT",
    "slow_unit": "SIGSTOP/SIGCONT duty cycle",
    "kill_slice": "slice control message",
    "corrupt": "control message: the learner corrupts its outgoing contributions",
}


def mechanism_words(table: dict, kind: str) -> str:
    """How a fault of `kind` is done: the host's table, else what the fault's class says
    (link faults: the same Toxiproxy toxics on every host), else its name."""
    cls = FAULT_KINDS.get(kind)
    return table.get(kind) or (cls.mechanism if cls is not None else "") or kind


def link_name(learner: str, shard: str) -> str:
    return f"{learner}~{shard}"


def make_topology(learners: int, shards: int, fragments: int) -> dict:
    """Names, and which shard owns which fragment (round robin)."""
    return {
        "learners": [f"learner-{i}" for i in range(learners)],
        "shards": {f"syncer-{j}": [p for p in range(fragments) if p % shards == j] for j in range(shards)},
    }


@dataclass(frozen=True)
class Spawned:
    """How a restarted unit started: "cold", "spare" (a warm spare took the identity) or
    "spare_booting" (one not ready yet); its pid where the host has one."""

    start: str
    pid: int | None = None


class LinkControl(Protocol):
    """The links' toxics (Toxiproxy's API): every learner↔shard link is a proxy."""

    def proxies(self) -> dict[str, dict]: ...
    def toxics(self, proxy: str) -> list[dict]: ...
    def add_toxic(self, proxy: str, spec: dict) -> None: ...
    def remove_toxic(self, proxy: str, toxic: str) -> None: ...
    def set_enabled(self, name: str, enabled: bool) -> None: ...


def apply_profile(links: LinkControl, proxy: str, profile: LinkProfile, *, prefix: str = "wan") -> list[str]:
    """Adds the toxics of `profile` to `proxy`, named `{prefix}_{type}_{stream}`; returns their names."""
    names = []
    for spec in profile.toxics():
        spec = {**spec, "name": f"{prefix}_{spec['name']}"}
        links.add_toxic(proxy, spec)
        names.append(spec["name"])
    return names


class Control(Protocol):
    """What the injector (the nemesis) and the run loop may do to a run's units and links,
    whatever hosts them; no probing for optional methods."""

    topology: dict
    wan: LinkProfile | None
    client: LinkControl | None  # the links' toxics

    def mechanism(self, kind: str) -> str: ...               # how a fault kind is done here, in words
    def running(self, name: str) -> bool: ...                # a process (or container, or sim unit) is up
    def kill(self, name: str) -> None: ...
    def terminate(self, name: str) -> None: ...              # SIGTERM: the unit closes and leaves
    def spawn(self, name: str) -> Spawned: ...
    def pause(self, name: str) -> str | None: ...            # None, or the words for another way
    def resume(self, name: str) -> None: ...
    def set_speed(self, name: str, speed: float, period_s: float = 0.1) -> None: ...  # 1.0: full speed
    def set_live_slices(self, learner: str, live: int) -> None: ...  # the core's SliceControl
    # a fault on a unit (learner or shard) while it lasts: the unit's dict of the faults on it,
    # which the hooks of the code both tiers share read (trainer/protocol/unit_faults.py); a host may do
    # a kind beneath the unit instead (processes: the disk's, disk_full and disk_slow)
    def set_fault(self, unit: str, kind: str, **fields) -> None: ...
    def clear_fault(self, unit: str, kind: str) -> None: ...
    def lose_writes(self, unit: str) -> dict: ...  # a dead unit's un-fsynced writes dropped: {"lost", "truncated", ...}
    def checkpoints(self, unit: str) -> dict: ...  # {"finalized": [...], "sealed": [...]} steps in its folder
    def damage_checkpoint(self, unit: str, damage: str) -> dict: ...  # its newest sealed one damaged at rest
