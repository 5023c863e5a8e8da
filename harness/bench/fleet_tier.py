"""The fleet model's tier of `bench fidelity`: its goodput for a scenario beside the real run's.

harness/fleet/scenario.py prices a scenario's drawn faults with the fleet model's
policy rules; what it needs of the machine (`Pace`: the run's length, the share of a
running unit's time outside its steps, the boots, the step time) is measured here from
the real run's own log — the boots and step time with the simulator's calibration
(harness/sim/calibrate.py) — so the sim tier and the fleet tier see the same machine and
differ only in what they model: the sim plays every message, link and core; the fleet
model only prices each fault.
"""
from __future__ import annotations

import json
import math
from pathlib import Path

GOAL_POINTS = 5.0  # issue 15: fleet vs real within +-5 points


STEADY_GAP_S = 2.0  # a longer gap between two steps is a fault's or a restart's, not the loop's


def steady_overhead(log) -> float:
    """The share of a running unit's time outside its steps, from its log: over every two
    consecutive steps of an incarnation (less than STEADY_GAP_S apart), the time between
    them outside the second one's `dt` (evals, checkpoint saves, the loop's own work), and
    inside it the time blocked on the others (data-parallel's wait for the mean gradient,
    which its `dt` includes). The steady cost of running under this policy on this
    machine, not of a fault: the faults' own costs are what the rules price."""
    from diloco_chaos.harness.intervals import clip, measure
    from diloco_chaos.harness.judging.history import histories

    spans = idle = 0.0
    for h in histories(log, math.inf).values():
        for inc in h.incs:
            for a, b in zip(inc.steps, inc.steps[1:]):
                gap = b["t"] - a["t"]
                if b["step"] != a["step"] + 1 or gap > STEADY_GAP_S:
                    continue
                blocked = measure(clip(inc.blocked, b["t"] - b["dt"], b["t"]))
                spans += gap
                idle += gap - max(0.0, b["dt"] - blocked)
    return round(max(0.0, idle) / spans, 6) if spans > 0 else 0.0


def pace_from_run(run_dir: Path):
    """The fleet model's `Pace`, measured from the run in `run_dir` (its log and summary)."""
    from diloco_chaos.harness import eventlog
    from diloco_chaos.harness.fleet.scenario import Pace
    from diloco_chaos.harness.sim.calibrate import params_from_log
    from diloco_chaos.trainer.protocol.learner_loop import CKPT_EVERY

    run_dir = Path(run_dir)
    log = eventlog.read(run_dir)
    p = params_from_log(log)  # p.step_s: the median of the units' step times
    summary = json.loads((run_dir / "summary.json").read_text())
    return Pace(job_s=summary["duration_s"], overhead=steady_overhead(log), boot_s=p.spare_startup_s,
                cold_boot_s=p.learner_startup_s, checkpoint_every_s=round(CKPT_EVERY * p.step_s, 6), step_s=p.step_s)


def fleet_row(scenario, real: dict) -> dict:
    """The fleet tier of one fidelity row: its prediction and the difference in points."""
    from diloco_chaos.harness.fleet.scenario import predict

    pred = predict(scenario, pace_from_run(Path(real["run_dir"])))
    return {"fleet": {"goodput": round(pred["ddl"]["goodput"], 6),
                      "badput": {k: round(v, 6) for k, v in pred["ddl"]["badput"].items()},
                      "dp_goodput": round(pred["dp"]["goodput"], 6), "pace": pred["pace"]},
            "fleet_minus_real_points": round(100 * (pred["ddl"]["goodput"] - real["goodput"]), 2)}
