"""The fleet model's rules applied to one scenario's faults: a goodput prediction.

harness/fleet/model.py draws Poisson failures over a fleet of chips and prices each one
with a policy's recovery rule. Here the same rules price a scenario's own drawn
schedule (the faults the injector will apply, `Scenario.schedule()`), over the run's M
learner units, so the model's structure can be checked against real runs of the same
work (`diloco-chaos bench fidelity`, `diloco-chaos fleet --scenario NAME`).

Accounting is the harness's (docs/METRICS.md): allocated = M x job_s of learner time,
goodput = productive learner time / allocated. Per learner unit, in this order:

- `dead`: a `kill_unit` keeps it down for `down_for`, then a replacement boots
  (`boot_s` with warm spares, `cold_boot_s` without) — the fleet model's restart.
- `recovery`: then `rejoin_s` until its first merged contribution (the fleet model's
  `reconfig_s`: the restored unit fetches Θ and sends one fragment).
- `paused`: a `pause_unit` (a hung unit) for its duration.
- `other`: a running unit spends `overhead` of its time outside its steps (held-out
  evals, checkpoint saves, the loop's own work; for data-parallel also each step's wait
  for the mean gradient): the machine's and the policy's steady pace, calibrated.
- `lost`: while its contributions are corrupt (`corrupt`, dropped by the shards'
  guard) a unit's steps reach no merge; nor do they while its link is cut
  (`partition`, `reset`, `truncate`: faults whose kind `cuts_link`) for longer than the
  staleness horizon — the time in which the other M − 1 units move a fragment
  `max_staleness` versions on (each commits every fragment once per H steps:
  max_staleness · H · step_s / (M − 1)): the progress it kept arrives staler than the
  bound and is dropped. A shorter cut loses nothing: the kept progress is merged when
  the link returns (docs/PROTOCOL.md "Keeping local progress"). A cut of one of its
  links costs the share of its fragments behind that link (1 / shards).

Costing nothing in learner time, as in the fleet model's Decoupled DiLoCo: a slow unit
(`slow_unit`: fewer tokens, not idle time), a lost slice (`kill_slice`: the unit runs on
its other slices; the fleet model's `slice_away` chip-time is reported beside the
goodput, `slice_away_share`), a crashed syncer shard (`kill_syncer`: learners never
wait for it), and a thin or slow link (`wan`, `latency_spike`: the unit's progress is
kept in its outbox and merged when the fragment gets through).

Data-parallel on the same draw (`dp`) applies the fleet model's `dp_no_elastic` rule:
every fault that stops one replica stops all M — a dead unit for `detect_s` +
`down_for` + a cold boot (the harness's dp mode restarts every member when the dead one
comes back, and one warm spare cannot take M identities; the fleet model's
`restart_s`), losing what ran since the last checkpoint (`rolled_back`: of each stretch
of running that a restart ends, all but whole checkpoint intervals, as the fleet
model's `dp_no_elastic`),
a hung unit or a cut link for its duration (the all-reduce cannot complete) — and a
slow unit holds the others to its speed. A thin link and corrupt gradients are not
priced for DP (its step time on a thin link is `bench wan`'s subject; corrupt gradients
cost quality, not time).

Each kind prices itself (faults/kinds/: `fleet_ddl`, `fleet_dp`, charging the ledgers
below; a kind without a price of its own costs what its link cut does, else nothing).
This module reads a scenario by duck typing (`cluster.learners/shards/slices/spares`,
`schedule().faults`), so the fleet model still imports nothing of the cluster code.
"""
from __future__ import annotations

import dataclasses
import math

from diloco_chaos.harness.intervals import measure, minus, norm

BUCKETS = ("dead", "recovery", "paused", "lost", "other")


