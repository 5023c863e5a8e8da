"""A syncer shard as a process: `python -m trainer.syncer --run-dir D --id syncer-0`.

It owns some fragments Θ[p] and their outer Nesterov state, merges what a minimum
quorum of learner units delivered, and sends Θ[p] back. A single-threaded loop:
poll the sockets (until the next grace-window timer), feed the SyncerCore, carry
out its actions. After every commit it checkpoints asynchronously (orbax),
coalescing while a save is in flight, and tells the core which versions are
durable once a save is on disk. Restarted after a crash, it resumes from its
latest complete checkpoint.
"""
from __future__ import annotations

import os
import sys
import time

import jax
import numpy as np

from trainer import shell
from trainer.checkpoint import Checkpointer
from trainer.outbox import outbox_key
from trainer.protocol import IllegalTransition, SaveCheckpoint, Send, SetTimer, SyncerCore
from trainer.tasks import task_for_run
from trainer.transport import BufferLog, ShardServer, parse_addr
from trainer.wiring import fragmenter_for, syncer_config, syncer_math


# Saves are coalesced while one is in flight, and at most one per interval (each costs
# CPU the learners share on a small machine). Durability is unchanged: only versions on
# disk are acknowledged; but an interval means a crash rolls Θ further back (learners
# follow the restarted shard to its restored version): 0.25 s measurably hurt the
# loss after a shard crash (suites/cluster/test_train_cluster.py), so it is off.
CKPT_MIN_INTERVAL_S = 0.0
KEEP_EVERY_S = 3       # besides the latest saves, the first of each 3 s of clock time is kept (the global loss curve)


class Syncer:
    def __init__(self, args):
        self.run_dir, self.name, self.incarnation = args.run_dir, args.id, args.incarnation
        self.run_info, self.cfg = shell.load_run(self.run_dir)
        topo = self.run_info["topology"]
        self.ev = shell.open_events(self.run_dir, self.name, self.incarnation)
        self.stopper = shell.Stopper()
        params = shell.global_init(task_for_run(self.cfg), self.cfg.seed)  # Θ0
        frag = fragmenter_for(self.cfg, params)
        bugs = self.bugs = frozenset(b for b in args.bugs.split(",") if b)
        self.core = SyncerCore(syncer_config(self.cfg, topo, self.name, bugs), syncer_math(self.cfg, frag))
        self.ckpt = Checkpointer(self.run_dir / "ckpt" / self.name, keep_every_s=KEEP_EVERY_S)
        restored = self.ckpt.restore()
        if restored is not None:
            self.state = self.core.restore(shell.from_ckpt(restored))
            self.ev.emit("checkpoint_restored", step=self.ckpt.latest_step(),
                         versions={str(p): v for p, v in self.state.version.items()})
        else:
            self.state = self.core.init({p: frag.get(params, p) for p in topo["shards"][self.name]})
        self.timers = shell.Timers()
        host, port = parse_addr(topo["shard_addrs"][self.name])
        self.server = ShardServer(self.name, topo["run_id"], host, port)
        self.buffer_log = BufferLog()
        self.resources = shell.ResourceLog(self.ev)
        self.saved = self.ckpt.latest_step() or 0  # checkpoint step numbers: one per save
        self.in_flight: dict | None = None          # versions of the save being written
        self.dirty = False
        self.last_save = -CKPT_MIN_INTERVAL_S

    def do(self, event: str, *args) -> None:
        self.state, actions = getattr(self.core, event)(self.state, shell.monotonic(), *args)
        shell.log_actions(self.ev, actions)
        for a in actions:
            if isinstance(a, Send):
                key = None if "unbounded_outbox" in self.bugs else outbox_key(a.msg)  # planted: plain FIFO
                nbytes = self.server.send(a.to, a.msg, key=key)
                shell.log_msg(self.ev, "send" if nbytes else "drop", a.to, a.msg, nbytes)
            elif isinstance(a, SetTimer):
                self.timers.set(a.key, a.at)
            elif isinstance(a, SaveCheckpoint):
                self.dirty = True

    def checkpoint(self) -> None:
        """Finishes a save that landed (-> durable) and starts the next if the state moved on."""
        if self.in_flight is not None and not self.ckpt.saving():
            self.ckpt.wait()  # raises if the save failed
            self.do("durable", self.in_flight)
            self.in_flight = None
        if self.dirty and self.in_flight is None and time.monotonic() - self.last_save >= CKPT_MIN_INTERVAL_S:
            self.last_save = time.monotonic()
            self.saved += 1
            self.in_flight = dict(self.state.version)
            # saved_at: when Θ was this, for the harness's global evals along the run
            self.ckpt.save(self.saved, {**shell.to_ckpt(self.core.snapshot(self.state)), "saved_at": time.time()})
            self.dirty = False

    def run(self) -> int:
        self.ev.emit("unit_up", incarnation=self.incarnation, pid=os.getpid(), addr=self.server.addr)
        while not self.stopper.stop:
            now = shell.monotonic()
            for key in self.timers.pop_due(now):
                self.do("timer", key)
            for ev in self.server.poll(self.timers.next_in(now, cap=0.05)):
                if ev.kind == "connected":
                    self.ev.emit("link_up", peer=ev.peer)
                    self.do("learner_connected", ev.peer)
                elif ev.kind == "disconnected":
                    self.ev.emit("link_down", peer=ev.peer)
                    self.do("learner_disconnected", ev.peer)
                else:
                    shell.log_msg(self.ev, "recv", ev.peer, ev.msg, ev.nbytes)
                    try:
                        self.do("receive", ev.peer, ev.msg)
                    except IllegalTransition as e:
                        self.ev.emit("drop", what=type(ev.msg).__name__, reason=f"illegal: {e}", peer=ev.peer)
            self.checkpoint()
            now = time.monotonic()
            self.resources.maybe(now)
            if self.buffer_log.due(now):  # `link_buffer` lines: at most one a second per link
                for fields in self.buffer_log.lines(now, self.server.buffers()):
                    self.ev.emit("link_buffer", **fields)
        # SIGTERM: make the final state durable before leaving
        self.dirty = self.dirty or self.in_flight is not None
        self.ckpt.wait()
        self.in_flight = None
        self.last_save = -CKPT_MIN_INTERVAL_S  # the final save is never deferred
        self.checkpoint()
        self.ckpt.wait()
        self.do("durable", self.in_flight or dict(self.state.version))
        self.ckpt.close()
        self.server.close()
        self.ev.emit("done", links={p: vars(s) for p, s in self.server.stats.items()},
                     versions={str(p): v for p, v in self.state.version.items()})
        self.ev.close()
        return 0


def main(argv=None) -> int:
    args = shell.parse_args(argv, "syncer")
    return Syncer(args).run()


if __name__ == "__main__":
    sys.exit(main())
