"""Judging a run reads the log once: every unit's history (harness/judging/history.py
`histories`) is built once per log and shared by the metrics, the checks, the
token-fate ledger and the model checks, which each used to rebuild it."""
from __future__ import annotations

from pathlib import Path

from diloco_chaos.harness import eventlog
from diloco_chaos.harness.judging import history
from diloco_chaos.harness.judging.judge import judge

SAMPLE = Path(__file__).parent / "data" / "fault_free_2learners.jsonl"


def counting(monkeypatch) -> list:
    calls = []
    build = history._build

    def counted(log, t_end):
        calls.append(t_end)
        return build(log, t_end)

    monkeypatch.setattr(history, "_build", counted)
    return calls


def test_a_judged_run_builds_its_histories_once(monkeypatch):
    calls = counting(monkeypatch)
    log = eventlog.read(SAMPLE)
    summary = judge(log, None, {"goodput_min": 0.1, "uptime_min": 0.1})  # with every safety check
    assert summary["checks"] and len(calls) == 1, calls
    judge(log)  # judged again (a report of the same log): nothing rebuilt
    assert len(calls) == 1


def test_another_log_or_end_gets_its_own_histories(monkeypatch):
    calls = counting(monkeypatch)
    log = eventlog.read(SAMPLE)
    t_end = history.window(log)[1]
    cut = eventlog.EventLog(log.header, log.events[: len(log.events) // 2])
    assert history.histories(log, t_end) is history.histories(log, t_end)
    assert history.histories(cut, t_end) is not history.histories(log, t_end)
    history.histories(log, t_end + 1.0)
    assert len(calls) == 3
