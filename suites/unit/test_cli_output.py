"""What CI reads from `diloco-chaos run`: the exit code (0 PASS, 1 FAIL, 2 bad input),
`--json` (the summary alone on stdout), under GitHub Actions an `::error` line per failed
check and a Markdown verdict in $GITHUB_STEP_SUMMARY; run directories named by UTC time
with `latest` pointing at the newest; rounded figures; `--version`; `init`."""
from __future__ import annotations

import json
import re
import subprocess
import sys
from pathlib import Path

import pytest

from diloco_chaos import __version__
from diloco_chaos.cli import COMMANDS, main

HERE = Path(__file__).parent
SCENARIO = HERE / "data" / "user-kill.toml"  # 3 learners, a kill, ~3 s in the simulator


def _run(tmp_path, *extra):
    return main(["run", str(SCENARIO), "--tier", "sim", "--no-live", "--out", str(tmp_path / "runs"), *extra])


def test_json_puts_the_summary_alone_on_stdout_and_latest_names_the_run(tmp_path, capsys, monkeypatch):
    monkeypatch.delenv("GITHUB_ACTIONS", raising=False)
    monkeypatch.delenv("GITHUB_STEP_SUMMARY", raising=False)
    assert _run(tmp_path, "--json") == 0
    out, err = capsys.readouterr()
    summary = json.loads(out)  # nothing else on stdout
    assert summary["valid"] is True and summary["exit_code"] == 0 and summary["checks"]
    assert "PASS" in err and "results:" in err  # the person's view went to stderr
    # the fault-free reference ran beside the run, in a process of its own, now gone
    import multiprocessing
    assert (Path(summary["reference_dir"]) / "report.html").exists() and not multiprocessing.active_children()
    run_dir = Path(summary["run_dir"])
    assert re.fullmatch(r"user-kill-\d{8}T\d{6}Z", run_dir.name), run_dir.name
    latest = tmp_path / "runs" / "latest"
    assert latest.is_symlink() and latest.resolve() == run_dir.resolve()
    assert json.loads((latest / "summary.json").read_text())["valid"] is True
    # the terminal table shows only the badput causes that cost something, figures rounded
    assert _run(tmp_path) == 0
    text = capsys.readouterr().out
    assert "badput:" in text and not re.search(r"badput: \w+\s+│\s+0\.0%", text)
    assert not re.search(r"\d\.\d{6,}", text), "unrounded figure in the terminal output"
    assert (tmp_path / "runs" / "latest").resolve() != run_dir.resolve()  # the newer run


def test_github_actions_gets_error_lines_and_a_step_summary(tmp_path, capsys, monkeypatch):
    step = tmp_path / "step-summary.md"
    monkeypatch.setenv("GITHUB_ACTIONS", "true")
    monkeypatch.setenv("GITHUB_STEP_SUMMARY", str(step))
    # goodput above what the run can reach: one check fails, exit 1
    bad = tmp_path / "unmet.toml"
    bad.write_text(SCENARIO.read_text().replace("goodput_min = 0.5", "goodput_min = 0.999"))
    assert main(["run", str(bad), "--tier", "sim", "--no-live", "--out", str(tmp_path / "runs")]) == 1
    out = capsys.readouterr().out
    errors = [line for line in out.splitlines() if line.startswith("::error ")]
    assert len(errors) == 1 and "title=user-kill%3A FAIL::goodput_min = " in errors[0], errors
    md = step.read_text()
    assert md.startswith("### ❌ diloco-chaos `user-kill` (sim): FAIL")
    assert "| `goodput_min` | FAIL |" in md and "| `no_crash` | PASS |" in md
    assert "| goodput | " in md and "%" in md


def test_a_baseline_five_points_better_fails_the_gate(tmp_path, capsys):
    """`--baseline RUN --fail-on goodput:-3pts`: against a stored run whose goodput is 5
    points above this one's the run fails (exit 1), against one 2 points above it holds."""
    assert _run(tmp_path, "--json") == 0
    summary = json.loads(capsys.readouterr().out)
    for better, code in ((0.05, 1), (0.02, 0)):
        base = tmp_path / f"base-{better}"
        base.mkdir()
        (base / "summary.json").write_text(json.dumps({**summary, "goodput": summary["goodput"] + better}))
        assert _run(tmp_path, "--baseline", str(base), "--fail-on", "goodput:-3pts", "--json") == code
        gated = json.loads(capsys.readouterr().out)
        assert [row["held"] for row in gated["gate"]] == [code == 0]
        assert gated["valid"] is (code == 0)


def test_bad_options_are_bad_input(tmp_path, capsys):
    assert _run(tmp_path, "--fail-on", "goodput:-3pts") == 2  # a gate needs a baseline run
    assert "--fail-on needs --baseline RUN" in capsys.readouterr().err
    assert _run(tmp_path, "--baseline", str(tmp_path / "nowhere")) == 2


def test_version():
    out = subprocess.run([sys.executable, "-m", "diloco_chaos", "--version"], capture_output=True, text=True)
    assert out.returncode == 0 and out.stdout.strip() == f"diloco-chaos {__version__}"


def test_init_writes_a_folder_that_runs_green_and_never_overwrites(tmp_path, capsys):
    d = tmp_path / "x"
    assert main(["init", str(d)]) == 0
    assert sorted(p.name for p in d.iterdir()) == ["conftest.py", "my_task.py", "scenario.toml", "test_chaos.py"]
    proc = subprocess.run([sys.executable, "-m", "pytest", "-q", "-p", "no:cacheprovider"], cwd=d,
                          capture_output=True, text=True, timeout=600)
    assert proc.returncode == 0 and "1 passed" in proc.stdout, proc.stdout[-3000:] + proc.stderr[-2000:]
    # the plugin's terminal line: one per chaos run, its verdict, figures, test and folder
    line = next(x for x in proc.stdout.splitlines() if x.startswith("PASS    my-first-scenario (sim) goodput"))
    assert "parity" in line and "test_chaos.py::" in line and "chaos-runs" in line, line
    (d / "scenario.toml").write_text("# mine\n")
    assert main(["init", str(d)]) == 2
    assert "already there; nothing written" in capsys.readouterr().err
    assert (d / "scenario.toml").read_text() == "# mine\n"


@pytest.mark.parametrize("name", [c[0] for c in COMMANDS])
def test_every_option_has_help(name):
    import argparse

    from diloco_chaos.cli import build_parser

    sub = next(a for a in build_parser()._actions if isinstance(a, argparse._SubParsersAction))
    parser = sub.choices[name]
    missing = [a.option_strings or a.dest for a in parser._actions
               if not isinstance(a, argparse._HelpAction) and not a.help]
    assert not missing, f"{name}: options without help: {missing}"


def test_preset_runs_a_scenario_with_a_trainer_preset(tmp_path, capsys):
    """`--preset sparse`: the same scenario (a kill) with sparse pseudo-gradients both ways;
    the run's own config line says so, and every check holds in the simulator."""
    assert _run(tmp_path, "--preset", "sparse", "--json") == 0
    summary = json.loads(capsys.readouterr().out)
    head = json.loads((Path(summary["run_dir"]) / "events.jsonl").read_text().splitlines()[0])
    diloco = json.dumps(head)
    assert '"compression": "sparse"' in diloco and '"broadcast_compression": "sparse"' in diloco, diloco[:400]
    assert _run(tmp_path, "--preset", "nothing") == 2
    assert "valid: paper, sparse" in capsys.readouterr().err
