"""The simulator's progress line (harness/sim/progress.py): on a terminal one line redrawn in
place, in a log one line per 10 % of the run, off with --quiet; the run's events the same
bytes with it on or off."""
from __future__ import annotations

import os
import pty
import select
import subprocess
import sys
from pathlib import Path

from diloco_chaos.harness.scenarios.scenario import load_scenario
from diloco_chaos.harness.sim.run import simulate

SCENARIO = Path(__file__).parent / "data" / "user-kill.toml"  # 3 learners, a kill, ~3 s in the simulator


def test_the_line_changes_nothing_in_the_log_and_shows_every_tenth_off_a_terminal(capsys):
    s = load_scenario(SCENARIO)
    quiet = simulate(s).text()
    shown = simulate(s, progress=True).text()
    assert shown == quiet
    lines = [x for x in capsys.readouterr().err.splitlines() if x.startswith("[user-kill · sim]")]
    assert 5 <= len(lines) <= 12, lines  # one per 10 % of the run, and the last
    assert lines[-1].startswith("[user-kill · sim] 100 %") and "commits" in lines[-1] and "ETA" in lines[-1]
    assert any("kill_unit→learner-1" in x for x in lines)  # the fault active at the time


def test_a_terminal_gets_one_line_redrawn_in_place(tmp_path):
    cli = [sys.executable, "-m", "diloco_chaos.cli", "run", str(SCENARIO), "--tier", "sim", "--reference", "none",
           "--out", str(tmp_path)]

    def stderr_of(extra):
        master, slave = pty.openpty()
        proc = subprocess.Popen(cli + extra, stdin=subprocess.DEVNULL, stdout=subprocess.DEVNULL, stderr=slave)
        os.close(slave)
        out = b""
        while True:
            ready, _, _ = select.select([master], [], [], 120)
            try:
                chunk = os.read(master, 65536) if ready else b""
            except OSError:  # the child closed the terminal
                chunk = b""
            if not chunk:
                break
            out += chunk
        os.close(master)
        assert proc.wait(60) == 0
        return out.decode(errors="replace")

    shown = stderr_of([])
    assert "\r\x1b[K[user-kill · sim]" in shown and "[user-kill · sim] 100 %" in shown


def test_quiet_turns_it_off():
    from diloco_chaos.cli import build_parser

    for cmd in (["run", str(SCENARIO)], ["replay", "runs/x"]):
        assert build_parser().parse_args([*cmd, "--quiet"]).no_live is True
        assert build_parser().parse_args(cmd).no_live is False
