"""The fleet model's rules priced on one scenario (harness/fleet/scenario.py): values worked
out by hand, and the prediction against the simulator's run of the same built-in."""
from __future__ import annotations

import dataclasses

import pytest

from diloco_chaos.harness.fleet import scenario as fs
from diloco_chaos.harness.fleet.scenario import Pace, predict, predict_ddl, predict_dp
from diloco_chaos.harness.scenarios.scenario import scenario_from_dict

PACE = Pace(job_s=100.0, overhead=0.05, boot_s=1.0, cold_boot_s=4.0, rejoin_s=0.5, checkpoint_every_s=4.0)


def _scenario(faults, learners=4, shards=1, slices=1, spares=True):
    return scenario_from_dict({
        "name": "by-hand", "seed": 1,
        "cluster": {"learners": learners, "shards": shards, "slices": slices, "spares": spares},
        "train": {"task": "markov", "steps": 100, "duration": "100s"}, "faults": faults})


KILL = {"kind": "kill_unit", "target": "learner-0", "at": "10s", "down_for": "10s"}
PAUSE = {"kind": "pause_unit", "target": "learner-1", "at": "30s", "duration": "10s"}
CUT = {"kind": "partition", "target": "link:learner-2", "at": "50s", "duration": "20s"}
SLOW = {"kind": "slow_unit", "target": "learner-3", "at": "0s", "duration": "100s", "speed": 0.5}


def test_ddl_by_hand():
    r = predict_ddl(_scenario([KILL, PAUSE, CUT, SLOW]), PACE)
    # learner-0: down 10-20, a spare boots in 1 s (dead 11), rejoins in 0.5 s; runs 88.5 s
    # learner-1: hung 10 s, runs 90; learner-2: runs 100, its 20 s cut lost (less overhead);
    # learner-3: slow, which costs no learner time
    other = 0.05 * (88.5 + 90 + 100 + 100)
    assert r["badput"] == pytest.approx({"dead": 11 / 400, "recovery": 0.5 / 400, "paused": 10 / 400,
                                         "lost": 20 * 0.95 / 400, "other": other / 400})
    assert r["goodput"] == pytest.approx((400 - 11 - 0.5 - 10 - 19 - other) / 400)


def test_ddl_without_spares_boots_cold():
    r = predict_ddl(_scenario([KILL], spares=False), PACE)
    assert r["badput"]["dead"] == pytest.approx(14 / 400)


def test_a_cut_while_dead_is_not_lost_twice():
    """learner-0 dead 10-21 and rejoining to 21.5; its link cut 15-35: only 21.5-35 is lost
    (pricing the whole cut would count 6.5 s twice)."""
    cut = {"kind": "partition", "target": "link:learner-0", "at": "15s", "duration": "20s"}
    r = predict_ddl(_scenario([KILL, cut]), PACE)
    assert r["badput"]["lost"] == pytest.approx(13.5 * 0.95 / 400)
    assert r["goodput"] + sum(r["badput"].values()) == pytest.approx(1.0)


def test_a_cut_within_the_staleness_horizon_loses_nothing():
    """M = 4, H = 6, max_staleness 16, 0.07 s steps: the other three move a fragment 16
    versions on in 16 * 6 * 0.07 / 3 = 2.24 s; a 2 s cut's kept progress is merged."""
    s = _scenario([{**CUT, "duration": "2s"}])
    r = predict_ddl(s, PACE)
    assert r["staleness_horizon_s"] == pytest.approx(2.24) and r["badput"]["lost"] == 0
    assert predict_ddl(_scenario([{**CUT, "duration": "2.5s"}]), PACE)["badput"]["lost"] == pytest.approx(2.5 * 0.95 / 400)


def test_one_link_of_two_shards_costs_half_the_fragments():
    cut = {"kind": "reset", "target": "link:learner-2~syncer-1", "at": "50s", "duration": "20s"}
    r = predict_ddl(_scenario([cut], shards=2), PACE)
    assert r["badput"]["lost"] == pytest.approx(0.5 * 20 * 0.95 / 400)


def test_a_lost_slice_is_chip_time_not_learner_time():
    lose = {"kind": "kill_slice", "target": "learner-1", "at": "20s", "duration": "40s", "slices": 1}
    r = predict_ddl(_scenario([lose], slices=2), PACE)
    assert r["goodput"] == pytest.approx(0.95) and r["slice_away_share"] == pytest.approx(0.5 * 40 / 400)


def test_dp_by_hand():
    r = predict_dp(_scenario([KILL, SLOW]), PACE)
    # every member restarts with the dead one, and one warm spare cannot take four
    # identities: the job waits for a cold start, down 10-24 (10 + boot 4) on all 4; the
    # 10 s it ran before lose what followed the last checkpoint (every 4 s: 2 s rolled
    # back); the slow one holds the other three to half speed for the 86 s it runs
    assert r["badput"] == pytest.approx({"dead": 14 * 4 / 400, "rolled_back": 2 * 4 / 400,
                                         "waiting_on_sync": 43 * 3 / 400, "other": (86 - 2 - 43) * 0.05 * 4 / 400})
    assert r["goodput"] + sum(r["badput"].values()) == pytest.approx(1.0)


