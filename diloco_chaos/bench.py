"""`diloco-chaos bench NAME`: benchmarks write runs/bench/NAME.json and print it.

A benchmark is a function `run(out_dir: Path) -> dict` in some module; this file
only maps names to those functions and writes the result. Performance is
measured here, never asserted in timed tests.
"""
from __future__ import annotations

import argparse
import importlib
import json
import platform
import time
from pathlib import Path

from diloco_chaos.harness.errors import UserError

# name -> ("module:function", one line of what it measures)
BENCHES: dict[str, tuple[str, str]] = {
    "fleet": ("diloco_chaos.harness.fleet.model:bench", "seconds for the full fleet goodput table"),
    "overhead": ("diloco_chaos.harness.bench.benches:overhead", "learner tokens/s in the full system / bare inner loop"),
    "bandwidth": ("diloco_chaos.harness.bench.benches:bandwidth", "bytes per trained token, DP vs Decoupled DiLoCo (fp32, int4)"),
    "parity": ("diloco_chaos.harness.bench.benches:parity", "final held-out loss, Decoupled DiLoCo vs DP at equal tokens"),
    "frontier": ("diloco_chaos.harness.bench.frontier:frontier", "quality against bytes: parity gap vs bytes reduction "
                 "over H x codec (fp32, int4, sparse), with intervals over seeds; writes frontier.svg"),
    "report": ("diloco_chaos.reports.bench:report", "page weight and time to draw a run's HTML report (<= 5 MB, < 2 s)"),
    "wan": ("diloco_chaos.harness.bench.wan:wan", "time to a target loss over throttled links (rate sweep), DP vs Decoupled DiLoCo"),
    "grace": ("diloco_chaos.harness.bench.grace:grace", "heterogeneous units: K = M vs K = 1 without / with the grace window "
              "(goodput, final loss with intervals)"),
    "fidelity": ("diloco_chaos.harness.bench.fidelity:fidelity", "goodput of every built-in scenario with faults on real processes "
                 "and in the simulator, and their difference in points"),
    "sim": ("diloco_chaos.harness.bench.sim:bench", "simulator: property examples/min (quadratic), simulated s per wall s (LM)"),
}


TAKES_FROM = ("fidelity",)  # benches whose function takes `real_from`


def register(sub, help_: str) -> None:
    benches = "\n".join(f"  {name:10s} {line}" for name, (_, line) in BENCHES.items())
    p = sub.add_parser("bench", help=help_, formatter_class=argparse.RawDescriptionHelpFormatter,
                       description="Run a benchmark: it writes runs/bench/NAME.json (figures, the machine, "
                                   "the time it took) and prints it. Methods and current figures: "
                                   "docs/BENCHMARKS.md.",
                       epilog="benchmarks:\n" + benches)
    p.add_argument("name", metavar="NAME", help="the benchmark (listed below)")
    p.add_argument("--out", default="runs/bench", help="folder for NAME.json (default runs/bench)")
    p.add_argument("--from", dest="real_from", metavar="DIR",
                   help=f"({', '.join(TAKES_FROM)} only) take the real runs an earlier bench kept in DIR "
                        "(its --out) instead of running them again")
    p.set_defaults(func=main)


def _render_runs(folder: Path) -> None:
    """A report beside every run the bench kept that has none yet (every run writes one)."""
    from diloco_chaos.run_cmd import render

    for log in sorted(folder.glob("**/events.jsonl")) if folder.is_dir() else ():
        if not (log.parent / "report.html").exists():
            render(log.parent)


def main(args) -> int:
    if args.name not in BENCHES:
        raise UserError(f"unknown benchmark {args.name!r}; valid: {', '.join(sorted(BENCHES))}")
    target, _ = BENCHES[args.name]
    module, func = target.split(":")
    fn = getattr(importlib.import_module(module), func)
    out = Path(args.out)
    out.mkdir(parents=True, exist_ok=True)
    kw = {}
    if getattr(args, "real_from", None):
        if args.name not in TAKES_FROM:
            raise UserError(f"--from: the {args.name!r} bench runs everything itself; valid with: {', '.join(TAKES_FROM)}")
        kw["real_from"] = Path(args.real_from)
    t0 = time.time()
    result = fn(out, **kw)
    _render_runs(out / args.name)
    result = {
        "bench": args.name,
        "unix_time": round(t0),
        "machine": {"node": platform.node(), "cpu_count": _cpus(), "python": platform.python_version()},
        **result,
    }
    path = out / f"{args.name}.json"
    path.write_text(json.dumps(result, indent=2) + "\n")
    print(json.dumps(result, indent=2))
    print(f"wrote {path}")
    return 0


def _cpus() -> int:
    import os

    return len(os.sched_getaffinity(0))
