"""A syncer shard as a process: `python -m trainer.syncer --run-dir D --id syncer-0`.

It owns some fragments Θ[p] and their outer Nesterov state, merges what a minimum
quorum of learner units delivered, and sends Θ[p] back. A single-threaded loop:
poll the sockets (until the next grace-window timer) and feed the SyncerDriver
(trainer/protocol/syncer_driver.py, the same driver the simulator runs), which carries out
the SyncerCore's actions and checkpoints asynchronously (orbax), coalescing while a
save is in flight. Restarted after a crash, it resumes from its latest complete
checkpoint.
"""
from __future__ import annotations

import json
import os
import sys
import time

from diloco_chaos.trainer.numerics.checkpoint import Checkpointer, why_failed
from diloco_chaos.trainer.numerics.journal import CommitJournal
from diloco_chaos.trainer.numerics.tasks import task_for_run
from diloco_chaos.trainer.numerics.wiring import fragmenter_for, syncer_config, syncer_math
from diloco_chaos.trainer.protocol.outbox import outbox_key
from diloco_chaos.trainer.protocol.syncer_core import SyncerCore
from diloco_chaos.trainer.protocol.syncer_driver import SaveFailed, SyncerDriver
from diloco_chaos.trainer.protocol.unit_faults import UnitFaults
from diloco_chaos.trainer.units import shell
from diloco_chaos.trainer.wire import auth
from diloco_chaos.trainer.wire.flow import BufferLog
from diloco_chaos.trainer.wire.transport import ShardServer, parse_addr


KEEP_EVERY_S = 3       # besides the latest saves, the first of each 3 s of clock time is kept (the global loss curve)
CONTROL_EVERY_S = 0.05  # how often the loop looks at its control file (a learner: every step)


