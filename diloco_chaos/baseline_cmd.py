"""`diloco-chaos baseline record NAME`: a scenario's known-good envelope, recorded on purpose.

Runs the scenario (a built-in name or a file) several times on one tier with the code as it
is, one seed after another (`--seeds`, default the scenario's and the two after it), and
stores the spread of what the runs kept (goodput, tokens merged, tokens lost or in flight,
final loss): a built-in scenario's in harness/scenarios/envelopes.json, any other scenario's
in an envelopes.json beside its file (harness/judging/envelopes.py). Every later
run of that scenario and tier is judged against it. Only from code you trust: an envelope
recorded from a bug makes the bug the standard. `baseline show NAME` prints what is stored."""
from __future__ import annotations

import dataclasses
import json
import tempfile
from pathlib import Path

from diloco_chaos.harness.errors import UserError


def register(sub, help_: str) -> None:
    p = sub.add_parser("baseline", help=help_, description=__doc__.split("\n\n")[0])
    what = p.add_subparsers(dest="action", metavar="ACTION", required=True, help="record or show")
    rec = what.add_parser("record", help="run the scenario on known-good code and store its envelope")
    rec.add_argument("scenario", help="a TOML file, or a built-in name")
    rec.add_argument("--tier", choices=["cluster", "sim"], default="sim", help="the tier whose envelope it is (default sim)")
    rec.add_argument("--seeds", default=None, metavar="N,N,N",
                     help="the seeds of the known-good runs (at least 3; default: the scenario's and the two after)")
    rec.add_argument("--why", default="", help="a note kept with the envelope (which code, which machine)")
    rec.add_argument("--add", action="store_true",
                     help="add these runs to the stored envelope (e.g. the same seeds on a busy machine) "
                          "instead of replacing it")
    rec.set_defaults(func=cmd_record)
    show = what.add_parser("show", help="print the stored envelope of a scenario and tier")
    show.add_argument("scenario")
    show.add_argument("--tier", choices=["cluster", "sim"], default="sim")
    show.set_defaults(func=cmd_show)


def _seeds(text: str | None, first: int, least: int = 3) -> list[int]:
    if text is None:
        return [first, first + 1, first + 2]
    try:
        seeds = [int(x) for x in text.split(",") if x.strip()]
    except ValueError:
        raise UserError(f"--seeds {text!r}: whole numbers separated by commas, e.g. --seeds 1,2,3") from None
    if len(seeds) < least or len(set(seeds)) != len(seeds):
        raise UserError(f"--seeds {text!r}: at least {least} different seed{'s' if least > 1 else ''}"
                        f"{' (an envelope is a spread)' if least > 1 else ''}")
    return seeds


def cmd_record(args) -> int:
    from diloco_chaos.harness.judging import envelopes
    from diloco_chaos.scenario_args import load, runner

    from diloco_chaos.harness.scenarios.scenario import locate

    s = load(args.scenario, None)
    store = envelopes.store_for(locate(args.scenario)[0])
    before = envelopes.stored(s, args.tier, store=store) if args.add else None
    if args.add and before is None:
        raise UserError(f"--add: no envelope stored for {envelopes.key(s, args.tier)} to add to; record one first")
    seeds, run = _seeds(args.seeds, s.seed, 1 if args.add else 3), runner(args.tier)
    runs = list(before["runs"]) if before else []
    with tempfile.TemporaryDirectory(prefix="envelope-") as out:
        for seed in seeds:
            print(f"known-good run of {s.name}, seed {seed}, tier {args.tier}", flush=True)
            result = run(dataclasses.replace(s, seed=seed), Path(out), live=False, reference=None)
            figures = envelopes.figures_of(result.summary)
            runs.append({"seed": seed, **figures})
            print("  " + ", ".join(f"{k} {v:.4g}" if v is not None else f"{k} -" for k, v in figures.items()))
    why = "; ".join(x for x in ((before or {}).get("why", ""), args.why) if x)
    entry = envelopes.record(s, args.tier, runs, store=store, why=why)
    print(f"stored {envelopes.key(s, args.tier)} in {store}")
    _print(entry)
    return 0


def cmd_show(args) -> int:
    from diloco_chaos.harness.judging import envelopes
    from diloco_chaos.scenario_args import load

    from diloco_chaos.harness.scenarios.scenario import locate

    s = load(args.scenario, None)
    entry = envelopes.stored(s, args.tier, store=envelopes.store_for(locate(args.scenario)[0]))
    if entry is None:
        print(f"no envelope for {envelopes.key(s, args.tier)} (record one: diloco-chaos baseline record "
              f"{args.scenario} --tier {args.tier})")
        return 1
    _print(entry)
    return 0


def _print(entry: dict) -> None:
    from diloco_chaos.harness.judging import envelopes

    for name, spread in entry["figures"].items():
        f = envelopes.FIGURES[name]
        print(f"  {f.check}: known good {spread['min']:.4g}..{spread['max']:.4g}, band {envelopes.band(f, spread):.3g} "
              f"({len(spread['values'])} runs, {entry['recorded']})")
    if entry.get("why"):
        print(f"  why: {json.dumps(entry['why'])}")
