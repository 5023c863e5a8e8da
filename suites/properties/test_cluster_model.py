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

from hypothesis import settings
from hypothesis import strategies as st
from hypothesis.stateful import RuleBasedStateMachine, initialize, invariant, precondition, rule

from faults.model import KillSyncer, KillUnit, Partition, PauseUnit, SlowUnit
from harness import checks
from harness.eventlog import EventLog
from harness.sim import finish, launch, simulate
from sim_cases import SIM, Case, RejoinProbe, examples, report, scenario
from sim_props import quorum_respected, weights_match_staleness
from trainer.learner import FETCH_WAIT_S

LEARNERS = [f"learner-{i}" for i in range(3)]
SHARDS = ["syncer-0", "syncer-1"]
SETTLE_S = 3.0  # a shard up or a link healed this long ago has been found again (backoff ≤ 1 s)
READY_S = SIM.learner_startup_s + FETCH_WAIT_S + 0.5  # a restarted learner steps by then
STEP_MAX_S = SIM.step_s * (1 + SIM.hetero) * (1 + SIM.step_jitter)
SAFETY = (checks.merged_at_most_once, checks.versions_monotonic, checks.no_nan, checks.durable_rounds_kept,
          quorum_respected, weights_match_staleness)


class SimulatedCluster(RuleBasedStateMachine):
    bugs: frozenset = frozenset()  # planted bugs (test_planted_bugs.py runs the machine with one)

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
        self.reach_since = dict.fromkeys(LEARNERS, 0.0)        # when each learner's links last healed
        self.speed = dict.fromkeys(LEARNERS, 1.0)

    # --- the nemesis: targets are drawn among those a rule can act on, so nothing is filtered
    def _start(self, fault) -> None:
        self.open[(fault.kind, fault.target)] = fault
        self.injector.start(fault)

    def _end(self, data, kind: str) -> str:
        target = data.draw(st.sampled_from(self._ending(kind)))
        fault = self.open.pop((kind, target))
        self.injector.end(fault)
        self.done.append(dataclasses.replace(fault, **{fault.length_field: round(self.at - fault.at_s, 6)}))
        return target

    def _ending(self, kind: str) -> list[str]:
        """Targets of `kind` faults that have lasted some time."""
        return sorted(t for (k, t), f in self.open.items() if k == kind and self.at > f.at_s)

    def _free(self) -> list[str]:
        """Learners no process fault acts on (kill, pause and slow exclude each other)."""
        return [u for u in LEARNERS if not self._busy(u)]

    def _busy(self, u: str) -> bool:
        return any((k, u) in self.open for k in ("kill_unit", "pause_unit", "slow_unit"))

    @property
    def at(self) -> float:
        return round(self.world.now - self.t0, 6)

    @precondition(lambda self: self._free())
    @rule(data=st.data())
    def kill(self, data):
        self._start(KillUnit(data.draw(st.sampled_from(self._free())), self.at, down_for_s=None))

    @precondition(lambda self: self._ending("kill_unit"))
    @rule(data=st.data())
    def restart(self, data):
        self.up_since[self._end(data, "kill_unit")] = self.world.now

    @precondition(lambda self: self._free())
    @rule(data=st.data())
    def pause(self, data):
        self._start(PauseUnit(data.draw(st.sampled_from(self._free())), self.at, duration_s=1.0))

    @precondition(lambda self: self._ending("pause_unit"))
    @rule(data=st.data())
    def resume(self, data):
        self._end(data, "pause_unit")

    @precondition(lambda self: self._free())
    @rule(data=st.data(), speed=st.sampled_from([0.5, 0.25, 0.1]))
    def slow(self, data, speed):
        u = data.draw(st.sampled_from(self._free()))
        self._start(SlowUnit(u, self.at, duration_s=1.0, speed=speed))
        self.speed[u] = speed

    @precondition(lambda self: self._ending("slow_unit"))
    @rule(data=st.data())
    def unslow(self, data):
        self.speed[self._end(data, "slow_unit")] = 1.0

    @precondition(lambda self: self._cuttable())
    @rule(data=st.data(), direction=st.sampled_from(["both", "upstream", "downstream"]))
    def partition(self, data, direction):
        self._start(Partition(data.draw(st.sampled_from(self._cuttable())), self.at, duration_s=1.0,
                              direction=direction))

    def _cuttable(self) -> list[str]:
        return [f"link:{u}" for u in LEARNERS if ("partition", f"link:{u}") not in self.open]

    @precondition(lambda self: self._ending("partition"))
    @rule(data=st.data())
    def heal(self, data):
        self.reach_since[self._end(data, "partition").removeprefix("link:")] = self.world.now

    @precondition(lambda self: any(("kill_syncer", s) not in self.open for s in SHARDS))
    @rule(data=st.data())
    def kill_syncer(self, data):
        up = [s for s in SHARDS if ("kill_syncer", s) not in self.open]
        self._start(KillSyncer(data.draw(st.sampled_from(up)), self.at, down_for_s=1.0))

    @precondition(lambda self: self._ending("kill_syncer"))
    @rule(data=st.data())
    def restart_syncer(self, data):
        self.up_since[self._end(data, "kill_syncer")] = self.world.now

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
        reachable = [u for u in LEARNERS if not self._busy(u) and ("partition", f"link:{u}") not in self.open
                     and a - max(self.up_since[u] + READY_S, self.reach_since[u]) >= SETTLE_S]
        for s in SHARDS:
            if not reachable or b - a < 2.0 or ("kill_syncer", s) in self.open or a - self.up_since[s] < SETTLE_S:
                continue
            assert any(e["kind"] == "round_commit" and e["src"] == s for e in new), \
                f"{s} committed nothing in [{a:.2f}, {b:.2f}]s while {reachable} could reach it"

    @invariant()
    def processes_match_the_model(self):
        for u in LEARNERS:
            assert (self.world.pid(u) is None) == (("kill_unit", u) in self.open), f"{u}: process vs model"

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
                      f"{detail} (at {now:.2f}s after t_start, in the interactive run)")

    def teardown(self):
        if hasattr(self, "world"):
            finish(self.scenario, self.world, self.injector, self.header)


TestSimulatedCluster = SimulatedCluster.TestCase
TestSimulatedCluster.settings = settings(examples(12), stateful_step_count=12)
