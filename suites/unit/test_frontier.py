"""`bench frontier` (harness/bench/frontier.py) without training: its figures from
fabricated runs, checked by hand, and its chart as well-formed SVG. No process starts."""
from __future__ import annotations

import json
import math
import xml.etree.ElementTree as ET

import pytest

from diloco_chaos.harness.bench import frontier as fr
from diloco_chaos.harness.errors import UserError

SVG = "{http://www.w3.org/2000/svg}"


def _run(seed, codec, loss, steady, total, H=None, task="markov"):
    return {"task": task, "seed": seed, "codec": codec, "H": H, "loss": loss, "steady": steady, "total": total,
            "run_dir": f"dp-seed{seed}" if codec == "dp" else f"{codec}-H{H}-seed{seed}",
            "config": {"seed": seed}}


def _three_seeds() -> list[dict]:
    """DP: steady 100, total 200 B/token each seed, losses 2, 4, 1; int4 H = 24: steady 1, 2, 4,
    total 10, 20, 40, losses 2.02, 4.08, 1.03 (gaps 1 %, 2 %, 3 %). Seeds out of order."""
    return [_run(2, "int4", 1.03, 4.0, 40.0, H=24), _run(0, "dp", 2.0, 100.0, 200.0),
            _run(1, "dp", 4.0, 100.0, 200.0), _run(0, "int4", 2.02, 1.0, 10.0, H=24),
            _run(2, "dp", 1.0, 100.0, 200.0), _run(1, "int4", 4.08, 2.0, 20.0, H=24)]


def test_a_point_is_the_mean_over_seeds_of_each_seed_against_its_own_dp():
    [p] = fr.points_from(_three_seeds())
    assert (p["task"], p["H"], p["codec"]) == ("markov", 24, "int4")
    assert p["reduction_steady"] == pytest.approx((100 + 50 + 25) / 3)   # 58.33
    assert p["reduction_total"] == pytest.approx((20 + 10 + 5) / 3)      # 11.67
    assert [s["parity_gap"] for s in p["per_seed"]] == pytest.approx([0.01, 0.02, 0.03])
    assert p["parity_gap"] == pytest.approx(0.02)
    # sd of (1, 2, 3) % is 1 %: 0.02 ± 4.303 × 0.01 / √3 = 0.02 ± 0.024843
    assert p["parity_gap_ci"] == pytest.approx([0.02 - 0.024843, 0.02 + 0.024843], abs=1e-6)
    assert [s["seed"] for s in p["per_seed"]] == [0, 1, 2]
    assert p["per_seed"][1]["run_dir"] == "int4-H24-seed1" and p["per_seed"][1]["dp_loss"] == 4.0
    assert p["config"] == {"seed": 0}


def test_one_seed_has_no_interval_and_a_run_without_its_dp_is_an_error():
    with pytest.raises(ValueError, match="no DP run"):
        fr.points_from(_three_seeds()[3:5])      # seed 0's int4 run, seed 2's DP
    [p] = fr.points_from([_run(0, "dp", 2.0, 100.0, 200.0), _run(0, "fp32", 2.1, 50.0, 100.0, H=6)])
    assert (p["parity_gap"], p["parity_gap_ci"], p["reduction_steady"]) == (pytest.approx(0.05), None, 2.0)


def test_the_t_table_matches_scipy_where_it_is_installed():
    stats = pytest.importorskip("scipy.stats")
    for df, t in fr.T95.items():
        assert t == pytest.approx(stats.t.ppf(0.975, df), abs=1e-3)
    assert fr.t_interval([1.0]) is None
    assert fr.t_interval([1.0, 3.0]) == pytest.approx([2 - 12.706, 2 + 12.706])   # sd √2, / √2


def _point(task, H, codec, reduction, gap, ci=None):
    return {"task": task, "H": H, "codec": codec, "reduction_steady": reduction, "reduction_total": reduction / 2,
            "parity_gap": gap, "parity_gap_ci": ci}


POINTS = [_point("markov", 6, "fp32", 3.0, 0.005, [0.0, 0.01]), _point("markov", 24, "int4", 120.0, 0.019),
          _point("markov", 64, "int4", 480.0, 0.029, [0.02, 0.038]), _point("markov", 64, "sparse", 900.0, 0.05),
          _point("corpus", 6, "fp32", 3.0, 0.031), _point("corpus", 64, "sparse", 1.0, 0.2, [0.1, 0.3])]


def test_best_is_the_largest_reduction_within_each_gap_bound():
    best = fr.best_points(POINTS)
    assert (best["markov"]["gap_3pct"]["H"], best["markov"]["gap_3pct"]["codec"]) == (64, "int4")
    assert best["markov"]["gap_2pct"]["reduction_steady"] == 120.0
    assert best["markov"]["met"] == {"reduction_3pct": True, "reduction_2pct": True}   # 480 ≥ 400, 120 ≥ 100
    assert best["corpus"] == {"gap_3pct": None, "gap_2pct": None,
                              "met": {"reduction_3pct": False, "reduction_2pct": False}}


