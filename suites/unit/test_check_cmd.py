"""`diloco-chaos check` (every error of a file in one pass, then the drawn schedule) and
`diloco-chaos faults` (every fault kind with its parameters), called in-process."""
from __future__ import annotations

import dataclasses
import json

from diloco_chaos.cli import main
from diloco_chaos.faults.kinds import FAULT_KINDS
from diloco_chaos.harness.scenarios.scenario import SCENARIOS_DIR

BROKEN = """\
name = "broken"
seed = 3

[cluster]
learners = 2

[train]
steps = 100
duration = "30s"
sped = 4

[[faults]]
kind = "kill_unit"
target = "learner-0"
at = "5s"
down_for = "2s"

[[faults]]
kind = "pause_unit"
target = "syncer-0"
at = "10s"
duration = "1s"

[[faults]]
kind = "partition"
target = "link:learner-1"
at = "12s"
duration = "-3s"
"""


def test_a_file_with_three_errors_reports_all_three_at_once(tmp_path, capsys):
    path = tmp_path / "broken.toml"
    path.write_text(BROKEN)
    assert main(["check", str(path)]) == 2
    out = capsys.readouterr().out
    lines = [line for line in out.splitlines() if line.startswith(str(path))]
    assert len(lines) == 3, out
    # file:line:col, as editors read it: each key where the file spells it
    text = BROKEN.splitlines()
    sped = next(i for i, line in enumerate(text) if line.startswith("sped")) + 1
    target = [i for i, line in enumerate(text) if line.startswith("target")][1] + 1
    duration = [i for i, line in enumerate(text) if line.startswith("duration")][-1] + 1
    assert any(f"{path}:{sped}:1: train.sped: unknown key" in line for line in lines), out
    assert any(f"{path}:{target}:1: faults[1].target: " in line and "valid: learner-N" in line for line in lines), out
    assert any(f"{path}:{duration}:1: faults[2].duration: " in line and "> 0 seconds" in line for line in lines), out
    assert "3 errors in 1 file" in out


def test_the_json_output_lists_each_error_with_its_key(tmp_path, capsys):
    path = tmp_path / "broken.toml"
    path.write_text(BROKEN)
    assert main(["check", "--json", str(path)]) == 2
    (entry,) = json.loads(capsys.readouterr().out)
    assert entry["file"] == str(path) and entry["schedule"] == []
    assert [e["path"] for e in entry["errors"]] == ["train.sped", "faults[1].target", "faults[2].duration"]


def test_a_bad_required_value_is_one_error_not_a_missing_key_too(tmp_path, capsys):
    path = tmp_path / "steps.toml"
    path.write_text('name = "x"\nseed = 1\n[train]\nsteps = -5\nduration = "1m"\n[cluster]\nlearners = 0\n')
    assert main(["check", str(path)]) == 2
    out = capsys.readouterr().out
    assert "cluster.learners" in out and "train.steps" in out and "missing" not in out
    assert "2 errors in 1 file" in out


def test_a_valid_builtin_scenario_shows_its_shape_and_schedule(capsys):
    assert main(["check", str(SCENARIOS_DIR / "unit-loss.toml")]) == 0
    out = capsys.readouterr().out
    assert "valid: unit-loss" in out and "4 learners" in out and "900 steps" in out
    (row,) = [line for line in out.splitlines() if "kill_unit" in line]
    assert row.split()[:2] == ["20", "s"] and "learner-1" in row and "down_for 15 s" in row


