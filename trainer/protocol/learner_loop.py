"""A learner unit's loop, written once for the real process (trainer/units/learner.py) and the
simulator (harness/sim/learner.py).

The loop is a generator: it runs the unit's inner steps and feeds its core between
them, and wherever time has to pass it yields what it waits for. Each host carries the
waits out its own way:

- `Compute(fn)`: an inner step. The process calls fn (the step takes its wall time);
  the simulator calls fn and then lets `step_work` seconds of the unit's own time pass
  (longer while slowed, frozen while paused).
- `Idle()`: the core holds the next step back (its fetch, a staleness bound, dp's mean
  gradient): wait for the next thing a link delivers. The process polls its inbox for
  at most POLL_S, then comes back to read its control file and its stop flag.
- `Until(cond, timeout_s, through_stop)`: take what the links deliver as it arrives until
  cond() holds (None: never) or timeout_s of the unit's own time has passed (None: no
  limit); a stop ends the wait at once unless `through_stop` (the closing after a stop).
- `Spent(what)`: host work just done between two steps ("loop": the step's own
  bookkeeping, every step; "eval"; "checkpoint"). The process already spent its wall
  time on it and goes on; the simulator lets the time it models for `what` pass
  (SimParams.loop_s / eval_s / ckpt_s: 0 unless calibrated from a real run).

A stop (SIGTERM at the end of the run) ends the loop at its next check; a decoupled unit
then closes as one that ended by itself does (its last progress into Θ, waiting at most
STOP_CLOSE_S for the answers), writes its last step line, saves its final θ and exits.
The host's port is `LearnerLoopHost`.
"""
from __future__ import annotations

from dataclasses import dataclass
from typing import Any, Callable, Protocol

from diloco_chaos.trainer.numerics.step_audit import audit_fields, sampled

CKPT_EVERY = 50        # inner steps between learner checkpoints
FETCH_WAIT_S = 5.0     # at (re)start, wait this long for the global fragments before stepping
DRAIN_S = 1.0          # after the last step, keep receiving for this long
CLOSE_WAIT_S = 10.0    # a unit that ends by itself waits this long for its closing Δs' answers
STOP_CLOSE_S = 3.0     # a stopped unit's wait for them: within the harness's grace before SIGKILL
POLL_S = 0.05          # a process's longest wait on its inbox before it looks at its controls


@dataclass(frozen=True)
class Compute:
    fn: Callable[[], Any]


@dataclass(frozen=True)
class Idle:
    pass


@dataclass(frozen=True)
class Spent:
    what: str  # "loop" | "eval" | "checkpoint"


@dataclass(frozen=True)
class Until:
    cond: Callable[[], bool] | None
    timeout_s: float | None
    through_stop: bool = False


class LearnerLoopHost(Protocol):
    """What the loop reads and calls on its host (besides LearnerHost's core, state, do)."""

    cfg: Any
    step: int                 # inner steps done, this incarnation's count (restored from a checkpoint)
    opt_state: Any            # the inner optimizer's state (train_step replaces it; None: no inner_audit lines)
    live_slices: int
    max_steps: int            # the unit's own step cap (the harness ends the run before it)
    incarnation: int

    @property
    def stopping(self) -> bool: ...     # SIGTERM seen
    def pid(self) -> int | None: ...
    def open_links(self) -> None: ...
    def links_up(self) -> bool: ...     # every link connected (dp sends nothing before)
    def drain(self) -> None: ...        # feed what the links delivered to the driver, without waiting
    def read_control(self) -> None: ... # the harness's control: slices, the faults on the unit (driver.faults)
    def log_buffers(self) -> None: ...
    def train_step(self, params, step: int): ...  # -> (params, tokens, loss): one inner AdamW step
    def grad_step(self, params, step: int): ...   # dp -> (grads as numpy, tokens, loss)
    def step_line(self, **fields) -> None: ...    # the `step` line (a process writes it a step late)
    def flush_step_line(self) -> None: ...
    def evaluate(self, params) -> float: ...
    def save(self, final: bool = False) -> None: ...
    def saved_step(self) -> int: ...    # the newest save's step, finalized or in flight (0: none)
    def close(self, finished: bool) -> None: ...


