"""A learner unit as a process: `python -m trainer.learner --run-dir D --id learner-2`.

It runs inner AdamW steps on its own data shard and never blocks on the network
(decoupled mode): links to the syncer shards live in background threads and what
they receive is fed to the LearnerCore between two inner steps. It checkpoints
its own θ, inner optimizer state and step counter with orbax; after a restart it
restores them and the core fetches every current global fragment Θ[p].
"""
from __future__ import annotations

import json
import os
import queue
import shutil
import sys
import tempfile
import time
from pathlib import Path

import jax
import numpy as np

from diloco_chaos.trainer.numerics.checkpoint import Checkpointer, why_failed
from diloco_chaos.trainer.numerics.inner import make_inner, opt_state_to_tree, state_digests
from diloco_chaos.trainer.numerics.tally import step_tally
from diloco_chaos.trainer.numerics.tasks import task_for_run
from diloco_chaos.trainer.numerics.wiring import fragmenter_for, learner_config, learner_math, logged_combiner
from diloco_chaos.trainer.protocol.learner_core import LearnerCore
from diloco_chaos.trainer.protocol.learner_driver import LearnerDriver, LearnerHost
from diloco_chaos.trainer.protocol.learner_loop import POLL_S, Compute, Idle, Spent, learner_loop
from diloco_chaos.trainer.protocol.outbox import outbox_key
from diloco_chaos.trainer.protocol.protocol_base import DP_MODES
from diloco_chaos.trainer.protocol.sdc import Corrupter
from diloco_chaos.trainer.protocol.unit_faults import UnitFaults
from diloco_chaos.trainer.units import shell
from diloco_chaos.trainer.wire import auth
from diloco_chaos.trainer.wire.flow import BufferLog
from diloco_chaos.trainer.wire.shard_link import ShardLink

# Leaving, how long the unit waits for its shards to have read what it sent last (its
# closing Δs): inside the harness's grace before SIGKILL (STOP_CLOSE_S + 5 s), after the
# wait of up to STOP_CLOSE_S for their answers.
LEAVE_DRAIN_S = 2.0



