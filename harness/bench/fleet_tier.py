"""The fleet model's tier of `bench fidelity`: its goodput for a scenario beside the real run's.

harness/fleet/scenario.py prices a scenario's drawn faults with the fleet model's
policy rules; what it needs of the machine (`Pace`: the run's length, the share of a
running unit's time outside its steps, a warm spare's boot) is measured here from the
real run's own log, with the simulator's calibration (harness/sim/calibrate.py), so the
sim tier and the fleet tier see the same machine and differ only in what they model:
the sim plays every message, link and core; the fleet model only prices each fault.
"""
from __future__ import annotations

import json
import statistics
from pathlib import Path

GOAL_POINTS = 5.0  # issue 15: fleet vs real within +-5 points


def pace_from_run(run_dir: Path, scenario):
    """The fleet model's `Pace` for `scenario`, measured from the real run in `run_dir`."""
    from harness import eventlog
    from harness.fleet.scenario import Pace
    from harness.sim.calibrate import params_from_log
    from trainer.learner_loop import CKPT_EVERY

    run_dir = Path(run_dir)
    p = params_from_log(eventlog.read(run_dir))
    cfg = scenario.run_config()
    # host work per step: the loop's own, an eval every eval_every steps, a save every CKPT_EVERY
    per_step = p.loop_s + p.eval_s / cfg.eval_every + p.ckpt_s / CKPT_EVERY
    steps = p.step_s_by_unit or (p.step_s,)
    overhead = statistics.fmean(per_step / (s + per_step) for s in steps)
    summary = json.loads((run_dir / "summary.json").read_text())
    return Pace(job_s=summary["duration_s"], overhead=round(overhead, 6), boot_s=p.spare_startup_s,
                cold_boot_s=p.learner_startup_s, checkpoint_every_s=round(CKPT_EVERY * statistics.median(steps), 6),
                step_s=round(statistics.median(steps), 6))


def fleet_row(scenario, real: dict) -> dict:
    """The fleet tier of one fidelity row: its prediction and the difference in points."""
    from harness.fleet.scenario import predict

    pred = predict(scenario, pace_from_run(Path(real["run_dir"]), scenario))
    return {"fleet": {"goodput": round(pred["ddl"]["goodput"], 6),
                      "badput": {k: round(v, 6) for k, v in pred["ddl"]["badput"].items()},
                      "dp_goodput": round(pred["dp"]["goodput"], 6), "pace": pred["pace"]},
            "fleet_minus_real_points": round(100 * (pred["ddl"]["goodput"] - real["goodput"]), 2)}
