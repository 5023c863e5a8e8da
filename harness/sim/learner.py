"""A learner unit in the simulator: the loop of trainer/protocol/learner_loop.py in virtual time.

The same loop, the same LearnerCore, the same driver carrying out its actions and
handling what the links deliver (trainer/protocol/learner_driver.py), the same inner AdamW step
(trainer/numerics/inner.py) and the same event lines as the process (trainer/units/learner.py); what
the process does with threads and wall time is done here with the world's clock:

- compute time (the loop's `Compute`): each inner step costs `world.step_work(index)`
  seconds of the unit's own time, which runs at `rate` (1, a slow_unit's speed, 0 while
  paused); the step's numbers are real JAX, computed when the step starts;
- the inbox: what the links deliver waits in `inbox` and is fed to the core between two
  steps (`drain`), as the process does; while the loop waits (`Idle`, `Until`: its
  fetch, a streaming/dp block, the final drain) it is fed as it arrives;
- checkpoints: every CKPT_EVERY steps a snapshot (θ, inner state, step) becomes
  durable `ckpt_save_s` later, unless the process dies first (one that exits by
  itself waits for it, as orbax's close does); a restart restores the latest durable one;
- a crash: an exception out of the core, the driver or the loop kills the incarnation as
  the traceback kills the process (`unit_down` reason `crashed`, the world's `crashes`,
  which the run's header carries for `no_crash`), and no one restarts it.
"""
from __future__ import annotations

import functools
import traceback

import jax
import numpy as np

from diloco_chaos.trainer.numerics.inner import state_digests
from diloco_chaos.trainer.numerics.tally import step_tally
from diloco_chaos.trainer.numerics.wiring import learner_config, logged_combiner
from diloco_chaos.trainer.protocol.learner_core import LearnerCore
from diloco_chaos.trainer.protocol.learner_driver import LearnerDriver, LearnerHost
from diloco_chaos.trainer.protocol.learner_loop import Compute, Idle, Spent, Until, learner_loop
from diloco_chaos.trainer.protocol.messages import SliceControl
from diloco_chaos.trainer.protocol.sdc import Corrupter
from diloco_chaos.trainer.protocol.unit_faults import UnitFaults


def _dies_on_error(method):
    """Every way into the process's own code (its loop, its inbox, its start) ends the
    incarnation on an exception, as an uncaught one ends the process (trainer/units/learner.py)."""
    @functools.wraps(method)
    def guarded(self, *args, **kwargs):
        try:
            return method(self, *args, **kwargs)
        except Exception as exc:  # noqa: BLE001: the process's traceback, made a crash
            self.crash(exc)
    return guarded


