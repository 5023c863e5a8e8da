"""`diloco-chaos runs` finds the kept runs again (newest first, verdict, goodput, parity,
folder) and `run --compare last` shows a run beside its scenario's previous one."""
from __future__ import annotations

import json
from pathlib import Path

from diloco_chaos.cli import main

SCENARIO = Path(__file__).parent / "data" / "user-kill.toml"  # 3 learners, a kill, ~3 s in the simulator


def test_runs_lists_what_run_kept_and_compare_last_shows_the_previous(tmp_path, capsys):
    out = tmp_path / "runs"
    argv = ["run", str(SCENARIO), "--tier", "sim", "--quiet", "--out", str(out)]
    assert main([*argv, "--compare", "last"]) == 0
    assert "no earlier run of user-kill" in capsys.readouterr().out
    assert main([*argv, "--compare", "last"]) == 0
    text = capsys.readouterr().out
    assert "against the previous run of user-kill" in text and "goodput" in text and "Δ (B − A)" in text

    assert main(["runs", "--out", str(out), "--json"]) == 0
    rows = json.loads(capsys.readouterr().out)
    assert [r["scenario"] for r in rows] == ["user-kill", "user-kill"]  # the reference run left out
    assert rows[0]["path"] > rows[1]["path"]  # newest first (folders are named by UTC time)
    assert all(r["verdict"] == "PASS" and r["tier"] == "sim" and 0 < r["goodput"] <= 1 for r in rows)
    assert main(["runs", "--out", str(out), "--all", "--json"]) == 0
    assert sum(r["reference"] for r in json.loads(capsys.readouterr().out)) == 1

    assert main(["runs", "--out", str(out)]) == 0
    table = capsys.readouterr().out.splitlines()
    assert table[0].split()[:4] == ["scenario", "when", "tier", "verdict"] and len(table) == 3
    assert "PASS" in table[1] and rows[0]["path"] in table[1]


def test_runs_of_a_folder_that_is_not_there_is_bad_input(tmp_path, capsys):
    assert main(["runs", "--out", str(tmp_path / "nowhere")]) == 2
    assert "no folder" in capsys.readouterr().err
