"""Fleet-scale goodput simulator (harness/fleet/model.py): hand-checked cases, limits, calibration, CLI."""
from __future__ import annotations

import json
import math

import numpy as np
import pytest

from diloco_chaos import cli
from diloco_chaos.harness.fleet import model as fleet
from diloco_chaos.harness.fleet.model import PAPER, FleetParams, simulate, simulate_elastic, simulate_restart

LEARNERS = [1, 2, 4, 8, 16]
HAND = dict(job_s=1000.0, detect_s=10.0, restart_s=40.0, checkpoint_every_s=30.0,
            reconfig_s=5.0, repair_s=200.0, slice_chips=2)


@pytest.fixture(scope="module")
def default_table():
    """The published setting: MTBI 1 year, default parameters, seed 0."""
    return simulate(PAPER["chips"], LEARNERS, FleetParams(), seed=0)


@pytest.fixture(scope="module")
def harsh_table():
    """A harsher fleet (MTBI 30 days) over a shorter job, for the limits."""
    return simulate([20_000, 40_000, 80_000, 160_000], LEARNERS,
                    FleetParams(mtbi_s=30 * 86400.0, job_s=2 * 86400.0), seed=3)


# ------------------------------------------------------------ cases checked by hand
def test_restart_one_failure_by_hand():
    # up [0,100): 3 checkpoints of 30 s kept (90 s), 10 s rolled back; down [100,150);
    # up [150,1000) runs to the job's end (850 s kept).
    r = simulate_restart(np.array([100.0]), FleetParams(**HAND))
    assert r["goodput"] == pytest.approx(0.94)
    assert r["uptime"] == pytest.approx(0.95)
    assert r["rollback"] == pytest.approx(0.01)


def test_restart_absorbs_a_failure_during_the_restart():
    p = FleetParams(**HAND)
    one = simulate_restart(np.array([100.0]), p)
    assert simulate_restart(np.array([100.0, 120.0]), p) == one  # found by the restart's health check
    # at 150 the job is running again: a second restart [150,200), nothing kept between
    two = simulate_restart(np.array([100.0, 150.0]), p)
    assert two["goodput"] == pytest.approx((90 + 800) / 1000)
    assert two["uptime"] == pytest.approx(0.90)


def test_elastic_one_failure_by_hand():
    # 8 chips, slices of 2 -> 4 slices; M = 2: learner 0 has slices 0-1, learner 1 slices 2-3.
    # Chip 5 (slice 2, learner 1) fails at 100: learner 1 pauses [100,115) (detect + reconfigure),
    # slice 2 is away [100,300) and rejoins at 300 with a pause [300,305).
    # productive = 4*1000 + 4*(1000-20) - 2*(200-15) = 7550 chip-s of 8000.
    p = FleetParams(**HAND)
    r = simulate_elastic(np.array([100.0]), np.array([5]), 8, 2, p)
    assert r["goodput"] == pytest.approx(7550 / 8000)
    assert r["recovery"] == pytest.approx(4 * 20 / 8000)
    assert r["slice_away"] == pytest.approx(2 * 185 / 8000)
    assert r["uptime"] == 1.0  # learner 0 kept the syncer's quorum of 1
    k2 = simulate_elastic(np.array([100.0]), np.array([5]), 8, 2, FleetParams(**HAND, quorum=2))
    assert k2["uptime"] == pytest.approx(0.98)


def test_elastic_dp_one_failure_by_hand():
    # M = 1: all 8 chips pause for the same 20 s: 8*980 - 2*185 = 7470 chip-s of 8000.
    r = simulate_elastic(np.array([100.0]), np.array([5]), 8, 1, FleetParams(**HAND))
    assert r["goodput"] == pytest.approx(7470 / 8000)
    assert r["uptime"] == pytest.approx(0.98)


def test_a_slice_away_for_repair_cannot_fail_again():
    p = FleetParams(**HAND)
    one = simulate_elastic(np.array([100.0]), np.array([5]), 8, 2, p)
    # chip 4 is in slice 2 too, which is away until 300: that failure cannot happen
    assert simulate_elastic(np.array([100.0, 150.0]), np.array([5, 4]), 8, 2, p) == one


# ------------------------------------------------------------ limits
def test_no_failures_gives_exactly_full_goodput(tmp_path):
    res = simulate([150_000, 2_400_000], [1, 8], FleetParams(mtbi_s=math.inf), seed=0)
    for name in res["policies"]:
        assert res[name] == [1.0, 1.0]
        assert res["uptime"][name] == [1.0, 1.0]
    assert cli.main(["fleet", "--mtbi", "never", "--chips", "1k", "--learners", "2", "--out", str(tmp_path)]) == 0
    res = json.loads((tmp_path / "fleet.json").read_text(), parse_constant=pytest.fail)  # strict JSON
    assert res["params"]["mtbi_s"] is None and res["ddl_m2"] == [1.0]


def test_one_learner_is_elastic_dp(default_table, harsh_table):
    for res in (default_table, harsh_table):
        assert res["ddl_m1"] == res["elastic_dp"]
        assert res["uptime"]["ddl_m1"] == res["uptime"]["elastic_dp"]


