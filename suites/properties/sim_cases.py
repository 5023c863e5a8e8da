"""What the property suites share: the scenario they vary, how a case is simulated,
and the failure report (the shrunk schedule as TOML plus the commands that replay it).

The base scenario is small on purpose, so that an example costs a fraction of a
second: the quadratic task, 3 learner units of 2 slices, 2 syncer shards, 60 inner
steps each, a 25 ms WAN (a WAN is what DiLoCo is for: with it, data-parallel pays
a round trip per step). Faults are drawn in WINDOW. It runs at the inner lr 0.1
(harness/bench/sim.py CONVERGED_LR) and ends near its floor: fault-free 0.0758, 1.11× the
quadratic's floor of 0.0681 (measured; at the default lr it ended at 0.828, 12×, where a
damaged model looked like an undamaged one). A base still learning at its end, for the
bugs that only slow learning, is LEARNING_BASE (test_baseline.py).
"""
from __future__ import annotations

import dataclasses
import hashlib
import json
import os
import re
from contextlib import contextmanager
from functools import cached_property, lru_cache
from pathlib import Path

import numpy as np
from hypothesis import settings

from diloco_chaos.faults.schedule import Schedule
from diloco_chaos.harness.judging import checks, metrics
from diloco_chaos.harness.run.result import with_mode
from diloco_chaos.harness.scenarios.scenario import Scenario, scenario_from_dict
from diloco_chaos.harness.scenarios.scenario_toml import scenario_to_toml
from diloco_chaos.harness.sim.run import SimParams, SimRun, simulate
from diloco_chaos.harness.bench.sim import PROPERTY_BASE, PROPERTY_WINDOW
from diloco_chaos.trainer.protocol.messages import FragmentUpdate

REPO = Path(__file__).resolve().parents[2]
REPORTS = REPO / "runs" / "properties"  # where a failing example's run is written

BASE = scenario_from_dict(PROPERTY_BASE)
WINDOW = PROPERTY_WINDOW
SIM = SimParams()
H = BASE.run_config().diloco.sync_every


def examples(n: int) -> settings:
    """n examples under the ci profile (40 by default), scaled with the profile in use
    (dev: n/2, nightly: 25·n); the suites' time budget is set in ci terms."""
    return settings(max_examples=max(1, round(n * settings.default.max_examples / 40)))


def scenario(schedule: Schedule | tuple = (), *, mode: str | None = None, **train) -> Scenario:
    """BASE with these faults and [train] settings (e.g. quorum=2, mixing=0.5)."""
    s = dataclasses.replace(BASE, faults=tuple(schedule), train=dataclasses.replace(BASE.train, **train))
    return with_mode(s, mode) if mode else s


class RejoinProbe:
    """Watches every learner core event: the first FragmentUpdate of fragment p after a
    learner (re)connects to p's shard is the fetch. It must leave θ[p] equal to the Θ[p] it
    carries, bit for bit, whatever the mixing α (docs/PROTOCOL.md, "Rejoin rule"); or, where
    the fetch keeps the local progress (keep_on_fetch: progress not yet contributed, made at
    most keep_gap versions behind (0: any) and not cut off while rounds went on; from a restarted
    shard with no round since, `unmoved`, up to three versions ahead; never with its oldest
    step made on a copy more than max_staleness versions behind the fetch), to Θ[p] + (θ[p] − r) with θ[p] and r (θ[p] as last sent,
    else the base) taken from the state before the fetch: a reference of the rule, not the
    core's code (equal to float rounding)."""

    def __init__(self):
        self.fresh: set = set()
        self.fetches = 0
        self.kept = 0
        self.mismatches: list[dict] = []
        self.before: dict = {}  # (learner, incarnation) -> the core state before the current event

    def __call__(self, proc, event: str, args: tuple) -> None:
        key = (proc.unit.name, proc.incarnation)
        owners = proc.core.config.owners
        pre, self.before[key] = self.before.get(key), proc.state  # states are immutable
        if event in ("start", "shard_connected"):
            self.fresh |= {(key, p) for p, s in enumerate(owners) if event == "start" or s == args[0]}
        elif event == "receive" and isinstance(args[1], FragmentUpdate) and (key, args[1].fragment) in self.fresh:
            msg, p = args[1], args[1].fragment
            self.fresh.discard((key, p))
            self.fetches += 1
            frag = proc.world.model.frag
            want = [np.asarray(b, np.float32) for b in msg.params]
            cfg, kept = proc.core.config, False
            gap = msg.version - pre.base_version[p] if pre is not None else 0
            restart = msg.unmoved and gap <= 3  # a restarted shard's: an answer's version, a crash's lost answers behind
            too_old = cfg.max_staleness > 0 and pre is not None and msg.version - pre.anchor_version[p] > cfg.max_staleness
            if (pre is not None and msg.params and cfg.keep_on_fetch and cfg.keep_local and pre.c_steps[p] > 0
                    and not too_old  # its oldest step made on a copy too far behind
                    and (restart or (not (p in pre.cut and gap > 0)  # made while cut off, moved on
                                     and (not cfg.keep_gap or gap <= cfg.keep_gap)))):
                ref = pre.base[p] if pre.sent_from[p] is None else pre.sent_from[p]
                had = frag.get(proc.core.params(pre), p)
                want = [w + (np.asarray(x, np.float32) - np.asarray(r, np.float32)) for w, x, r in zip(want, had, ref)]
                self.kept, kept = self.kept + 1, True
            mine = frag.get(proc.core.params(proc.state), p)
            same = all(np.allclose(a, b, rtol=1e-5, atol=1e-6) if kept else np.array_equal(a, b)
                       for a, b in zip(mine, want))
            if not same:
                gap = max(float(np.max(np.abs(a - b))) for a, b in zip(mine, want))
                self.mismatches.append({"learner": key[0], "incarnation": key[1], "fragment": p,
                                        "version": msg.version, "t": round(proc.world.now, 6), "max_abs_diff": gap})


