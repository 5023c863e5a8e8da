"""The run page and the suite index in a real headless Chromium: no console error or
warning, no request beyond the page's own file, every section present and drawn, one
timeline lane per unit, the brush zooming every time chart. Screenshots go to
runs/screenshots/ for people to look at; how long the page took to draw is printed
(`diloco-chaos bench report` records it; it is not asserted here)."""
from __future__ import annotations

import importlib.util
import json
import shutil
import subprocess
import sys
import time
from pathlib import Path

import pytest

from diloco_chaos.reports import page as pagemod
from diloco_chaos.reports import render_index, render_run

FIXTURE = Path(__file__).resolve().parents[1] / "unit" / "data" / "report_run"
SCREENSHOTS = Path(__file__).resolve().parents[2] / "runs" / "screenshots"


@pytest.fixture(scope="module")
def run_page(tmp_path_factory) -> Path:
    """The fixture run with a data-parallel companion and a fault-free reference beside it."""
    root = tmp_path_factory.mktemp("browser")
    run = root / "unit-faults"
    shutil.copytree(FIXTURE, run)
    shutil.copytree(FIXTURE, run / "dp")
    shutil.copytree(FIXTURE, root / "_reference" / "unit-faults")
    s = json.loads((run / "summary.json").read_text())
    s["dp"], s["reference_dir"] = json.loads((run / "dp" / "summary.json").read_text()), str(root / "_reference" / "unit-faults")
    (run / "summary.json").write_text(json.dumps(s))
    render_run(run / "dp")
    return render_run(run)


def expected_lanes(run_dir: Path) -> list[str]:
    header = json.loads((run_dir / "events.jsonl").open().readline())
    topo = header["topology"]
    learners, shards = topo["learners"], sorted(topo["shards"])
    slices = [f"{n} slices" for n in learners] if header["scenario"]["cluster"]["slices"] > 1 else []
    links = [f"{n}~{s}" for n in learners for s in sorted(topo["links"][n])]
    return ["global model", *learners, *slices, *shards, *links]


def axis_labels(v, chart: str, axis: str) -> list[str]:
    return v.page.evaluate(
        """([chart, axis]) => Array.from(document.querySelectorAll(
             `#chart-${chart} svg g.role-axis[aria-label^="${axis}-axis"] g.role-axis-label text`)).map(t => t.textContent)""",
        [chart, axis])


def axis_aria(v, chart: str) -> list[str]:
    return v.page.evaluate("""chart => Array.from(document.querySelectorAll(
        `#chart-${chart} svg g.role-axis[aria-label^="X-axis"]`)).map(g => g.getAttribute('aria-label'))""", chart)


def test_run_page_renders_offline_with_every_section(visit, run_page):
    t0 = time.perf_counter()
    v = visit(run_page)
    drawn_s = time.perf_counter() - t0
    assert v.complaints() == []
    assert v.foreign_requests() == []
    for sid, _ in pagemod.SECTIONS:
        text = v.page.inner_text(f"#{sid}").strip()
        assert text, f"section {sid} is empty"
    charts = v.page.eval_on_selector_all(".chart", """els => els.map(e => {
        const svg = e.querySelector('svg'); const r = svg ? svg.getBoundingClientRect() : {width: 0, height: 0};
        return [e.id, e.dataset.rendered || '', r.width, r.height]; })""")
    assert {c[0] for c in charts} == {f"chart-{k}" for k in  # no link_buffer line in the fixture: no "buffers"
                                      ("timeline", "loss", "badput", "learner_goodput", "recovery", "staleness",
                                       "staleness_time", "links", "bpt")}
    assert "no link buffer lines in this log" in v.page.inner_text("#buffers")
    for cid, rendered, w, h in charts:
        assert rendered == "1" and w > 100 and h > 30, cid
    assert axis_labels(v, "timeline", "Y") == expected_lanes(run_page.parent)
    lines = v.page.eval_on_selector_all("#chart-links g.mark-line path", "ps => ps.map(p => p.getAttribute('d') || '')")
    assert sum(len(d) > 50 and "NaN" not in d for d in lines) >= 2 * 2, "up and down drawn for both links"
    assert v.page.eval_on_selector_all("svg path", "ps => ps.filter(p => (p.getAttribute('d') || '').includes('NaN')).length") == 0
    SCREENSHOTS.mkdir(parents=True, exist_ok=True)
    v.page.screenshot(path=str(SCREENSHOTS / "report-unit-faults.png"), full_page=True)
    print(f"report page drawn in {drawn_s:.2f} s; screenshot {SCREENSHOTS / 'report-unit-faults.png'}")