@pytest.mark.parametrize("table", ["default_table", "harsh_table"])
def test_goodput_never_increases_with_chips(table, request):
    res = request.getfixturevalue(table)
    for name in res["policies"]:
        g = res[name]
        assert all(a >= b for a, b in zip(g, g[1:])), (name, g)


@pytest.mark.parametrize("table", ["default_table", "harsh_table"])
def test_more_learners_never_lower_goodput(table, request):
    res = request.getfixturevalue(table)
    for i in range(len(res["chips"])):
        g = [res[f"ddl_m{m}"][i] for m in LEARNERS]
        u = [res["uptime"][f"ddl_m{m}"][i] for m in LEARNERS]
        assert all(a <= b for a, b in zip(g, g[1:])), g
        assert all(a <= b for a, b in zip(u, u[1:])), u


def test_same_seed_same_table():
    p = FleetParams(job_s=86400.0)
    a = simulate([150_000, 600_000], LEARNERS, p, seed=7)
    assert simulate([150_000, 600_000], LEARNERS, p, seed=7) == a
    assert simulate([150_000, 600_000], LEARNERS, p, seed=8) != a


def test_a_chips_failures_do_not_depend_on_fleet_size():
    p = FleetParams(job_s=86400.0)
    t_small, c_small = fleet.draw_failures(150_000, p, seed=1)
    t_big, c_big = fleet.draw_failures(300_000, p, seed=1)
    keep = c_big < 150_000
    np.testing.assert_array_equal(t_small, t_big[keep])
    np.testing.assert_array_equal(c_small, c_big[keep])


def test_failure_count_matches_the_rate():
    # 2^20 chips x 10 days at MTBI 1 year: 28728 failures expected, Poisson sd 170
    p = FleetParams(job_s=10 * 86400.0)
    t, c = fleet.draw_failures(1 << 20, p, seed=0)
    assert abs(len(t) - (1 << 20) * 10 / 365) < 5 * 170
    assert np.all(np.diff(t) >= 0) and t.min() >= 0 and t.max() < p.job_s


# ------------------------------------------------------------ calibration
@pytest.mark.parametrize("policy", ["dp_no_elastic", "ddl_m8"])
def test_calibration_rows_within_5_points(default_table, policy):
    got = np.array(default_table[policy]) * 100
    assert np.all(np.abs(got - PAPER[policy]) <= 5), (policy, got.round(1), PAPER[policy])


# ------------------------------------------------------------ input and command line
def test_parse_inputs():
    assert fleet.parse_duration("1y", "x") == 365 * 86400
    assert [fleet.parse_duration(s, "x") for s in ("30d", "2h", "15m", "90s", "90", "1.5min")] == \
        [30 * 86400, 7200, 900, 90, 90, 90]
    assert fleet.parse_duration("never", "x", allow_inf=True) == math.inf
    assert fleet.parse_counts("1.2M,150k,300K,150k", "x") == [150_000, 300_000, 1_200_000]
    assert [fleet.format_duration(s) for s in (365 * 86400, 28 * 86400, 1800, 12, math.inf)] == \
        ["1y", "28d", "30min", "12s", "never"]


def test_cli_writes_json_and_page(tmp_path, capsys):
    rc = cli.main(["fleet", "--chips", "150k,300k", "--learners", "1,8", "--job", "2d", "--out", str(tmp_path)])
    assert rc == 0
    res = json.loads((tmp_path / "fleet.json").read_text())
    assert res["chips"] == [150_000, 300_000]
    for name in ("dp_no_elastic", "elastic_dp", "ddl_m1", "ddl_m8"):
        assert len(res[name]) == 2 and all(0 < g <= 1 for g in res[name])
    page = (tmp_path / "fleet.html").read_text()
    assert "<svg" in page and "ddl_m8" in page and "checkpoint_every_s" in page
    assert "http" not in page and "<script" not in page  # works offline, fetches nothing
    out = capsys.readouterr().out
    assert "dp_no_elastic" in out and str(tmp_path / "fleet.html") in out


@pytest.mark.parametrize("argv, says", [
    (["--chips", "150q"], "--chips: cannot read '150q'"),
    (["--chips", "1.5"], "whole number"),
    (["--learners", "0"], "--learners: cannot read '0'"),
    (["--mtbi", "1parsec"], "--mtbi: cannot read '1parsec' as a duration"),
    (["--detect=-5s"], "--detect: cannot read"),
    (["--checkpoint-every", "0s"], "--checkpoint-every: checkpoint_every_s must be finite and > 0"),
    (["--quorum", "0"], "--quorum: quorum must be an integer >= 1"),
    (["--chips", "1k", "--slice-chips", "64", "--learners", "32"], "the smallest fleet (1,000 chips) has only 16 slices"),
])
def test_bad_input_is_a_clear_error(argv, says, tmp_path, capsys):
    assert cli.main(["fleet", *argv, "--out", str(tmp_path)]) == 2
    err = capsys.readouterr().err
    assert says in err and "Traceback" not in err
    assert not (tmp_path / "fleet.json").exists()


def test_bench_times_the_full_table(tmp_path):
    r = fleet.bench(tmp_path)
    assert r["seconds"] > 0 and r["policies"] == 7 and r["chips"] == PAPER["chips"]
