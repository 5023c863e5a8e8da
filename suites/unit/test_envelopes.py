"""Known-good envelopes (harness/judging/envelopes.py) by hand: bands, limits, the key, the
verdict a run gets, and the `baseline` command's refusals."""
from __future__ import annotations

import dataclasses
import json

import pytest

from diloco_chaos import cli
from diloco_chaos.harness.judging import envelopes
from diloco_chaos.harness.scenarios.scenario import load_scenario


def _summary(goodput, merged, lost, loss):
    return {"goodput": goodput, "final_loss": loss,
            "ledger": {"share": {"merged": merged, "lost": lost, "in_flight": 0.0}}}


RUNS = [{"seed": 1, "goodput": 0.90, "tokens_merged": 0.92, "tokens_lost": 0.01, "final_loss": 2.00},
        {"seed": 2, "goodput": 0.95, "tokens_merged": 0.95, "tokens_lost": 0.02, "final_loss": 2.10},
        {"seed": 3, "goodput": 0.93, "tokens_merged": 0.94, "tokens_lost": 0.015, "final_loss": 2.05}]


def test_an_envelope_judges_each_figure_with_the_band_of_its_spread(tmp_path):
    s = load_scenario("syncer-crash")
    store = tmp_path / "e.json"
    entry = envelopes.record(s, "sim", RUNS, store=store)
    # goodput 0.90..0.95: band max(0.02, 0.05) = 0.05, limit 0.85; tokens merged 0.92..0.95:
    # band 0.03, limit 0.89; lost 0.01..0.02: band max(0.01, 0.01), limit 0.03; loss 2.0..2.1:
    # band max(2 % of 2.1 = 0.042, 0.1) = 0.1, limit 2.2
    limits = {r.name: round(r.bound, 6) for r in envelopes.checks(_summary(0.9, 0.9, 0.0, 2.0), entry)}
    assert limits == {"goodput_vs_baseline": 0.85, "tokens_merged_vs_baseline": 0.89,
                      "tokens_lost_vs_baseline": 0.03, "final_loss_vs_baseline": 2.2}
    ok = envelopes.checks(_summary(0.86, 0.895, 0.029, 2.19), entry)
    assert all(r.valid for r in ok), ok
    bad = {r.name: r for r in envelopes.checks(_summary(0.84, 0.88, 0.031, 2.21), entry)}
    assert not any(r.valid for r in bad.values())
    assert "below what known-good runs kept (0.9..0.95)" in bad["goodput_vs_baseline"].details["why"]
    # no figure in the run: UNKNOWN, not a pass
    assert envelopes.checks({"goodput": 0.9}, entry)[1].valid is None
    # the key: the faults count, the seed and [expect] do not
    assert envelopes.key(dataclasses.replace(s, seed=99), "sim") == envelopes.key(s, "sim")
    assert envelopes.key(dataclasses.replace(s, faults=()), "sim") != envelopes.key(s, "sim")
    assert envelopes.stored(dataclasses.replace(s, seed=99), "sim", store=store) == json.loads(store.read_text())[
        envelopes.key(s, "sim")]
    with pytest.raises(ValueError, match="at least 3"):
        envelopes.record(s, "sim", RUNS[:2], store=store)
    assert envelopes.checks(_summary(0.9, 0.9, 0.0, 2.0), None) == []  # none stored: not judged
    # the simulator is deterministic: seed 2's run is judged against seed 2's figures (band: the floor)
    same = {r.name: r for r in envelopes.checks(_summary(0.92, 0.94, 0.02, 2.10), entry, seed=2)}
    assert same["goodput_vs_baseline"].valid is False and round(same["goodput_vs_baseline"].bound, 6) == 0.93
    assert same["tokens_merged_vs_baseline"].valid is True and same["final_loss_vs_baseline"].valid is True


def test_a_run_is_judged_against_the_stored_envelope(tmp_path, monkeypatch):
    from diloco_chaos.run_cmd import with_baseline

    s = load_scenario("syncer-crash")
    monkeypatch.setattr(envelopes, "STORE", tmp_path / "e.json")
    envelopes.record(s, "sim", RUNS)
    summary = with_baseline({"checks": [{"name": "no_nan", "valid": True}], **_summary(0.6, 0.6, 0.0, 2.0)}, s, "sim")
    by = {c["name"]: c["valid"] for c in summary["checks"]}
    assert by["goodput_vs_baseline"] is False and by["tokens_lost_vs_baseline"] is True and summary["valid"] is False


@pytest.mark.parametrize("argv, code, says", [
    (["baseline", "record", "syncer-crash", "--seeds", "1,2"], 2, "at least 3 different seeds"),
    (["baseline", "record", "syncer-crash", "--seeds", "1,x,3"], 2, "whole numbers"),
    (["baseline", "record", "nope"], 2, "nope"),
    (["baseline", "record", "{tmp}/mine.toml", "--add"], 2, "no envelope stored"),
])
def test_the_baseline_command_refuses_bad_input_before_running(argv, code, says, capsys, tmp_path):
    (tmp_path / "mine.toml").write_text('name = "mine"\nseed = 1\n[train]\nsteps = 10\nduration = "5s"\n')
    assert cli.main([a.replace("{tmp}", str(tmp_path)) for a in argv]) == code
    assert says in capsys.readouterr().err


def test_a_scenario_files_envelope_lives_beside_it_and_is_found_there(tmp_path, monkeypatch):
    from diloco_chaos.harness.scenarios.scenario import SCENARIOS_DIR

    assert envelopes.store_for(SCENARIOS_DIR / "syncer-crash.toml") == envelopes.STORE
    mine = tmp_path / "mine.toml"
    assert envelopes.store_for(mine) == tmp_path / "envelopes.json"
    s = load_scenario("syncer-crash")
    envelopes.record(s, "sim", RUNS, store=tmp_path / "envelopes.json")
    monkeypatch.setattr(envelopes, "STORE", tmp_path / "nothing.json")
    monkeypatch.delenv("DILOCO_CHAOS_TASK_PATH", raising=False)
    assert envelopes.stored(s, "sim") is None
    monkeypatch.setenv("DILOCO_CHAOS_TASK_PATH", str(tmp_path))  # what the CLI names for a scenario file
    assert envelopes.stored(s, "sim")["runs"] == RUNS
