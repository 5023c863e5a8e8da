"""Loading what a page shows: a run's event log and its check results, plus its companions.

A run directory holds `events.jsonl` (the contract, harness/eventlog.py) and, once the
runner has judged it, `summary.json` (metrics + check results + the composed verdict).
A page shows those and nothing else: when `summary.json` is missing (an interrupted
run, a hand-made log) the checks are run here through harness.judging.checks, never judged here.

Companions: with `--compare dp` the data-parallel run of the same fault draw lives in
`run_dir/dp/` (and summary.json has a `dp` object); the fault-free reference run's
directory is `summary["reference_dir"]` when the runner recorded it.
"""
from __future__ import annotations

import dataclasses
import json
from dataclasses import dataclass
from pathlib import Path

from diloco_chaos.harness import eventlog
from diloco_chaos.harness.judging import judge as judging
from diloco_chaos.harness.eventlog import EventLog


@dataclass(frozen=True)
class Run:
    run_dir: Path
    log: EventLog | None        # None: only a summary is known (a companion without its folder)
    summary: dict               # Metrics.to_dict() + "checks" + "valid"
    recomputed: bool = False    # the checks were run by the report (no summary.json)
    dp: "Run | None" = None
    reference: "Run | None" = None

    @property
    def name(self) -> str:
        if self.log is not None:
            return str((self.log.header.get("scenario") or {}).get("name") or self.log.config.get("name")
                       or self.run_dir.name)
        return self.run_dir.name

    @property
    def header(self) -> dict:
        return self.log.header if self.log is not None else {}

    @property
    def t_start(self) -> float:
        return float(self.summary.get("t_start") or 0.0)


def judge(log: EventLog, reference: EventLog | None = None) -> dict:
    """The summary a runner would have written (harness/judging/judge.py, the same function),
    with the scenario's `expect` from the log's header, read leniently."""
    expect = dict((log.header.get("scenario") or {}).get("expect") or {})
    return judging.judge(log, reference, expect, lenient=True)


def _read_summary(run_dir: Path) -> dict | None:
    p = run_dir / "summary.json"
    if not p.exists():
        return None
    try:
        return json.loads(p.read_text())
    except json.JSONDecodeError:
        return None


REFERENCE_DIR = "_reference"  # under --out, each scenario's fault-free reference runs (run_cmd.reference_run, runs_cmd)

def _reference_dir(run_dir: Path, summary: dict | None) -> Path | None:
    ref = (summary or {}).get("reference_dir")
    if not ref:
        return None
    # the runner writes it as it was given (e.g. relative to where it ran): try from here, then upwards
    for cand in (Path(ref), *(d / ref for d in run_dir.resolve().parents)):
        if (cand / "events.jsonl").exists() or (cand / "summary.json").exists():
            return cand
    return None


def load(run_dir: Path, *, companions: bool = True) -> Run:
    """The run in run_dir with (if companions) its dp and fault-free reference runs."""
    run_dir = Path(run_dir)
    log = eventlog.read(run_dir)
    summary = _read_summary(run_dir)
    ref = dp = None
    if companions:
        ref_dir = _reference_dir(run_dir, summary)
        if ref_dir is not None:
            ref = _load_companion(ref_dir, None)
        dp_dir = run_dir / "dp"
        if (dp_dir / "events.jsonl").exists() or (summary or {}).get("dp"):
            dp = _load_companion(dp_dir, (summary or {}).get("dp"))
    recomputed = summary is None
    if summary is None:
        summary = judge(log, ref.log if ref is not None else None)
    return Run(run_dir, log, summary, recomputed, dp, ref)


def _load_companion(d: Path, summary: dict | None) -> Run | None:
    try:
        log = eventlog.read(d)
    except eventlog.EventLogError:
        log = None
    s = _read_summary(d) or summary
    if s is None and log is None:
        return None
    if s is None:
        s = judge(log)
    return Run(d, log, s, recomputed=_read_summary(d) is None and summary is None)


def replace(run: Run, **kw) -> Run:
    return dataclasses.replace(run, **kw)
