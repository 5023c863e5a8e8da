"""A syncer shard in the simulator: the host of trainer/protocol/syncer_driver.py on virtual time.

The same SyncerDriver, SyncerCore and outer math as a shard process; messages are
handled the moment they arrive, grace-window timers fire at their virtual time.
Checkpoints are snapshots (`core.snapshot`) kept in memory: a save becomes durable
`ckpt_save_s` after it starts, unless the process dies first; the last KEEP saves and the
first are kept, as the process's orbax keeps the latest and the first of each 3 s. A
killed shard restarts from the newest intact one (a `corrupt_checkpoint` fault marks the
newest damaged: the restore passes it over with a `checkpoint_skipped` line, in the words
trainer/numerics/checkpoint.py uses), or from Θ0 if none.
"""
from __future__ import annotations

from diloco_chaos.trainer.protocol.syncer_core import SyncerCore
from diloco_chaos.trainer.protocol.syncer_driver import SaveFailed, SyncerDriver

from diloco_chaos.trainer.numerics.wiring import MATH_BUGS, syncer_config, syncer_math
from diloco_chaos.trainer.protocol.unit_faults import UnitFaults
from diloco_chaos.trainer.wire.transport import LinkStats

NO_SPACE = "OSError: [Errno 28] No space left on device (simulated disk_full)"
# disk_slow: the writes and fsyncs one save makes, each `latency_ms` late: an estimate for an
# orbax save of a shard's state and its manifest, not counted on processes
DISK_OPS_PER_SAVE = 24
KEEP = 3  # saves kept besides the first (trainer/numerics/checkpoint.py's max_to_keep)
SKIPPED = {  # a damaged save's reason, as trainer/numerics/checkpoint.py words it (simulated)
    "flip": "not what was saved: a leaf's sha256 differs from its manifest (simulated)",
    "truncate": "did not load: a data file shorter than its index says (simulated)",
    "manifest": "no manifest (a save cut short, or its manifest lost)",
}


