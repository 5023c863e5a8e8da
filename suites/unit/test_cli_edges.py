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


RUN = str(__import__("pathlib").Path(__file__).parent / "data" / "report_run")


@pytest.mark.parametrize("argv", [["faults", "--json"], ["faults"], ["scenarios"], ["planted"],
                                  ["compare", RUN, RUN], ["compare", RUN, RUN, "--json"], ["check", "unit-loss"]])
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
    internal class and a task the user never wrote (the [task] table read as the default's).
    The command leaves the environment as it found it (a test in the same process)."""
    from diloco_chaos.cli import main
    from diloco_chaos.trainer.numerics.plugins import SEARCH_ENV

    project, elsewhere = tmp_path / "project", tmp_path / "elsewhere"
    elsewhere.mkdir()
    monkeypatch.delenv(SEARCH_ENV, raising=False)
    monkeypatch.setattr(sys, "path", list(sys.path))  # the import's folder goes into this copy
    assert main(["init", str(project)]) == 0
    monkeypatch.chdir(elsewhere)
    capsys.readouterr()
    try:
        assert main(["check", str(project / "scenario.toml")]) == 0
        assert SEARCH_ENV not in __import__("os").environ
        (project / "my_task.py").rename(project / "their_task.py")
        sys.modules.pop("my_task", None)
        sys.path[:] = [p for p in sys.path if p != str(project)]
        assert main(["check", str(project / "scenario.toml")]) == 2  # bad input
    finally:
        sys.modules.pop("my_task", None)
    out = capsys.readouterr()
    text = out.out + out.err
    assert "1 error in 1 file" in text and "cannot import 'my_task'" in text and "TaskConfig" not in text, text


def test_a_compile_cache_written_without_the_size_cap_is_stamped_for_it(tmp_path, monkeypatch):
    """Entries the units wrote before the cache had its cap (no `-atime` file) made every
    later write fail once JAX's eviction read them: they are stamped when the cache is set up."""
    from diloco_chaos.trainer.units import shell

    cache = tmp_path / "jax"
    cache.mkdir()
    (cache / "jit_step-abc-cache").write_bytes(b"x")
    (cache / "jit_eval-def-cache").write_bytes(b"y")
    (cache / "jit_eval-def-atime").write_bytes((7).to_bytes(8, "little"))
    monkeypatch.setenv(shell.COMPILE_CACHE_ENV, str(cache))
    for key in ("JAX_COMPILATION_CACHE_DIR", "JAX_PERSISTENT_CACHE_MIN_COMPILE_TIME_SECS",
                "JAX_COMPILATION_CACHE_MAX_SIZE"):
        monkeypatch.delenv(key, raising=False)
    assert shell.use_compile_cache() == str(cache)
    assert (cache / "jit_step-abc-atime").is_file()
    assert (cache / "jit_eval-def-atime").read_bytes() == (7).to_bytes(8, "little")  # left as it was


def test_run_dry_run_prints_what_would_run_and_starts_nothing(tmp_path, monkeypatch, capsys):
    from diloco_chaos import cli

    monkeypatch.chdir(tmp_path)
    assert cli.main(["run", "unit-loss", "--tier", "sim", "--dry-run"]) == 0
    out = capsys.readouterr().out
    assert "kill_unit  learner-1" in out and "would run on the sim tier" in out and "nothing started" in out
    assert not (tmp_path / "runs").exists()
    assert cli.main(["run", "nope", "--dry-run"]) == 2  # bad input is still bad input


def test_a_missing_table_is_one_error_not_one_per_key_it_would_hold(tmp_path, capsys):
    from diloco_chaos import cli

    f = tmp_path / "s.toml"
    f.write_text('name = "x"\nseed = 1\n[cluster]\nlearners = 3\n')
    assert cli.main(["check", str(f)]) == 2
    out = capsys.readouterr().out
    assert "train: missing (required)" in out and "train.steps" not in out and "train.duration" not in out
    assert "1 error in 1 file" in out


def test_run_help_lists_the_exit_codes_and_names_the_default_tier_as_the_quick_start_does(capsys):
    """`run --help` says what 0, 1 and 2 mean, and which tier runs without --tier in the
    README's words ("the simulator", "the full path" ... "real processes behind Toxiproxy")."""
    from diloco_chaos.cli import main

    with pytest.raises(SystemExit):
        main(["run", "--help"])
    out = " ".join(capsys.readouterr().out.split())
    readme = " ".join((__import__("pathlib").Path(__file__).parents[2] / "README.md").read_text().split())
    assert "exit codes: 0 PASS" in out and "1 FAIL" in out and "2 bad input" in out, out
    assert "--tier cluster the full path, and the default when --tier is not given" in out, out
    assert "--tier sim the simulator" in out, out
    for words in ("the simulator: no Go, Chromium or Docker", "The full path runs learners and syncer shards as "
                  "real processes behind Toxiproxy"):
        assert words in readme, words
