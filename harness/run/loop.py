"""The run loop, written once for both tiers: the log's header, time zero, the token
budget, the walk of the fault schedule and the end of the run. The process runner drives
it on wall time over real processes or containers, the simulator on its virtual clock;
each passes its clock, its hosts (the `Control` protocol) and its injector.

1. time zero is when every learner has made its first inner step (or a learner crashed,
   or STARTUP_TIMEOUT_S passed): the first start-up (Python, JAX import, compilation)
   is the same for every mode and would otherwise decide a miniature run;
2. the schedule's faults start and end at their times from time zero; a fault that
   would start after `train.duration` is not started;
3. the run ends once the job has trained its token budget, M × steps × batch tokens,
   whoever trained them (a dead learner's share is taken by the others), when every
   learner has exited, or `duration + end_grace` after time zero (`train.end_grace`,
   END_GRACE_S unless the scenario sets it).
"""
from __future__ import annotations

from typing import Callable, Protocol

from diloco_chaos.faults.schedule import Schedule
from diloco_chaos.harness.run.control import Control
from diloco_chaos.harness.run.injector import Injector
from diloco_chaos.harness.scenarios.scenario import Scenario
from diloco_chaos.trainer.config import RunConfig

MAX_STEPS_FACTOR = 2.0  # learners may step past their share while another one is down
END_GRACE_S = 20.0
STARTUP_TIMEOUT_S = 180.0  # how long time zero waits for every learner's first step


class RunClock(Protocol):
    def now(self) -> float: ...
    def run_until(self, t: float, until: Callable[[], bool]) -> object: ...  # up to time t, or until() holds


def log_header(s: Scenario, cfg: RunConfig, tier: str, replay: str | None) -> dict:
    """The first keys of every event log's header: what replays the run."""
    return {"seed": s.seed, "config": cfg.to_dict(), "scenario": s.to_dict(), "tier": tier,
            "schedule": s.schedule().to_dicts(), "replay": replay}


def token_budget(cfg: RunConfig) -> int:
    """The job's token budget: M × steps × batch tokens, whoever trains them."""
    return cfg.diloco.learners * cfg.steps * cfg.task.batch_size * cfg.task.tokens_per_row


class Budget:
    """Whether the run is over: its tokens trained, or every learner gone for good."""

    def __init__(self, cfg: RunConfig, cluster: Control, injector: Injector, tokens: Callable[[], int]):
        self.total = token_budget(cfg)
        self.cluster, self.injector, self.tokens = cluster, injector, tokens
        self.learners = cluster.topology["learners"]

    def spent(self) -> bool:
        if self.tokens() >= self.total:
            return True
        return all(not self.cluster.running(u) and not self.injector.is_down(u) for u in self.learners)


def training_start(clock: RunClock, ready: Callable[[], bool], timeout_s: float = STARTUP_TIMEOUT_S) -> float:
    """Time zero of the fault schedule and of the measurement window (step 1 above)."""
    clock.run_until(clock.now() + timeout_s, until=ready)
    return clock.now()


def run_end_s(train) -> float:
    """The latest end of a run, from time zero: `train.duration` + its end grace
    (`train.end_grace`, END_GRACE_S unless set)."""
    return train.duration_s + (END_GRACE_S if train.end_grace_s is None else train.end_grace_s)


def walk(schedule: Schedule, clock: RunClock, injector: Injector, budget: Budget, t0: float,
         train) -> None:
    """Steps 2 and 3 above: returns when the run is over."""
    for t, what, fault in schedule.timeline():
        if t >= train.duration_s and what == "start":
            break
        clock.run_until(t0 + t, until=budget.spent)
        if budget.spent():
            return
        injector.start(fault) if what == "start" else injector.end(fault)
    if not budget.spent():
        clock.run_until(t0 + run_end_s(train), until=budget.spent)
