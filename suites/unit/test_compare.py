"""`diloco-chaos compare A B`: two stored runs (copies of suites/unit/data/report_run with
summary.json edited) side by side: the table, the checks that flipped, `--json`, and
`--fail-on`'s exit code (B judged against A as its baseline)."""
from __future__ import annotations

import json
import shutil
from pathlib import Path

import pytest

from diloco_chaos import cli

RUN = Path(__file__).parent / "data" / "report_run"


def _copy(tmp_path: Path, name: str, edit) -> Path:
    d = tmp_path / name
    d.mkdir()
    shutil.copy(RUN / "summary.json", d / "summary.json")  # the events are not read: summary only
    s = json.loads((d / "summary.json").read_text())
    edit(s)
    (d / "summary.json").write_text(json.dumps(s))
    return d


def _check(s: dict, name: str, valid) -> None:
    next(c for c in s["checks"] if c["name"] == name)["valid"] = valid


@pytest.fixture
def runs(tmp_path):
    def worse(s):
        s["goodput"] -= 0.05                 # 65.7 % → 60.7 %
        s["final_loss"] = 1.72621 * 1.01     # +1 %
        s["badput"]["dead"] += 0.05
        _check(s, "no_global_downtime", True)
        _check(s, "global_loss_regression", False)
        s["checks"].append({"name": "loss_parity_max", "valid": True, "value": 0.01, "bound": 0.05,
                            "details": {"ci": [-0.01, 0.03]}})
    return _copy(tmp_path, "a", lambda s: None), _copy(tmp_path, "b", worse)


def test_the_table_rounds_figures_and_lists_flipped_checks(runs, capsys):
    a, b = runs
    assert cli.main(["compare", str(a), str(b)]) == 0  # no --fail-on: nothing to fail
    out = capsys.readouterr().out
    lines = out.splitlines()
    row = lambda k: next(l for l in lines if l.split()[:1] == [k]).split()  # noqa: E731
    assert row("goodput") == ["goodput", "65.7", "%", "60.7", "%", "-5.0", "pts"]
    assert row("badput.dead") == ["badput.dead", "6.5", "%", "11.5", "%", "+5.0", "pts"]
    assert row("final_loss") == ["final_loss", "1.726", "1.743", "+0.01726", "(+1.0", "%)"]
    assert row("recovery_max_s") == ["recovery_max_s", "4.67", "s", "4.67", "s", "+0.00", "s"]
    assert row("verdict") == ["verdict", "FAIL", "FAIL"]
    assert not any(l.startswith("badput.waiting_on_sync") for l in lines)  # zero on both sides
    assert "figure(s) zero in both runs not shown" in out
    assert "no_global_downtime      FAIL → PASS" in out
    assert "global_loss_regression  UNKNOWN → FAIL" in out
    assert "loss_parity_max         absent → PASS" in out
    assert "noise: final_loss +1.00 % is within noise (±2.00 %" in out
    assert "gate:" not in out


def test_json(runs, capsys):
    a, b = runs
    assert cli.main(["compare", str(a), str(b / "summary.json"), "--json"]) == 0
    d = json.loads(capsys.readouterr().out)
    assert set(d) >= {"a", "b", "figures", "checks", "flipped", "noise"} and "gate" not in d
    fig = {f["key"]: f for f in d["figures"]}
    assert fig["goodput"]["delta"] == pytest.approx(-5.0) and fig["goodput"]["delta_unit"] == "pts"
    assert {"name": "no_global_downtime", "a": "FAIL", "b": "PASS"} in d["flipped"]
    assert d["noise"]["within_noise"] is True and d["b"]["path"].endswith("summary.json")


def test_fail_on_exit_code(runs, capsys):
    a, b = runs
    assert cli.main(["compare", str(a), str(b), "--fail-on", "goodput:-3pts,final_loss:+2%"]) == 1
    out = capsys.readouterr().out
    assert "goodput 60.7 % vs baseline 65.7 %: -5.0 pts, limit -3 pts: FAIL" in out
    assert "final_loss 1.743 vs baseline 1.726: +1.00 %, limit +2 %: PASS" in out
    assert "gate: FAIL (1 of 2 rule(s) failed)" in out
    assert cli.main(["compare", str(a), str(b), "--fail-on", "goodput:-6pts"]) == 0
    assert "gate: PASS" in capsys.readouterr().out
    # B better than A never fails a "fell" rule; and --json carries the gate too
    assert cli.main(["compare", str(b), str(a), "--fail-on", "goodput:-3pts", "--json"]) == 0
    g = json.loads(capsys.readouterr().out)["gate"]
    assert g["held"] is True and g["rules"][0]["delta"] == pytest.approx(5.0)
    # a figure neither run has: the gate cannot judge it, which is not a pass
    assert cli.main(["compare", str(a), str(b), "--fail-on", "parity:+1%"]) == 1


def test_bad_input_is_one_line_and_exit_2(runs, tmp_path, capsys):
    a, b = runs
    assert cli.main(["compare", str(a), str(tmp_path / "nope")]) == 2
    err = capsys.readouterr().err
    assert err.startswith("diloco-chaos compare: ") and "nope: no such run directory" in err and len(err.splitlines()) == 1
    assert cli.main(["compare", str(a), str(b), "--fail-on", "goodput:3pts,foo:+1"]) == 2
    err = capsys.readouterr().err
    assert "'goodput:3pts': no sign" in err and "unknown figure 'foo'" in err