def learner_loop(h):
    """The unit from `unit_up` to `done`: a generator of waits (see the module docstring)."""
    dp = h.cfg.diloco.mode in ("dp", "elastic_dp")
    h.emit("unit_up", incarnation=h.incarnation, pid=h.pid(), step=h.step)
    h.open_links()
    h.do("start")
    # DiLoCo modes wait for the global fragments; dp for its links (a gradient
    # sent before the link's `connected` event is handled would be sent twice)
    yield Until(lambda: not (h.state.awaiting or (dp and not h.links_up())), FETCH_WAIT_S)
    h.drain()
    closes = h.cfg.diloco.mode == "decoupled"  # its last progress goes to Θ first (`finish`)
    first, start = True, h.step  # the incarnation's first step with lr > 0: an inner_audit line (trainer/numerics/step_audit.py)
    # planted `batch_of_incarnation`: batches keyed by the incarnation's own count, so a restarted
    # unit draws its first batches again; `batch_off_by_one`: each step draws the next step's
    # batch (1-based steps taken for 0-based). The inner_audit's judge draws them by the global step.
    bugs = getattr(getattr(h.core, "config", None), "bugs", frozenset())
    key_from = (start if "batch_of_incarnation" in bugs else 0) - (1 if "batch_off_by_one" in bugs else 0)
    while h.step < h.max_steps and not h.stopping:
        h.drain()
        h.read_control()
        h.driver.faults.step(h)  # `before_step` hooks of the faults on the unit (trainer/protocol/unit_faults.py)
        h.log_buffers()
        if h.core.must_wait(h.state):
            yield Idle()
            continue
        t0 = h.now()
        params = h.core.params(h.state)
        step = h.grad_step if dp else h.train_step
        audit = not dp and h.opt_state is not None and sampled(h.step + 1, first and h.step > 0)
        opt_before, first = h.opt_state, first and h.step == 0  # a cold start's step 1 has lr 0: its step 2 is audited
        out = yield Compute(lambda: step(params, h.step - key_from))
        if out is None:  # stopped mid-step where time no longer runs (the simulator's teardown)
            break
        if dp:
            grads, tokens, loss = out
            h.driver.grads_ready(grads, tokens, h.now() - t0)
            if h.core.must_wait(h.state):  # the mean gradient comes back through the inbox
                yield Until(lambda: not h.core.must_wait(h.state), None)
        else:
            before, (params, tokens, loss) = params, out
            h.driver.stepped(before, params)
            h.do("after_inner_step", params, tokens, h.now() - t0)
        h.step += 1
        if audit:
            h.emit("inner_audit", **audit_fields(h.step, h.live_slices, before, params, opt_before, h.opt_state))
        h.step_line(step=h.step, tokens=tokens, loss=loss, dt=round(h.now() - t0, 6), live_slices=h.live_slices)
        yield Spent("loop")
        if (h.step % h.cfg.eval_every == 0 or h.step == h.cfg.steps) and not (closes and h.step >= h.max_steps):
            h.emit("eval", step=h.step, loss=h.evaluate(h.core.params(h.state)))
            yield Spent("eval")
        if h.step % CKPT_EVERY == 0:
            h.save()
            yield Spent("checkpoint")
    if closes and (h.step >= h.max_steps or h.stopping):  # ended by itself or stopped: the closing Δs
        stopped = h.stopping  # the run's end: a shorter wait, within the harness's grace
        h.do("finish")
        yield Until(lambda: h.core.closed(h.state), STOP_CLOSE_S if stopped else CLOSE_WAIT_S, through_stop=stopped)
        if h.step >= h.max_steps:  # then its own final eval (a stopped run's is the harness's, of Θ)
            h.emit("eval", step=h.step, loss=h.evaluate(h.core.params(h.state)), closed=h.core.closed(h.state))
            yield Spent("eval")
    h.flush_step_line()
    yield Until(None, 0.0 if h.stopping else DRAIN_S)
    if h.step > h.saved_step():
        h.save(final=True)  # the final θ (the data-parallel baseline's global model)
    h.close(finished=h.step >= h.cfg.steps)