class Learner(LearnerHost):
    def __init__(self, args):
        self.run_dir, self.name, self.incarnation = args.run_dir, args.id, args.incarnation
        self.run_info, self.cfg = shell.load_run(self.run_dir)
        topo = self.run_info["topology"]
        self.index = topo["learners"].index(self.name)
        self.ev = shell.open_events(self.run_dir, self.name, self.incarnation)
        self.stopper = shell.Stopper()
        # The links connect while the unit restores (held until `open_links`: the core
        # sees each link once it is ready for it); a restart's boot overlaps the two.
        self.inbox: queue.Queue = queue.Queue()
        secret = auth.secret_from_env()
        self.links = {shard: ShardLink(self.name, shard, addr, topo["run_id"], self.inbox, secret=secret)
                      for shard, addr in topo["links"][self.name].items()}
        for link in self.links.values():
            link.start(hold=True)
        self.task, self.eval_batches, params, self.inner = shared(self.cfg)  # params: Θ0
        self.opt_state = self.inner.init(params)
        self.frag = fragmenter_for(self.cfg, params)
        self.ckpt = Checkpointer(self.run_dir / "ckpt" / self.name, start_in_thread=True)
        self.step, self.pending_step = 0, None
        # The harness ends the run (SIGTERM) once the job's token budget is spent,
        # whoever trained it; the step cap only bounds a learner run on its own.
        self.max_steps = int(self.run_info.get("max_steps_factor", 1.0) * self.cfg.steps)
        # the newest intact save: one without its manifest, that does not load or whose bytes
        # differ from it is passed over, with a `checkpoint_skipped` line (trainer/numerics/checkpoint.py)
        _, restored, skipped = self.ckpt.restore_verified(like={"params": params, "opt": opt_state_to_tree(self.opt_state),
                                                                "step": np.int64(0)})
        for s in skipped:
            self.ev.emit("checkpoint_skipped", step=s["step"], why=s["why"])
        if restored is not None:
            params = restored["params"]
            self.opt_state = self.inner.opt_state_from_tree(params, restored["opt"])
            self.step = int(restored["step"])
            self.ev.emit("checkpoint_restored", step=self.step, digests=state_digests(params, self.opt_state))
        bugs = self.bugs = frozenset(b for b in args.bugs.split(",") if b)
        lmath = learner_math(self.cfg, self.frag)
        core = LearnerCore(learner_config(self.cfg, topo, self.name, self.incarnation, bugs), lmath)
        tally = step_tally(self.cfg, self.frag)  # what its inner steps did (trainer/numerics/tally.py)
        self.driver = LearnerDriver(core, core.init(params), self,
                                    Corrupter(self.cfg.seed, self.index, self.incarnation),  # the `corrupt` fault
                                    self.cfg.diloco.slices, tally, UnitFaults())
        self.control_mtime, self.control_live, self.control = 0.0, None, {}
        self.control_read_at = 0.0
        if shell.control_on_stdin():  # the harness's control messages
            shell.follow_control(self.run_dir, self.name)
        self.buffer_log = BufferLog()
        self.resources = shell.ResourceLog(self.ev)
        self.combine = logged_combiner(self.cfg, self.ev.emit)  # two unsent Δs of p waiting on a link

    # --- the LearnerPort (trainer/protocol/learner_driver.py), and the driver's state as the loop reads it
    def now(self) -> float:
        return shell.monotonic()

    def send(self, to: str, msg) -> int:
        key = None if "unbounded_outbox" in self.bugs else outbox_key(msg)  # planted: plain FIFO
        return self.links[to].send(msg, key=key, combine=self.combine)

    def emit(self, kind: str, **fields) -> None:
        if kind == "unit_up":  # when the process started: the unit's own start, for the run's pace
            fields["started"] = shell.process_started()
        self.ev.emit(kind, **fields)

    def apply_grads(self, params, grads):
        params, self.opt_state = self.inner.apply_grads(params, self.opt_state, grads)
        return params

    def after_event(self, event: str, args: tuple) -> None:
        pass

    def drain(self, timeout_s: float = 0.0) -> None:
        """Feeds everything the links received to the core; waits up to timeout_s for the first."""
        try:
            ev = self.inbox.get(timeout=timeout_s) if timeout_s > 0 else self.inbox.get_nowait()
        except queue.Empty:
            return
        while True:
            if ev.kind == "refused":  # the shard did not prove the run's secret: nothing to feed
                self.ev.emit("auth_refused", peer=ev.peer, reason=ev.msg)
            else:
                self.driver.handle(ev.kind, ev.peer, ev.msg, ev.nbytes, at=ev.at)
            try:
                ev = self.inbox.get_nowait()
            except queue.Empty:
                return

    def log_buffers(self) -> None:
        """`link_buffer` lines (at most one a second per link, while bytes wait on it); one
        clock read per call otherwise."""
        now = time.monotonic()
        self.resources.maybe(now)
        if self.buffer_log.due(now):
            for fields in self.buffer_log.lines(now, {s: link.buffer() for s, link in self.links.items()}):
                self.ev.emit("link_buffer", **fields)

    def read_control(self) -> None:
        """control/<name>.json, the last control message (trainer/units/shell.py `follow_control`):
        the faults on the unit (`faults`: the driver's dict, trainer/protocol/unit_faults.py), and live
        slices (kill_slice), told the core here, between two steps."""
        self.poll_control()
        live = self.control.get("live_slices")
        if live is not None and live != self.control_live:  # (not when only the faults changed)
            from diloco_chaos.trainer.protocol.messages import SliceControl
            self.control_live = live = int(live)
            self.do("receive", "harness", SliceControl(max(1, min(live, self.cfg.diloco.slices))))

    def poll_control(self) -> None:
        """Reads the control file if it changed: the faults on the unit take effect at once
        (what a cleared one held leaves); also while the loop waits, every POLL_S."""
        self.control_read_at = time.monotonic()
        path = self.run_dir / "control" / f"{self.name}.json"
        try:
            mtime = path.stat().st_mtime
        except FileNotFoundError:
            return
        if mtime != self.control_mtime:
            self.control_mtime = mtime
            self.control = json.loads(path.read_text())
            self.driver.faults.update(self.control.get("faults", {}))

    # --- the loop (trainer/protocol/learner_loop.py), carried out with threads and wall time -----------
    def run(self) -> int:
        loop, value = learner_loop(self), None
        while True:
            try:
                wait = loop.send(value)
            except StopIteration:
                return 0
            value = self.wait(wait)

    def wait(self, w):
        if isinstance(w, Compute):
            return w.fn()
        if isinstance(w, Idle):
            self.drain(timeout_s=POLL_S)
            self.poll_control()
            return None
        if isinstance(w, Spent):  # its wall time is spent already
            return None
        deadline = time.monotonic() + (w.timeout_s if w.timeout_s is not None else float("inf"))
        while (not (w.cond is not None and w.cond()) and not (self.stopper.stop and not w.through_stop)
               and time.monotonic() < deadline):
            self.drain(timeout_s=POLL_S)
            if time.monotonic() - self.control_read_at >= POLL_S:
                self.poll_control()
        return None

    @property
    def stopping(self) -> bool:
        return self.stopper.stop

    def pid(self) -> int:
        return os.getpid()

    def open_links(self) -> None:
        for link in self.links.values():
            link.release()

    def links_up(self) -> bool:
        return all(link.up for link in self.links.values())

    def train_step(self, params, step: int):
        batch = self.task.batch(self.index, step)
        params, self.opt_state, metrics = self.inner.step(params, self.opt_state, batch, range(self.live_slices))
        return params, int(metrics["tokens"]), metrics["loss"]

    def grad_step(self, params, step: int):
        grads, metrics = self.inner.grad(params, self.task.batch(self.index, step), range(self.live_slices))
        return jax.tree.map(np.asarray, grads), int(metrics["tokens"]), metrics["loss"]

    def step_line(self, **fields) -> None:
        """Metrics reach the host one step late, so the device is never waited on for a log line."""
        self.flush_step_line()
        self.pending_step = {"t": time.time(), **fields}

    def flush_step_line(self) -> None:
        if self.pending_step is not None:
            self.ev.emit("step", **{**self.pending_step, "loss": float(self.pending_step["loss"])})
            self.pending_step = None

    def evaluate(self, params) -> float:
        return self.inner.evaluate(params, self.eval_batches)

    def saved_step(self) -> int:  # a save still in flight counts: its step is taken
        return self.ckpt.last_saved or 0

    def save(self, final: bool = False) -> None:  # orbax: durable when its async write ends
        """A save of θ, the inner state and the step. A failed save (a full disk, an I/O error:
        orbax raises it at the next save, wait or close) is never fatal: `checkpoint_failed`
        names it and this save is tried once more on a fresh manager; a restart then restores
        the newest save that landed."""
        durable = self.ckpt.latest_step() or 0  # the newest finalized save, before this one starts
        params = self.core.params(self.state)
        tree = {"params": jax.tree.map(np.asarray, params), "opt": opt_state_to_tree(self.opt_state),
                "step": np.int64(self.step)}
        try:
            self.ckpt.save(self.step, tree)
        except Exception as e:  # noqa: BLE001 - the previous save's failure, surfacing here
            self.storage_failed(e)
            try:
                self.ckpt.save(self.step, tree)
            except Exception as e2:  # noqa: BLE001 - this one's own start failed too
                self.storage_failed(e2, step=self.step)
                return
        self.ev.emit("checkpoint_saved", step=self.step, durable=durable,
                     digests=state_digests(params, self.opt_state))

    def storage_failed(self, e: Exception, step: int | None = None) -> None:
        self.ev.emit("checkpoint_failed", step=step, error=why_failed(e))
        self.ckpt.recover()

    def close(self, finished: bool) -> None:
        deadline = time.monotonic() + LEAVE_DRAIN_S  # what was sent reaches the shards first
        for link in self.links.values():
            link.drain(deadline)
        for link in self.links.values():
            link.close()
        stats = {s: vars(link.stats) for s, link in self.links.items()}
        try:
            self.ckpt.close()
        except Exception as e:  # noqa: BLE001 - the last save did not land: a restart takes an older one
            self.ev.emit("checkpoint_failed", step=self.ckpt.last_saved, error=why_failed(e))
        self.ev.emit("done", step=self.step, finished=finished, links=stats)
        self.ev.close()