@dataclasses.dataclass
class Case:
    """One simulated run of a scenario, and what the properties read from it."""

    scenario: Scenario
    run: SimRun
    bugs: frozenset
    probe: RejoinProbe

    @cached_property
    def log(self):
        return self.run.log()

    @cached_property
    def metrics(self) -> metrics.Metrics:
        faultless = not self.scenario.faults and self.scenario.failure_process is None
        ref = self if faultless and not self.bugs else reference(self.scenario)
        return metrics.compute(self.log, ref.log)

    def check(self, result: checks.Result, *, unknown_ok: bool = False) -> None:
        """A harness check as an assertion: it must hold. UNKNOWN (the run could not judge
        it) fails too, unless the caller says `unknown_ok` (an explicit opt-out)."""
        ok = result.valid is True or (unknown_ok and result.valid is None)
        verdict = {False: "failed", None: "UNKNOWN (not judged; UNKNOWN is not a pass)"}.get(result.valid, "")
        assert ok, f"{result.name} {verdict}: value {result.value}, bound {result.bound}, " \
                   f"{json.dumps(result.details, default=str)[:1500]}"


def simulate_case(s: Scenario, bugs=frozenset()) -> Case:
    probe = RejoinProbe()
    return Case(s, simulate(s, params=SIM, bugs=frozenset(bugs), probe=probe), frozenset(bugs), probe)


def reference(s: Scenario) -> Case:
    """The fault-free run of `s` (same config and seed), simulated once."""
    return _reference(json.dumps(dataclasses.replace(s, faults=(), failure_process=None).to_dict(), sort_keys=True))


@lru_cache(maxsize=16)
def _reference(key: str) -> Case:
    return simulate_case(scenario_from_dict(json.loads(key)))


# --- failure reports -------------------------------------------------------------------------
def report(case: Case, prop: str, detail: str, out: Path = REPORTS) -> str:
    """Writes the failing run (events.jsonl, scenario.toml) and says how to run it again."""
    toml = scenario_to_toml(case.scenario)
    # One folder per test, overwritten by each failing example while Hypothesis shrinks:
    # the last one written is the shrunk example the final message is about.
    test = os.environ.get("PYTEST_CURRENT_TEST", "").split(" ")[0].split("::")[-1]
    slot = re.sub(r"[^A-Za-z0-9_.-]", "_", test) or hashlib.sha256(toml.encode()).hexdigest()[:10]
    run_dir = out / f"{prop}-{slot}"
    case.run.header["replay"] = f"diloco-chaos replay {run_dir}"
    case.run.write(run_dir)
    bugs = (f"\n  planted bugs: {', '.join(sorted(case.bugs))}: the commands run without them; "
            f"diloco_chaos.harness.sim.run.replay_sim({str(run_dir)!r}, Path('runs')) keeps them") if case.bugs else ""
    return (f"{prop}: {detail}\n"
            f"  the schedule, shrunk by Hypothesis, as a scenario file ({run_dir / 'scenario.toml'}):\n"
            + "".join(f"    {line}\n" for line in toml.splitlines()) +
            f"  replay this run:          diloco-chaos replay {run_dir}\n"
            f"  run it in the simulator:  diloco-chaos run {run_dir / 'scenario.toml'} --tier sim\n"
            f"  run it on real processes: diloco-chaos run {run_dir / 'scenario.toml'}{bugs}")


@contextmanager
def reported(case: Case, prop: str, out: Path = REPORTS):
    """Turns a property's AssertionError into a report with the schedule and the replay command."""
    try:
        yield
    except AssertionError as e:
        raise AssertionError(report(case, prop, str(e), out)) from None
