"""The simulated cluster: a virtual clock, the units, the links, the event log.

`World` is the simulator's host: it implements `Control` (harness/run/control.py: kill,
spawn, running, pause, resume, set_speed, set_live_slices, set_fault / clear_fault,
`client` for the links' toxics, `wan`) beside the real hosts, so the simulator is driven by the same
`Injector` and run loop (harness/run/); slow_unit takes the injector's `set_speed` path
(as on the docker backend).

Everything is ordered by (virtual time, insertion order): same inputs, same
order, same event log, byte for byte.
"""
from __future__ import annotations

import heapq
from dataclasses import dataclass

import numpy as np

from diloco_chaos.harness.run.control import GRACE_S, LOCAL_MECHANISMS, SPARE_DELAY_S, Spawned, apply_profile, mechanism_words
from diloco_chaos.harness.sim.learner import SimLearner
from diloco_chaos.harness.sim.net import Net
from diloco_chaos.harness.sim.syncer import SimSyncer
from diloco_chaos.trainer.protocol.protocol_base import DP_MODES
from diloco_chaos.trainer.protocol.protocol_base import LEARNER_BUGS, SYNCER_BUGS
from diloco_chaos.trainer.units.events import KINDS


class Handle:
    __slots__ = ("cancelled",)

    def __init__(self):
        self.cancelled = False

    def cancel(self) -> None:
        self.cancelled = True


class Clock:
    """Discrete events on virtual seconds; ties run in the order they were set."""

    def __init__(self):
        self.now = 0.0
        self._heap: list = []
        self._n = 0

    def at(self, t: float, fn, *args) -> Handle:
        h = Handle()
        heapq.heappush(self._heap, (t, self._n, h, fn, args))
        self._n += 1
        return h

    def run_until(self, t_stop: float, until=None) -> bool:
        """Runs every event due by `t_stop`; stops early (True) once `until()` holds."""
        while self._heap and self._heap[0][0] <= t_stop:
            t, _, h, fn, args = heapq.heappop(self._heap)
            if h.cancelled:
                continue
            self.now = t
            fn(*args)
            if until is not None and until():
                return True
        self.now = max(self.now, t_stop)
        return False


@dataclass(frozen=True)
class SimParams:
    """What the simulator models that the scenario does not say (virtual seconds)."""

    step_s: float = 0.1  # one inner step of a full-speed unit
    hetero: float = 0.1  # unit m's steps take step_s · (1 + hetero · u_m), u_m ~ U[0, 1) seeded
    step_jitter: float = 0.05  # and each step ± this fraction, uniform, seeded
    learner_startup_s: float = 2.0  # process start to unit_up (imports, jit)
    syncer_startup_s: float = 1.0
    spare_startup_s: float = 0.5  # a warm spare taking a restarted unit's identity, to its unit_up
    ckpt_save_s: float = 0.2  # a checkpoint save until it is durable
    loopback_ms: float = 0.2  # one-way delay of a link with no latency toxic
    # what a link's kernel send queue and proxy hold beyond the sender's outbox (KiB):
    # measured 352 through a 16 kbit/s Toxiproxy bandwidth toxic (harness/sim/net.py)
    held_kib: float = 352.0
    # host work between steps on a learner (its loop's `Spent` waits): 0 unless calibrated
    loop_s: float = 0.0  # after every step: links, control file, the step line (the `other` badput)
    eval_s: float = 0.0  # one held-out eval
    ckpt_s: float = 0.0  # starting a checkpoint save
    # each learner's own step time, in topology order (calibrated from a real run:
    # harness/sim/calibrate.py); empty: step_s · (1 + hetero · u_m) as above
    step_s_by_unit: tuple = ()

    def __post_init__(self) -> None:
        object.__setattr__(self, "step_s_by_unit", tuple(self.step_s_by_unit))
        for name, value in vars(self).items():
            values = value if name == "step_s_by_unit" else (value,)
            for v in values:
                if not (isinstance(v, (int, float)) and not isinstance(v, bool) and v >= 0) \
                        or (name.startswith("step_s") and v <= 0):
                    raise ValueError(f"SimParams.{name} = {value!r}; valid: a number >= 0 (step times > 0)")


