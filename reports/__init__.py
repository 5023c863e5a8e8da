"""HTML resilience reports: one self-contained page per run, an index page per suite.

    from diloco_chaos.reports import render_run, render_index
    render_run(Path("runs/chaos"))   # -> runs/chaos/report.html

Reads only a run's events.jsonl and its check results (summary.json); see docs/REPORTS.md.
"""
from diloco_chaos.reports.render import IndexEntry, render_index, render_run

__all__ = ["IndexEntry", "render_index", "render_run"]
