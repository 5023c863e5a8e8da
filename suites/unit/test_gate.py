"""The baseline gate (harness/judging/gate.py): parsing --fail-on SPECs (units, signs, every
bad part at once), judging a run against a stored one (a missing figure is not a pass),
reading summaries, and compare()'s flipped checks and noise band."""
from __future__ import annotations

import json
import math

import pytest

from diloco_chaos.harness.judging import gate
from diloco_chaos.harness.errors import UserError
from pathlib import Path

RUN = Path(__file__).parent / "data" / "report_run"


def _base(**kw) -> dict:
    s = {"goodput": 0.953, "uptime": 0.9, "final_loss": 0.43, "loss_parity": 0.01, "recovery_max_s": 4.0,
         "downtime": [[1.0, 2.5], [3.0, 3.5]], "restarts": 2, "badput": {"dead": 0.05},
         "participation": {"mean": 1.2}, "checks": []}
    s.update(kw)
    return s


def test_parse_aliases_units_and_signs():
    rules = gate.parse_fail_on("goodput:-3pts, parity:+1%,final_loss:+2%,recovery:+5s,restarts:+1,badput.dead:+2pt")
    got = [(r.key, r.sign, r.amount, r.measure) for r in rules]
    assert got == [("goodput", -1, 3.0, "pts"), ("loss_parity", 1, 1.0, "pts"), ("final_loss", 1, 2.0, "%"),
                   ("recovery_max_s", 1, 5.0, "abs"), ("restarts", 1, 1.0, "abs"), ("badput.dead", 1, 2.0, "pts")]
    # the full summary key is accepted as well as the alias
    assert gate.parse_fail_on("loss_parity:+1%")[0].key == gate.parse_fail_on("parity:+1%")[0].key


def test_every_bad_part_is_named_at_once_with_the_valid_figures_and_units():
    with pytest.raises(UserError) as e:
        gate.parse_fail_on("goodputt:-3pts,final_loss:+3pts,goodput:3%,recovery:+5x,steps:+1s")
    msg = str(e.value)
    for part in ("unknown figure 'goodputt'", "'final_loss:+3pts': pts (percentage points) is for fractions",
                 "'goodput:3%': no sign", "'recovery:+5x': not FIGURE", "'steps:+1s': s (seconds) is for time"):
        assert part in msg, msg
    assert "Figures: goodput" in msg and "parity (= loss_parity)" in msg and "Units: pts = percentage points" in msg
    for bad in ("", " ", "goodput:-3pts,", "goodput"):
        with pytest.raises(UserError):
            gate.parse_fail_on(bad)


def test_a_baseline_5_points_better_fails_and_2_points_better_passes():
    rules = gate.parse_fail_on("goodput:-3pts")
    row, = gate.evaluate(_base(goodput=0.903), _base(goodput=0.953), rules)
    assert not row["held"] and row["delta"] == pytest.approx(-5.0)
    assert row["line"] == "goodput 90.3 % vs baseline 95.3 %: -5.0 pts, limit -3 pts: FAIL"
    row, = gate.evaluate(_base(goodput=0.933), _base(goodput=0.953), rules)
    assert row["held"] and row["line"].endswith("limit -3 pts: PASS")
    # exactly the limit is not "more than" it (0.95 → 0.92 is 3.0000000000000027 points in floats)
    assert gate.evaluate(_base(goodput=0.92), _base(goodput=0.95), rules)[0]["held"]
    # the sign: a rise never fails a "-" rule, however large
    assert gate.evaluate(_base(goodput=0.99), _base(goodput=0.5), rules)[0]["held"]


def test_percent_on_a_fraction_is_points_and_relative_elsewhere():
    # goodput:-3% reads as "goodput dropped 3 %": points (95.3 → 92.0 is -3.3 pts, but only -3.5 % relative)
    row, = gate.evaluate(_base(goodput=0.920), _base(goodput=0.953), gate.parse_fail_on("goodput:-3%"))
    assert not row["held"] and row["unit"] == "pts" and row["delta"] == pytest.approx(-3.3)
    # final_loss:+2%: relative (0.43 → 0.4386 is +2.0 %, 0.43 → 0.44 +2.33 %)
    rules = gate.parse_fail_on("final_loss:+2%")
    assert gate.evaluate(_base(final_loss=0.4386), _base(), rules)[0]["held"]
    row, = gate.evaluate(_base(final_loss=0.44), _base(), rules)
    assert not row["held"] and row["delta"] == pytest.approx(100 * 0.01 / 0.43)
    assert row["line"] == "final_loss 0.44 vs baseline 0.43: +2.33 %, limit +2 %: FAIL"
    # parity is a percent gap: +1% means one point of parity (0.01 → 0.025 is +1.5 pts)
    assert not gate.evaluate(_base(loss_parity=0.025), _base(), gate.parse_fail_on("parity:+1%"))[0]["held"]
    # a bare number is absolute in the figure's own unit
    assert not gate.evaluate(_base(goodput=0.91), _base(), gate.parse_fail_on("goodput:-0.03"))[0]["held"]


def test_seconds_counts_and_derived_figures():
    rules = gate.parse_fail_on("recovery:+5s,downtime:+1s,restarts:+1,participation:-0.5")
    rows = gate.evaluate(_base(recovery_max_s=9.5, downtime=[[1.0, 4.0]], restarts=4), _base(), rules)
    assert [r["held"] for r in rows] == [False, True, False, True]
    assert rows[0]["line"] == "recovery 9.50 s vs baseline 4.00 s: +5.50 s, limit +5 s: FAIL"
    assert rows[1]["current"] == 3.0 and rows[1]["baseline"] == 2.0  # the gaps' seconds summed
    assert rows[2]["line"] == "restarts 4 vs baseline 2: +2, limit +1: FAIL"


