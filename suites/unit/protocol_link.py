"""An in-memory link for the protocol cores (h11-style tests), plus plain-numpy math.

`MemNet` holds named cores and their states, moves each `Send` to the receiver's inbox
after `latency_s`, fires `SetTimer`s in time order, and records everything else
(logs, blocks, checkpoints) with its time. No threads, no clock: `run(until)` pops
events in (time, insertion) order.
"""
from __future__ import annotations

import heapq
import itertools

import numpy as np

from diloco_chaos.trainer.protocol.learner_types import LearnerMath
from diloco_chaos.trainer.protocol.protocol_base import Log, Send, SetTimer
from diloco_chaos.trainer.protocol.syncer_types import SyncerMath


def due_fragment(step: int, H: int, P: int) -> int | None:
    """Fragment p is due at steps offset_p + k·H, offset_p = (p·H)//P (as trainer/numerics/fragments.py)."""
    due = [p for p in range(P) if step >= 1 and (step - (p * H) // P) % H == 0]
    return due[0] if due else None


def learner_math(H: int, P: int) -> LearnerMath:
    """params = a list of P float arrays; fragment p is the one-leaf list [params[p]]."""
    return LearnerMath(
        get_fragment=lambda params, p: [params[p]],
        set_fragment=lambda params, p, arrays: params[:p] + [arrays[0]] + params[p + 1:],
        pseudo_grad_payload=lambda base, local: [b - x for b, x in zip(base, local)],
        mix=lambda local, glob, a: [a * x + (1 - a) * g for x, g in zip(local, glob)],
        due_fragment=lambda step: due_fragment(step, H, P),
        grad_payload=lambda arrays: list(arrays),
    )


def weighted_mean(deltas: list, weights: list) -> list:
    total = sum(weights)
    return [sum(w * d[i] for w, d in zip(weights, deltas)) / total for i in range(len(deltas[0]))]


def syncer_math(lr: float = 1.0) -> SyncerMath:
    """Θ ← Θ − lr · (weighted mean Δ); the outer state counts outer steps; weight
    = c_tokens · (1 + staleness)^-0.5."""
    return SyncerMath(
        merge_and_step=lambda theta, n, deltas, w, scale=1.0, mean=False: ([t - lr * scale * m for t, m in zip(theta, weighted_mean(deltas, w))],
                                                   n + 1),
        weight=lambda tokens, steps, staleness: tokens * (1 + staleness) ** -0.5,
        decode=list,
        outer_init=lambda theta: 0,
        average=weighted_mean,
    )


class MemNet:
    def __init__(self, latency_s: float = 0.0):
        self.now = 0.0
        self.latency_s = latency_s
        self.cores: dict = {}
        self.states: dict = {}
        self.logs: list = []      # (t, src, kind, fields)
        self.sent: list = []      # (t, src, to, msg)
        self.other: list = []     # (t, src, action): Block, Unblock, SaveCheckpoint, ApplyGrads, ...
        self.cut: set = set()     # names whose links drop every message
        self.epoch: dict = {}     # name -> restarts: what was on the wire to an old process is lost
        self._q: list = []
        self._n = itertools.count()

    def add(self, name: str, core, state) -> None:
        """A new core; under a name already used, a restarted process."""
        self.cores[name], self.states[name] = core, state
        self.epoch[name] = self.epoch.get(name, -1) + 1

    def do(self, name: str, event: str, *args) -> list:
        """Calls `core.event(state, now, *args)`, keeps the new state, applies the actions."""
        state, actions = getattr(self.cores[name], event)(self.states[name], self.now, *args)
        self.states[name] = state
        for a in actions:
            self._apply(name, a)
        return actions

    def at(self, t: float, fn) -> None:
        heapq.heappush(self._q, (t, next(self._n), fn))

    def run(self, until: float) -> None:
        while self._q and self._q[0][0] <= until:
            t, _, fn = heapq.heappop(self._q)
            self.now = max(self.now, t)
            fn()
        self.now = max(self.now, until)

    def _apply(self, src: str, a) -> None:
        if isinstance(a, Send):
            self.sent.append((self.now, src, a.to, a.msg))
            if a.to in self.cores and not {src, a.to} & self.cut:
                epochs = (self.epoch[src], self.epoch[a.to])
                self.at(self.now + self.latency_s, lambda: self._deliver(src, a.to, a.msg, epochs))
        elif isinstance(a, SetTimer):
            self.at(a.at, lambda: self.do(src, "timer", a.key))
        elif isinstance(a, Log):
            self.logs.append((self.now, src, a.kind, a.fields))
        else:
            self.other.append((self.now, src, a))

    def _deliver(self, src: str, to: str, msg, epochs: tuple) -> None:
        # a link cut, or an end restarted, while the message was on it loses it
        if not {src, to} & self.cut and epochs == (self.epoch[src], self.epoch[to]):
            self.do(to, "receive", src, msg)

    # --- conveniences -----------------------------------------------------------------
    def connect(self, learner: str, shards: list[str], start: bool = True) -> None:
        for s in shards:
            self.do(s, "learner_connected", learner)
        if start:
            self.do(learner, "start")
        else:
            for s in shards:
                self.do(learner, "shard_connected", s)

    def stepper(self, learner: str, every_s: float, until: float, tokens: int = 10, first_s: float | None = None):
        """Inner steps every `every_s` (θ ← θ + 1); a step the core says must wait is retried later."""
        def tick():
            core, state = self.cores[learner], self.states[learner]
            if not core.must_wait(state):
                params = [x + 1.0 for x in core.params(state)]
                self.do(learner, "after_inner_step", params, tokens, every_s)
            if self.now + every_s <= until:
                self.at(self.now + every_s, tick)
        self.at(every_s if first_s is None else first_s, tick)

    def log(self, kind: str, src: str | None = None) -> list[dict]:
        return [f for _, s, k, f in self.logs if k == kind and src in (None, s)]

    def sent_msgs(self, cls, src: str | None = None, to: str | None = None) -> list:
        return [m for _, s, t, m in self.sent if isinstance(m, cls) and src in (None, s) and to in (None, t)]

    def merged_ids(self) -> list[tuple]:
        return [(f["learner"], f["incarnation"], f["seq"]) for f in self.log("merge")]


def arr(*xs) -> np.ndarray:
    return np.array(xs, dtype=np.float64)
