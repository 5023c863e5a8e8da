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
