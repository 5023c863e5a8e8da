"""`diloco-chaos runs`: the runs kept under an output folder, newest first, one line each
(scenario, when, tier, verdict, goodput, loss parity, folder), like Jepsen's `serve` index
or pytest-benchmark's saved runs; `--json` for tools. Every `run` is kept there already (a
folder named by its UTC time, `latest` naming the newest); this finds them again.
`previous_run(out, name, before)` is what `run --compare last` compares a new run with."""
from __future__ import annotations

import json
import time
from pathlib import Path

from diloco_chaos.harness.errors import UserError

REFERENCE_DIR = "_reference"


def register(sub, help_: str) -> None:
    p = sub.add_parser("runs", help=help_,
                       description="The runs kept under an output folder, newest first: scenario, when, tier, "
                                   "verdict (PASS / FAIL / UNKNOWN), goodput, loss parity, folder.")
    p.add_argument("--out", default="runs", type=Path, help="the output folder runs were written to (default runs/)")
    p.add_argument("-n", "--limit", type=int, default=20, metavar="N", help="the newest N runs (default 20; 0: all)")
    p.add_argument("--scenario", default=None, metavar="NAME", help="only the runs of this scenario")
    p.add_argument("--all", action="store_true", help="the fault-free reference runs (_reference/) too")
    p.add_argument("--json", action="store_true", help="a JSON list on stdout instead of the table")
    p.set_defaults(func=main)


def verdict(summary: dict) -> str:
    """PASS (every check held), FAIL (one did not), UNKNOWN (none failed, one could not tell)."""
    if any(c.get("valid") is False for c in summary.get("checks") or []):
        return "FAIL"
    return "PASS" if summary.get("valid") is True else "UNKNOWN"


def _header(run_dir: Path) -> dict:
    try:
        with open(run_dir / "events.jsonl") as f:
            return json.loads(f.readline())
    except (OSError, ValueError):
        return {}


def find_runs(out: Path, *, references: bool = False, scenario: str | None = None) -> list[dict]:
    """Every run folder under `out` holding a summary.json (and, with `references`, those
    under _reference/), newest first (by the summary's time of writing)."""
    dirs = [p.parent for p in out.glob("*/summary.json")]
    if references:
        dirs += [p.parent for p in (out / REFERENCE_DIR).glob("*/summary.json")]
    rows = []
    for d in dirs:
        if d.is_symlink():  # `latest`
            continue
        try:
            summary = json.loads((d / "summary.json").read_text())
        except (OSError, ValueError):
            continue
        header = _header(d)
        name = (header.get("scenario") or {}).get("name") or d.name
        if scenario is not None and name != scenario:
            continue
        written = (d / "summary.json").stat().st_mtime
        rows.append({"scenario": name, "when": time.strftime("%Y-%m-%d %H:%M:%S", time.localtime(written)),
                     "tier": header.get("tier"), "verdict": verdict(summary), "goodput": summary.get("goodput"),
                     "loss_parity": summary.get("loss_parity"), "reference": d.parent.name == REFERENCE_DIR,
                     "path": str(d), "_t": written})
    rows.sort(key=lambda r: r["_t"], reverse=True)
    for r in rows:
        del r["_t"]
    return rows


def previous_run(out: Path, scenario: str, before: Path) -> Path | None:
    """The newest run of `scenario` under `out` other than `before` (run --compare last)."""
    for r in find_runs(out, scenario=scenario):
        if Path(r["path"]).resolve() != Path(before).resolve():
            return Path(r["path"])
    return None


def _pct(x) -> str:
    return "-" if x is None else f"{100 * x:.1f} %"


def _parity(x) -> str:
    return "-" if x is None else f"{100 * x:+.2f} %"


def main(args) -> int:
    if args.limit < 0:
        raise UserError(f"runs --limit {args.limit}: a count of runs >= 0 (0: all)")
    if not args.out.is_dir():
        raise UserError(f"runs: no folder {args.out}; runs are kept where `run --out` wrote them (default runs/)")
    rows = find_runs(args.out, references=args.all, scenario=args.scenario)
    rows = rows[:args.limit] if args.limit else rows
    if args.json:
        print(json.dumps(rows, indent=1))
        return 0
    if not rows:
        print(f"no runs under {args.out}" + (f" of scenario {args.scenario}" if args.scenario else ""))
        return 0
    table = [("scenario", "when", "tier", "verdict", "goodput", "parity", "folder")]
    table += [(r["scenario"] + (" (reference)" if r["reference"] else ""), r["when"], r["tier"] or "-", r["verdict"],
               _pct(r["goodput"]), _parity(r["loss_parity"]), r["path"]) for r in rows]
    widths = [max(len(row[i]) for row in table) for i in range(len(table[0]) - 1)]
    for row in table:
        print("  ".join(cell.ljust(w) for cell, w in zip(row, widths)) + "  " + row[-1])
    return 0