def _unit_data():
    """suites/unit/test_report_buffers.py, for its `add_link_lines` (the fixture as a newer run logs it)."""
    path = Path(__file__).resolve().parents[1] / "unit" / "test_report_buffers.py"
    spec = importlib.util.spec_from_file_location("report_unit_data", path)
    mod = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(mod)
    return mod


@pytest.mark.parametrize("runaway", [False, True], ids=["bounded", "runaway"])
def test_link_buffers_starved_marks_and_staleness_over_time_are_drawn(visit, tmp_path, runaway):
    """The fixture with link_buffer, starved and stale-drop lines (a runaway backlog: a symlog
    axis): the new charts draw with no complaint, one ▼ per starved line on the timeline."""
    run = tmp_path / "starved"
    shutil.copytree(FIXTURE, run)
    _unit_data().add_link_lines(run, runaway=runaway)
    v = visit(render_run(run))
    assert v.complaints() == [] and v.foreign_requests() == []
    for key in ("buffers", "staleness_time", "timeline"):
        assert v.page.get_attribute(f"#chart-{key}", "data-rendered") == "1", key
    lines = v.page.eval_on_selector_all("#chart-buffers g.mark-line path", "ps => ps.map(p => p.getAttribute('d') || '')")
    assert len(lines) == 3 and all(len(d) > 20 and "NaN" not in d for d in lines), "2 links, one with a break"
    points = """ps => ps.filter(p => p.getAttribute('aria-roledescription') === 'point')
                           .map(p => p.getAttribute('aria-label'))"""
    marks = v.page.eval_on_selector_all("#chart-timeline g.mark-symbol.role-mark path", points)
    assert len(marks) == 2 and all("starved learner: learner-1; silent shard: syncer-0" in m for m in marks)
    crosses = v.page.eval_on_selector_all("#chart-staleness_time g.mark-symbol.role-mark path", points)
    assert len(crosses) == 1 and "staleness: 30" in crosses[0]  # the merges are circles, the stale drop a point
    assert v.page.eval_on_selector_all("svg path", "ps => ps.filter(p => (p.getAttribute('d') || '').includes('NaN')).length") == 0
    assert v.page.locator("#buffers table.starved tr").count() == 1 + 2
    SCREENSHOTS.mkdir(parents=True, exist_ok=True)
    v.page.locator("#buffers").screenshot(path=str(SCREENSHOTS / f"report-link-buffers-{'runaway' if runaway else 'bounded'}.png"))


def test_brushing_the_overview_zooms_every_time_chart(visit, run_page):
    v = visit(run_page)
    before = axis_aria(v, "loss") + axis_aria(v, "links")
    v.page.locator("#timeline").scroll_into_view_if_needed()
    box = v.page.locator("#chart-timeline svg").first.bounding_box()
    plot_x = v.page.evaluate("""() => {
        const g = document.querySelector('#chart-timeline svg g.role-axis[aria-label^="X-axis"]');
        const r = g.getBoundingClientRect(); return [r.left, r.right]; }""")
    y = box["y"] + 30  # the overview strip, under its title
    a, b = plot_x[0] + 0.25 * (plot_x[1] - plot_x[0]), plot_x[0] + 0.5 * (plot_x[1] - plot_x[0])
    v.page.mouse.move(a, y)
    v.page.mouse.down()
    v.page.mouse.move(b, y, steps=6)
    v.page.mouse.up()
    v.page.wait_for_function("document.getElementById('zoom-label').textContent !== 'whole run'")
    after = axis_aria(v, "loss") + axis_aria(v, "links")
    assert len(after) == len(before) and all(x != y for x, y in zip(before, after))
    v.page.click("[data-reset-zoom]")
    v.page.wait_for_function("document.getElementById('zoom-label').textContent === 'whole run'")
    assert v.complaints() == []


