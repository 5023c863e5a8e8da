"""Writing the pages: `render_run` (one page per run) and `render_index` (a suite's runs).

    render_run(Path("runs/chaos"))            # -> runs/chaos/report.html
    render_index([page, ...], Path("out"))    # -> out/index.html

A page is one self-contained HTML file: CSS, the Vega bundle, the specs and their
data are inlined, and a Content-Security-Policy forbids every request, so it works
offline and from a CI artifact. Templates (reports/templates/) only lay out values.
"""
from __future__ import annotations

import functools
import hashlib
import json
import os
from dataclasses import dataclass
from importlib import resources
from pathlib import Path

import jinja2
from markupsafe import Markup

from diloco_chaos.reports import assets, check_rows, page, runs

TEMPLATES = Path(resources.files(__package__)) / "templates"


@functools.lru_cache(maxsize=1)
def _env() -> jinja2.Environment:
    return jinja2.Environment(loader=jinja2.FileSystemLoader(TEMPLATES), autoescape=True,
                              undefined=jinja2.StrictUndefined, trim_blocks=False)


def _inline_json(obj) -> Markup:
    """JSON safe inside <script>: no '<' at all, so no '</script>' or '<!--'."""
    return Markup(json.dumps(obj, separators=(",", ":"), default=str, allow_nan=False).replace("<", "\\u003c"))


def _write(path: Path, text: str) -> Path:
    path.parent.mkdir(parents=True, exist_ok=True)
    tmp = path.with_name(f".{path.name}.{os.getpid()}.tmp")
    tmp.write_text(text, encoding="utf-8")
    tmp.replace(path)  # a reader never sees half a page
    return path


def render_run(run_dir: Path, out: Path | None = None, *, test: dict | None = None,
               shared_js: Path | None = None) -> Path:
    """Renders run_dir's page to `out` (default run_dir/report.html) and returns its path.
    `test`: the pytest test that made the run ({nodeid, outcome, command, falsifying,
    reproduce, error}), shown above the checks. `shared_js`: a folder above `out` where
    many pages are written (a --chaos-report folder): the Vega bundle (0.9 MB) is written
    there once and each page loads it by a relative path, instead of inlining it."""
    run_dir = Path(run_dir)
    out = Path(out) if out is not None else run_dir / "report.html"
    run = runs.load(run_dir)
    ctx = page.context(run, test)
    page.relative_links(ctx, out.parent)
    html = _env().get_template("run.html.j2").render(
        **ctx, specs_json=_inline_json(_clean(ctx.pop("specs"))),
        vega_script=_vega_script(out, shared_js), js=Markup((TEMPLATES / "report.js").read_text()),
        css=Markup((TEMPLATES / "report.css").read_text()))
    return _write(out, html)


def _vega_script(page: Path, shared_js: Path | None) -> Markup:
    """The page's Vega bundle: inlined (a page that opens on its own), or a <script src> to
    the one copy in `shared_js` (written there once, named by its content)."""
    js = assets.vega_js()
    if shared_js is None:
        return Markup(f"<script>{js}</script>")
    name = f"vega-embed-{hashlib.sha256(js.encode()).hexdigest()[:12]}.js"
    if not (Path(shared_js) / name).exists():
        _write(Path(shared_js) / name, js)
    rel = Path(os.path.relpath(Path(shared_js) / name, page.parent)).as_posix()
    return Markup(f'<script src="{rel}"></script>')


def _clean(obj):
    """NaN / inf are not JSON: they become null (Vega leaves a gap)."""
    if isinstance(obj, float):
        return obj if obj == obj and obj not in (float("inf"), float("-inf")) else None
    if isinstance(obj, dict):
        return {k: _clean(v) for k, v in obj.items()}
    if isinstance(obj, (list, tuple)):
        return [_clean(v) for v in obj]
    return obj


# --- the suite index ---------------------------------------------------------------------------


@dataclass(frozen=True)
class IndexEntry:
    page: Path                    # the run's page
    run_dir: Path                 # the run (summary.json, events.jsonl)
    label: str = ""               # e.g. the pytest node id that made it
    outcome: str | None = None    # the test's outcome: passed / failed / skipped


def _entry(p) -> IndexEntry:
    if isinstance(p, IndexEntry):
        return p
    p = Path(p)
    if p.is_dir():
        return IndexEntry(p / "report.html", p)
    return IndexEntry(p, p.parent)


def _header(run_dir: Path) -> dict:
    try:
        with open(run_dir / "events.jsonl") as f:
            return json.loads(f.readline())
    except (OSError, json.JSONDecodeError):
        return {}


def index_row(e: IndexEntry, out_dir: Path) -> dict:
    s = runs._read_summary(e.run_dir) or {}
    h = _header(e.run_dir)
    sc = h.get("scenario") or {}
    checks = s.get("checks") or []
    failed = [c["name"] for c in checks if c.get("valid") is False]
    status = check_rows.STATUS.get(s.get("valid")) if s else "unknown"
    reference = e.run_dir.parent.name == runs.REFERENCE_DIR
    if reference and status != "fail":  # a yardstick, not a run under test: its parity has nothing to be judged against
        status = "reference"
    return {
        "name": sc.get("name") or e.run_dir.name, "label": e.label, "outcome": e.outcome,
        "href": os.path.relpath(e.page, out_dir) if e.page.exists() else None,
        "status": status, "reference": reference, "failed": failed,
        "seed": h.get("seed", "–"), "mode": s.get("mode") or ((h.get("config") or {}).get("diloco") or {}).get("mode", "–"),
        "faults": len(h.get("schedule") or []),
        "goodput": check_rows.fmt(s.get("goodput"), "pct"), "goodput_v": s.get("goodput") or 0.0,
        "uptime": check_rows.fmt(s.get("uptime"), "pct"), "parity": check_rows.fmt(s.get("loss_parity"), "parity"),
        "recovery": check_rows.fmt(s.get("recovery_max_s"), "s"), "bpt": check_rows.fmt(s.get("bytes_per_token"), "int"),
        "restarts": s.get("restarts", "–"), "duration": check_rows.fmt(s.get("duration_s"), "s"),
        "replay": h.get("replay", ""),
    }


def render_index(pages: list, out_dir: Path, *, title: str = "diloco-chaos suite") -> Path:
    """out_dir/index.html: every run with its verdict, key figures and a link to its page.
    `pages`: IndexEntry, a page path or a run directory each."""
    out_dir = Path(out_dir)
    rows = [index_row(_entry(p), out_dir) for p in pages]
    counts = {k: sum(r["status"] == k for r in rows) for k in ("fail", "unknown", "pass", "reference")}
    # a test counts once, however many runs it made (its run, the reference, data-parallel)
    outcomes = {r["label"] or id(r): r["outcome"] for r in rows if r["outcome"]}
    tests = {k: sum(o == k for o in outcomes.values()) for k in ("passed", "failed", "skipped")}
    html = _env().get_template("index.html.j2").render(
        title=title, rows=rows, counts=counts, tests=tests, css=Markup((TEMPLATES / "report.css").read_text()))
    return _write(out_dir / "index.html", html)
