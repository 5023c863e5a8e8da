"""`diloco-chaos compare A B`: two runs side by side, B against A.

Every figure of the two summaries with its delta (fractions in % with their change in
points, losses to 4 significant digits, seconds to 2 decimals; rows zero on both sides
are left out), the checks whose state flipped (PASS, FAIL, UNKNOWN), and whether the
final-loss change is within the eval's noise (the loss-parity interval, where a summary
carries one). `--fail-on SPEC` judges B against A as its baseline and exits 1 when a rule
fails (harness/judging/gate.py).
"""
from __future__ import annotations

import argparse
import json
from pathlib import Path

from diloco_chaos.harness.judging import gate

FAIL_ON_HELP = ("judge B against A as its baseline; exit 1 when a rule fails. SPEC: FIGURE:±LIMIT[,...], e.g. "
                "goodput:-3pts,parity:+1%%,final_loss:+2%%,recovery:+5s. The sign is the way that fails (-3pts: "
                "fail if it fell by more than 3 points). Units: pts = percentage points of a fraction (goodput "
                "0.95 = 95 %%); %% = relative change, but points for fractions and percent gaps (goodput, uptime, "
                "parity, badput.*); s = seconds; none = absolute. A figure missing on either side fails. Figures: "
                + ", ".join(gate.FIGURE_ALIASES) + ", or a summary key (recovery_max_s, badput.dead, ...)")


def register(sub, help_: str) -> None:
    p = sub.add_parser("compare", help=help_, description=__doc__,
                       formatter_class=argparse.RawDescriptionHelpFormatter,
                       epilog="exit codes: 0 no --fail-on rule failed; 1 a rule failed; 2 bad input")
    p.add_argument("a", type=Path, metavar="A",
                   help="the first run (the baseline for --fail-on): a run directory or its summary.json")
    p.add_argument("b", type=Path, metavar="B", help="the second run, judged against A: a run directory or its summary.json")
    p.add_argument("--json", action="store_true",
                   help="print the comparison as JSON (figures, deltas, checks, flipped, noise; with --fail-on, gate)")
    p.add_argument("--fail-on", default=None, metavar="SPEC", help=FAIL_ON_HELP)
    p.add_argument("--all", action="store_true", help="also list the figures that are zero in both runs")
    p.set_defaults(func=main)


def main(args) -> int:
    rules = gate.parse_fail_on(args.fail_on) if args.fail_on is not None else None
    a, b = gate.load_summary(args.a), gate.load_summary(args.b)
    result = gate.compare(a, b)
    rows = gate.evaluate(b, a, rules) if rules is not None else None
    if args.json:
        out = dict(result, a=dict(result["a"], path=str(args.a)), b=dict(result["b"], path=str(args.b)))
        if rows is not None:
            out["gate"] = {"spec": args.fail_on, "held": gate.gate_held(rows), "rules": rows}
        print(json.dumps(out, indent=2, default=str))
    else:
        print(render(result, str(args.a), str(args.b), rows=rows, spec=args.fail_on, show_zero=args.all))
    return 0 if rows is None or gate.gate_held(rows) else 1


def render(result: dict, a_name: str, b_name: str, *, rows=None, spec=None, show_zero=False) -> str:
    """The comparison as aligned text."""
    shown = [f for f in result["figures"] if show_zero or not f["zero"]]
    table = [("figure", "A", "B", "Δ (B − A)")]
    table += [(f["key"], f["a_text"], f["b_text"], f["delta_text"]) for f in shown]
    table.append(("verdict", result["a"]["verdict"], result["b"]["verdict"], ""))
    widths = [max(len(r[i]) for r in table) for i in range(4)]
    lines = [f"A: {a_name}", f"B: {b_name}", ""]
    for i, r in enumerate(table):
        lines.append(f"{r[0]:<{widths[0]}}  {r[1]:>{widths[1]}}  {r[2]:>{widths[2]}}  {r[3]}".rstrip())
        if i == 0:
            lines.append("-" * (sum(widths) + 6))
    hidden = len(result["figures"]) - len(shown)
    if hidden:
        lines.append(f"({hidden} figure(s) zero in both runs not shown; --all lists them)")
    lines.append("")
    if result["flipped"]:
        lines.append("checks that flipped (A → B):")
        w = max(len(c["name"]) for c in result["flipped"])
        lines += [f"  {c['name']:<{w}}  {c['a']} → {c['b']}" for c in result["flipped"]]
    else:
        lines.append(f"checks that flipped: none ({len(result['checks'])} check(s) in the same state)")
    noise = result["noise"]
    lines.append(f"noise: {noise['note']}" if noise else
                 "noise: no loss interval in either summary: a final-loss change cannot be told from eval noise")
    if rows is not None:
        lines.append("")
        lines += gate.report_lines(rows, baseline_name="A (B judged against it)", spec=spec)
    return "\n".join(lines)
