"""Fault-free reference runs kept in the user's cache (diloco_chaos/reference_store.py):
a second run of a scenario from a new output folder reuses the first one's reference,
and nothing that would change the reference's outcome lets it be reused."""
from __future__ import annotations

import dataclasses
import json
from pathlib import Path

import pytest

from diloco_chaos import reference_store
from diloco_chaos.cli import main
from diloco_chaos.harness.scenarios.scenario import load_scenario

SCENARIO = """
name = "kept-reference"
seed = 5
[cluster]
learners = 2
[train]
task = "quadratic"
steps = 30
duration = "15s"
[[faults]]
kind = "kill_unit"
target = "learner-1"
at = "2s"
down_for = "1s"
[expect]
loss_parity_max = 0.5
"""


@pytest.fixture
def scenario(tmp_path) -> Path:
    path = tmp_path / "kept-reference.toml"
    path.write_text(SCENARIO)
    return path


def test_the_key_changes_with_everything_the_reference_depends_on(scenario, monkeypatch):
    s = dataclasses.replace(load_scenario(str(scenario)), faults=())
    key = reference_store.reference_key(s, "sim")
    assert key == reference_store.reference_key(s, "sim")  # a pure function of its inputs
    assert key != reference_store.reference_key(s, "cluster")
    assert key != reference_store.reference_key(dataclasses.replace(s, seed=6), "sim")
    monkeypatch.setenv(reference_store.BUGS_ENV, "merge_twice")
    assert key != reference_store.reference_key(s, "sim")
    monkeypatch.delenv(reference_store.BUGS_ENV)
    monkeypatch.setattr(reference_store, "code_digest", lambda: "edited")
    assert key != reference_store.reference_key(s, "sim")


def test_a_plug_in_tasks_source_is_part_of_the_key(tmp_path, monkeypatch):
    (tmp_path / "kr_task.py").write_text("def make(**kw):\n    return None\n")
    monkeypatch.syspath_prepend(str(tmp_path))
    first = reference_store._plugin_digest("kr_task:make")
    (tmp_path / "kr_task.py").write_text("def make(**kw):\n    return 1\n")
    import sys
    sys.modules.pop("kr_task", None)
    assert first and reference_store._plugin_digest("kr_task:make") not in ("", first)
    assert reference_store._plugin_digest(None) == ""


def test_keep_copies_a_finished_reference_whole_and_fetch_brings_it_back(tmp_path, monkeypatch):
    monkeypatch.setenv(reference_store.CACHE_ENV, str(tmp_path / "cache"))
    run = tmp_path / "run"
    run.mkdir()
    reference_store.keep("x-1", run)  # no summary yet: not finished, not kept
    assert not (tmp_path / "cache" / "x-1").exists()
    (run / "summary.json").write_text(json.dumps({"goodput": 0.9}))
    (run / "events.jsonl").write_text("{}\n")
    reference_store.keep("x-1", run)
    assert sorted(p.name for p in (tmp_path / "cache").iterdir()) == ["x-1"]  # no temporary left
    back = tmp_path / "out" / "_reference" / "x-1"
    assert reference_store.fetch("x-1", back) == tmp_path / "cache" / "x-1"
    assert json.loads((back / "summary.json").read_text()) == {"goodput": 0.9}
    assert reference_store.fetch("x-2", tmp_path / "y") is None
    monkeypatch.setenv(reference_store.CACHE_ENV, "off")
    assert reference_store.cache_dir() is None and reference_store.fetch("x-1", tmp_path / "z") is None


def test_a_second_run_from_a_new_folder_reuses_the_reference(scenario, tmp_path, monkeypatch, capsys):
    monkeypatch.setenv(reference_store.CACHE_ENV, str(tmp_path / "cache"))
    argv = ["run", str(scenario), "--tier", "sim", "--no-live", "--baseline", "none"]
    assert main(argv + ["--out", str(tmp_path / "a")]) == 0
    first = capsys.readouterr().out
    assert "reference (fault-free) run: " in first and "reusing" not in first
    kept = list((tmp_path / "cache").iterdir())
    assert len(kept) == 1 and (kept[0] / "summary.json").is_file()
    assert main(argv + ["--out", str(tmp_path / "b")]) == 0
    second = capsys.readouterr().out
    assert f"(kept in {tmp_path / 'cache'}" in second
    ref = tmp_path / "b" / "_reference" / kept[0].name
    summary = json.loads(next((tmp_path / "b").glob("kept-reference-2*/summary.json")).read_text())
    assert summary["reference_dir"] == str(ref)  # judged against the copy in its own folder
    assert (ref / "events.jsonl").read_bytes() == (kept[0] / "events.jsonl").read_bytes()
