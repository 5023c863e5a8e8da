"""`diloco-chaos bench fidelity`: does the simulator predict the real run?

Every built-in scenario with faults runs on real processes through Toxiproxy (the
cluster tier, local backend), then twice in the simulator with the same seed and drawn
schedule: with its default `SimParams`, and calibrated from that real run's own log
(harness/sim/calibrate.py: each learner's step time, eval and checkpoint costs, start-up
and spare boot — the machine's pace, not the faults' effects). Each row holds the three
goodputs, final losses, staleness, failed checks and wall times, and the goodput
differences in points (sim − real). `sim_vs_real_max_points` is the largest |difference|
of the calibrated simulator (goal ±3, issue 15), `sim_default_vs_real_max_points` the
same for the defaults, `misses` the rows of the calibrated one beyond the goal.

The third tier is the fleet model's rules priced on the scenario's own drawn faults
(harness/fleet/scenario.py, with the machine's pace measured from the same real run:
harness/bench/fleet_tier.py): `fleet` in each row, `fleet_minus_real_points`,
`fleet_vs_real_max_points` (goal ±5), `fleet_misses`.

`real_from` (`diloco-chaos bench fidelity --from DIR`) takes the real runs from an
earlier bench's `DIR/fidelity/real/NAME` instead of running them again, and recomputes
the simulator and fleet tiers from them (the simulations alone: ~35 min here, not ~60); the JSON says so
(`real_runs_from`).

Real-process figures move with this machine's load (2 shared cores): run it alone.
"""
from __future__ import annotations

import dataclasses
import time
from pathlib import Path

GOAL_POINTS = 3.0


def scenarios(names: list[str] | None = None) -> list:
    """The built-ins with faults (local backend), or those of `names`."""
    from diloco_chaos.harness.scenarios.scenario import list_scenarios, load_scenario

    out = []
    for name, _ in list_scenarios():
        s = load_scenario(name)
        if s.schedule().faults and (names is None or name in names):
            out.append(dataclasses.replace(s, cluster=dataclasses.replace(s.cluster, backend="local")))
    return out


def _tier(result, wall_s: float) -> dict:
    s = result.summary
    return {"goodput": s["goodput"], "final_loss": s["final_loss"], "staleness_max": s["staleness_max"],
            "recovery_cycles_median": s.get("recovery_cycles_median"),
            "failed_checks": [c["name"] for c in s["checks"] if c["valid"] is False],
            "wall_s": round(wall_s, 1), "run_dir": str(result.run_dir)}


def _timed(fn, *args, **kw) -> dict:
    t0 = time.monotonic()
    result = fn(*args, **kw)
    return _tier(result, time.monotonic() - t0)


def sim_rows(s, real: dict, out: Path) -> dict:
    """The two simulator runs of `s` beside its real run, and the differences."""
    from diloco_chaos.harness.sim.calibrate import replay_calibrated
    from diloco_chaos.harness.sim.run import run_sim

    sim = _timed(run_sim, s, out / "sim", expect=False)
    t0 = time.monotonic()
    result, params = replay_calibrated(s, real["run_dir"], out / "sim-calibrated")
    cal = {**_tier(result, time.monotonic() - t0), "sim_params": dataclasses.asdict(params)}
    return {"sim": sim, "sim_calibrated": cal,
            "sim_minus_real_points": round(100 * (cal["goodput"] - real["goodput"]), 2),
            "sim_default_minus_real_points": round(100 * (sim["goodput"] - real["goodput"]), 2),
            "loss_sim_vs_real": (cal["final_loss"] / real["final_loss"] - 1
                                 if real["final_loss"] and cal["final_loss"] else None)}


def summarize(rows: list[dict]) -> dict:
    from diloco_chaos.harness.bench.fleet_tier import GOAL_POINTS as FLEET_GOAL

    worst = max(abs(r["sim_minus_real_points"]) for r in rows)
    return {"sim_vs_real_max_points": worst, "goal_points": GOAL_POINTS,
            "sim_default_vs_real_max_points": max(abs(r["sim_default_minus_real_points"]) for r in rows),
            "misses": [r["scenario"] for r in rows if abs(r["sim_minus_real_points"]) > GOAL_POINTS],
            "fleet_vs_real_max_points": max(abs(r["fleet_minus_real_points"]) for r in rows),
            "fleet_goal_points": FLEET_GOAL,
            "fleet_misses": [r["scenario"] for r in rows if abs(r["fleet_minus_real_points"]) > FLEET_GOAL],
            "rows": rows}


def _stored_real(s, folder: Path) -> dict:
    """A real run of `s` kept by an earlier bench (`--from`), read back as a row's `real`."""
    import json

    from diloco_chaos.harness.errors import UserError

    run_dir = folder / s.name
    try:
        summary = json.loads((run_dir / "summary.json").read_text())
    except (OSError, ValueError) as e:
        raise UserError(f"--from: no finished real run of {s.name!r} at {run_dir} ({e}); "
                        f"valid: the folder an earlier `bench fidelity --out` wrote (its fidelity/real/NAME)") from None
    return {"goodput": summary["goodput"], "final_loss": summary["final_loss"],
            "staleness_max": summary["staleness_max"], "recovery_cycles_median": summary.get("recovery_cycles_median"),
            "failed_checks": [c["name"] for c in summary["checks"] if c["valid"] is False],
            "wall_s": None, "run_dir": str(run_dir)}


def fidelity(out_dir: Path, names: list[str] | None = None, real_from: Path | None = None) -> dict:
    """Registered in diloco_chaos/bench.py as `fidelity`."""
    from diloco_chaos.harness.backends.runner import run_scenario
    from diloco_chaos.harness.bench.fleet_tier import fleet_row

    out, rows = out_dir / "fidelity", []
    for s in scenarios(names):
        if real_from is None:
            real = _timed(run_scenario, s, out / "real", live=False, expect=False)
        else:
            real = _stored_real(s, Path(real_from) / "fidelity" / "real")
        rows.append({"scenario": s.name, "faults": len(s.schedule().faults), "real": real,
                     **sim_rows(s, real, out), **fleet_row(s, real)})
    return {**summarize(rows), "real_runs_from": None if real_from is None else str(real_from)}
