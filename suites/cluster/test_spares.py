"""Warm spares on real processes: a run whose schedule restarts learners keeps a
pre-started process that takes the next restart's identity (harness/backends/cluster.py
`Processes`, trainer/spare.py). Judged from the event log: each restart says it took the
spare, the spare's unit restored its checkpoint and contributed again, its boot (restart →
first inner step) stays under 1.5 s (a cold start: 3-5 s here), and no process of the run
outlives it.
The cold path stays covered by suites/cluster/test_train_cluster.py (a LocalCluster with
no spares) and the docker backend."""
from __future__ import annotations

import os
from pathlib import Path

import pytest

from harness import eventlog
from harness.backends.runner import run_scenario
from harness.scenarios.scenario import scenario_from_dict

pytestmark = [pytest.mark.cluster, pytest.mark.slow]


def _scenario(spares: bool):
    return scenario_from_dict({
        "name": "spares", "seed": 2,
        "cluster": {"learners": 2, "spares": spares},
        "train": {"task": "markov", "steps": 2000, "duration": "18s", "end_grace": "0s", "batch_size": 16},
        # the second restart takes the replacement spare, started 3 s after the first
        "faults": [{"kind": "kill_unit", "target": "learner-1", "at": "3s", "down_for": "1s"},
                   {"kind": "kill_unit", "target": "learner-0", "at": "11s", "down_for": "1s"}]})


def _processes_of(run_dir: Path) -> list[int]:
    """Live pids whose command line names the run directory (each unit's and spare's does)."""
    out = []
    for d in Path("/proc").iterdir():
        if d.name.isdigit():
            try:
                cmd = (d / "cmdline").read_bytes().replace(b"\0", b" ").decode(errors="replace")
                state = (d / "stat").read_text().rsplit(")", 1)[1].split()[0]
            except OSError:
                continue
            if str(run_dir) in cmd and state != "Z" and int(d.name) != os.getpid():
                out.append(int(d.name))
    return out


def test_restarts_take_the_warm_spare(tmp_path):
    result = run_scenario(_scenario(spares=True), tmp_path, live=False)
    log = eventlog.read(result.run_dir)
    assert not log.header.get("crashes"), log.header.get("crashes")
    assert log.header["topology"]["backend"]["spares"] == ["learner"]
    ups = [e for e in log.of("unit_up") if e.get("reason") == "restarted"]  # the harness's lines
    assert [(e["src"], e["start"]) for e in ups] == [("learner-1", "spare"), ("learner-0", "spare")], ups
    recs = result.summary["recovery"]
    assert [r["start"] for r in recs] == ["spare", "spare"]
    for r in recs:  # back from its checkpoint, stepping within a second, and merged again
        assert r["recovery_s"] is not None and r["boot_s"] < 1.5, r
    assert result.summary["recovery_cycles_median"] is not None
    for unit in ("learner-0", "learner-1"):
        assert log.of("checkpoint_restored", src=unit), unit
    # the spare's stdout is the unit's incarnation's (the crash tail reads it)
    assert (result.run_dir / "stdout" / "learner-1.1.log").resolve().name.startswith("spare-learner-")
    assert not _processes_of(result.run_dir)
