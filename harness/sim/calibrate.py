"""The simulator's parameters, measured from a real run's own event log.

`diloco-chaos replay RUN --tier sim` of a run made on real processes replays its
scenario and schedule in the simulator with `params_from_log(log)` instead of the
defaults, and reports the two goodputs side by side. What is measured (start-up and
eval costs as medians, so one outlier does not set them; step and loop times as means,
since goodput is a sum of times):

- `loop_s`: the loop's own work between two steps (links, control file, step line):
  the mean time between consecutive step lines beyond the second's `dt` (the `other`
  badput), after steps with no eval or checkpoint;
- `step_s_by_unit`: each learner's mean interval between consecutive step lines less
  `loop_s` (so the simulated pace is the real one, the slow steps this machine's
  contention makes included). Both leave out the intervals inside the faults that act on
  that learner's process (pause, slow, kill, a lost slice) and those over WAIT_S (the
  protocol holding it back): the simulator plays those itself;
- `eval_s`, `ckpt_s`: the time beyond the next step's `dt` after an eval step / a
  checkpoint step, less `loop_s`;
- `learner_startup_s`: launch → a learner's `unit_up` (process start, imports, the
  task, Θ0), plus what its first step took beyond a step (the compile); the fetch
  before it the simulator plays itself;
- `syncer_startup_s`: launch → a shard's `unit_up`;
- `spare_startup_s`: a restart that took a warm spare → its first inner step.

Left at their defaults: jitter, link delays and buffers, the shard's save time.
"""
from __future__ import annotations

import dataclasses
import statistics

from diloco_chaos.harness.eventlog import EventLog
from diloco_chaos.harness.sim.world import SimParams

CKPT_EVERY = 50  # trainer/protocol/learner_loop.py
WAIT_S = 1.0  # two step lines further apart: the protocol held the learner back (the simulator plays that)
PACE_FAULTS = ("pause_unit", "slow_unit", "kill_unit", "kill_slice")  # faults that change a unit's own pace


def _median(xs, default: float) -> float:
    xs = [x for x in xs if x is not None]
    return float(statistics.median(xs)) if xs else default


def _own_fault_windows(log: EventLog, learner: str) -> list[tuple[float, float]]:
    """Log-time windows in which a fault acted on this learner's process (and a second
    after): its pace there is the fault's, which the simulator plays itself."""
    t0, out = log.header.get("t_start") or 0.0, []
    for f in log.header.get("schedule") or ():
        if f.get("target") == learner and f.get("kind") in PACE_FAULTS:
            length = f.get("duration_s") or f.get("down_for_s") or 0.0
            out.append((t0 + f["at_s"], t0 + f["at_s"] + length + 1.0))
    return out


def _intervals(log: EventLog, learner: str) -> tuple[list[float], list[float], list[float], list[float]]:
    """Of one learner's consecutive step lines outside its own faults and under WAIT_S apart:
    the intervals after a plain step, and the time beyond the next step's `dt` (≥ 0) after a
    plain step, an eval step, a checkpoint step."""
    every = log.config.get("eval_every") or 100
    windows = _own_fault_windows(log, learner)
    gaps, plain, evals, ckpts = [], [], [], []
    steps = log.of("step", src=learner)
    for a, b in zip(steps, steps[1:]):
        gap = b["t"] - a["t"]
        if b["step"] != a["step"] + 1 or gap > WAIT_S or any(lo < b["t"] and a["t"] < hi for lo, hi in windows):
            continue  # a restart in between, a wait the protocol made, or a fault's doing
        between = max(0.0, gap - b["dt"])
        if a["step"] % every == 0:
            evals.append(between)
        elif a["step"] % CKPT_EVERY == 0:
            ckpts.append(between)
        else:
            gaps.append(gap)
            plain.append(between)
    return gaps, plain, evals, ckpts


def params_from_log(log: EventLog, base: SimParams = SimParams()) -> SimParams:
    """SimParams measured from a cluster-tier run's log (see the module docstring)."""
    learners = log.header["topology"]["learners"]
    t_launch = log.header.get("t_launch")
    steps, loops, evals, ckpts, firsts = [], [], [], [], []
    for name in learners:
        gaps, plain, ev, ck = _intervals(log, name)
        loop = float(statistics.fmean(plain)) if plain else 0.0
        step = float(statistics.fmean(gaps)) - loop if gaps else base.step_s  # the pace: mean interval
        steps.append(step)
        loops.append(loop)
        evals += [g - loop for g in ev]
        ckpts += [g - loop for g in ck]
        up = next((e["t"] for e in log.of("unit_up", src=name) if e.get("incarnation") == 0), None)
        first = next((e for e in log.of("step", src=name)), None)
        if up is not None and first is not None and t_launch is not None:
            firsts.append(up - t_launch + max(0.0, first["dt"] - step))  # the first step's compile too
    shard_ups = [e["t"] - t_launch for e in log.of("unit_up") if e["src"] in log.header["topology"]["shards"]
                 and e.get("incarnation") == 0 and t_launch is not None]
    from diloco_chaos.harness.judging import metrics  # the run's restarts, as the summary reads them

    spare_boots = [r.boot_s for r in metrics.compute(log).recovery if r.start == "spare"]
    return dataclasses.replace(
        base, step_s_by_unit=tuple(round(s, 6) for s in steps), hetero=0.0,
        step_s=round(statistics.median(steps), 6), loop_s=round(statistics.median(loops), 6),
        eval_s=round(max(0.0, _median(evals, 0.0)), 6), ckpt_s=round(max(0.0, _median(ckpts, 0.0)), 6),
        learner_startup_s=round(max(0.0, _median(firsts, base.learner_startup_s)), 6),
        syncer_startup_s=round(max(0.0, _median(shard_ups, base.syncer_startup_s)), 6),
        spare_startup_s=round(_median(spare_boots, base.spare_startup_s), 6))


def replay_calibrated(s, real_dir, out, *, label: str | None = None):
    """Scenario `s` (the real run's, with its drawn schedule) in the simulator with the
    parameters measured from the real run in `real_dir`: (the sim's RunResult, the params)."""
    from pathlib import Path

    from diloco_chaos.harness import eventlog
    from diloco_chaos.harness.sim.run import run_sim

    params = params_from_log(eventlog.read(Path(real_dir)))
    return run_sim(s, out, params=params, label=label, expect=False), params
