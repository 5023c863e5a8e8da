"""`diloco-chaos bench report`: page weight and time to render a run page.

Pages: the fixture run the tests keep (suites/unit/data/report_run; in a checkout only: an
install has no suites/) and the newest run under ./runs/ (the demo's, if one ran). For each: bytes of the page, seconds
to write it (render_run: read the log, compute the page data, build the specs; median
of 3 after one warm-up), and seconds from opening it in headless Chromium to every
chart drawn (median of 3 fresh tabs; none without a browser). Goals: ≤ 5 MB, < 2 s.
"""
from __future__ import annotations

import statistics
import time
from importlib import resources
from pathlib import Path

from diloco_chaos.reports import browser, render_run

# (an editable install: the checkout beside the package's folder)
FIXTURE = Path(resources.files("diloco_chaos")).resolve().parent / "suites" / "unit" / "data" / "report_run"
GOAL_BYTES, GOAL_S = 5_000_000, 2.0


def _newest_run(runs: Path) -> Path | None:
    cands = [p.parent for p in runs.glob("*/events.jsonl") if p.parent.name not in ("bench", "_reference", "latest")]
    return max(cands, key=lambda d: (d / "events.jsonl").stat().st_mtime, default=None)


def _python_s(run_dir: Path, out: Path) -> float:
    render_run(run_dir, out)  # warm-up: imports, the cached JS bundle
    times = []
    for _ in range(3):
        t = time.perf_counter()
        render_run(run_dir, out)
        times.append(time.perf_counter() - t)
    return statistics.median(times)


def _browser_s(pages: list[Path]) -> dict[Path, float] | str:
    if browser.find() is None:
        return "no Chromium on PATH (scripts/install-browser.sh)"
    out = {}
    with browser.chromium() as ctx:
        for page in pages:
            times = []
            for _ in range(4):
                tab, s = browser.open_drawn(ctx, page)
                times.append(s)
                tab.close()
            out[page] = statistics.median(times[1:])  # the first tab also starts the renderer
    return out


def report(out_dir: Path) -> dict:
    work = out_dir / "report"
    work.mkdir(parents=True, exist_ok=True)
    runs = {"fixture": FIXTURE} if (FIXTURE / "events.jsonl").is_file() else {}
    newest = _newest_run(Path("runs"))
    if newest is not None:
        runs[newest.name] = newest
    pages, rows = {}, {}
    for name, d in runs.items():
        page = work / f"{name}.html"
        rows[name] = {"run_dir": str(d), "events": sum(1 for _ in open(d / "events.jsonl")) - 1,
                      "python_s": round(_python_s(d, page), 3), "page_bytes": page.stat().st_size}
        pages[name] = page
    browser = _browser_s(list(pages.values()))
    for name, page in pages.items():
        rows[name]["browser_s"] = round(browser[page], 3) if isinstance(browser, dict) else None
    return {"pages": rows, "browser": browser if isinstance(browser, str) else "chromium (headless)",
            "goal": {"page_bytes_max": GOAL_BYTES, "browser_s_max": GOAL_S},
            "met": all(r["page_bytes"] <= GOAL_BYTES and (r["browser_s"] or 0) < GOAL_S for r in rows.values())}