def shared(cfg):
    """What every learner of the run builds alike: the task, its eval batches, Θ0 (the same
    everywhere) and the inner loop; once per process (a warm spare builds it early)."""
    def build():
        task = task_for_run(cfg)
        return task, task.eval_batches(), shell.global_init(task, cfg.seed), make_inner(cfg, task.loss_fn)
    return shell.warm("learner", build)


def warm_up(run_dir) -> None:
    """A spare's preparation: `shared`, and one of each program the unit runs compiled
    (an inner step on every slice, or dp's gradient and update; the eval; the fragment
    operations a fetch and a contribution use; the step tally's gather)."""
    _, cfg = shell.load_run(run_dir)
    task, evals, params, inner = shared(cfg)
    frag = fragmenter_for(cfg, params)
    math = learner_math(cfg, frag)
    for p in range(cfg.n_fragments):
        x = frag.get(params, p)
        jax.block_until_ready(frag.rebase(frag.set(params, p, x), p, x, x))
        math.pseudo_grad_payload(x, x)
    opt, batch = inner.init(params), task.batch(0, 0)
    if cfg.diloco.mode in DP_MODES:
        grads, _ = inner.grad(params, batch)
        jax.block_until_ready(inner.apply_grads(params, opt, jax.tree.map(np.asarray, grads)))
    else:
        stepped, _, _ = inner.step(params, opt, batch)
        step_tally(cfg, frag).record(1, stepped, stepped)  # its gather, compiled for θ on every slice
        jax.block_until_ready(stepped)
    inner.evaluate(params, evals)
    # orbax's first save and restore in a process build its handlers and threads: done
    # here on a checkpoint of the unit's shape, a restart's restore finds them ready
    # (under load that first restore took 0.1-0.3 s of a 0.2-0.5 s recovery)
    (Path(run_dir) / "spares").mkdir(exist_ok=True)
    scratch = Path(tempfile.mkdtemp(prefix="warm-", dir=Path(run_dir) / "spares"))
    try:
        with Checkpointer(scratch, start_in_thread=True) as ckpt:
            tree = {"params": jax.tree.map(np.asarray, params), "opt": opt_state_to_tree(opt), "step": np.int64(0)}
            ckpt.save(0, tree)
            ckpt.wait()
            ckpt.restore(0, like=tree)
    finally:
        shutil.rmtree(scratch, ignore_errors=True)


def main(argv=None) -> int:
    args = shell.parse_args(argv, "learner")
    shell.stream_events()  # (stream mode: stdout carries event lines only, from the start)
    if args.spare is not None:
        warm_up(args.run_dir)
        if shell.await_identity(args) is None:
            return 0
    return Learner(args).run()


if __name__ == "__main__":
    sys.exit(main())
