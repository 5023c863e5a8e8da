"""Sharp edges of the command line, one test each.

- A reader that goes away (`diloco-chaos faults --json | head -c 10`) gets no traceback: the
  command stops writing and exits 0 (a command that only prints) or 1 (one whose verdict was
  never printed: run, replay, demo, bench), never with a BrokenPipeError on stderr.
- `run --allow-unknown unit-loss`: a bare flag before the scenario, not a list of checks named
  `unit-loss` (argparse took it as the value and then missed the scenario).
- `--fail-on goodput:-3` (suites/unit/test_gate.py): refused, naming -3pts."""
from __future__ import annotations

import subprocess
import sys

import pytest


@pytest.mark.parametrize("argv", [["faults", "--json"], ["faults"], ["scenarios"], ["planted"]])
def test_a_closed_pipe_ends_a_printing_command_quietly(argv):
    proc = subprocess.Popen([sys.executable, "-m", "diloco_chaos", *argv], stdout=subprocess.PIPE,
                            stderr=subprocess.PIPE)
    proc.stdout.close()  # the reader is gone before the first write: every write fails
    err = proc.stderr.read().decode()
    assert proc.wait(timeout=120) == 0, err
    assert "Traceback" not in err and "BrokenPipeError" not in err, err


def test_a_bare_allow_unknown_before_the_scenario_is_a_flag_not_a_check_list():
    from diloco_chaos.cli import build_parser
    from diloco_chaos.run_cmd import bare_allow_unknown

    def parsed(*argv):
        return build_parser().parse_args(bare_allow_unknown(list(argv)))

    a = parsed("run", "--allow-unknown", "unit-loss", "--tier", "sim")
    assert (a.scenario, a.allow_unknown) == ("unit-loss", True)
    a = parsed("run", "--allow-unknown", "loss_parity_max,faults_applied", "unit-loss")
    assert (a.scenario, a.allow_unknown) == ("unit-loss", ("loss_parity_max", "faults_applied"))
    a = parsed("run", "unit-loss", "--allow-unknown")
    assert (a.scenario, a.allow_unknown) == ("unit-loss", True)


def test_a_plugin_task_is_found_beside_its_scenario_file_and_a_missing_one_is_one_error(tmp_path, monkeypatch,
                                                                                          capsys):
    """`init`'s scenario says "my_task.py beside this file": `check` (and `run`) find it from
    any working directory; without it, one error for the import, not a second one naming an
    internal class and a task the user never wrote (the [task] table read as the default's)."""
    from diloco_chaos.cli import main
    from diloco_chaos.trainer.plugins import SEARCH_ENV

    project, elsewhere = tmp_path / "project", tmp_path / "elsewhere"
    elsewhere.mkdir()
    monkeypatch.delenv(SEARCH_ENV, raising=False)
    assert main(["init", str(project)]) == 0
    monkeypatch.chdir(elsewhere)
    capsys.readouterr()
    assert main(["check", str(project / "scenario.toml")]) == 0
    (project / "my_task.py").rename(project / "their_task.py")
    monkeypatch.delitem(sys.modules, "my_task", raising=False)
    monkeypatch.setattr(sys, "path", [p for p in sys.path if p != str(project)])
    assert main(["check", str(project / "scenario.toml")]) == 2  # bad input
    out = capsys.readouterr()
    text = out.out + out.err
    assert "1 error in 1 file" in text and "cannot import 'my_task'" in text and "TaskConfig" not in text, text
