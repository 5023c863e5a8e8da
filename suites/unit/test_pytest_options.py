"""The `chaos` plugin's own options and marker, each in a real pytest session in a
subprocess in a directory with no ini file and no conftest (`-p diloco_chaos.pytest_plugin`,
as a user's repository gets it): `--chaos-tier`, `--chaos-baseline` / `--chaos-fail-on`
(a test whose stored baseline is 5 points better in goodput fails, one 2 points better
passes), the `chaos` marker registered by the plugin itself, and `--chaos-report` under
pytest-xdist (`-n 2`: the controller's index lists the runs both workers made)."""
from __future__ import annotations

import json
import re
import subprocess
import sys
from pathlib import Path

import pytest

# a tiny sim scenario (about half a second): two learners, one killed and back
SCENARIO = '''
from diloco_chaos.harness.scenarios.scenario import scenario_from_dict

def tiny(name):
    return scenario_from_dict({{"name": name, "seed": 3, "cluster": {{"learners": 2, "shards": 1}},
                               "train": {{"task": "quadratic", "steps": 20, "duration": "10s"}},
                               "faults": [{{"kind": "kill_unit", "target": "learner-1", "at": "1s", "down_for": "1s"}}]}})
'''.format()


def _pytest(d: Path, *args: str) -> subprocess.CompletedProcess:
    return subprocess.run([sys.executable, "-m", "pytest", "-p", "diloco_chaos.pytest_plugin", "-p", "no:cacheprovider",
                           "-q", "-rA", *args], cwd=d, capture_output=True, text=True, timeout=300)


def _user_dir(tmp_path: Path, tests: str) -> Path:
    d = tmp_path / "user-repo"
    d.mkdir()
    (d / "tiny.py").write_text(SCENARIO)
    (d / "test_user.py").write_text(tests)
    return d


TIER_TESTS = '''
import pytest
import diloco_chaos.harness.backends.runner as runner
from diloco_chaos.harness.sim.run import run_sim
from tiny import tiny

@pytest.fixture
def tiers(monkeypatch):
    used = []  # a cluster run here would need real processes: the sim stands in, the call is recorded
    def fake_cluster(s, out_dir, live, reference):
        used.append("cluster")
        return run_sim(s, out_dir, reference=reference)
    monkeypatch.setattr(runner, "run_scenario", fake_cluster)
    return used

def test_default_tier(chaos, tiers):
    chaos.run(tiny("tier-default"))
    print("TIER", tiers or ["sim"])

@pytest.mark.chaos(tier="sim")
def test_marker_tier(chaos, tiers):
    chaos.run(tiny("tier-marker"))
    print("MARKED", tiers or ["sim"])

def test_argument_tier(chaos, tiers):
    chaos.run(tiny("tier-arg"), tier="sim")
    print("ARG", tiers or ["sim"])
'''


def test_chaos_tier_is_the_default_tier_of_chaos_run(tmp_path):
    d = _user_dir(tmp_path, TIER_TESTS)
    out = _pytest(d, "-s", "--strict-markers").stdout
    assert "TIER ['sim']" in out and "3 passed" in out, out  # no option: sim
    out = _pytest(d, "-s", "--chaos-tier", "cluster").stdout
    assert "TIER ['cluster']" in out and "3 passed" in out, out
    assert "MARKED ['sim']" in out and "ARG ['sim']" in out  # the marker and an argument win over the option
    proc = _pytest(d, "--chaos-tier", "docker")
    assert proc.returncode == 4 and "invalid choice: 'docker'" in proc.stderr, proc.stdout + proc.stderr


GATE_TESTS = '''
import pytest
from tiny import tiny

def test_five_points_behind(chaos):
    chaos.assert_held(chaos.run(tiny("gate-five")))

def test_two_points_behind(chaos):
    chaos.assert_held(chaos.run(tiny("gate-two")))

def test_no_stored_baseline(chaos):
    chaos.assert_held(chaos.run(tiny("gate-none")))

def test_explicit_baseline(chaos):
    result = chaos.run(tiny("explicit"))
    chaos.assert_held(result, baseline={five!r}, fail_on="goodput:-6pts")
    with pytest.raises(pytest.fail.Exception, match="goodput .* vs baseline .*: -5.0 pts, limit -4 pts: FAIL"):
        chaos.assert_held(result, baseline={five!r}, fail_on="goodput:-4pts")
    rows = chaos.gate(result, baseline={five!r})  # the default rule: goodput:-3pts
    assert [r["held"] for r in rows] == [False] and rows[0]["rule"] == "goodput:-3pts"
'''


@pytest.fixture(scope="module")
def run_summary(tmp_path_factory) -> dict:
    """The tiny scenario's summary, made here: its stored baselines are edited copies."""
    from diloco_chaos.harness.scenarios.scenario import scenario_from_dict
    from diloco_chaos.harness.sim.run import run_sim

    s = scenario_from_dict({"name": "tiny", "seed": 3, "cluster": {"learners": 2, "shards": 1},
                            "train": {"task": "quadratic", "steps": 20, "duration": "10s"},
                            "faults": [{"kind": "kill_unit", "target": "learner-1", "at": "1s", "down_for": "1s"}]})
    return json.loads((Path(run_sim(s, tmp_path_factory.mktemp("base")).run_dir) / "summary.json").read_text())


def _section(out: str, test: str) -> str:
    """The failure text pytest printed for `test` (between its ___ header and the next)."""
    m = re.search(rf"_+ {test} _+\n(.*?)(?=\n_{{3,}} |\n={{3,}} )", out, re.S)
    assert m, out
    return m.group(1)