class SyncerProc:
    """One incarnation: the SyncerPort of its driver on the simulated world."""

    def __init__(self, unit: "SimSyncer", incarnation: int, startup_s: float | None = None):
        self.unit, self.world, self.incarnation = unit, unit.world, incarnation
        self.alive, self.listening = True, False
        self.timers: dict[str, object] = {}
        self.stats: dict[str, LinkStats] = {}
        self.driver: SyncerDriver | None = None
        startup = self.world.params.syncer_startup_s if startup_s is None else startup_s
        self.world.clock.at(self.world.now + startup, self.started)

    @property
    def state(self):
        return self.driver.state

    def started(self) -> None:
        if not self.alive:
            return
        unit, w = self.unit, self.world
        math = w.model.smath if not w.syncer_bugs & MATH_BUGS else syncer_math(w.cfg, w.model.frag, w.syncer_bugs)
        core = SyncerCore(syncer_config(w.cfg, w.topology, unit.name, w.syncer_bugs), math)
        restored = self._restore(core) if unit.saves else None
        if restored is not None:
            state = core.restore(restored[0])
        else:
            frags = w.topology["shards"][unit.name]
            state = core.init({p: w.model.frag.get(w.model.params0, p) for p in frags})
        self.driver = SyncerDriver(core, core.remember(state, unit.journal), self, unit.saved,
                                   faults=UnitFaults(unit.faults))  # the unit's own dict: what the world sets
        if restored is not None:
            self.emit("checkpoint_restored", step=restored[1], versions=self.driver.versions(),
                      digests=self.driver.digests())  # of what it loaded (restores_faithful)
        self.emit("unit_up", incarnation=self.incarnation, pid=None, addr=f"sim:{unit.name}")
        self.listening = True

    def _restore(self, core) -> tuple[dict, int] | None:
        """(snapshot, save number) the restart loads: the newest intact save; None if none is."""
        unit, bugs = self.unit, self.world.syncer_bugs
        snap, step = unit.durable
        if "restore_oldest" in bugs:  # planted: the oldest save, the line naming the latest
            return unit.oldest[0], step
        if "restore_mixed" in bugs:  # planted: Θ from the oldest save, the rest from the latest
            return {**snap, "fragments": {p: {**f, "theta": unit.oldest[0]["fragments"][p]["theta"]}
                                          for p, f in snap["fragments"].items()}}, step
        if "restore_stale_outer" in bugs:  # planted: Θ and versions from the latest, momentum not
            return {**snap, "fragments": {p: {**f, "outer": unit.oldest[0]["fragments"][p]["outer"]}
                                          for p, f in snap["fragments"].items()}}, step
        if "restore_unverified" in bugs:  # planted: the newest save loaded as it is, damage and all
            return unit.as_stored(snap, step), step
        for snap, step in reversed(unit.saves):
            if (damage := unit.damaged.get(step)) is None:
                return snap, step
            self.emit("checkpoint_skipped", step=step, why=SKIPPED[damage])
        return None

    # --- events from the network and the clock -------------------------------------------
    def on_net(self, kind: str, peer: str, msg=None, nbytes: int = 0) -> None:
        if not self.listening:
            return
        if kind == "connected":
            self.stats.setdefault(peer, LinkStats()).connects += 1
            self.driver.connected(peer)
        elif kind == "disconnected":
            self.driver.disconnected(peer)
        else:
            stats = self.stats[peer]
            stats.bytes_recv += nbytes
            stats.frames_recv += 1
            self.driver.received(peer, msg, nbytes)

    def on_timer(self, key: str) -> None:
        if self.alive and self.timers.pop(key, None) is not None:
            self.driver.timer(key)

    def _saved(self, snap) -> None:
        if not self.alive:
            return  # the save died with the process
        if self.unit.disk_full:  # the write found no space (disk_full): orbax raises it when it ends
            self.driver.save_failed(NO_SPACE)
            return
        self.unit.landed(*snap)
        self.driver.saved_landed()

    # --- the SyncerPort --------------------------------------------------------------------
    def now(self) -> float:
        return self.world.now

    def send(self, to: str, msg, whole=None) -> int:
        nbytes = self.world.net.shard_send(self.unit.name, to, msg, whole)
        if nbytes:
            self.stats[to].bytes_sent += nbytes
            self.stats[to].frames_sent += 1
        return nbytes

    def set_timer(self, key: str, at: float) -> None:
        w = self.world
        if (old := self.timers.get(key)) is not None:
            old.cancel()
        self.timers[key] = w.clock.at(max(at, w.now), self.on_timer, key)

    def start_save(self, number: int, snapshot: dict) -> None:
        self.unit.saved = number
        slow = self.unit.disk_latency_s * DISK_OPS_PER_SAVE  # disk_slow
        self.world.clock.at(self.world.now + self.world.params.ckpt_save_s + slow, self._saved, (snapshot, number))

    def save_now(self, number: int, snapshot: dict) -> None:
        if self.unit.disk_full:
            raise SaveFailed(NO_SPACE)
        self.unit.saved = number
        self.unit.landed(snapshot, number)

    def journal(self, fragment: int, version: int, digest: str) -> None:
        self.unit.journal.append((fragment, version, digest))  # (its own disk: disk_full spares it)
        if "journal_unsynced" not in self.world.syncer_bugs:  # fsynced with the line (trainer/numerics/journal.py)
            self.unit.journal_synced = len(self.unit.journal)

    def emit(self, kind: str, **fields) -> None:
        self.world.emit(kind, self.unit.name, **fields)

    # --- the end ---------------------------------------------------------------------------
    def kill(self) -> None:
        self.alive = self.listening = False
        for handle in self.timers.values():
            handle.cancel()
        self.world.net.shard_stopped(self.unit.name)

    def stop(self) -> None:
        """SIGTERM: the final state is made durable, then the process leaves."""
        if not self.listening:  # still starting up: dies without a word
            self.kill()
            return
        self.driver.finish()
        self.kill()
        for learner, s in self.stats.items():  # the shard end's buffer counters live on the links
            held = self.world.net.link(learner, self.unit.name).shard_stats
            s.unsent_max, s.superseded = held.unsent_max, held.superseded
        self.emit("done", links={p: vars(s) for p, s in self.stats.items()}, versions=self.driver.versions())


