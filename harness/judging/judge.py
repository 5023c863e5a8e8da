"""Judging a run, once: metrics, every check and the composed verdict, from the event log.

The runner writes what `judge` returns into summary.json (plus where the run and its
reference lie); a report of a log without a summary calls the same function, so a page
and the runner cannot disagree on a run (issue 14: judging once).
"""
from __future__ import annotations

from diloco_chaos.harness.judging import checks, metrics
from diloco_chaos.harness.judging.check_base import compose
from diloco_chaos.harness.eventlog import EventLog


def judge(log: EventLog, reference: EventLog | None = None, expect: dict | None = None, *,
          lenient: bool = False) -> dict:
    """The summary of one run: `Metrics.to_dict()`, how many scheduled faults happened,
    `checks` (each check's result), `valid` (the composed verdict) and `mode`. `expect`:
    the scenario's thresholds (None: not judged); `lenient`: an expect table this version
    cannot read is left out instead of raising (a log of another version)."""
    m = metrics.compute(log, reference)
    results = checks.verdict(log, m, expect, lenient=lenient)
    return {**m.to_dict(), **faults_seen(log), "checks": [r.to_dict() for r in results],
            "valid": compose(results).valid, "mode": log.config["diloco"]["mode"]}


def unknown_checks(summary: dict) -> list[str]:
    """The checks of a summary that ended UNKNOWN (the run could not judge them)."""
    return [c["name"] for c in summary.get("checks", []) if c.get("valid") is None]


def held(summary: dict, *, allow_unknown=False) -> bool:
    """The run held: no check failed, and none ended UNKNOWN. A check the run could not
    judge is not a pass (a loss check without global evals, a recovery bound without a
    restart): the run did not test what it was asked to. `allow_unknown`: True (any), or
    the names of checks whose UNKNOWN is accepted, an explicit opt-out."""
    if any(c.get("valid") is False for c in summary.get("checks", [])) or summary.get("valid") is False:
        return False
    unknown = unknown_checks(summary)
    if allow_unknown is True:
        return True
    return not [n for n in unknown if n not in (allow_unknown or ())]


def faults_seen(log: EventLog) -> dict:
    """How many of the scheduled faults happened. A run ends at its token budget, so on a
    fast machine faults due later are never applied; the summary and report say so."""
    schedule = log.header.get("schedule") or []
    applied = len(log.of("fault_start", src="harness"))
    t0, t1 = log.header.get("t_start"), log.header.get("t_end")
    return {"faults_scheduled": len(schedule), "faults_applied": applied,
            "run_s": t1 - t0 if t0 is not None and t1 is not None else None,
            "stop_kills": log.header.get("stop_kills")}  # units SIGKILLed after their stop grace
