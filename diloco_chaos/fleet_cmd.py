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
import time
from pathlib import Path

from diloco_chaos.harness.errors import UserError

# the duration flags: FleetParams field each sets (harness/fleet/model.py)
PARAM_FLAGS = {"--job": "job_s", "--detect": "detect_s", "--restart": "restart_s",
               "--checkpoint-every": "checkpoint_every_s", "--reconfig": "reconfig_s", "--repair": "repair_s"}


def register(sub, help_: str) -> None:
    from diloco_chaos.harness.fleet import model

    d = model.FleetParams()
    p = sub.add_parser("fleet", help=help_, description=model.__doc__.split("\n\n")[0])
    p.add_argument("--chips", default=model.DEFAULT_CHIPS, help=f"comma list of fleet sizes (default {model.DEFAULT_CHIPS})")
    p.add_argument("--learners", default=model.DEFAULT_LEARNERS,
                   help=f"comma list of M for Decoupled DiLoCo (default {model.DEFAULT_LEARNERS})")
    p.add_argument("--mtbi", default="1y", help="mean time between interruptions per chip, or 'never' (default 1y)")
    p.add_argument("--seed", type=int, default=0, help="seed of the failure draws (default 0)")
    p.add_argument("--out", default="runs/fleet", help="folder for fleet.json and fleet.html (default runs/fleet)")
    for flag, field in (("--slice-chips", "slice_chips"), ("--quorum", "quorum")):
        p.add_argument(flag, type=int, default=getattr(d, field),
                       help=f"{model.PARAM_DOC[field]} (default {getattr(d, field)})")
    for flag, field in PARAM_FLAGS.items():
        p.add_argument(flag, default=model.format_duration(getattr(d, field)),
                       help=f"{model.PARAM_DOC[field]} (default {model.format_duration(getattr(d, field))})")
    p.add_argument("--scenario", metavar="NAME|FILE",
                   help="price this scenario's drawn faults with the fleet model's rules (DDL and DP) "
                        "instead of drawing failures over a fleet")
    p.add_argument("--calibrate", metavar="RUN",
                   help="with --scenario: take the machine's pace and the run length from this run's folder")
    p.set_defaults(func=main)


def params_from_args(args):
    """The FleetParams the flags give (a UserError naming the flag for a value out of range)."""
    from diloco_chaos.harness.fleet.model import FleetParams, parse_duration

    kw = {field: parse_duration(getattr(args, flag[2:].replace("-", "_")), flag)
          for flag, field in PARAM_FLAGS.items()}
    kw["mtbi_s"] = parse_duration(args.mtbi, "--mtbi", allow_inf=True)
    try:
        return FleetParams(slice_chips=args.slice_chips, quorum=args.quorum, **kw)
    except ValueError as e:  # the message starts with the field; name the flag too
        flags = {**{f: k for k, f in PARAM_FLAGS.items()}, "mtbi_s": "--mtbi",
                 "slice_chips": "--slice-chips", "quorum": "--quorum"}
        flag = next((v for k, v in flags.items() if str(e).startswith(k)), "fleet")
        raise UserError(f"{flag}: {e}") from None


def table(args) -> int:
    """The fleet goodput table: printed, and written as fleet.json and fleet.html."""
    from diloco_chaos.harness.fleet import model

    chips = model.parse_counts(args.chips, "--chips")
    learners = model.parse_counts(args.learners, "--learners")
    p = params_from_args(args)
    t0 = time.perf_counter()
    res = model.run(chips, learners, p, args.seed)
    seconds = time.perf_counter() - t0
    print(f"goodput (productive / allocated chip-time), MTBI {model.format_duration(p.mtbi_s)} per chip, "
          f"{model.format_duration(p.job_s)} job, seed {args.seed}")
    print(model.format_table(res))
    print("\nuptime (share of wall time the global model advances)")
    print(model.format_table(res, "uptime"))
    js, page = model.write(res, Path(args.out))
    print(f"\nsimulated in {seconds:.2f} s\nwrote {js}\nwrote {page}")
    return 0


def main(args) -> int:
    if not args.scenario:
        if args.calibrate:
            raise UserError("--calibrate: only with --scenario NAME|FILE (it measures the pace that prices one scenario)")
        return table(args)
    from diloco_chaos.scenario_args import load
    from diloco_chaos.harness.fleet.scenario import Pace, predict

    s = load(args.scenario, None)
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
