"""A Hypothesis state machine over the simulated cluster: kill, restart, pause, resume,
partition, heal, slow, kill and restart a syncer shard, and let virtual time pass;
after each step the cluster is checked against a small reference model of what must
hold. Faults go through the cluster tier's own injector, as in a scenario run.

The reference model knows which units are down, paused, slowed or cut off and since
when. From that it expects: a killed learner is silent and has no process; a paused
one makes no step; one that has been up, unpaused and at speed s for a while makes
steps at about s / step time; every shard that has been up for a while commits
rounds while some learner has been able to reach it; and the safety checks hold on
the log so far. A failure reports the faults so far as a scenario file and the
command that replays it.
"""
from __future__ import annotations

import dataclasses
from pathlib import Path

from hypothesis import settings
from hypothesis import strategies as st
from hypothesis.stateful import RuleBasedStateMachine, initialize, invariant, rule

from diloco_chaos.faults.kinds import KillSyncer, KillUnit, Partition, PauseUnit, SlowUnit
from diloco_chaos.harness.judging import checks
from diloco_chaos.harness.eventlog import EventLog
from diloco_chaos.harness.sim.run import finish, launch, simulate
from sim_cases import REPORTS, SIM, Case, RejoinProbe, examples, report, scenario
from diloco_chaos.harness.judging.audits import quorum_respected, weights_match_staleness
from diloco_chaos.trainer.protocol.learner_loop import FETCH_WAIT_S

LEARNERS = [f"learner-{i}" for i in range(3)]
SHARDS = ["syncer-0", "syncer-1"]
SETTLE_S = 3.0  # a shard up or a link healed this long ago has been found again (backoff ≤ 1 s)
GAP_S = 2.0     # the longest a settled shard may go without a commit while a learner can reach it
READY_S = SIM.learner_startup_s + FETCH_WAIT_S + 0.5  # a restarted learner steps by then
STEP_MAX_S = SIM.step_s * (1 + SIM.hetero) * (1 + SIM.step_jitter)
SAFETY = (checks.merged_at_most_once, checks.versions_monotonic, checks.no_nan, checks.durable_rounds_kept,
          quorum_respected, weights_match_staleness)


