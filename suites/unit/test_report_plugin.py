"""`pytest --chaos-report DIR`: a real pytest session in a subprocess, on a test file
that records the fixture run from a passing test, a failing test and a failing
Hypothesis property, and runs a sim scenario in a test that records nothing itself (the
harness tells the plugin); then its pages, index and JUnit XML are read back."""
from __future__ import annotations

import re
import subprocess
import sys
import xml.etree.ElementTree as ET
from pathlib import Path

import pytest

from diloco_chaos.reports import pytest_plugin

FIXTURE = Path(__file__).parent / "data" / "report_run"

TESTS = f'''
from hypothesis import given, settings, strategies as st

RUN = {str(FIXTURE)!r}

def test_passes(chaos_report):
    chaos_report.add(RUN)

def test_fails(chaos_report):
    chaos_report.add(RUN)
    assert 1 == 2, "goodput fell"

@settings(max_examples=50, derandomize=True, database=None)
@given(st.integers(0, 1000))
def test_property(chaos_report, n):
    chaos_report.add(RUN)
    assert n < 17

def test_runs_a_scenario_and_records_nothing_itself(tmp_path):
    from diloco_chaos.harness.scenarios.scenario import scenario_from_dict
    from diloco_chaos.harness.sim.run import run_sim
    s = scenario_from_dict({{"name": "plugin-sim", "seed": 3, "cluster": {{"learners": 2, "shards": 1}},
                            "train": {{"task": "quadratic", "steps": 20, "duration": "10s"}},
                            "faults": [{{"kind": "kill_unit", "target": "learner-1", "at": "1s",
                                        "down_for": "1s"}}]}})
    run_sim(s, tmp_path)
'''


@pytest.fixture(scope="module")
def session(tmp_path_factory):
    d = tmp_path_factory.mktemp("plugin")
    (d / "test_made_runs.py").write_text(TESTS)
    out, junit = d / "report", d / "junit.xml"
    proc = subprocess.run(
        [sys.executable, "-m", "pytest", "-p", "diloco_chaos.reports.pytest_plugin", "-p", "no:cacheprovider", "-q",
         f"--chaos-report={out}", f"--junitxml={junit}", "test_made_runs.py"],
        cwd=d, capture_output=True, text=True, timeout=300)
    return proc, out, junit


def test_index_and_a_page_per_recorded_run(session):
    proc, out, _ = session
    assert proc.returncode == 1, proc.stdout + proc.stderr  # two tests fail on purpose
    assert f"chaos report: {out / 'index.html'} (4 run pages)" in proc.stdout
    index = (out / "index.html").read_text()
    hrefs = re.findall(r'<a href="([^"]+)">', index)
    assert len(hrefs) == 4 and all((out / h).exists() for h in hrefs)
    assert index.count(">failed<") == 2 and index.count(">passed<") == 2


def test_the_folders_pages_share_one_vega_bundle(session):
    """The Vega bundle (0.9 MB) is written once beside the pages, each loading it by a
    relative path: a page is its own data and code only (1.2 MB -> 0.3 MB for unit-loss)."""
    _, out, _ = session
    bundle = list(out.glob("vega-embed-*.js"))
    pages = list(out.glob("*/*.html"))
    assert len(bundle) == 1 and len(pages) == 4
    for page in pages:
        html = page.read_text()
        assert f'<script src="../{bundle[0].name}"></script>' in html and "vegaEmbed=" not in html
        assert page.stat().st_size < bundle[0].stat().st_size


def test_failing_property_page_shows_the_shrunk_example_and_replay(session):
    _, out, _ = session
    page, = (out / "test_made_runs.py_test_property").glob("*.html")
    html = page.read_text()
    assert "test_property(" in html and "n=17," in html  # Hypothesis shrank 0..1000 to the boundary
    assert "pytest test_made_runs.py::test_property" in html
    assert "diloco-chaos replay" in html and "Fault schedule" in html
    fails = (out / "test_made_runs.py_test_fails").glob("*.html")
    assert "goodput fell" in next(fails).read_text()


def test_key_figures_land_in_junit_properties(session):
    _, _, junit = session
    cases = {c.get("name"): c for c in ET.parse(junit).getroot().iter("testcase")}
    props = {p.get("name"): p.get("value") for p in cases["test_passes"].iter("property")}
    assert props["chaos.goodput"].startswith("0.656")
    assert props["chaos.valid"] == "False"
    assert props["chaos.report"].endswith(".html")
    assert {"chaos.uptime", "chaos.bytes_per_token", "chaos.restarts"} <= set(props)


def test_falsifying_example_is_cut_where_its_brackets_close():
    text = ("E   AssertionError\nE   Falsifying example: test_p(\nE       chaos_report=...,\nE       schedule=[Kill(at_s=1.0)],\n"
            "E   )\nE   more text\n")
    assert pytest_plugin.falsifying_example(text) == (
        "Falsifying example: test_p(\n    chaos_report=...,\n    schedule=[Kill(at_s=1.0)],\n)")
    assert pytest_plugin.falsifying_example("Falsifying example: test_p(n=3)\nrest") == "Falsifying example: test_p(n=3)"
    assert pytest_plugin.falsifying_example("E   Failing test case: test_p(\nE       n=17,\nE   )") == (
        "Failing test case: test_p(\n    n=17,\n)")
    assert pytest_plugin.falsifying_example("no hypothesis here") == ""


def test_a_scenario_run_in_a_test_is_recorded_without_a_line_in_the_test(session):
    _, out, junit = session
    page, = (out / "test_made_runs.py_test_runs_a_scenario_and_records_nothing_itself").glob("*.html")
    assert "plugin-sim" in page.read_text()  # one page although the sim wrote events, then summary
    cases = {c.get("name"): c for c in ET.parse(junit).getroot().iter("testcase")}
    props = {p.get("name"): p.get("value") for p in
             cases["test_runs_a_scenario_and_records_nothing_itself"].iter("property")}
    assert 0 < float(props["chaos.goodput"]) <= 1 and {"chaos.uptime", "chaos.report"} <= set(props)