@dataclasses.dataclass(frozen=True)
class Pace:
    """What the rules need of the machine that runs the scenario (seconds; shares of 1).

    The defaults are this project's real processes on a 2-core machine (medians of the
    13 built-in scenarios' real runs, docs/BENCHMARKS.md "fidelity"); `pace_from_run` in
    harness/bench/fleet_tier.py measures them from one run's log instead."""

    job_s: float  # wall time of the run: allocated = M x job_s
    overhead: float = 0.055  # share of a running unit's time outside its steps
    boot_s: float = 0.3  # a warm spare taking the identity, to its first step
    cold_boot_s: float = 5.0  # a new process (Python, JAX, compile) to its first step
    rejoin_s: float = 0.3  # first step after a restart to its first merged contribution
    detect_s: float = 0.0  # kill to noticed: the harness sees the process exit at once
    checkpoint_every_s: float = 3.5  # DP: a checkpoint every CKPT_EVERY steps (50 x 0.07 s)
    step_s: float = 0.07  # one inner step (median over the units): sets the staleness horizon

    def __post_init__(self):
        for f in dataclasses.fields(self):
            v = getattr(self, f.name)
            if isinstance(v, bool) or not isinstance(v, (int, float)) or not (0 <= v < math.inf):
                raise ValueError(f"Pace.{f.name} = {v!r}; valid: a finite number >= 0")
        if self.job_s <= 0 or self.overhead >= 1:
            raise ValueError(f"Pace: job_s must be > 0 and overhead < 1 (got {self.job_s}, {self.overhead})")


def _learner_index(target: str, names: list[str]) -> list[int]:
    """The learner units a fault's target reaches: `learner-N`, `link:learner-N[~syncer-M]`, `link:*`."""
    t = target.removeprefix("link:")
    if t == "*":
        return list(range(len(names)))
    unit = t.split("~")[0]
    return [names.index(unit)] if unit in names else []


def _share(target: str, shards: int) -> float:
    """The share of a learner's fragments behind a link target (one link of S: 1/S)."""
    return 1.0 / shards if "~" in target else 1.0


def _end(f, T: float) -> float:
    return T if f.length_s is None else min(T, f.at_s + f.length_s)


def staleness_horizon_s(scenario, pace: Pace) -> float:
    """How long a cut unit's kept progress stays within `max_staleness` (inf: no bound)."""
    d, m = scenario.run_config().diloco, scenario.cluster.learners
    if d.max_staleness == 0 or m == 1:
        return math.inf
    return d.max_staleness * d.sync_every * pace.step_s / (m - 1)


class _DdlLedger:
    """Decoupled DiLoCo's ledger (faults/kinds/base.py `FleetLedger`): a kind's `fleet_ddl`
    charges it for one learner unit at a time, `unit`."""

    def __init__(self, c, pace: Pace, horizon_s: float):
        self.job_s, self.rejoin_s, self.detect_s, self.horizon_s = pace.job_s, pace.rejoin_s, pace.detect_s, horizon_s
        self.boot_s = pace.boot_s if c.spares else pace.cold_boot_s
        self.shards, self.slices, self.unit = c.shards, c.slices, 0
        self.spans = {m: {b: [] for b in ("dead", "recovery", "paused")} for m in range(c.learners)}
        self.cuts = {m: [] for m in range(c.learners)}  # (start, end, share of fragments)
        self.slice_away = 0.0

    def charge(self, bucket: str, a: float, b: float) -> None:
        self.spans[self.unit][bucket].append((a, b))

    def lost(self, a: float, b: float, target: str) -> None:
        self.cuts[self.unit].append((a, b, _share(target, self.shards)))

    def slices_away(self, a: float, b: float, slices: int) -> None:
        self.slice_away += (b - a) * min(slices, self.slices) / self.slices


