"""One syncer shard's driver, the same code for a real process and for the simulator.

The SyncerCore decides; the driver carries out its actions and keeps the shard's
checkpoint discipline; a *host* does the I/O behind a small port. Two hosts exist:
trainer/units/syncer.py (sockets, a monotonic clock, orbax) and harness/sim/syncer.py (the
simulated network, a virtual clock, snapshots in memory). What the shard does with a
message, a timer, a commit or a SIGTERM is therefore written once, and the simulator
cannot drift from the processes there (issue 14: one driver per role).

Checkpoints: a commit asks for a save (SaveCheckpoint). At most one save is in flight,
and a save starts at most every SAVE_GAP_S; commits in between coalesce into the next
save, started when the gap is over and the previous one landed. (Starting an orbax save
holds the shard's loop for 20-250 ms on a busy machine; a save after every landing
stalled every learner's fetch and merge four to five times a second.) Only versions
that are on disk are reported to the core as durable (`core.durable`): a learner is told
nothing a crash could take back. On SIGTERM the current state is saved and made
durable before the process leaves.

A save can fail (a full disk, an I/O error): the host's port raises `SaveFailed`, at the
start or when the write ends. Never fatal: the shard logs `checkpoint_failed`, nothing of
that save is reported durable, and its state goes into the next save (after the gap);
at SIGTERM, what is durable stays the last save that landed.

The journal: every commit's (fragment, version, digest of Θ[p]) is appended to a small
file of the shard's own, apart from its checkpoints (`Journal` actions; a host whose
journal write fails says so once with `journal_failed` and goes on). A restarted shard
hands it to the core (`SyncerCore.remember`): the versions committed since its last
checkpoint, which a learner's copy may repair only if its digest is the journal's.
"""
from __future__ import annotations

from typing import Protocol

from diloco_chaos.trainer.protocol.messages import describe
from diloco_chaos.trainer.protocol.protocol_base import (IllegalTransition, Journal, Log, SaveCheckpoint,
                                                         Send, SetTimer)
from diloco_chaos.trainer.protocol.syncer_core import SyncerCore
from diloco_chaos.trainer.protocol.syncer_types import SyncerState
from diloco_chaos.trainer.protocol.unit_faults import UnitFaults


class SyncerPort(Protocol):
    """What a host offers the driver."""

    def now(self) -> float: ...                       # the clock the core reads (seconds)
    def send(self, to: str, msg, whole=None) -> int: ...  # bytes framed; 0: dropped (no link); whole: Send.whole
    def set_timer(self, key: str, at: float) -> None: ...  # call driver.timer(key) at `at`; a later set replaces
    def emit(self, kind: str, **fields) -> None: ...  # one event-log line from this shard
    def start_save(self, number: int, snapshot: dict) -> None: ...  # asynchronous: call driver.saved() when on disk
    def save_now(self, number: int, snapshot: dict) -> None: ...    # synchronous (the final save)
    def journal(self, fragment: int, version: int, digest: str) -> None: ...  # append to the shard's journal


SAVE_GAP_S = 0.5    # the least time from one save's start to the next's (a crash loses at most this much more)
SAVE_TIMER = "save"  # the driver's own timer key: the coalesced save, once the gap is over


class SaveFailed(Exception):
    """The storage refused a save (its host's words for why): raised by a port's
    start_save / save_now, or passed to `SyncerDriver.save_failed` when a write ends badly."""


