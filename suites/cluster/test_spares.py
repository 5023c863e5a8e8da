"""Warm spares on real processes: a run whose schedule restarts learners keeps a
pre-started process that takes the next restart's identity (harness/backends/cluster.py
`Processes`, trainer/spare.py). Judged from the event log: each restart says it took the
spare, the spare's unit restored its checkpoint and contributed again, its boot (restart →
first inner step) stays under 1.5 s (a cold start: 3-5 s here), a replacement spare was
started, and no process of the run outlives it. The replacement's own use is the same code
path (and the simulator models both: docs/SIMULATOR.md).
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


def _scenario():
    return scenario_from_dict({
        "name": "spares", "seed": 2,
        "cluster": {"learners": 2},  # spares: on by default
        "train": {"task": "markov", "steps": 2000, "duration": "10s", "end_grace": "0s", "batch_size": 16},
        "faults": [{"kind": "kill_unit", "target": "learner-1", "at": "3s", "down_for": "1s"}]})


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


def test_a_restart_takes_the_warm_spare(tmp_path):
    result = run_scenario(_scenario(), tmp_path, live=False)
    log = eventlog.read(result.run_dir)
    assert not log.header.get("crashes"), log.header.get("crashes")
    assert log.header["topology"]["backend"]["spares"] == ["learner"]
    ups = [e for e in log.of("unit_up") if e.get("reason") == "restarted"]  # the harness's lines
    assert [(e["src"], e["start"]) for e in ups] == [("learner-1", "spare")], ups
    (rec,) = result.summary["recovery"]
    # back from its checkpoint, stepping within a second and a half (a cold start: 3-5 s
    # here), and merged again
    assert rec["start"] == "spare" and rec["recovery_s"] is not None and rec["boot_s"] < 1.5, rec
    assert result.summary["recovery_cycles_median"] == rec["recovery_cycles"]
    assert log.of("checkpoint_restored", src="learner-1")
    stdout = result.run_dir / "stdout"
    # the spare's stdout is the unit's incarnation's (the crash tail reads it), and a
    # replacement spare was started for the next restart
    assert (stdout / "learner-1.1.log").resolve().name == "spare-learner-1.log"
    assert (stdout / "spare-learner-2.log").exists()
    assert not _processes_of(result.run_dir)  # units, the used spare and its replacement
