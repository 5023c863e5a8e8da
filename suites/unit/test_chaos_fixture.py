"""The `chaos` fixture from outside the repository: a pytest session in a directory with no
conftest runs the README's user test file (passes) and the same test with an expectation
the run cannot meet (fails with a readable check table); then the same from a fresh
virtualenv where the repository was `pip install`ed, so the plugin comes only from the
package's `pytest11` entry point (suites/unit/test_fresh_install.py)."""
from __future__ import annotations

import shutil
import subprocess
import sys
from pathlib import Path

HERE = Path(__file__).parent
ROOT = HERE.parents[1]
UNMET = '''
from pathlib import Path
from dataclasses import replace
from diloco_chaos.harness.scenarios.scenario import load_scenario

def test_an_unmet_expectation_fails_with_the_check_table(chaos):
    s = load_scenario(Path({scenario!r}))
    s = replace(s, expect=replace(s.expect, goodput_min=0.999))
    chaos.assert_held(chaos.run(s, tier="sim"))
'''


def _user_dir(tmp_path: Path) -> Path:
    d = tmp_path / "user-repo"
    (d / "data").mkdir(parents=True)
    shutil.copy(HERE / "test_user_example.py", d / "test_user_example.py")
    shutil.copy(HERE / "data" / "user-kill.toml", d / "data" / "user-kill.toml")
    (d / "test_unmet.py").write_text(UNMET.format(scenario=str(d / "data" / "user-kill.toml")))
    return d


def _pytest(python: str, d: Path, *args: str) -> subprocess.CompletedProcess:
    return subprocess.run([python, "-m", "pytest", "-p", "no:cacheprovider", "-q", *args], cwd=d,
                          capture_output=True, text=True, timeout=600)


def _check(proc: subprocess.CompletedProcess) -> None:
    out = proc.stdout + proc.stderr
    assert proc.returncode == 1, out  # the unmet expectation fails, the user's example passes
    assert "1 failed, 1 passed" in out, out
    assert "the run did not PASS" in out and "FAIL    goodput_min" in out and "verdict: FAIL" in out, out
    assert "Traceback" not in out  # a check table, not a stack


def test_the_fixture_in_a_directory_without_conftest(tmp_path):
    d = _user_dir(tmp_path)
    _check(_pytest(sys.executable, d, "-p", "diloco_chaos.pytest_plugin"))