class World:
    def __init__(self, cfg, topology: dict, model, params: SimParams, *, wan=None, bugs: frozenset = frozenset(),
                 seed: int = 0, max_steps: int | None = None, spares: tuple = (), spare_pool: int = 2):
        unknown = set(bugs) - LEARNER_BUGS - SYNCER_BUGS
        if unknown:
            raise ValueError(f"unknown planted bugs {sorted(unknown)}; valid: {sorted(LEARNER_BUGS | SYNCER_BUGS)}")
        self.cfg, self.topology, self.model, self.params, self.wan = cfg, topology, model, params, wan
        self.learner_bugs = frozenset(bugs) & LEARNER_BUGS
        self.syncer_bugs = frozenset(bugs) & SYNCER_BUGS
        self.dp = cfg.diloco.mode in DP_MODES
        self.probe = None  # probe(learner_proc, event, args) after each learner core event
        self.max_steps = cfg.steps if max_steps is None else max_steps  # a learner's own step cap
        self.tokens = 0  # of every learner step so far (the runner's token budget)
        self.first_step: dict[str, float] = {}  # learner -> time of its first step line
        self.clock = Clock()
        self.events: list[dict] = []
        self.crashes: list[dict] = []  # learner incarnations that died of their own exception
        self.rng = np.random.default_rng([seed, 0x51])  # link jitter
        names = topology["learners"]
        self._step_rng = [np.random.default_rng([seed, 0x52, i]) for i in range(len(names))]
        u = np.random.default_rng([seed, 0x53]).random(len(names))
        self.step_base = [params.step_s * (1 + params.hetero * float(x)) for x in u]
        if params.step_s_by_unit:
            if len(params.step_s_by_unit) != len(names):
                raise ValueError(f"SimParams.step_s_by_unit has {len(params.step_s_by_unit)} step times for "
                                 f"{len(names)} learners")
            self.step_base = [float(x) for x in params.step_s_by_unit]
        # warm spares (`[cluster] spares`, the roles the schedule restarts): when each of a
        # role's `spare_pool` spares is ready; they boot with the units at t = 0, the k-th
        # after k × SPARE_DELAY_S (as the process host starts them)
        self.spare_ready = {r: [(params.learner_startup_s if r == "learner" else params.syncer_startup_s)
                                + k * SPARE_DELAY_S for k in range(spare_pool)] for r in spares}
        self.learners = {n: SimLearner(self, n, i) for i, n in enumerate(names)}
        self.syncers = {s: SimSyncer(self, s) for s in topology["shards"]}
        self.net = Net(self, names, list(self.syncers), topology["run_id"], params.loopback_ms / 1000)
        self.client = self.net.proxies
        if wan is not None:
            for link in self.net.links:
                apply_profile(self.client, link, wan)

    @property
    def now(self) -> float:
        return self.clock.now

    def emit(self, kind: str, src: str, **fields) -> None:
        if kind not in KINDS:
            raise ValueError(f"unknown event kind {kind!r}; valid: {sorted(KINDS)}")
        self.events.append({"t": round(self.clock.now, 6), "src": src, "kind": kind, **fields})

    def step_work(self, index: int) -> float:
        jitter = self.params.step_jitter * (2 * float(self._step_rng[index].random()) - 1)
        return self.step_base[index] * (1 + jitter)

    def start(self) -> None:
        """t = 0: every shard and learner process starts (LocalCluster.start)."""
        for s in self.syncers.values():
            s.spawn()
        for u in self.learners.values():
            u.spawn()

    # --- Control (harness/run/control.py) ----------------------------------------------------
    def _unit(self, name: str):
        return self.learners.get(name) or self.syncers[name]

    def running(self, name: str) -> bool:
        return self._unit(name).proc is not None

    def kill(self, name: str) -> None:
        self._unit(name).kill()

    def terminate(self, name: str) -> None:
        """SIGTERM: the unit closes and leaves, as at the end of the run."""
        if (proc := self._unit(name).proc) is not None:
            proc.stop()

    def spawn(self, name: str) -> Spawned:
        """A restart: cold (learner_startup_s / syncer_startup_s), or a warm spare's
        spare_startup_s (plus what is left of its boot if it is not ready yet: a spare still
        in its delay boots at once, so at most a cold start); the spare's replacement is
        ready SPARE_DELAY_S + a cold start later."""
        unit = self._unit(name)
        if unit.proc is not None:
            raise RuntimeError(f"{name} is already running")
        role = "learner" if name in self.learners else "syncer"
        cold = self.params.learner_startup_s if role == "learner" else self.params.syncer_startup_s
        start, startup = "cold", cold
        if self.spare_ready.get(role):
            pool = sorted(self.spare_ready[role])  # the restart takes the one ready first
            ready = min(pool.pop(0), self.now + cold)  # trainer/units/spare.py ends its delay
            start = "spare" if self.now >= ready else "spare_booting"
            startup = max(ready - self.now, 0.0) + self.params.spare_startup_s
            self.spare_ready[role] = pool + [self.now + SPARE_DELAY_S + cold]
        unit.spawn(startup)
        return Spawned(start)  # no pid: the simulator has no processes

    def pause(self, name: str) -> None:
        if (proc := self.learners[name].proc) is not None:
            proc.set_rate(paused=True)

    def resume(self, name: str) -> None:
        if (proc := self.learners[name].proc) is not None:
            proc.set_rate(paused=False)

    def mechanism(self, kind: str) -> str:
        """How the world does a fault of `kind` (the `via` of its fault_start line)."""
        how = {"slow_unit": "step time / speed", "pause_unit": "process frozen",
               "kill_unit": "process gone; a new one after down_for",
               "kill_syncer": "process gone; a new one restores the checkpoint",
               "corrupt": "the learner corrupts its outgoing contributions",
               "disk_full": "the shard's saves fail (ENOSPC) while it lasts",
               "disk_slow": "each write and fsync of the shard's saves late",
               "lost_writes": "process gone; its un-fsynced journal lines dropped; a new one restores",
               "corrupt_checkpoint": "process gone; its newest save marked damaged; a new one restores"}
        return "simulated: " + mechanism_words({**LOCAL_MECHANISMS, **how}, kind)

    def set_speed(self, name: str, speed: float, period_s: float = 0.1) -> None:
        """slow_unit: the unit's process runs at `speed` (a restarted one starts at full speed)."""
        if (proc := self.learners[name].proc) is not None:
            proc.set_rate(speed=speed)

    def set_live_slices(self, learner: str, live: int) -> None:
        self.learners[learner].set_control(live)

    def set_fault(self, unit: str, kind: str, **fields) -> None:
        """The fault `kind` on `unit` (a learner or a shard) with `fields`: into the unit's dict
        of the faults on it, which its hooks (trainer/protocol/unit_faults.py) and this tier's model of
        its disk read; as the control file on processes, it outlives a restart of the unit."""
        self._unit(unit).faults[kind] = dict(fields)

    def clear_fault(self, unit: str, kind: str) -> None:
        """The fault `kind` off `unit`: what it held leaves now (a process reads its control
        within a step or POLL_S)."""
        u = self._unit(unit)
        u.faults.pop(kind, None)
        if u.proc is not None and u.proc.driver is not None and u.proc.alive:
            u.proc.driver.faults.release()

    def lose_writes(self, unit: str) -> dict:
        """lost_writes: the dead shard's un-fsynced writes dropped (harness/sim/syncer.py)."""
        return self.syncers[unit].lose_writes()

    def checkpoints(self, unit: str) -> dict:
        """A shard's kept saves as the harness lists a process's folder ({} for a learner)."""
        return self.syncers[unit].checkpoints() if unit in self.syncers else {}

    def damage_checkpoint(self, unit: str, damage: str) -> dict:
        """corrupt_checkpoint: the shard's newest sealed save damaged (harness/sim/syncer.py)."""
        return self.syncers[unit].damage(damage)

    # --- what the links call ---------------------------------------------------------------
    def learner_link_event(self, learner: str, kind: str, shard: str, msg=None, nbytes: int = 0) -> None:
        if (proc := self.learners[learner].proc) is not None:
            proc.inbox_put((kind, shard, msg, nbytes))

    def shard_listening(self, shard: str) -> bool:
        proc = self.syncers[shard].proc
        return proc is not None and proc.listening

    def shard_event(self, shard: str, kind: str, learner: str, msg=None, nbytes: int = 0) -> None:
        if (proc := self.syncers[shard].proc) is not None and proc.alive:
            proc.on_net(kind, learner, msg, nbytes)

    # --- the end -------------------------------------------------------------------------
    def close(self) -> None:
        """LocalCluster.close: SIGTERM to the learners, virtual time for them to close and
        leave (GRACE_S, then SIGKILL), then the shards."""
        for u in self.learners.values():
            if u.proc is not None:
                u.proc.stop()
        gone = lambda: all(u.proc is None for u in self.learners.values())  # noqa: E731
        if not gone():
            self.clock.run_until(self.now + GRACE_S["learner"], until=gone)
        self.stop_kills = []  # as LocalCluster.record_stop notes them
        for u in self.learners.values():
            if u.proc is not None:  # past the grace
                self.stop_kills.append({"unit": u.name, "incarnation": u.proc.incarnation,
                                        "grace_s": GRACE_S["learner"]})
                u.proc.kill()
                u.exited()
        for s in self.syncers.values():
            if s.proc is not None:
                s.proc.stop()
                s.proc = None