class Syncer:
    """The process host of trainer/protocol/syncer_driver.py: sockets, the monotonic clock, orbax."""

    def __init__(self, args):
        self.run_dir, self.name, self.incarnation = args.run_dir, args.id, args.incarnation
        self.run_info, self.cfg = shell.load_run(self.run_dir)
        topo = self.run_info["topology"]
        self.ev = shell.open_events(self.run_dir, self.name, self.incarnation)
        self.stopper = shell.Stopper()
        params = theta0(self.cfg)
        frag = fragmenter_for(self.cfg, params)
        self.bugs = frozenset(b for b in args.bugs.split(",") if b)
        core = SyncerCore(syncer_config(self.cfg, topo, self.name, self.bugs), syncer_math(self.cfg, frag, self.bugs))
        self.ckpt = Checkpointer(self.run_dir / "ckpt" / self.name, keep_every_s=KEEP_EVERY_S,
                                 start_in_thread=True)  # the loop is not held by a save's start
        kept = self.ckpt.steps()   # finalized (sealed or not), ascending
        saved = kept[-1] if kept else 0  # checkpoint numbers: one per save; the next exceeds every one on disk
        if "restore_oldest" in self.bugs:  # planted: an index off, the oldest kept save, logged as the latest
            step, restored, skipped = saved, self.ckpt.restore(kept[0], listed=kept) if kept else None, []
        else:  # the newest intact save (its manifest's checksums); "restore_unverified": the newest as it is
            step, restored, skipped = self.ckpt.restore_verified(verify="restore_unverified" not in self.bugs)
        for s in skipped:  # what the restore passed over, and why (checkpoint_integrity)
            self.ev.emit("checkpoint_skipped", step=s["step"], why=s["why"])
        if restored is not None and "restore_mixed" in self.bugs and len(kept) > 1:
            # planted: Θ read from the oldest kept save, everything else (versions too) from the latest
            oldest = shell.from_ckpt(self.ckpt.restore(kept[0], listed=kept))
            restored = shell.from_ckpt(restored)
            for p, f in restored["fragments"].items():
                f["theta"] = oldest["fragments"][p]["theta"]
        elif restored is not None and "restore_stale_outer" in self.bugs and len(kept) > 1:
            # planted: Θ and versions from the latest save, the outer momentum from the oldest kept
            oldest = shell.from_ckpt(self.ckpt.restore(kept[0], listed=kept))
            restored = shell.from_ckpt(restored)
            for p, f in restored["fragments"].items():
                f["outer"] = oldest["fragments"][p]["outer"]
        elif restored is not None:
            restored = shell.from_ckpt(restored)
        self.commit_journal = CommitJournal(self.run_dir / "journal" / f"{self.name}.jsonl",
                                            fsync="journal_unsynced" not in self.bugs)  # planted: flushed only
        if restored is not None:
            state = core.restore(restored)
        else:
            state = core.init({p: frag.get(params, p) for p in topo["shards"][self.name]})
        self.driver = SyncerDriver(core, core.remember(state, self.commit_journal.entries()), self, saved,
                                   faults=UnitFaults())
        self.control_mtime, self.control_read_at = 0.0, 0.0
        if shell.control_on_stdin():  # the harness's control messages: the faults on the shard
            shell.follow_control(self.run_dir, self.name)
        if restored is not None:
            self.ev.emit("checkpoint_restored", step=step, versions=self.driver.versions(),
                         digests=self.driver.digests())  # of what it loaded (restores_faithful)
        self.timers = shell.Timers()
        host, port = parse_addr(topo["shard_addrs"][self.name])
        self.server = ShardServer(self.name, topo["run_id"], host, port, secret=auth.secret_from_env())
        self.buffer_log = BufferLog()
        self.resources = shell.ResourceLog(self.ev)

    # --- the SyncerPort --------------------------------------------------------------------
    def now(self) -> float:
        return shell.monotonic()

    def send(self, to: str, msg, whole=None) -> int:
        key = None if "unbounded_outbox" in self.bugs else outbox_key(msg)  # planted: plain FIFO
        return self.server.send(to, msg, key=key, whole=whole)

    def set_timer(self, key: str, at: float) -> None:
        self.timers.set(key, at)

    def emit(self, kind: str, **fields) -> None:
        self.ev.emit(kind, **fields)

    def start_save(self, number: int, snapshot: dict) -> None:
        # saved_at: when Θ was this, for the harness's global evals along the run
        try:
            self.ckpt.save(number, {**shell.to_ckpt(snapshot), "saved_at": time.time()})
        except Exception as e:  # noqa: BLE001 - the storage's refusal (orbax: ValueError, OSError)
            raise self._failed(e) from None

    def save_now(self, number: int, snapshot: dict) -> None:
        try:
            self.ckpt.wait()
        except Exception as e:  # noqa: BLE001 - the save in flight failed; this one holds newer state
            self.ev.emit("checkpoint_failed", number=number - 1, error=why_failed(e))
            self.ckpt.recover()
        self.start_save(number, snapshot)
        try:
            self.ckpt.wait()
        except Exception as e:  # noqa: BLE001
            raise self._failed(e) from None

    def journal(self, fragment: int, version: int, digest: str) -> None:
        was = self.commit_journal.failed
        if (why := self.commit_journal.append(fragment, version, digest)) is not None and was is None:
            self.ev.emit("journal_failed", fragment=fragment, version=version, error=why)

    def _failed(self, e: Exception) -> SaveFailed:
        """A failed save: orbax's manager is made anew (it keeps the error), the driver told."""
        self.ckpt.recover()
        return SaveFailed(why_failed(e))

    def poll_control(self, now: float) -> None:
        """control/<name>.json, the last control message (trainer/units/shell.py `follow_control`), if
        it changed: the faults on the shard (trainer/protocol/unit_faults.py), at most every CONTROL_EVERY_S."""
        if now - self.control_read_at < CONTROL_EVERY_S:
            return
        self.control_read_at = now
        path = self.run_dir / "control" / f"{self.name}.json"
        try:
            mtime = path.stat().st_mtime
        except FileNotFoundError:
            return
        if mtime != self.control_mtime:
            self.control_mtime = mtime
            self.driver.faults.update(json.loads(path.read_text()).get("faults", {}))

    # --- the loop --------------------------------------------------------------------------
    def run(self) -> int:
        d = self.driver
        self.ev.emit("unit_up", incarnation=self.incarnation, pid=os.getpid(), addr=self.server.addr,
                     started=shell.process_started())
        while not self.stopper.stop:
            now = shell.monotonic()
            for key in self.timers.pop_due(now):
                d.timer(key)
            for ev in self.server.poll(self.timers.next_in(now, cap=0.05)):
                if ev.kind == "connected":
                    d.connected(ev.peer)
                elif ev.kind == "disconnected":
                    d.disconnected(ev.peer)
                elif ev.kind == "refused":  # no proof of the run's secret: nothing reached the core
                    self.ev.emit("auth_refused", peer=ev.peer, reason=ev.msg)
                else:
                    d.received(ev.peer, ev.msg, ev.nbytes)
            if d.in_flight is not None and not self.ckpt.saving():
                try:
                    self.ckpt.wait()  # raises if the save failed (a full disk, an I/O error)
                except Exception as e:  # noqa: BLE001 - never fatal: the next save holds its state
                    d.save_failed(self._failed(e).args[0])
                else:
                    d.saved_landed()
            now = time.monotonic()
            self.poll_control(now)
            self.resources.maybe(now)
            if self.buffer_log.due(now):  # `link_buffer` lines: at most one a second per link
                for fields in self.buffer_log.lines(now, self.server.buffers()):
                    self.ev.emit("link_buffer", **fields)
        d.finish()  # SIGTERM: the final state durable before leaving (or checkpoint_failed)
        try:
            self.ckpt.close()
        except Exception as e:  # noqa: BLE001 - a failed save's error, raised once more on the way out
            self.ev.emit("checkpoint_failed", number=d.saved, error=why_failed(e))
        self.server.close()
        self.commit_journal.close()
        self.ev.emit("done", links={p: vars(s) for p, s in self.server.stats.items()}, versions=d.versions())
        self.ev.close()
        return 0


def theta0(cfg):
    """Θ0 (the same in every process), once per process: a warm spare builds it early."""
    return shell.warm("syncer", lambda: shell.global_init(task_for_run(cfg), cfg.seed))


def main(argv=None) -> int:
    args = shell.parse_args(argv, "syncer")
    shell.stream_events()  # (stream mode: stdout carries event lines only, from the start)
    if args.spare is not None:
        theta0(shell.load_run(args.run_dir)[1])
        if shell.await_identity(args) is None:
            return 0
    return Syncer(args).run()


if __name__ == "__main__":
    sys.exit(main())
