"""One verdict for a run, whoever asks: the runner's summary and a report of a log without
a summary run the same checks (harness.judging.checks.verdict). They used to disagree on
`no_crash` for a log without a crash entry (the runner called it PASS)."""
from __future__ import annotations

import pytest
from log_builder import LogBuilder

from diloco_chaos.harness.judging import checks, metrics
from diloco_chaos.reports.runs import judge


def _log(**header):
    b = LogBuilder(**header)
    for unit in b.names:
        b.up(0.0, unit).train(unit, 6)
    return b.log()


def _checks(results) -> dict:
    return {r.name: r.valid for r in results}


@pytest.mark.parametrize("crashes, no_crash", [(None, None), ([], True), ([{"unit": "learner-1"}], False)])
def test_the_runner_and_the_report_judge_no_crash_alike(crashes, no_crash):
    log = _log(**({} if crashes is None else {"crashes": crashes}))
    mine = _checks(checks.verdict(log, metrics.compute(log), {}))
    report = {c["name"]: c["valid"] for c in judge(log)["checks"]}
    assert mine == report
    assert mine.get("no_crash") is no_crash      # no crash entry: not judged, not PASS


def test_an_unreadable_expect_table_raises_for_the_runner_and_is_skipped_by_a_report():
    log = _log(scenario={"expect": {"goodput": 0.8}})
    with pytest.raises(ValueError, match="unknown key"):
        checks.verdict(log, metrics.compute(log), {"goodput": 0.8})
    assert "goodput" not in {c["name"] for c in judge(log)["checks"]}


def test_the_report_judges_a_log_as_the_runner_summarised_it(tmp_path):
    # the runner's summary.json and a report of the same log without it: one function
    # (harness/judging/judge.py); they used to differ (the report's had no faults_scheduled / run_s)
    from diloco_chaos.harness.judging.judge import judge as runner_judge
    log = _log(crashes=[], t_start=0.0, t_end=7.5, schedule=[{"kind": "kill_unit"}])
    mine, report = runner_judge(log, None, {}), judge(log)
    assert report == mine
    assert (mine["faults_scheduled"], mine["faults_applied"], mine["run_s"]) == (1, 0, 7.5)