def _store(base: Path, name: str, summary: dict, better_pts: float) -> Path:
    d = base / name
    d.mkdir(parents=True)
    (d / "summary.json").write_text(json.dumps(dict(summary, goodput=summary["goodput"] + better_pts / 100)))
    return d


def test_chaos_baseline_fails_a_run_5_points_behind_and_passes_2(tmp_path, run_summary):
    base = tmp_path / "baselines"
    five = _store(base, "gate-five", run_summary, 5)
    _store(base, "gate-two", run_summary, 2)
    d = _user_dir(tmp_path, GATE_TESTS.format(five=str(five)))
    proc = _pytest(d, f"--chaos-baseline={base}")
    out = proc.stdout + proc.stderr
    assert proc.returncode == 1 and "2 failed, 2 passed" in out, out
    five_fails = _section(out, "test_five_points_behind")
    assert five_fails.startswith(f"the run fell behind its baseline ({base / 'gate-five'}; fail_on goodput:-3pts):")
    assert re.search(r"goodput \d+\.\d % vs baseline \d+\.\d %: -5\.0 pts, limit -3 pts: FAIL", five_fails), out
    assert "FAILED test_user.py::test_five_points_behind" in out
    assert "PASSED test_user.py::test_two_points_behind" in out
    # a scenario with no stored run under DIR: the gate cannot judge it, which is not a pass
    none_fails = _section(out, "test_no_stored_baseline")
    assert none_fails.startswith("the baseline gate cannot judge scenario 'gate-none'"), out
    assert "gate-none: no such run directory" in none_fails and "During handling" not in none_fails
    assert "PASSED test_user.py::test_explicit_baseline" in out
    assert "Traceback" not in out
    # --chaos-fail-on loosens the rule: 5 points behind is within goodput:-6pts
    proc = _pytest(d, f"--chaos-baseline={base}", "--chaos-fail-on", "goodput:-6pts", "-k", "five or two")
    assert proc.returncode == 0 and "2 passed" in proc.stdout, proc.stdout + proc.stderr
    # and without --chaos-baseline nothing is gated (the explicit one still is)
    proc = _pytest(d, "-k", "five or explicit")
    assert proc.returncode == 0 and "2 passed" in proc.stdout, proc.stdout + proc.stderr


def test_a_bad_fail_on_spec_or_baseline_dir_stops_the_session(tmp_path):
    d = _user_dir(tmp_path, "def test_nothing():\n    pass\n")
    proc = _pytest(d, "--chaos-fail-on", "goodput:3pts,foo:+1")
    assert proc.returncode == 4, proc.stdout + proc.stderr
    assert "'goodput:3pts': no sign" in proc.stderr and "unknown figure 'foo'" in proc.stderr
    proc = _pytest(d, "--chaos-baseline", "no-such-dir")
    assert proc.returncode == 4 and "no-such-dir: no such directory" in proc.stderr, proc.stdout + proc.stderr


MARKER_TESTS = '''
import pytest
from tiny import tiny

@pytest.mark.chaos(tier="sim")
def test_marked(chaos):
    assert chaos.tier == "sim"

def test_uses_the_fixture(chaos):
    pass

def test_plain():
    pass
'''


def test_the_chaos_marker_is_registered_by_the_plugin(tmp_path):
    d = _user_dir(tmp_path, MARKER_TESTS)
    assert not any(d.glob("*.ini")) and not (d / "pyproject.toml").exists() and not (d / "conftest.py").exists()
    proc = _pytest(d, "--strict-markers", "-W", "error::pytest.PytestUnknownMarkWarning")
    assert proc.returncode == 0 and "3 passed" in proc.stdout, proc.stdout + proc.stderr
    proc = _pytest(d, "--markers")
    assert "@pytest.mark.chaos(tier=None, baseline=None, fail_on=None)" in proc.stdout, proc.stdout
    proc = _pytest(d, "-m", "chaos")  # every test using the fixture carries the marker
    assert "2 passed, 1 deselected" in proc.stdout, proc.stdout + proc.stderr


XDIST_TESTS = '''
from diloco_chaos.harness.sim.run import run_sim
from tiny import tiny

def test_first(tmp_path):
    run_sim(tiny("xdist-first"), tmp_path)

def test_second(chaos):
    chaos.run(tiny("xdist-second"))
'''


@pytest.mark.nightly  # (CI itself writes that index under xdist: .ci/run --chaos-report, -n 2)
def test_chaos_report_index_under_xdist_lists_every_workers_runs(tmp_path):
    pytest.importorskip("xdist")
    d = _user_dir(tmp_path, XDIST_TESTS)
    out = tmp_path / "report"
    proc = _pytest(d, "-n", "2", f"--chaos-report={out}")
    text = proc.stdout + proc.stderr
    assert proc.returncode == 0 and "2 passed" in text, text
    assert f"chaos report: {out / 'index.html'} (2 run pages)" in text, text
    index = (out / "index.html").read_text()
    hrefs = re.findall(r'<a href="([^"]+)">', index)
    assert len(hrefs) == 2 and all((out / h).exists() for h in hrefs), hrefs
    assert "xdist-first" in index and "xdist-second" in index
    # the controller made no run itself: both came from the workers' records, gone once in the index
    assert not (out / ".chaos-entries").exists()
    # a second session into the same DIR starts afresh: its index is not the old one plus the new
    proc = _pytest(d, "-n", "2", f"--chaos-report={out}", "-k", "first")
    assert "(1 run pages)" in proc.stdout + proc.stderr, proc.stdout + proc.stderr
    assert len(re.findall(r'<a href="([^"]+)">', (out / "index.html").read_text())) == 1