def test_index_page_links_each_run(visit, run_page, tmp_path):
    index = render_index([run_page, run_page.parent / "dp" / "report.html"], tmp_path / "suite")
    v = visit(index)
    assert v.complaints() == [] and v.foreign_requests() == []
    assert v.page.locator("tr[data-bad]").count() == 2
    v.page.click("tr[data-bad] a >> nth=0")
    v.page.wait_for_function("document.body.dataset.ready === '1'", timeout=60_000)
    assert v.page.url == run_page.resolve().as_uri()
    v.page.goto(index.resolve().as_uri())
    v.page.screenshot(path=str(SCREENSHOTS / "report-index.png"), full_page=True)


def test_report_command_saves_a_screenshot(tmp_path):
    """`diloco-chaos report RUN_DIR --screenshot PNG`: the page re-rendered, then photographed
    (in a process of its own: this session's Playwright already runs here)."""
    from diloco_chaos.reports import browser

    if browser.find() is None:
        pytest.skip("no Chromium on PATH; install one with scripts/install-browser.sh")
    run = tmp_path / "run"
    shutil.copytree(FIXTURE, run)
    cmd = ("import argparse, sys; from diloco_chaos import report_cmd; p = argparse.ArgumentParser(); "
           "report_cmd.register(p.add_subparsers(), ''); a = p.parse_args(sys.argv[1:]); sys.exit(a.func(a))")
    proc = subprocess.run([sys.executable, "-c", cmd, "report", str(run), "--screenshot", str(tmp_path / "shot.png")],
                          capture_output=True, text=True, timeout=300)
    assert proc.returncode == 0, proc.stderr
    assert f"screenshot: {tmp_path / 'shot.png'}" in proc.stdout
    png = (tmp_path / "shot.png").read_bytes()
    assert png[:8] == b"\x89PNG\r\n\x1a\n" and len(png) > 50_000


def test_the_loss_chart_starts_clipped_and_shows_the_whole_range_on_demand(visit, run_page):
    """The start-up evals (~5.5 nats) are off the default view; the checkbox brings them back."""
    v = visit(run_page)
    y_axis = """() => Array.from(document.querySelectorAll(
        '#chart-loss svg g.role-axis[aria-label^="Y-axis"]')).map(g => g.getAttribute('aria-label')).join('|')"""
    before = v.page.evaluate(y_axis)
    box = v.page.locator("#chart-loss input[type=checkbox]")
    assert box.count() == 1 and before
    box.check()
    v.page.wait_for_function(f"({y_axis})() !== {json.dumps(before)}")
    assert v.complaints() == []


def test_pages_of_a_report_folder_share_one_vega_bundle_and_say_so_without_it(visit, run_page, tmp_path):
    """A --chaos-report folder: each page loads the folder's one vega-embed-*.js (0.9 MB once,
    not in every page) and draws every chart with no request outside the folder; a page
    copied out without it says what it needs instead of failing with a script error."""
    folder = tmp_path / "report"
    pages = [render_run(run_page.parent, folder / f"test_{i}" / "0-run.html", shared_js=folder) for i in (1, 2)]
    bundle = list(folder.glob("vega-embed-*.js"))
    assert len(bundle) == 1 and all(p.stat().st_size < bundle[0].stat().st_size for p in pages)
    v = visit(pages[1])
    assert v.complaints() == [] and v.foreign_requests() == [bundle[0].resolve().as_uri()]
    assert v.page.locator(".chart[data-rendered='1']").count() == v.page.locator(".chart").count() > 0
    lone = tmp_path / "copied" / "0-run.html"
    lone.parent.mkdir()
    lone.write_text(pages[0].read_text())
    v = visit(lone)
    assert v.page.locator(".chart .error").count() == v.page.locator(".chart").count() > 0
    assert "vega-embed-*.js" in v.page.inner_text(".chart .error >> nth=0")
