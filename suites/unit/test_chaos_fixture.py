"""The `chaos` fixture from outside the repository: a pytest session in a directory with no
conftest runs the README's user test file (passes) and the same test with an expectation
the run cannot meet (fails with a readable check table); then the same from a fresh
virtualenv where the repository was `pip install`ed, so the plugin comes only from the
package's `pytest11` entry point."""
from __future__ import annotations

import os
import shutil
import subprocess
import sys
import sysconfig
from pathlib import Path

import pytest

HERE = Path(__file__).parent
ROOT = HERE.parents[1]
UNMET = '''
from pathlib import Path
from dataclasses import replace
from harness.scenarios.scenario import load_scenario

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
    assert "the run did not hold" in out and "FAIL    goodput_min" in out and "verdict: NOT valid" in out, out
    assert "Traceback" not in out  # a check table, not a stack


def test_the_fixture_in_a_directory_without_conftest(tmp_path):
    d = _user_dir(tmp_path)
    _check(_pytest(sys.executable, d, "-p", "diloco_chaos.pytest_plugin"))


@pytest.mark.slow
def test_pip_install_into_a_fresh_virtualenv_gives_the_fixture(tmp_path):
    """The repository (its tracked files) installed, not editable, into a new virtualenv
    that borrows only the pinned dependencies (a .pth to this venv's site-packages; pip
    builds the package as for any user, its build backend from the package index);
    pytest there finds the plugin through the entry point alone."""
    src = tmp_path / "src"
    files = subprocess.run(["git", "ls-files"], cwd=ROOT, capture_output=True, text=True, check=True).stdout.split()
    for f in files:
        (src / f).parent.mkdir(parents=True, exist_ok=True)
        shutil.copy2(ROOT / f, src / f, follow_symlinks=False)  # scenarios/ is a link
    venv = tmp_path / "venv"
    subprocess.run([sys.executable, "-m", "venv", "--without-pip", str(venv)], check=True)
    site = next((venv / "lib").glob("python3*/site-packages"))
    (site / "deps.pth").write_text(sysconfig.get_paths()["purelib"] + "\n")
    pip = subprocess.run([sys.executable, "-m", "pip", "--python", str(venv / "bin" / "python"), "install", "-q",
                          "--no-deps", "--disable-pip-version-check", str(src)],
                         capture_output=True, text=True, timeout=600)
    assert pip.returncode == 0, pip.stdout + pip.stderr
    assert (venv / "bin" / "diloco-chaos").exists()
    d = _user_dir(tmp_path)
    proc = _pytest(str(venv / "bin" / "python"), d)
    _check(proc)
    assert str(ROOT) not in (proc.stdout + proc.stderr)  # nothing came from the checkout

    # the built-in scenarios are package data: by name, from the installed package
    cli = str(venv / "bin" / "diloco-chaos")
    listed = subprocess.run([cli, "scenarios"], capture_output=True, text=True, cwd=tmp_path, timeout=120)
    assert listed.returncode == 0 and "one-way-cut" in listed.stdout, listed.stdout + listed.stderr
    where = subprocess.run([str(venv / "bin" / "python"), "-c", "from harness.scenarios import scenario as m; "
                            "print(m.load_scenario('chaos').name, m.SCENARIOS_DIR)"],
                           capture_output=True, text=True, cwd=tmp_path, timeout=120)
    assert where.stdout.startswith("chaos ") and str(venv) in where.stdout, where.stdout + where.stderr

    # `diloco-chaos setup` puts a Toxiproxy server in the user's tools folder (here: the
    # checkout's, found on PATH, linked) and the installed harness finds it there
    tools = tmp_path / "tools"
    env = {**os.environ, "DILOCO_CHAOS_TOOLS": str(tools),
           "PATH": f"{ROOT / '.tools'}{os.pathsep}{os.environ.get('PATH', '')}"}
    setup = subprocess.run([cli, "setup"], capture_output=True, text=True, env=env, timeout=300)
    assert setup.returncode == 0 and (tools / "toxiproxy-server").exists(), setup.stdout + setup.stderr
    env["PATH"] = os.environ.get("PATH", "")
    found = subprocess.run([str(venv / "bin" / "python"), "-c", "from harness.backends import toxiproxy_server as t; "
                            "print(t.find_binary())"], capture_output=True, text=True, env=env, cwd=tmp_path,
                           timeout=120)
    assert found.stdout.strip() == str(tools / "toxiproxy-server"), found.stdout + found.stderr
