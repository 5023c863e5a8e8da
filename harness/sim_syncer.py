"""A syncer shard in the simulator: trainer/syncer.py's loop as discrete events.

The same SyncerCore and outer math; messages are handled the moment they arrive,
grace-window timers fire at their virtual time. Checkpoints are snapshots
(`core.snapshot`) kept in memory: a save started after a commit becomes durable
`ckpt_save_s` later (coalescing while one is in flight, as the process does), and
then `core.durable` is told. A killed shard restarts from the last durable
snapshot, or from Θ0 if it never saved.
"""
from __future__ import annotations

from trainer.messages import describe
from trainer.protocol import IllegalTransition, Log, SaveCheckpoint, Send, SetTimer, SyncerCore
from trainer.syncer import CKPT_MIN_INTERVAL_S
from trainer.transport import LinkStats
from trainer.wiring import syncer_config


class SyncerProc:
    def __init__(self, unit: "SimSyncer", incarnation: int):
        self.unit, self.world, self.incarnation = unit, unit.world, incarnation
        self.alive, self.listening = True, False
        self.timers: dict[str, object] = {}
        self.stats: dict[str, LinkStats] = {}
        self.in_flight: dict | None = None  # versions of the save being written
        self.dirty = False
        self.last_save = -CKPT_MIN_INTERVAL_S
        self.deferred = None  # the clock handle of a save put off by CKPT_MIN_INTERVAL_S
        self.world.clock.at(self.world.now + self.world.params.syncer_startup_s, self.started)

    def started(self) -> None:
        if not self.alive:
            return
        unit, w = self.unit, self.world
        self.core = SyncerCore(syncer_config(w.cfg, w.topology, unit.name, w.syncer_bugs), w.model.smath)
        if unit.durable is not None:
            snap, step = unit.durable
            self.state = self.core.restore(snap)
            self.emit("checkpoint_restored", step=step, versions={str(p): v for p, v in self.state.version.items()})
        else:
            frags = w.topology["shards"][unit.name]
            self.state = self.core.init({p: w.model.frag.get(w.model.params0, p) for p in frags})
        self.emit("unit_up", incarnation=self.incarnation, pid=None, addr=f"sim:{unit.name}")
        self.listening = True

    # --- events from the network and the clock -------------------------------------------
    def on_net(self, kind: str, peer: str, msg=None, nbytes: int = 0) -> None:
        if not self.listening:
            return
        if kind == "connected":
            self.stats.setdefault(peer, LinkStats()).connects += 1
            self.emit("link_up", peer=peer)
            self.do("learner_connected", peer)
        elif kind == "disconnected":
            self.emit("link_down", peer=peer)
            self.do("learner_disconnected", peer)
        else:
            stats = self.stats[peer]
            stats.bytes_recv += nbytes
            stats.frames_recv += 1
            self.emit("recv", peer=peer, bytes=nbytes, **describe(msg))
            try:
                self.do("receive", peer, msg)
            except IllegalTransition as e:
                self.emit("drop", what=type(msg).__name__, reason=f"illegal: {e}", peer=peer)
        self.checkpoint()

    def on_timer(self, key: str) -> None:
        if self.alive and self.timers.pop(key, None) is not None:
            self.do("timer", key)
            self.checkpoint()

    def do(self, event: str, *args) -> None:
        w = self.world
        self.state, actions = getattr(self.core, event)(self.state, w.now, *args)
        for a in actions:
            if isinstance(a, Log):
                self.emit(a.kind, **a.fields)
        for a in actions:
            if isinstance(a, Send):
                nbytes = w.net.shard_send(self.unit.name, a.to, a.msg)
                if nbytes:
                    self.stats[a.to].bytes_sent += nbytes
                    self.stats[a.to].frames_sent += 1
                self.emit("send" if nbytes else "drop", peer=a.to, bytes=nbytes, **describe(a.msg))
            elif isinstance(a, SetTimer):
                if (old := self.timers.get(a.key)) is not None:
                    old.cancel()
                self.timers[a.key] = w.clock.at(max(a.at, w.now), self.on_timer, a.key)
            elif isinstance(a, SaveCheckpoint):
                self.dirty = True

    # --- checkpoints ---------------------------------------------------------------------
    def checkpoint(self, due: bool = False) -> None:
        """Starts a save if the state moved on, none is in flight and the last one started
        CKPT_MIN_INTERVAL_S ago (Syncer.checkpoint); else comes back when it may."""
        w = self.world
        if not self.dirty or self.in_flight is not None:
            return
        if not due and w.now - self.last_save < CKPT_MIN_INTERVAL_S:
            if self.deferred is None:
                self.deferred = w.clock.at(self.last_save + CKPT_MIN_INTERVAL_S, self._deferred)
            return
        self.last_save = w.now
        self.unit.saved += 1
        self.in_flight = dict(self.state.version)
        snap = (self.core.snapshot(self.state), self.unit.saved)
        self.dirty = False
        w.clock.at(w.now + w.params.ckpt_save_s, self._saved, snap)

    def _deferred(self) -> None:
        self.deferred = None
        if self.alive:
            self.checkpoint(due=True)

    def _saved(self, snap) -> None:
        if not self.alive:
            return  # the save died with the process
        self.unit.durable = snap
        versions, self.in_flight = self.in_flight, None
        self.do("durable", versions)
        self.checkpoint()

    # --- the end ---------------------------------------------------------------------------
    def kill(self) -> None:
        self.alive = self.listening = False
        for handle in [*self.timers.values(), self.deferred]:
            if handle is not None:
                handle.cancel()
        self.world.net.shard_stopped(self.unit.name)

    def stop(self) -> None:
        """SIGTERM: the final state is made durable, then the process leaves."""
        if not self.listening:  # still starting up: dies without a word
            self.kill()
            return
        if self.dirty or self.in_flight is not None:
            self.unit.saved += 1
            self.unit.durable = (self.core.snapshot(self.state), self.unit.saved)
        self.do("durable", dict(self.state.version))
        self.kill()
        for learner, s in self.stats.items():  # the shard end's buffer counters live on the links
            held = self.world.net.link(learner, self.unit.name).shard_stats
            s.unsent_max, s.superseded = held.unsent_max, held.superseded
        self.emit("done", links={p: vars(s) for p, s in self.stats.items()},
                  versions={str(p): v for p, v in self.state.version.items()})

    def emit(self, kind: str, **fields) -> None:
        self.world.emit(kind, self.unit.name, **fields)


class SimSyncer:
    """A syncer shard across its incarnations; `durable` = (snapshot, save number)."""

    def __init__(self, world, name: str):
        self.world, self.name = world, name
        self.incarnation = -1
        self.proc: SyncerProc | None = None
        self.durable = None
        self.saved = 0

    def spawn(self) -> None:
        self.incarnation += 1
        self.proc = SyncerProc(self, self.incarnation)

    def kill(self) -> None:
        if self.proc is not None:
            self.proc.kill()
            self.proc = None

    def theta(self) -> dict | None:
        """p -> Θ[p] as the end of the run leaves it on disk: the live state (a shard
        that is stopped saves it) or the last durable snapshot."""
        if self.proc is not None and self.proc.listening:
            return dict(self.proc.state.theta)
        if self.durable is None:
            return None
        return {int(p): f["theta"] for p, f in self.durable[0]["fragments"].items()}
