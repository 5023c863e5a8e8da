"""What a learner unit does with its core's actions and with what its links deliver,
the same code for a real process (trainer/units/learner.py) and the simulator
(harness/sim/learner.py).

The LearnerCore decides; the driver carries out its actions over a host port:
a Send leaves through the host's link, past the `before_send` hooks of the faults on
the unit (trainer/protocol/unit_faults.py: the `corrupt` fault's corruption happens in the unit,
before the wire), an ApplyGrads
(data-parallel: the mean gradient came back) is applied by the host's inner optimizer
and fed back as the inner step, a SetSlices changes how many slices the next step uses.
`handle` is one item of the inbox: a link up or down, or a message. The loop around it
(when to step, when to drain) is trainer/protocol/learner_loop.py, also shared; how time passes
stays with each host: threads and wall time in the process, the virtual clock in the
simulator.
"""
from __future__ import annotations

from typing import Protocol

from diloco_chaos.trainer.numerics.tally import StepTally, b64
from diloco_chaos.trainer.protocol.learner_core import LearnerCore
from diloco_chaos.trainer.protocol.learner_types import LearnerState
from diloco_chaos.trainer.protocol.messages import describe
from diloco_chaos.trainer.protocol.protocol_base import ApplyGrads, IllegalTransition, Log, Send, SetSlices
from diloco_chaos.trainer.protocol.sdc import Corrupter
from diloco_chaos.trainer.protocol.unit_faults import UnitFaults


class LearnerPort(Protocol):
    """What a host offers the driver."""

    def now(self) -> float: ...                           # the clock the core reads (seconds)
    def send(self, to: str, msg) -> int: ...              # bytes framed; 0: dropped (no link)
    def emit(self, kind: str, **fields) -> None: ...      # one event-log line from this unit
    def apply_grads(self, params, grads): ...             # dp: the inner optimizer's update -> new params
    def after_event(self, event: str, args: tuple) -> None: ...  # after each core event (sim probes)


class LearnerDriver:
    def __init__(self, core: LearnerCore, state: LearnerState, port: LearnerPort, corrupter: Corrupter,
                 live_slices: int, tally: StepTally | None = None, faults: UnitFaults | None = None):
        self.core, self.state, self.port, self.sdc = core, state, port, corrupter
        self.faults = UnitFaults() if faults is None else faults  # the faults on the unit now, their hooks
        self.live_slices = live_slices
        self.tally = tally  # what the inner steps did, beside the core (trainer/numerics/tally.py)
        self.dp_tokens, self.dp_dt = 0, 0.0   # the dp step whose mean gradient is awaited

    def grads_ready(self, grads, tokens: int, dt: float) -> None:
        """dp: this step's gradient is computed; its tokens and time go with the applied step."""
        self.dp_tokens, self.dp_dt = tokens, dt
        self.do("grads_ready", grads, tokens)

    def handle(self, kind: str, peer: str, msg=None, nbytes: int = 0, at: float | None = None) -> None:
        """One inbox item from a link to shard `peer`; `at`: when the link saw it, if the
        host's link says (the line's `at`; its `t` is when the loop handled it)."""
        when = {} if at is None else {"at": at}
        if kind == "connected":
            self.port.emit("link_up", peer=peer)
            self.do("shard_connected", peer)
        elif kind == "disconnected":
            self.port.emit("link_down", peer=peer, **when)
            self.do("shard_disconnected", peer)
        else:
            self.port.emit("recv", peer=peer, bytes=nbytes, **describe(msg), **when)
            try:
                self.do("receive", peer, msg)
            except IllegalTransition as e:
                self.port.emit("drop", what=type(msg).__name__, reason=f"illegal: {e}", peer=peer)

    def stepped(self, before, after) -> None:
        """The next inner step took θ from `before` to `after` (called before the core hears
        of it; counted as the core counts, from 0 in each incarnation)."""
        if self.tally is not None:
            self.tally.record(self.state.step + 1, before, after)
            self.tally.forget_before(min(self.state.anchor_step, default=0))

    def _progress(self, fields: dict) -> dict:
        """A `contribute` line's `progress`: the Δ its claimed steps make by the tally."""
        if self.tally is None:
            return fields
        x = self.tally.progress(fields["fragment"], fields["from_step"], fields["to_step"])
        return {**fields, "progress": None if x is None else b64(x)}

    def do(self, event: str, *args) -> None:
        port = self.port
        self.state, actions = getattr(self.core, event)(self.state, port.now(), *args)
        port.after_event(event, args)
        for a in actions:
            if isinstance(a, Log):
                port.emit(a.kind, **(self._progress(a.fields) if a.kind == "contribute" else a.fields))
        for a in actions:
            if isinstance(a, Send):
                self.faults.send(self, a.msg, lambda msg, to=a.to: self._send(to, msg))
            elif isinstance(a, ApplyGrads):
                params = port.apply_grads(self.core.params(self.state), a.grads)
                self.do("after_inner_step", params, self.dp_tokens, self.dp_dt)
            elif isinstance(a, SetSlices):
                self.live_slices = a.live_slices


    def _send(self, to: str, msg) -> None:
        nbytes = self.port.send(to, msg)
        self.port.emit("send" if nbytes else "drop", peer=to, bytes=nbytes, **describe(msg), at_step=self.state.step)


class LearnerHost:
    """A host's view of its driver, as its loop reads it (mixed into both hosts)."""

    driver: LearnerDriver

    @property
    def core(self) -> LearnerCore:
        return self.driver.core

    @property
    def state(self) -> LearnerState:
        return self.driver.state

    @property
    def live_slices(self) -> int:
        return self.driver.live_slices

    def do(self, event: str, *args) -> None:
        self.driver.do(event, *args)