class SyncerDriver:
    def __init__(self, core: SyncerCore, state: SyncerState, port: SyncerPort, saved: int = 0,
                 save_gap_s: float = SAVE_GAP_S, faults: UnitFaults | None = None):
        self.core, self.state, self.port = core, state, port
        self.faults = UnitFaults() if faults is None else faults  # the faults on the shard now, their hooks
        self.saved = saved                   # checkpoint numbers: one per save, across incarnations
        self.in_flight: dict | None = None   # versions of the save being written
        self.dirty = False                   # a commit since the last save started
        self.save_gap_s = save_gap_s
        self.next_save_at: float | None = None  # the earliest start of the next save
        self.save_timer_set = False

    # --- what the host feeds in ------------------------------------------------------------
    def connected(self, peer: str) -> None:
        self.port.emit("link_up", peer=peer)
        self.do("learner_connected", peer)
        self.checkpoint()

    def disconnected(self, peer: str) -> None:
        self.port.emit("link_down", peer=peer)
        self.do("learner_disconnected", peer)
        self.checkpoint()

    def received(self, peer: str, msg, nbytes: int) -> None:
        self.port.emit("recv", peer=peer, bytes=nbytes, **describe(msg))
        try:
            self.do("receive", peer, msg)
        except IllegalTransition as e:
            self.port.emit("drop", what=type(msg).__name__, reason=f"illegal: {e}", peer=peer)
        self.checkpoint()

    def timer(self, key: str) -> None:
        if key == SAVE_TIMER:
            self.save_timer_set = False
        else:
            self.do("timer", key)
        self.checkpoint()

    def saved_landed(self) -> None:
        """The save in flight is on disk: its versions are durable; start the next if due."""
        versions, self.in_flight = self.in_flight, None
        self._durable(versions, self.saved)
        self.checkpoint()

    def save_failed(self, why: str) -> None:
        """The save in flight did not land: nothing of it is durable; its state goes into the
        next save, started when the save gap allows (never fatal: the shard goes on)."""
        if "durable_on_failure" in self.core.config.bugs:  # planted: a failed save taken for one that landed
            self.saved_landed()
            return
        number, self.in_flight, self.dirty = self.saved, None, True
        self.port.emit("checkpoint_failed", number=number, error=why)
        self.checkpoint()

    def finish(self) -> None:
        """SIGTERM: the current state is saved (if it moved on) and made durable; if that
        save fails, what is durable stays the last save that landed."""
        if self.dirty or self.in_flight is not None:
            self.saved += 1
            self.in_flight, self.dirty = None, False
            if not self._start(self.port.save_now, final=True):
                return
        self._durable(dict(self.state.version), self.saved)

    def digests(self, state=None) -> dict:
        """{"theta": {p: digest}, "outer": {p: digest}} of what the shard holds (or `state`
        holds): the `checkpoint_started` line's of what a save writes, the `checkpoint_restored`
        line's of what a restore loaded, for restores_faithful (harness/judging/audits.py)."""
        digest, state = self.core.math.digest, state or self.state
        if digest is None:
            return {}
        return {"theta": {str(p): digest(t) for p, t in sorted(state.theta.items())},
                "outer": {str(p): digest(list(o)) for p, o in sorted(state.outer.items())}}

    def _start(self, save, final: bool = False) -> bool:
        """Hands the host a snapshot under the current save number, after a `checkpoint_started`
        line with the digests of what it holds (written before the save, so a restore of a
        save that landed while its shard was killed, before the landing was logged, can still
        be checked against what it wrote)."""
        self.port.emit("checkpoint_started", number=self.saved, versions=self.versions(), digests=self.digests())
        try:
            save(self.saved, self.core.snapshot(self.state))
        except SaveFailed as e:
            if final:
                self.port.emit("checkpoint_failed", number=self.saved, error=str(e))
            else:
                self.save_failed(str(e))
            return False
        return True

    def _durable(self, versions: dict, number: int) -> None:
        """The core's `durable`, its checkpoint_saved line naming the save and what it holds."""
        self.state, actions = self.core.durable(self.state, self.port.now(), versions)
        for a in actions:
            if isinstance(a, Log) and a.kind == "checkpoint_saved":
                a.fields.update(number=number)
        for a in actions:
            if isinstance(a, Log):
                self.port.emit(a.kind, **a.fields)

    def versions(self) -> dict:
        """The `versions` field of the shard's `done` and `checkpoint_restored` lines."""
        return {str(p): v for p, v in self.state.version.items()}

    # --- carrying out the core's actions ------------------------------------------------------
    def do(self, event: str, *args) -> None:
        self.state, actions = getattr(self.core, event)(self.state, self.port.now(), *args)
        for a in actions:
            if isinstance(a, Log):
                self.port.emit(a.kind, **a.fields)
        for a in actions:
            if isinstance(a, Send):  # past the `before_send` hooks of the faults on the shard
                self.faults.send(self, a.msg, lambda msg, a=a: self._send(a.to, msg, a.whole))
            elif isinstance(a, SetTimer):
                self.port.set_timer(a.key, a.at)
            elif isinstance(a, SaveCheckpoint):
                self.dirty = True
            elif isinstance(a, Journal):
                self.port.journal(a.fragment, a.version, a.digest)

    def _send(self, to: str, msg, whole) -> None:
        nbytes = self.port.send(to, msg, whole)
        self.port.emit("send" if nbytes else "drop", peer=to, bytes=nbytes, **describe(msg))

    def checkpoint(self) -> None:
        """Starts a save if the state moved on and none is in flight (coalescing)."""
        if self.dirty and self.in_flight is None:
            now = self.port.now()
            if self.next_save_at is not None and now < self.next_save_at:
                if not self.save_timer_set:
                    self.port.set_timer(SAVE_TIMER, self.next_save_at)
                    self.save_timer_set = True
                return
            self.next_save_at = now + self.save_gap_s
            self.saved += 1
            self.in_flight = dict(self.state.version)
            self.dirty = False
            self._start(self.port.start_save)