class SimulatedCluster(RuleBasedStateMachine):
    bugs: frozenset = frozenset()  # planted bugs (test_planted_bugs.py runs the machine with one)
    reports: Path = REPORTS         # where a failure's run is written

    @initialize()
    def launch(self):
        self.scenario = scenario(steps=400, duration_s=300.0)  # never ends within a machine's steps
        self.probe = RejoinProbe()
        self.world, self.injector, self.header = launch(self.scenario, params=SIM, bugs=self.bugs,
                                                        probe=self.probe)
        self.world.clock.run_until(60.0, until=lambda: len(self.world.first_step) == len(LEARNERS))
        self.t0 = self.world.now
        self.open: dict[tuple, object] = {}   # (kind, target) -> the fault now active
        self.done: list = []                  # faults that have ended, with their real length
        self.up_since = dict.fromkeys(LEARNERS + SHARDS, 0.0)  # when each unit last (re)started
        # when each unit can be counted on again: after a fault on it started or ended, it
        # reconnects, fetches and contributes (a shard: restarts and is found again)
        self.settled_at = dict.fromkeys(LEARNERS + SHARDS, self.t0)
        self.commits = dict.fromkeys(SHARDS, self.t0)          # each shard's last round_commit
        self.speed = dict.fromkeys(LEARNERS, 1.0)

    # --- the nemesis. Each rule toggles a fault on a unit: starts it, or ends it if it is on
    # (and has lasted); a unit another process fault holds is left alone. So every rule is
    # always enabled and nothing is filtered out.
    def _toggle(self, fault, busy: bool = False):
        """Starts `fault`, or ends the active fault of its kind on its target; returns the
        target if it ended one."""
        key = (fault.kind, fault.target)
        active = self.open.get(key)
        unit = fault.target.removeprefix("link:")
        if active is None:
            if not busy:
                self.open[key] = fault
                self.injector.start(fault)
            return None
        if self.at <= active.at_s:
            return None  # a fault lasts some time
        restart = {"kill_unit": READY_S, "kill_syncer": SIM.syncer_startup_s}.get(fault.kind, 0.0)
        self.settled_at[unit] = self.world.now + restart + SETTLE_S
        del self.open[key]
        self.injector.end(active)
        self.done.append(dataclasses.replace(active, **{active.length_field: round(self.at - active.at_s, 6)}))
        return fault.target

    def _busy(self, u: str, but: str = "") -> bool:
        """A kill, pause or slow (other than `but`) holds learner u: they exclude each other."""
        return any((k, u) in self.open for k in ("kill_unit", "pause_unit", "slow_unit") if k != but)

    @property
    def at(self) -> float:
        return round(self.world.now - self.t0, 6)

    @rule(u=st.sampled_from(LEARNERS))
    def kill_or_restart(self, u):
        if self._toggle(KillUnit(u, self.at, down_for_s=None), self._busy(u, "kill_unit")):
            self.up_since[u] = self.world.now

    @rule(u=st.sampled_from(LEARNERS))
    def pause_or_resume(self, u):
        self._toggle(PauseUnit(u, self.at, duration_s=1.0), self._busy(u, "pause_unit"))

    @rule(u=st.sampled_from(LEARNERS), speed=st.sampled_from([0.5, 0.25, 0.1]))
    def slow_or_unslow(self, u, speed):
        if ("slow_unit", u) not in self.open and not self._busy(u):
            self.speed[u] = speed
        if self._toggle(SlowUnit(u, self.at, duration_s=1.0, speed=speed), self._busy(u, "slow_unit")):
            self.speed[u] = 1.0

    @rule(u=st.sampled_from(LEARNERS), direction=st.sampled_from(["both", "upstream", "downstream"]))
    def partition_or_heal(self, u, direction):
        self._toggle(Partition(f"link:{u}", self.at, duration_s=1.0, direction=direction))

    @rule(s=st.sampled_from(SHARDS))
    def kill_or_restart_syncer(self, s):
        if self._toggle(KillSyncer(s, self.at, down_for_s=1.0)):
            self.up_since[s] = self.world.now

    @rule(dt=st.sampled_from([0.5, 1.0, 2.0, 4.0]))
    def advance(self, dt):
        a, steps = self.world.now, self._steps()
        n = len(self.world.events)
        self.world.clock.run_until(a + dt)
        with self._reported():
            self._check_interval(a, self.world.now, steps, self.world.events[n:])

    # --- the reference model's expectations ----------------------------------------------------
    def _steps(self) -> dict:
        return {u: (p.step if (p := self.world.learners[u].proc) is not None and p.phase != "starting" else None)
                for u in LEARNERS}

    def _check_interval(self, a: float, b: float, before: dict, new: list) -> None:
        after = self._steps()
        for e in new:
            u, harness = e["src"], e["kind"] in ("unit_down", "unit_up") and "incarnation" not in e
            if ("kill_unit", u) in self.open and not harness:
                raise AssertionError(f"{u} is down but logged {e}")
            if ("pause_unit", u) in self.open and e["kind"] == "step":
                raise AssertionError(f"{u} is paused but stepped: {e}")
        for u in LEARNERS:
            if ("kill_unit", u) in self.open or ("pause_unit", u) in self.open or a - self.up_since[u] < READY_S:
                continue
            least = int((b - a) * self.speed[u] / STEP_MAX_S) - 1
            assert after[u] is not None and after[u] - before[u] >= least, \
                f"{u} made {None if after[u] is None else after[u] - before[u]} steps in {b - a:.1f}s, expected ≥ {least}"
        for e in new:
            if e["kind"] == "round_commit":
                self.commits[e["src"]] = e["t"]
        # a shard that has been up and settled, while some learner has been free, reachable and
        # settled, commits at least every GAP_S (a fragment cycle is 0.6 s here)
        free = [self.settled_at[u] for u in LEARNERS if not self._busy(u) and ("partition", f"link:{u}") not in self.open]
        for s in SHARDS:
            if ("kill_syncer", s) in self.open or not free:
                continue
            since = max(self.settled_at[s], min(free), self.commits[s])
            assert b - since <= GAP_S, f"{s} committed nothing in [{since:.2f}, {b:.2f}]s while a learner could reach it"

    @invariant()
    def processes_match_the_model(self):
        for u in LEARNERS:
            assert (not self.world.running(u)) == (("kill_unit", u) in self.open), f"{u}: process vs model"

    @invariant()
    def safety_holds_so_far(self):
        log = EventLog({"kind": "config", **self.header}, list(self.world.events))
        with self._reported():
            for check in SAFETY:
                r = check(log)
                assert r.valid is not False, f"{r.name}: {r.details}"
            assert not self.probe.mismatches, f"θ[p] ≠ fetched Θ[p]: {self.probe.mismatches[:3]}"

    # --- reporting -----------------------------------------------------------------------------
    def _reported(self):
        machine = self

        class Reported:
            def __enter__(self):
                return self

            def __exit__(self, kind, exc, tb):
                if kind is AssertionError:
                    raise AssertionError(machine._report(str(exc))) from None

        return Reported()

    def _report(self, detail: str) -> str:
        """The faults so far (the open ones lasting to now) as a scenario, simulated again."""
        now = self.at
        faults = self.done + [dataclasses.replace(f, **{f.length_field: max(0.1, round(now - f.at_s, 6))})
                              if f.kind != "kill_unit" else f for f in self.open.values()]
        s = dataclasses.replace(self.scenario, faults=tuple(faults))
        return report(Case(s, simulate(s, params=SIM, bugs=self.bugs), self.bugs, RejoinProbe()), "cluster_model",
                      f"{detail} (at {now:.2f}s after t_start, in the interactive run)", self.reports)

    def teardown(self):
        if hasattr(self, "world"):
            finish(self.scenario, self.world, self.injector, self.header)


TestSimulatedCluster = SimulatedCluster.TestCase
TestSimulatedCluster.settings = settings(examples(30), stateful_step_count=15)