def test_a_figure_missing_on_either_side_fails_with_the_reason():
    rules = gate.parse_fail_on("recovery:+5s,parity:+1%,goodput:-3pts")
    cur = _base(recovery_max_s=None, goodput=math.nan)
    del cur["loss_parity"]
    rows = gate.evaluate(cur, _base(loss_parity=None), rules)
    assert [r["held"] for r in rows] == [False, False, False]
    assert "recovery_max_s missing in this run" in rows[0]["why"] and "not a pass" in rows[0]["line"]
    assert "missing in this run and the baseline" in rows[1]["why"]
    assert "not a finite number" in rows[2]["why"]


def test_load_summary_takes_a_directory_a_file_or_a_symlink(tmp_path):
    assert gate.load_summary(RUN)["goodput"] == pytest.approx(0.6567, abs=1e-4)
    assert gate.load_summary(RUN / "summary.json")["goodput"] == gate.load_summary(RUN)["goodput"]
    (tmp_path / "latest").symlink_to(RUN.resolve())
    assert gate.load_summary(tmp_path / "latest")["steps"] == 921
    with pytest.raises(UserError, match="no summary.json in this directory"):
        gate.load_summary(tmp_path)
    with pytest.raises(UserError, match="nope: no such run directory or file"):
        gate.load_summary(tmp_path / "nope")
    (tmp_path / "bad.json").write_text("{not json")
    with pytest.raises(UserError, match="bad.json: not a readable summary.json"):
        gate.load_summary(tmp_path / "bad.json")


def test_compare_deltas_flips_and_noise():
    a = json.loads((RUN / "summary.json").read_text())
    b = json.loads(json.dumps(a))
    b["goodput"] -= 0.05
    b["final_loss"] = a["final_loss"] * 1.004
    names = [c["name"] for c in a["checks"]]
    b["checks"][names.index("no_global_downtime")]["valid"] = True       # FAIL → PASS
    b["checks"][names.index("global_loss_regression")]["valid"] = False  # UNKNOWN → FAIL
    b["checks"][names.index("no_nan")]["valid"] = None                   # PASS → UNKNOWN
    c = gate.compare(a, b)
    fig = {f["key"]: f for f in c["figures"]}
    assert fig["goodput"]["delta"] == pytest.approx(-5.0) and fig["goodput"]["delta_text"] == "-5.0 pts"
    assert fig["badput.dead"]["a_text"] == "6.5 %" and fig["badput.waiting_on_sync"]["zero"]
    assert fig["final_loss"]["relative"] == pytest.approx(0.4)
    assert "t_start" not in fig and "valid" not in fig
    assert c["flipped"] == [{"name": "no_nan", "a": "PASS", "b": "UNKNOWN"},
                            {"name": "no_global_downtime", "a": "FAIL", "b": "PASS"},
                            {"name": "global_loss_regression", "a": "UNKNOWN", "b": "FAIL"}]
    assert c["noise"] is None  # no loss-parity interval in either
    ci = {"name": "loss_parity_max", "valid": True, "value": 0.01, "bound": 0.05, "details": {"ci": [0.0, 0.02]}}
    a["checks"].append(ci)
    c = gate.compare(a, b)
    assert c["noise"]["half_width"] == pytest.approx(0.01) and c["noise"]["within_noise"] is True
    assert "within noise" in c["noise"]["note"]
    b["final_loss"] = a["final_loss"] * 1.03
    assert gate.compare(a, b)["noise"]["within_noise"] is False


def test_run_gate_and_report_lines_for_a_command_line(tmp_path):
    base = tmp_path / "base"
    base.mkdir()
    (base / "summary.json").write_text(json.dumps(_base(goodput=0.953)))
    rows = gate.run_gate(_base(goodput=0.903), base, "goodput:-3pts,final_loss:+2%")
    assert [r["held"] for r in rows] == [False, True] and not gate.gate_held(rows)
    assert gate.report_lines(rows, baseline_name=str(base), spec="goodput:-3pts,final_loss:+2%") == [
        f"gate: against {base}, --fail-on goodput:-3pts,final_loss:+2%",
        "  goodput 90.3 % vs baseline 95.3 %: -5.0 pts, limit -3 pts: FAIL",
        "  final_loss 0.43 vs baseline 0.43: +0.00 %, limit +2 %: PASS",
        "gate: FAIL (1 of 2 rule(s) failed)"]
    assert gate.gate_held(gate.run_gate(_base(goodput=0.933), _base(goodput=0.953)))  # default goodput:-3pts
    with pytest.raises(UserError, match="unknown figure"):
        gate.run_gate(_base(), tmp_path / "missing", "nope:+1")  # the SPEC is checked before the baseline is read


def test_a_bare_number_on_a_fraction_that_can_never_fail_is_refused_with_the_unit_meant():
    """goodput:-3 (no unit) is an absolute change of 3 in a 0-1 fraction: a rule that never
    fails. It is refused, naming the spelling meant; goodput:-0.03 (the same as -3pts) is not."""
    with pytest.raises(UserError, match=r"goodput is a fraction .* did you mean -3pts"):
        gate.parse_fail_on("goodput:-3")
    assert gate.parse_fail_on("goodput:-0.03")[0].amount == 0.03
    assert gate.parse_fail_on("restarts:+1")[0].amount == 1.0  # a count: a bare number is its unit