def test_a_long_point_sits_beside_the_grid_gap_of_the_same_point():
    grid = fr.points_from(_three_seeds())
    long = fr.points_from([_run(0, "dp", 2.0, 100.0, 200.0), _run(0, "int4", 2.01, 1.0, 10.0, H=24),
                           _run(0, "fp32", 2.2, 50.0, 100.0, H=6)])
    a, b = fr.long_vs_grid(long, grid)
    assert a["parity_gap"] == pytest.approx(0.005)
    assert a["grid_parity_gap"] == pytest.approx(0.02) and a["grid_parity_gap_seed0"] == pytest.approx(0.01)
    assert (b["grid_parity_gap"], b["grid_parity_gap_seed0"]) == (None, None)   # not in the grid


def _result():
    return {"tasks": {"markov": 300, "corpus": 400}, "points": POINTS, "anchors": [dict(a) for a in fr.ANCHORS],
            "long": [{**_point("corpus", 12, "sparse", 40.0, 0.01), "factor": 4}]}


def test_the_chart_is_svg_with_one_marker_per_point_and_the_anchors_in_each_panel():
    root = ET.fromstring(fr.chart_svg(_result()))
    assert root.tag == f"{SVG}svg"
    by_class = lambda c: [e for e in root.iter() if e.get("class") == c]  # noqa: E731
    assert len(by_class("point")) == len(POINTS)
    assert sorted(e.get("data-codec") for e in by_class("point")) == sorted(p["codec"] for p in POINTS)
    assert len(by_class("anchor")) == 2 * 2          # two anchors, two panels
    assert len(by_class("long-point")) == 1 and len(by_class("bound")) == 2 * 2   # 2 % and 3 %, each panel
    assert len(by_class("ci")) == 3 + 0               # the points with an interval
    texts = " ".join("".join(e.itertext()) for e in root.iter(f"{SVG}text"))
    assert "H=64" in texts and "H=12, 4× steps" in texts and "Streaming DiLoCo 35M400×, +3.7 %" in texts
    # x is log10(reduction) over 1..3000 from each panel's left edge: the two fp32 points at 3×
    x0, x1 = fr.LEFT, fr.PANEL_W - fr.RIGHT
    at_3 = x0 + (x1 - x0) * math.log10(3) / math.log10(3000)
    circles = sorted(float(e.get("cx")) for e in by_class("point") if e.tag == f"{SVG}circle")
    assert circles == pytest.approx([at_3, fr.PANEL_W + at_3], abs=0.05)


def test_the_chart_is_redrawn_from_a_stored_result(tmp_path, capsys):
    stored = tmp_path / "frontier.json"
    stored.write_text(json.dumps({"bench": "frontier", **_result()}))
    assert fr.main(["CHART", str(stored), str(tmp_path / "f.svg")]) == 0
    assert len([e for e in ET.parse(tmp_path / "f.svg").iter() if e.get("class") == "point"]) == len(POINTS)


def test_run_configs_put_H_the_codec_and_the_base_into_the_diloco_section(monkeypatch):
    dp = fr.run_config("corpus", 400, 1, None, None)
    assert (dp.diloco.mode, dp.diloco.learners, dp.seed, dp.steps, dp.task.kind) == ("dp", 4, 1, 400, "corpus")
    assert dp.inner.total_steps == 400
    monkeypatch.setattr(fr, "BASE_DILOCO", {"downlink": "answer", "sync_every": 99})
    ddl = fr.run_config("markov", 10, 0, "int4", 24)
    assert (ddl.diloco.mode, ddl.diloco.sync_every, ddl.diloco.downlink) == ("decoupled", 24, "answer")
    assert (ddl.diloco.compression, ddl.diloco.broadcast_compression, ddl.inner.total_steps) == ("int4", "int4", 21)


def test_bad_restrictions_fail_before_any_run(tmp_path, monkeypatch):
    with pytest.raises(UserError, match="unknown task 'nope'"):
        fr.frontier(tmp_path, tasks=["nope"])
    with pytest.raises(UserError, match="unknown codec 'bf8'"):
        fr.frontier(tmp_path, tasks=["markov"], codecs=["bf8"])
    monkeypatch.setenv("DILOCO_FRONTIER_SEEDS", "0, x")
    with pytest.raises(UserError, match="DILOCO_FRONTIER_SEEDS"):
        fr.frontier(tmp_path)
    monkeypatch.setenv("DILOCO_FRONTIER_SEEDS", "1,2")
    assert fr._env("DILOCO_FRONTIER_SEEDS", int) == (1, 2)
    assert not (tmp_path / "frontier").exists()