class SimSyncer:
    """A syncer shard across its incarnations; `saves` = its kept (snapshot, save number)s."""

    def __init__(self, world, name: str):
        self.world, self.name = world, name
        self.incarnation = -1
        self.proc: SyncerProc | None = None
        self.saves: list[tuple[dict, int]] = []  # landed, oldest first: the first and the last KEEP
        self.damaged: dict[int, str] = {}  # save number -> how corrupt_checkpoint damaged it
        self.oldest = None  # the first durable snapshot (planted restore_oldest restores it)
        self.saved = 0
        # the faults on the shard by kind (trainer/protocol/unit_faults.py), set by the world; the disk's
        # (disk_full, disk_slow) are this host's model of its disk, read below
        self.faults: dict[str, dict] = {}
        self.journal: list = []  # (fragment, version, digest) per commit, across incarnations (trainer/numerics/journal.py)
        self.journal_synced = 0  # how many of its lines an fsync made durable

    @property
    def disk_full(self) -> bool:
        """disk_full: every save fails while it lasts (it outlives a restart, as a disk does)."""
        return "disk_full" in self.faults

    @property
    def disk_latency_s(self) -> float:
        """disk_slow: each write and fsync of a save this much late (0: healed)."""
        return self.faults["disk_slow"]["latency_ms"] / 1000.0 if "disk_slow" in self.faults else 0.0

    @property
    def durable(self) -> tuple[dict, int] | None:
        """The newest landed save (damaged or not): what is on disk at the end of a run."""
        return self.saves[-1] if self.saves else None

    @property
    def intact(self) -> tuple[dict, int] | None:
        """The newest landed save the harness did not damage: what the process tier's global
        evals read (only checkpoints that match their manifests: harness/run/global_eval.py)."""
        return next((s for s in reversed(self.saves) if s[1] not in self.damaged), None)

    def landed(self, snapshot: dict, number: int) -> None:
        self.saves.append((snapshot, number))
        self.oldest = self.oldest or self.saves[0]  # the first save: what a real shard keeps longest
        if len(self.saves) > KEEP + 1:
            del self.saves[1]

    def checkpoints(self) -> dict:
        """As the harness lists a process's checkpoint folder: finalized and sealed save numbers."""
        numbers = [n for _, n in self.saves]
        return {"finalized": numbers, "sealed": [n for n in numbers if self.damaged.get(n) != "manifest"]}

    def damage(self, how: str) -> dict:
        """corrupt_checkpoint: the newest save damaged (`manifest`: the newest sealed one), as
        harness/backends/checkpoint_disk.py does; recorded, `as_stored` applies it."""
        before = self.checkpoints()
        candidates = before["sealed" if how == "manifest" else "finalized"]
        if not candidates:
            return {"step": None, "damage": how, "file": None, **before}
        step = candidates[-1]
        self.damaged[step] = how
        return {"step": step, "damage": how, "file": "(simulated)", **before}

    def lose_writes(self) -> dict:
        """lost_writes, once the process is dead: what no fsync made durable is gone, as
        harness/backends/ckptfs drops it on processes (a file never fsynced deleted, one written past its
        last fsync cut back to it). Here that is the journal's tail (every line, with the
        planted journal_unsynced); the save being written died with the process already, and
        a landed save was fsynced before it was sealed."""
        lines = len(self.journal) - self.journal_synced
        lost = truncated = 0
        if lines and not self.journal_synced:
            lost = 1
        elif lines:
            truncated = 1
        del self.journal[self.journal_synced:]
        return {"lost": 0, "truncated": 0, "journal_lost": lost, "journal_truncated": truncated,
                "journal_lines_lost": lines}

    def as_stored(self, snap: dict, step: int) -> dict:
        """A save as a load without verification reads it: a `flip` changes one value of its
        first fragment's Θ (the middle one, its bits 16-23 inverted); the others read whole
        (a truncated save's load raising is not modelled)."""
        if self.damaged.get(step) != "flip":
            return snap
        import numpy as np
        frags = dict(snap["fragments"])
        p = sorted(frags)[0]
        theta = np.array(frags[p]["theta"], dtype=np.float32, copy=True)
        flat = theta.reshape(-1).view(np.uint32)
        flat[flat.size // 2] ^= np.uint32(0x00FF0000)
        frags[p] = {**frags[p], "theta": theta}
        return {**snap, "fragments": frags}

    def spawn(self, startup_s: float | None = None) -> None:
        self.incarnation += 1
        self.proc = SyncerProc(self, self.incarnation, startup_s)

    def kill(self) -> None:
        if self.proc is not None:
            self.proc.kill()
            self.proc = None

    def theta(self) -> dict | None:
        """p -> Θ[p] as the end of the run leaves it on disk: the live state (a shard
        that is stopped saves it) or the last durable snapshot."""
        if self.proc is not None and self.proc.listening and not self.disk_full:
            return dict(self.proc.state.theta)
        if self.durable is None:
            return None
        return {int(p): f["theta"] for p, f in self.durable[0]["fragments"].items()}
