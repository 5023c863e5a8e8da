"""docs/reference/ is generated from the code (diloco_chaos/reference.py): the committed
pages equal what the code generates now, and each page covers what the code has (every
event kind a run logs, every key of a summary, every fault kind's fields, every check,
every command)."""
from __future__ import annotations

import dataclasses
import json
from pathlib import Path

import pytest

from diloco_chaos import reference
from diloco_chaos.faults.kinds import FAULT_KINDS
from diloco_chaos.faults.kinds.base import Fault
from diloco_chaos.harness.judging.metrics import Metrics

DATA = Path(__file__).parent / "data" / "report_run"


@pytest.fixture(scope="module")
def sim_run(tmp_path_factory):
    """A small simulator run with a kill, a cut and a pause: (its event kinds, its summary)."""
    from diloco_chaos.harness.scenarios.scenario import scenario_from_dict
    from diloco_chaos.harness.sim.run import run_sim

    s = scenario_from_dict({
        "name": "reference-docs", "seed": 5, "cluster": {"learners": 3, "slices": 2, "shards": 2},
        "train": {"task": "quadratic", "steps": 40, "duration": "20s"}, "wan": {"latency_ms": 10},
        "faults": [{"kind": "kill_unit", "target": "learner-1", "at": "0.5s", "down_for": "2s"},
                   {"kind": "partition", "target": "link:learner-2", "at": "1s", "duration": "1s"},
                   {"kind": "kill_slice", "target": "learner-0", "at": "3s", "duration": "1s"},
                   {"kind": "pause_unit", "target": "learner-0", "at": "2s", "duration": "0.5s"}]})
    result = run_sim(s, tmp_path_factory.mktemp("sim"))
    return _kinds(result.run_dir / "events.jsonl"), result.summary


def _kinds(path: Path) -> set[str]:
    return {json.loads(line)["kind"] for line in path.read_text().splitlines() if line.strip()}


def test_the_committed_pages_are_the_generated_ones():
    pages = reference.pages()
    stale = reference.stale()
    assert not stale, (f"docs/reference/ is out of date ({', '.join(stale)}): "
                       f"run `{reference.REGENERATE}` and commit the pages")
    on_disk = sorted(p.name for p in reference.REFERENCE_DIR.iterdir() if p.suffix in (".md", ".json"))
    assert on_disk == sorted(pages), "docs/reference/ holds a page the code does not generate"


def test_the_pages_are_the_same_every_time():
    assert reference.pages() == reference.pages()


def test_every_event_kind_is_documented_and_every_kind_a_run_logs_appears(sim_run):
    from diloco_chaos.trainer.units.events import KINDS

    assert set(reference.EVENT_KINDS) == set(KINDS)  # one declaration: what the writer accepts is documented
    page = reference.pages()["events.md"]
    logged = _kinds(DATA / "events.jsonl") | sim_run[0]
    assert {"fault_start", "merge", "round_commit", "unit_down"} <= logged
    for kind in logged:
        assert f"| `{kind}` |" in page, kind


def test_every_summary_key_is_documented(sim_run):
    page = reference.pages()["summary-json.md"]
    stored = json.loads((DATA / "summary.json").read_text())
    for key in set(stored) | set(sim_run[1]):
        assert f"| `{key}` |" in page, key
    documented = {key for key, _, _ in reference.summary_keys()}
    assert {f.name for f in dataclasses.fields(Metrics)} <= documented


def test_every_fault_kind_and_field_is_on_its_page():
    page = reference.pages()["fault-kinds.md"]
    for kind, cls in FAULT_KINDS.items():
        row = next(line for line in page.splitlines() if line.startswith(f"| `{kind}` |"))
        for f in dataclasses.fields(cls):
            if f.name not in reference.COMMON_FAULT_FIELDS:
                assert f"`{reference.written_name(f.name)}`" in row, (kind, f.name)


def test_every_check_of_the_catalogue_is_on_its_page():
    from diloco_chaos.harness.judging.planted import PROOFS

    page = reference.pages()["checks.md"]
    for name in PROOFS:
        assert f"| `{name}` |" in page, name


def test_every_scenario_key_and_command_is_on_its_page():
    from diloco_chaos.harness.scenarios.specs import ClusterSpec, Expect, TrainSpec

    keys = reference.pages()["scenario-keys.md"]
    for cls in (ClusterSpec, TrainSpec, Expect):
        for f in dataclasses.fields(cls):
            assert f"| `{reference.written_name(f.name)}` |" in keys, f.name
    cli = reference.pages()["cli.md"]
    for name, _, parser in reference.commands():
        assert f"## {name}\n" in cli
        for action in parser._actions:
            if action.dest == "help":
                continue
            for option in action.option_strings:
                assert f"`{option}" in cli or f", {option}" in cli, (name, option)
    for code in ("\n  0 ", "\n  1 ", "\n  2 ", "\n  130 ", " 143 "):
        assert code in cli, code


def test_no_page_cites_an_issue_or_a_path_outside_the_repository():
    for name, text in reference.pages().items():
        assert "issue " not in text.lower() and "/work/" not in text and "/home/" not in text, name


def test_a_new_field_of_a_fault_kind_makes_its_page_stale(monkeypatch):
    """The planted proof: the code gains a field, and the committed page no longer matches."""
    before = reference.pages()["fault-kinds.md"]

    @dataclasses.dataclass(frozen=True)
    class Surge(Fault):
        """A link's traffic surges for `duration_s`."""

        role = "link"
        duration_s: float
        surge_factor: float = 2.0

    Surge.kind = "surge"
    monkeypatch.setitem(FAULT_KINDS, "surge", Surge)
    after = reference.pages()["fault-kinds.md"]
    assert after != before and "`surge_factor` (float, 2)" in after
    assert "fault-kinds.md" in reference.stale()