def test_a_failure_process_shows_its_drawn_faults_and_seed_keeps_the_draw(tmp_path, capsys):
    """`check --seed` shows what `run --seed` runs: the training's seed changes, the failure
    process draws from the seed the file gave it (the same faults)."""
    path = tmp_path / "random.toml"
    path.write_text('name = "r"\nseed = 1\n[train]\nsteps = 100\nduration = "10m"\n'
                    '[failure_process]\nmtbi = "20m"\nchips_per_unit = 64\nrepair = "30s"\n')
    assert main(["check", "--json", str(path)]) == 0
    first = json.loads(capsys.readouterr().out)[0]["schedule"]
    assert first and all(row["from"] == "failure_process" for row in first)
    assert main(["check", "--json", "--seed", "2", str(path)]) == 0
    again = json.loads(capsys.readouterr().out)[0]
    assert again["schedule"] == first and again["shape"]["seed"] == 2


def test_a_toml_syntax_error_is_one_error_with_its_line(tmp_path, capsys):
    path = tmp_path / "syntax.toml"
    path.write_text('name = "x"\nseed = 1\n[train\nsteps = 3\n')
    assert main(["check", str(path)]) == 2
    out = capsys.readouterr().out
    assert f"{path}:3:" in out and "TOML syntax error" in out
    assert "1 error in 1 file" in out


def test_several_files_are_counted_apart(tmp_path, capsys):
    bad = tmp_path / "bad.toml"
    bad.write_text(BROKEN)
    assert main(["check", "unit-loss", str(bad), str(tmp_path / "absent.toml")]) == 2
    out = capsys.readouterr().out
    assert "cannot read the file" in out and "4 errors in 2 files" in out


def test_faults_lists_every_kind_with_its_fields(capsys):
    assert main(["faults"]) == 0
    out = capsys.readouterr().out
    for kind, cls in FAULT_KINDS.items():
        assert f"{kind}  (target: " in out
        for f in dataclasses.fields(cls):
            if f.name not in ("target", "at_s"):
                assert f.name.removesuffix("_s") in out, (kind, f.name)
    assert main(["faults", "--json"]) == 0
    kinds = json.loads(capsys.readouterr().out)
    assert [k["kind"] for k in kinds] == list(FAULT_KINDS)
    corrupt = next(k for k in kinds if k["kind"] == "corrupt")
    assert {p["name"]: p["default"] for p in corrupt["parameters"]}["mode"] == '"scale"'


def test_a_key_is_found_where_the_file_spells_it():
    from diloco_chaos.check_cmd import key_position

    text = 'name = "x"\nseed = 1\n[train]\nsteps = 3\n  lr = 0.1\n[[faults]]\nkind = "a"\n[[faults]]\nkind = "b"\n'
    assert key_position(text, "seed") == (2, 1)
    assert key_position(text, "train") == (3, 1)
    assert key_position(text, "train.lr") == (5, 3)
    assert key_position(text, "train.duration") == (3, 1)  # missing: its table's header
    assert key_position(text, "faults[1].kind") == (9, 1) and key_position(text, "faults[0]") == (6, 1)
    assert key_position(text, "cluster.learners") is None and key_position(text, "faults[2].kind") is None


def test_a_fault_with_a_bad_field_still_has_its_target_judged(tmp_path, capsys):
    path = tmp_path / "two.toml"
    path.write_text('name = "x"\nseed = 1\n[train]\nsteps = 10\nduration = "60s"\n'
                    '[[faults]]\nkind = "kill_unit"\ntarget = "learner-9"\nat = "2s"\ndown_for = "soon"\n')
    assert main(["check", str(path)]) == 2
    out = capsys.readouterr().out
    assert f"{path}:10:1: faults[0].down_for:" in out
    assert f"{path}:8:1: faults[0].target: unknown target 'learner-9' in a run with 4 learners" in out
    assert "2 errors in 1 file" in out