class LearnerProc(LearnerHost):
    """One incarnation of a learner unit (a process, from spawn to death or exit)."""

    def __init__(self, unit: "SimLearner", incarnation: int, startup_s: float | None = None):
        self.unit, self.world, self.incarnation = unit, unit.world, incarnation
        self.alive, self.phase = True, "starting"
        self.paused, self.speed = False, 1.0
        self.inbox: list[tuple] = []
        self.timer = None  # (handle, work_left_s, set_at, fn): the one pending own-time wait
        self.control_seen = 0
        self.waiting = None  # what the loop waits for (trainer/protocol/learner_loop.py)
        self.stopping = False
        self.max_steps, self.cfg = self.world.max_steps, self.world.cfg
        self.driver: LearnerDriver | None = None
        self.combine = logged_combiner(self.world.cfg, self.emit)  # two unsent Δs of p waiting on a link
        self.wait_own(self.world.params.learner_startup_s if startup_s is None else startup_s, self.started)

    # --- own time: a paused or slowed process runs its waits slower ----------------------
    @property
    def rate(self) -> float:
        return 0.0 if self.paused else self.speed

    def wait_own(self, work_s: float, fn) -> None:
        self.cancel_wait()
        self.timer = (None, work_s, self.world.now, fn)
        self._arm()

    def cancel_wait(self) -> None:
        if self.timer is not None and self.timer[0] is not None:
            self.timer[0].cancel()
        self.timer = None

    def _arm(self) -> None:
        _, left, _, fn = self.timer
        handle = self.world.clock.at(self.world.now + left / self.rate, self._fire, fn) if self.rate > 0 else None
        self.timer = (handle, left, self.world.now, fn)

    def _fire(self, fn) -> None:
        self.timer = None
        fn()

    def set_rate(self, paused: bool | None = None, speed: float | None = None) -> None:
        if self.timer is not None:
            handle, left, since, fn = self.timer
            if handle is not None:
                handle.cancel()
            self.timer = (None, left - (self.world.now - since) * self.rate, self.world.now, fn)
        self.paused = self.paused if paused is None else paused
        self.speed = self.speed if speed is None else speed
        if self.timer is not None:
            self._arm()
        if not self.paused:
            self.inbox_arrived()

    # --- events from the world -----------------------------------------------------------
    def inbox_put(self, item: tuple) -> None:
        self.inbox.append(item)
        self.inbox_arrived()

    @_dies_on_error
    def inbox_arrived(self) -> None:
        """What the process does when something lands while it is blocked on its inbox."""
        if self.paused or not self.inbox or not self.alive:
            return
        if isinstance(self.waiting, Idle):
            self.resume()
        elif isinstance(self.waiting, Until):
            self.drain()
            if self.waiting.cond is not None and self.waiting.cond():
                self.cancel_wait()
                self.resume()

    def kill(self) -> None:
        self.alive, self.phase = False, "dead"
        self.cancel_wait()
        self.world.net.learner_stopped(self.unit.name)

    def crash(self, exc: Exception) -> None:
        """Died of its own exception: what the harness's watch records of a process that exits
        non-zero (the process runner's watch), with the traceback's tail."""
        if not self.alive:
            return
        self.kill()
        tail = "".join(traceback.format_exception(exc)[-3:])
        self.world.crashes.append({"unit": self.unit.name, "incarnation": self.incarnation, "rc": 1,
                                   "stdout_tail": tail})
        self.world.emit("unit_down", self.unit.name, reason="crashed", rc=1)
        self.unit.exited()

    # --- the process: trainer/protocol/learner_loop.py in virtual time --------------------------------
    @_dies_on_error
    def started(self) -> None:
        unit, w = self.unit, self.world
        m = w.model
        params, self.opt_state, self.step = m.params0, m.inner.init(m.params0), 0
        if unit.ckpt is not None:
            params, self.opt_state, self.step = unit.ckpt
            self.emit("checkpoint_restored", step=self.step, digests=state_digests(params, self.opt_state))
        self.last_save, self.saving = self.step, None  # the newest save's step (written or not), its snapshot if not
        core = LearnerCore(learner_config(w.cfg, w.topology, unit.name, self.incarnation, w.learner_bugs), m.lmath)
        self.driver = LearnerDriver(core, core.init(params), self,
                                    Corrupter(w.cfg.seed, unit.index, self.incarnation),  # the `corrupt` fault
                                    w.cfg.diloco.slices, step_tally(w.cfg, m.frag),
                                    UnitFaults(unit.faults))  # the unit's own dict: what the world sets
        self.phase, self.loop = "running", learner_loop(self)
        self.resume()

    @_dies_on_error
    def resume(self, value=None) -> None:
        """Runs the loop up to its next wait that takes time, and sets that wait up."""
        self.waiting = None
        while self.alive:
            try:
                w = self.loop.send(value)
            except StopIteration:
                return
            value = None
            if isinstance(w, Compute):
                self.opt_undo = self.opt_state  # a stop mid-step gives the step up: its optimizer state too
                out = w.fn()  # real JAX now; the step's time passes on the unit's own clock
                self.waiting = w
                self.wait_own(self.world.step_work(self.unit.index), lambda: self.resume(out))
                return
            if isinstance(w, Spent):  # loop, eval or checkpoint: what a calibrated run measured
                spent = {"loop": self.world.params.loop_s, "eval": self.world.params.eval_s,
                         "checkpoint": self.world.params.ckpt_s}[w.what]
                if spent <= 0 or self.stopping:
                    continue
                self.waiting = w
                self.wait_own(spent, self.resume)
                return
            if isinstance(w, Until):
                if (self.stopping and not w.through_stop) or (w.timeout_s is not None and w.timeout_s <= 0):
                    continue
                self.drain()
                if w.cond is not None and w.cond():
                    continue
                self.waiting = w
                if w.timeout_s is not None:
                    self.wait_own(w.timeout_s, self.resume)
                return
            if self.stopping:  # Idle
                continue
            self.waiting = w
            return

    def stop(self) -> None:
        """SIGTERM at the end of the run: the loop ends at its next check. A step in progress
        is given up (the loop is told so); then a decoupled unit closes, while World.close runs
        virtual time for it within the processes' grace."""
        if self.phase == "starting":  # still importing: the default handler kills it
            self.kill()
            self.unit.exited()
            return
        self.stopping = True
        if isinstance(self.waiting, Compute):  # the step computed at its start is given up, its
            self.opt_state = self.opt_undo     # Adam state with it (a save must not pair θ at step s
        self.cancel_wait()                     # with the optimizer of step s + 1: inner_steps_reexecuted)
        self.resume()

    # --- the LearnerLoopHost ------------------------------------------------------------------
    def pid(self) -> None:
        return None  # the sim has no pids

    def open_links(self) -> None:
        self.world.net.learner_started(self.unit.name)

    def links_up(self) -> bool:
        return all(link.conn is not None and not link.conn.closed
                   for link in self.world.net.links.values() if link.learner == self.unit.name)

    def log_buffers(self) -> None:
        pass

    def _batch(self, step: int):
        m = self.world.model
        batch = m.task.batch(self.unit.index, step)
        batch = batch[: batch.shape[0] * self.live_slices // m.slices]  # the live slices' share
        return batch, batch.shape[0] * m.tokens_per_row

    def train_step(self, params, step: int):
        batch, tokens = self._batch(step)
        params, self.opt_state, loss = self.world.model.step(params, self.opt_state, batch)
        return params, tokens, loss

    def grad_step(self, params, step: int):
        batch, tokens = self._batch(step)
        grads, loss = self.world.model.grad(params, batch)
        return jax.tree.map(np.asarray, grads), tokens, loss

    def step_line(self, **fields) -> None:
        w = self.world
        self.emit("step", **{**fields, "loss": float(fields["loss"])})
        w.tokens += fields["tokens"]
        w.first_step.setdefault(self.unit.name, w.now)

    def flush_step_line(self) -> None:
        pass

    def evaluate(self, params) -> float:
        return self.world.model.evaluate(params)

    def saved_step(self) -> int:  # a save still in flight counts, as on a process (orbax's steps must increase)
        return self.last_save

    def save(self, final: bool = False) -> None:
        snap = (self.core.params(self.state), self.opt_state, self.step)
        self.last_save = self.step
        self.emit("checkpoint_saved", step=self.step, durable=self.unit.ckpt[2] if self.unit.ckpt is not None else 0,
                  digests=state_digests(snap[0], snap[1]))
        if final:  # the process waits for it, and for a save before it, before it exits
            self.unit.ckpt, self.saving = snap, None
        else:
            self.saving = snap
            self.world.clock.at(self.world.now + self.world.params.ckpt_save_s, self._durable, snap)

    def _durable(self, snap) -> None:
        if self.alive:  # an async save dies with its process; never an older one over a newer
            if self.unit.ckpt is None or snap[2] > self.unit.ckpt[2]:
                self.unit.ckpt = snap
            if self.saving is snap:
                self.saving = None

    def close(self, finished: bool) -> None:
        """The end of the loop: links close, a save in flight is finished (the process waits
        for it, trainer/numerics/checkpoint.py `close`), the unit has exited."""
        if self.saving is not None:
            self._durable(self.saving)
        self.alive, self.phase = False, "exited"
        self.cancel_wait()
        self.world.net.learner_stopped(self.unit.name)
        links = {link.shard: vars(link.stats) for link in self.world.net.links.values()
                 if link.learner == self.unit.name}
        self.emit("done", step=self.step, finished=finished, links=links)
        self.unit.exited()

    # --- the LearnerPort, and the driver's state as the loop reads it ------------------------
    def now(self) -> float:
        return self.world.now

    def send(self, to: str, msg) -> int:
        return self.world.net.learner_send(self.unit.name, to, msg, combine=self.combine)

    def apply_grads(self, params, grads):
        params, self.opt_state = self.world.model.inner.apply_grads(params, self.opt_state, grads)
        return params

    def after_event(self, event: str, args: tuple) -> None:
        if self.world.probe is not None:  # tests look at the core's state after each event
            self.world.probe(self, event, args)

    def drain(self) -> None:
        while self.inbox and self.alive:
            self.driver.handle(*self.inbox.pop(0))

    def read_control(self) -> None:
        unit = self.unit
        if unit.control_version != self.control_seen:
            self.control_seen = unit.control_version
            S = self.world.cfg.diloco.slices
            self.do("receive", "harness", SliceControl(max(1, min(unit.control, S))))

    def emit(self, kind: str, **fields) -> None:
        self.world.emit(kind, self.unit.name, **fields)


class SimLearner:
    """A learner unit across its incarnations: what survives a process (its durable
    checkpoint, the harness's control file: slices, the faults on it)."""

    def __init__(self, world, name: str, index: int):
        self.world, self.name, self.index = world, name, index
        self.incarnation = -1
        self.proc: LearnerProc | None = None
        self.ckpt = None  # (params, opt_state, step), the latest durable save
        self.control, self.control_version = None, 0
        self.faults: dict[str, dict] = {}  # the faults on the unit by kind (trainer/protocol/unit_faults.py)

    def spawn(self, startup_s: float | None = None) -> None:
        self.incarnation += 1
        self.proc = LearnerProc(self, self.incarnation, startup_s)

    def kill(self) -> None:
        if self.proc is not None:
            self.proc.kill()
            self.proc = None

    def exited(self) -> None:
        self.proc = None

    def set_control(self, live_slices: int) -> None:
        self.control, self.control_version = live_slices, self.control_version + 1