def predict_ddl(scenario, pace: Pace) -> dict:
    """Decoupled DiLoCo on the scenario's drawn faults: goodput and badput (shares of M x job_s)."""
    c, T = scenario.cluster, pace.job_s
    horizon = staleness_horizon_s(scenario, pace)
    names = [f"learner-{i}" for i in range(c.learners)]
    ledger = _DdlLedger(c, pace, horizon)
    for f in scenario.schedule().faults:
        at = min(f.at_s, T)
        for m in _learner_index(f.target, names):
            ledger.unit = m
            f.fleet_ddl(ledger, at, _end(f, T))
    spans, cuts = ledger.spans, ledger.cuts
    total = {b: 0.0 for b in BUCKETS}
    for m in range(c.learners):
        taken: list = []
        for b in ("dead", "recovery", "paused"):
            own = minus(spans[m][b], taken)
            total[b] += measure(own)
            taken += own
        running = T - measure(taken)
        total["other"] += running * pace.overhead
        for a, b, share in cuts[m]:
            total["lost"] += measure(minus([(a, b)], taken)) * (1 - pace.overhead) * share
    allocated = c.learners * T
    badput = {b: v / allocated for b, v in total.items()}
    return {"goodput": 1.0 - sum(badput.values()), "badput": badput,
            "slice_away_share": ledger.slice_away / allocated,
            "staleness_horizon_s": None if math.isinf(horizon) else horizon}


class _DpLedger:
    """Data-parallel's ledger (faults/kinds/base.py `FleetLedger`): a kind's `fleet_dp`
    charges it once per fault that reaches a learner."""

    def __init__(self, c, pace: Pace):
        self.job_s, self.rejoin_s, self.detect_s, self.horizon_s = pace.job_s, pace.rejoin_s, pace.detect_s, math.inf
        # every member restarts at once: warm only if the spare pool can take every identity,
        # else the job waits for a cold start
        self.boot_s = pace.boot_s if c.spares and c.learners <= getattr(c, "spare_pool", 1) else pace.cold_boot_s
        self.stalls, self.restarts, self.slows = [], [], []

    def stall(self, a: float, b: float, restart: bool = False) -> None:
        self.stalls.append((a, b))
        if restart:
            self.restarts.append(a)

    def slowed(self, a: float, b: float, speed: float) -> None:
        self.slows.append((a, b, speed))


def predict_dp(scenario, pace: Pace) -> dict:
    """Data-parallel (no elasticity) on the same draw: one replica's fault stops all M."""
    c, T = scenario.cluster, pace.job_s
    names = [f"learner-{i}" for i in range(c.learners)]
    ledger = _DpLedger(c, pace)
    for f in scenario.schedule().faults:
        if _learner_index(f.target, names):
            f.fleet_dp(ledger, min(f.at_s, T), _end(f, T))
    stopped, restarts = norm(ledger.stalls), ledger.restarts
    # the rollback (the fleet model's rule): a restart loses what ran since the last
    # checkpoint, one every checkpoint_every_s of running; a wait loses nothing
    rolled, up_from = 0.0, 0.0
    for a, b in stopped:
        up = a - up_from
        if any(a <= t < b for t in restarts):
            rolled += up - math.floor(up / pace.checkpoint_every_s) * pace.checkpoint_every_s
        up_from = b
    # a slow replica holds the others to its speed: they wait (1 - speed) of its span
    slow = sum(measure(minus([(a, b)], stopped)) * (1 - speed) for a, b, speed in ledger.slows)
    allocated = c.learners * T
    running = T - measure(stopped)
    badput = {"dead": measure(stopped) * c.learners / allocated, "rolled_back": rolled * c.learners / allocated,
              "waiting_on_sync": slow * (c.learners - 1) / allocated,
              "other": (running - rolled - slow) * pace.overhead * c.learners / allocated}
    return {"goodput": 1.0 - sum(badput.values()), "badput": badput}


def _in_mode(scenario, mode: str):
    """The same scenario (and failure draw) in another training mode: a failure process
    prices the fleet model's chip failure by policy (faults/failures.py)."""
    return dataclasses.replace(scenario, train=dataclasses.replace(scenario.train, mode=mode))


def predict(scenario, pace: Pace) -> dict:
    """Both policies on the scenario's draw, and what they were priced with."""
    ddl = scenario if scenario.train.mode != "dp" else _in_mode(scenario, "decoupled")
    dp = _in_mode(scenario, "dp")
    return {"scenario": scenario.name, "learners": scenario.cluster.learners,
            "faults": len(ddl.schedule().faults), "ddl": predict_ddl(ddl, pace),
            "dp": predict_dp(dp, pace), "pace": dataclasses.asdict(pace)}