def test_a_malformed_target_is_named_beside_its_faults_other_error(tmp_path, capsys):
    """A target that is no learner-N (`lerner-1`) in a fault whose duration is also wrong:
    both errors in the first pass, not the target's after the duration is fixed."""
    path = tmp_path / "typo.toml"
    path.write_text('name = "x"\nseed = 1\n[train]\nsteps = 10\nduration = "60s"\n'
                    '[[faults]]\nkind = "kill_unit"\ntarget = "lerner-1"\nat = "2s"\ndown_for = "soon"\n')
    assert main(["check", str(path)]) == 2
    out = capsys.readouterr().out
    assert f"{path}:10:1: faults[0].down_for:" in out
    assert f"{path}:8:1: faults[0].target: kill_unit cannot target 'lerner-1'; valid: learner-N" in out
    assert "2 errors in 1 file" in out


def test_a_wrong_cluster_size_is_one_error_not_a_target_judged_against_the_default(tmp_path, capsys):
    """learners = 0 is the error; learner-7 is not "unknown in a run with 4 learners" (the
    default the reader fell back on), which the file never said."""
    path = tmp_path / "size.toml"
    path.write_text('name = "x"\nseed = 1\n[cluster]\nlearners = 0\n[train]\nsteps = 10\nduration = "60s"\n'
                    '[[faults]]\nkind = "kill_unit"\ntarget = "learner-7"\nat = "2s"\ndown_for = "5s"\n'
                    '[[faults]]\nkind = "pause_unit"\ntarget = "learner-8"\nat = "2s"\nduration = "x"\n')
    assert main(["check", str(path)]) == 2
    out = capsys.readouterr().out
    assert f"{path}:4:1: cluster.learners: 0 is out of range" in out
    assert "learner-7" not in out and "learner-8" not in out and "4 learners" not in out, out
    assert "2 errors in 1 file" in out, out  # learners, and the second fault's duration


def test_the_broken_plugin_errors_docs_tasks_md_shows_are_what_check_prints(tmp_path, monkeypatch, capsys):
    """docs/TASKS.md "Checked before any process starts": each sample line is what `check`
    prints for the broken plug-in the page describes (init's stub as `my_pkg.tasks`)."""
    import sys
    from pathlib import Path

    doc = (Path(__file__).parents[2] / "docs" / "TASKS.md").read_text()
    block = doc[doc.index("## Checked before any process starts"):]
    documented = block[block.index("```\n") + 4:block.index("\n```", block.index("```\n"))].splitlines()
    assert main(["init", str(tmp_path / "proj")]) == 0
    stub = (tmp_path / "proj" / "my_task.py").read_text()
    (tmp_path / "my-scenario.toml").write_text((tmp_path / "proj" / "scenario.toml").read_text().replace(
        'task = "my_task:make_task"', 'task = "my_pkg.tasks:make_task"'))
    (tmp_path / "my_pkg").mkdir()
    (tmp_path / "my_pkg" / "__init__.py").write_text("")
    monkeypatch.chdir(tmp_path)
    monkeypatch.setattr(sys, "path", list(sys.path))
    broken = {  # what the page says each sample line is from
        "rows": stub.replace("return self._rows(TRAIN, learner, step)", "return self._rows(TRAIN, learner, step)[:8]"),
        "missing": None,
        "asarray": stub.replace("jnp.square(x @ w - y)", "jnp.square(np.asarray(x @ w) - y)"),
    }
    printed = []
    for name, text in broken.items():
        for m in [m for m in sys.modules if m == "my_pkg" or m.startswith("my_pkg.")]:
            del sys.modules[m]
        if text is None:
            (tmp_path / "my_pkg").rename(tmp_path / "not_my_pkg")
        else:
            assert text != stub, name
            (tmp_path / "my_pkg" / "tasks.py").write_text(text)
        capsys.readouterr()
        assert main(["check", "my-scenario.toml"]) == 2, name
        if text is None:
            (tmp_path / "not_my_pkg").rename(tmp_path / "my_pkg")
        out = capsys.readouterr().out.splitlines()
        assert out[-1] == "1 error in 1 file", out
        printed.append(out[0])
    for m in [m for m in sys.modules if m == "my_pkg" or m.startswith("my_pkg.")]:
        del sys.modules[m]
    assert printed == documented