def test_dp_stalls_overlap_once():
    r = predict_dp(_scenario([KILL, {**PAUSE, "at": "20s"}]), PACE)
    # learner-0's kill stalls everyone 10-24, learner-1's hang 20-30: one stall, 10-30
    assert r["badput"]["dead"] == pytest.approx(20 * 4 / 400)


def test_the_paper_operating_point_is_priced_per_policy_on_one_draw():
    """paper-1.2m's chip failures: twelve 4.75 s pauses of one learner each for DDL (the
    last, at 76.3 s, cut at the run's 80 s), job-wide restarts for DP."""
    from diloco_chaos.harness.scenarios.scenario import load_scenario

    s = load_scenario("paper-1.2m")
    r = predict(s, dataclasses.replace(PACE, job_s=80.0))
    assert r["faults"] == 12 and r["ddl"]["badput"]["paused"] == pytest.approx((11 * 4.75 + 80 - 75.802) / 640, abs=1e-4)
    assert r["dp"]["badput"]["dead"] > 0.6 and r["ddl"]["goodput"] > 0.85 > 0.35 > r["dp"]["goodput"]


def test_pace_rejects_nonsense():
    with pytest.raises(ValueError, match="overhead"):
        Pace(job_s=10, overhead=1.0)
    with pytest.raises(ValueError, match="boot_s"):
        Pace(job_s=10, boot_s=-1)


@pytest.fixture(scope="module")
def simulated(tmp_path_factory):
    """A simulated run (every message, link and core played) of a dead unit and a cut
    learner, and the fleet model's pace measured from its log."""
    from diloco_chaos.harness.bench.fleet_tier import pace_from_run
    from diloco_chaos.harness.sim.run import run_sim

    s = scenario_from_dict({
        "name": "fleet-vs-sim", "seed": 3, "cluster": {"learners": 2},
        "train": {"task": "markov", "steps": 300, "duration": "40s"},
        "faults": [{"kind": "kill_unit", "target": "learner-0", "at": "8s", "down_for": "8s"},
                   {"kind": "partition", "target": "link:learner-1", "at": "12s", "duration": "16s"}]})
    result = run_sim(s, tmp_path_factory.mktemp("sim"), expect=False)
    return s, result.summary, pace_from_run(result.run_dir)


def test_the_rules_agree_with_the_simulator(simulated):
    """The fleet rules priced with the pace measured from the simulated run's log: within
    the ±5 points of issue 15."""
    s, summary, pace = simulated
    pred = predict(s, pace)["ddl"]
    assert abs(pred["goodput"] - summary["goodput"]) <= 0.05, (pred, summary["badput"])
    assert pred["badput"]["dead"] > 0.05 and pred["badput"]["lost"] > 0.05, pred


@pytest.mark.parametrize("planted", ["cuts cost nothing", "a dead unit costs nothing"])
def test_the_comparison_catches_a_rule_left_out(simulated, planted, monkeypatch):
    """Each rule matters here: without it the prediction misses the simulated run by more
    than the 5 points the comparison allows."""
    s, summary, pace = simulated
    if planted == "cuts cost nothing":
        monkeypatch.setattr(fs, "staleness_horizon_s", lambda scenario, pace: float("inf"))
    else:
        s = dataclasses.replace(s, faults=tuple(f for f in s.faults if f.kind != "kill_unit"))
    assert abs(predict(s, pace)["ddl"]["goodput"] - summary["goodput"]) > 0.05


def test_the_rule_checks_catch_a_planted_bug(monkeypatch):
    """A fleet model that forgot to take the dead span out of a cut (a planted bug) fails
    the by-hand check above."""
    monkeypatch.setattr(fs, "minus", lambda spans, taken: fs.norm(spans))
    with pytest.raises(AssertionError):
        test_a_cut_while_dead_is_not_lost_twice()


def test_cli_prices_a_scenario(tmp_path, capsys):
    import json

    from diloco_chaos import cli

    assert cli.main(["fleet", "--scenario", "unit-loss", "--out", str(tmp_path)]) == 0
    out = capsys.readouterr().out
    assert "scenario unit-loss: 4 learner units, 1 faults drawn" in out and "ddl  goodput" in out
    res = json.loads((tmp_path / "fleet-unit-loss.json").read_text())
    # unit-loss: learner-1 down 15 s of 4 x 60 s, then a warm spare's 0.3 s and the rejoin's 0.3 s
    assert res["ddl"]["badput"]["dead"] == pytest.approx(15.3 / 240)
    assert res["dp"]["goodput"] < res["ddl"]["goodput"] and res["pace"]["job_s"] == 60.0


@pytest.mark.parametrize("argv, says", [
    (["--calibrate", "x"], "--calibrate: only with --scenario"),
    (["--scenario", "unit-los"], "did you mean 'unit-loss'"),
    (["--scenario", "unit-loss", "--calibrate", "."], "has no events.jsonl and summary.json"),
])
def test_cli_bad_input_is_a_clear_error(argv, says, tmp_path, capsys):
    from diloco_chaos import cli

    assert cli.main(["fleet", *argv, "--out", str(tmp_path)]) == 2
    err = capsys.readouterr().err
    assert says in err and "Traceback" not in err
    assert not list(tmp_path.iterdir())
