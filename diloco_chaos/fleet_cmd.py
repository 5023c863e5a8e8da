"""`diloco-chaos fleet`: the fleet goodput table (harness/fleet/model.py), or with
`--scenario NAME|FILE` the fleet model's rules priced on that scenario's drawn faults
(harness/fleet/scenario.py): Decoupled DiLoCo and data-parallel on the same draw.

The machine's pace (the share of a running unit's time outside its steps, a warm
spare's and a cold process's boot) is this project's measured default, or with
`--calibrate RUN` measured from that run's log (harness/bench/fleet_tier.py), which
also sets the run length; without it the length is the scenario's `train.duration`.
"""
from __future__ import annotations

import json
from pathlib import Path

from diloco_chaos.harness.errors import UserError


def register(sub, help_: str) -> None:
    from diloco_chaos.harness.fleet import model

    p = model.register(sub, help_)
    p.add_argument("--scenario", metavar="NAME|FILE",
                   help="price this scenario's drawn faults with the fleet model's rules (DDL and DP) "
                        "instead of drawing failures over a fleet")
    p.add_argument("--calibrate", metavar="RUN",
                   help="with --scenario: take the machine's pace and the run length from this run's folder")
    p.set_defaults(func=main)


def main(args) -> int:
    from diloco_chaos.harness.fleet import model

    if not args.scenario:
        if args.calibrate:
            raise UserError("--calibrate: only with --scenario NAME|FILE (it measures the pace that prices one scenario)")
        return model.main(args)
    from diloco_chaos.run_cmd import _load
    from diloco_chaos.harness.fleet.scenario import Pace, predict

    s = _load(args.scenario, None)
    if args.calibrate:
        from diloco_chaos.harness.bench.fleet_tier import pace_from_run

        run = Path(args.calibrate)
        if not (run / "events.jsonl").is_file() or not (run / "summary.json").is_file():
            raise UserError(f"--calibrate: {run} has no events.jsonl and summary.json; valid: a run's folder "
                            f"(runs/NAME/...) that `diloco-chaos run` finished")
        pace = pace_from_run(run)
    else:
        pace = Pace(job_s=s.train.duration_s)
    res = predict(s, pace)
    print(f"scenario {s.name}: {s.cluster.learners} learner units, {res['faults']} faults drawn "
          f"(seed {s.seed}), {pace.job_s:g} s, pace {'from ' + args.calibrate if args.calibrate else 'default'}")
    for policy in ("ddl", "dp"):
        r = res[policy]
        bad = ", ".join(f"{k} {100 * v:.1f}%" for k, v in r["badput"].items() if v > 0)
        print(f"  {policy:<4} goodput {100 * r['goodput']:5.1f}%   badput: {bad or 'none'}")
    out = Path(args.out)
    out.mkdir(parents=True, exist_ok=True)
    path = out / f"fleet-{s.name}.json"
    path.write_text(json.dumps(res, indent=1) + "\n")
    print(f"wrote {path}")
    return 0
