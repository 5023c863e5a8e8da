"""`diloco-chaos report RUN_DIR...`: render a stored run's HTML page again (like Jepsen's
`analyze`), from its events.jsonl and summary.json only; `--index DIR` also writes a
suite index over the runs given."""
from __future__ import annotations

from pathlib import Path

from diloco_chaos.harness.errors import UserError


def register(sub, help_: str) -> None:
    p = sub.add_parser("report", help=help_, description=__doc__)
    p.add_argument("run_dirs", nargs="+", type=Path, metavar="RUN_DIR", help="a run directory (holds events.jsonl)")
    p.add_argument("--out", type=Path, default=None,
                   help="where to write the page (one RUN_DIR only; default RUN_DIR/report.html)")
    p.add_argument("--index", type=Path, default=None, metavar="DIR", help="also write DIR/index.html over the runs")
    p.add_argument("--screenshot", type=Path, default=None, metavar="PNG",
                   help="also save a full-page screenshot (one RUN_DIR; needs Chromium: scripts/install-browser.sh)")
    p.set_defaults(func=main)


def main(args) -> int:
    from diloco_chaos.harness.eventlog import EventLogError
    from diloco_chaos.reports import IndexEntry, render_index, render_run

    if (args.out is not None or args.screenshot is not None) and len(args.run_dirs) > 1:
        raise UserError("--out and --screenshot name one page: give one RUN_DIR with them")
    entries = []
    for d in args.run_dirs:
        if not (d / "events.jsonl").exists():
            raise UserError(f"{d}: no events.jsonl here; a run directory is what `diloco-chaos run` printed "
                            "after 'results:' (e.g. runs/chaos)")
        try:
            page = render_run(d, args.out)
        except EventLogError as e:
            raise UserError(str(e)) from None
        print(f"report: {page}")
        entries.append(IndexEntry(page, d))
        if args.screenshot is not None:
            from diloco_chaos.reports import browser

            try:
                print(f"screenshot: {browser.screenshot(page, args.screenshot)}")
            except RuntimeError as e:
                raise UserError(str(e)) from None
    if args.index is not None:
        print(f"index: {render_index(entries, args.index)}")
    return 0
