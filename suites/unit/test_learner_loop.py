"""The learner unit's loop (trainer/protocol/learner_loop.py), written once for both tiers, driven
by a scripted host: the waits it yields and the lines it writes, counted by hand."""
from __future__ import annotations

from types import SimpleNamespace

from diloco_chaos.trainer.protocol.learner_loop import (CKPT_EVERY, CLOSE_WAIT_S, DRAIN_S, FETCH_WAIT_S, STOP_CLOSE_S,
                                                        Compute, Until, learner_loop)
from diloco_chaos.trainer.protocol.unit_faults import UnitFaults


class Core:
    def __init__(self, holds: int = 0):
        self.holds = holds  # how many times must_wait answers True before it lets a step go

    def must_wait(self, state) -> bool:
        if self.holds:
            self.holds -= 1
            return True
        return False

    def params(self, state):
        return state.params

    @staticmethod
    def closed(state) -> bool:  # every closing Δ answered
        return state.closing is not None and not state.closing


class Host:
    """Records what the loop does; `run` plays the host's part for each wait."""

    def __init__(self, steps: int, mode: str = "decoupled", holds: int = 0, saved: int = 0):
        self.cfg = SimpleNamespace(steps=steps, eval_every=25, diloco=SimpleNamespace(mode=mode))
        self.step, self.max_steps, self.incarnation, self.live_slices = 0, steps, 0, 1
        self.opt_state = None  # no optimizer here: no inner_audit lines
        self.core, self.state = Core(holds), SimpleNamespace(params=0.0, awaiting=frozenset({0}), closing=None)
        self.stopping, self.saved, self.t = False, saved, 0.0
        self.lines, self.waits, self.saves, self.done = [], [], [], None
        self.driver = SimpleNamespace(grads_ready=lambda g, tokens, dt: self.lines.append(("grads", g)),
                                      stepped=lambda before, after: None, tally=None,
                                      faults=UnitFaults())

    def now(self) -> float:
        return self.t

    def emit(self, kind, **fields):
        self.lines.append((kind, fields.get("step")) + ((fields["closed"],) if "closed" in fields else ()))

    def do(self, event, *args):
        self.lines.append((event,))
        if event == "start":
            self.state.awaiting = frozenset({0})
        elif event == "after_inner_step":
            self.state.params = args[0]
        elif event == "finish":
            self.state.closing = {0}  # one closing Δ out, its answer still to come

    def pid(self):
        return 7

    def open_links(self):
        pass

    def links_up(self):
        return True

    def drain(self):
        self.state.awaiting = frozenset()  # the fetch answered
        if self.state.closing:
            self.state.closing = set()     # and the closing Δ

    def read_control(self):
        pass

    def log_buffers(self):
        pass

    def train_step(self, params, step):
        return params + 1.0, 16, 2.0

    def grad_step(self, params, step):
        return -1.0, 16, 2.0

    def step_line(self, **fields):
        self.lines.append(("step", fields["step"]))

    def flush_step_line(self):
        self.lines.append(("flush",))

    def evaluate(self, params):
        return 1.0

    def save(self, final=False):
        self.saves.append((self.step, final))

    def saved_step(self):
        return max([self.saved] + [s for s, _ in self.saves])

    def close(self, finished):
        self.done = (self.step, finished)

    def run(self, stop_at_compute: int | None = None):
        loop, value, computes = learner_loop(self), None, 0
        while True:
            try:
                w = loop.send(value)
            except StopIteration:
                return
            self.waits.append(type(w).__name__ if not isinstance(w, Until)
                              else ("Until", w.timeout_s) + (("through_stop",) if w.through_stop else ()))
            value = None
            if isinstance(w, Compute):
                computes += 1
                if computes == stop_at_compute:  # the simulator's teardown mid-step
                    self.stopping = True
                    continue
                value = w.fn()
                self.t += 0.1
            elif isinstance(w, Until) and w.cond is not None:
                self.drain()
                assert w.cond()


def test_a_run_fetches_steps_evaluates_saves_and_drains():
    h = Host(steps=CKPT_EVERY)
    h.run()
    assert h.waits[0] == ("Until", FETCH_WAIT_S) and h.waits[-1] == ("Until", DRAIN_S)
    assert h.waits.count("Compute") == CKPT_EVERY and "Idle" not in h.waits
    assert [x[1] for x in h.lines if x[0] == "step"] == list(range(1, CKPT_EVERY + 1))
    assert [x[1] for x in h.lines if x[0] == "eval"] == [25, 50]
    # ended by itself: the closing Δs go first, their answers are awaited, then the last eval
    assert h.waits[-3:] == [("Until", CLOSE_WAIT_S), "Spent", ("Until", DRAIN_S)]
    assert h.lines.index(("finish",)) < h.lines.index(("eval", 50, True))
    assert h.saves == [(CKPT_EVERY, False)]  # the periodic save covers the end: no final one
    assert h.state.params == CKPT_EVERY and h.done == (CKPT_EVERY, True)
    assert h.lines[0] == ("unit_up", 0) and h.lines[1] == ("start",)


def test_a_held_step_waits_for_a_delivery_and_a_short_run_saves_its_end():
    h = Host(steps=3, holds=2)
    h.run()
    assert h.waits[1:3] == ["Idle", "Idle"] and h.waits.count("Compute") == 3
    assert h.saves == [(3, True)] and h.done == (3, True)


def test_a_stop_mid_step_drops_that_step_closes_and_skips_the_drain():
    h = Host(steps=10, saved=0)
    h.run(stop_at_compute=4)
    assert [x[1] for x in h.lines if x[0] == "step"] == [1, 2, 3]
    # the run's end: its last progress into Θ all the same, a wait the stop does not cut short
    assert h.waits[-2:] == [("Until", STOP_CLOSE_S, "through_stop"), ("Until", 0.0)]
    assert h.lines.index(("finish",)) < h.lines.index(("flush",))
    assert not [x for x in h.lines if x[0] == "eval"]  # a stopped run's final eval is the harness's
    assert h.saves == [(3, True)] and h.done == (3, False)


def test_a_unit_stopped_at_its_last_step_closes_then_evaluates():
    h = Host(steps=4)
    step_line = h.step_line
    h.step_line = lambda **f: (step_line(**f), setattr(h, "stopping", f["step"] == 4))
    h.run()
    assert h.waits[-3:] == [("Until", STOP_CLOSE_S, "through_stop"), "Spent", ("Until", 0.0)]
    assert h.lines[-3:] == [("finish",), ("eval", 4, True), ("flush",)]


def test_dp_hands_its_gradient_to_the_driver():
    h = Host(steps=2, mode="dp")
    h.run()
    assert [x for x in h.lines if x[0] == "grads"] == [("grads", -1.0)] * 2
    assert ("after_inner_step",) not in h.lines and h.done == (2, True)
    assert ("finish",) not in h.lines  # closing is the decoupled mode's
