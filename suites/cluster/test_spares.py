"""Warm spares on real processes: a run whose schedule restarts learners keeps a
pre-started process that takes the next restart's identity (harness/backends/cluster.py
`Processes`, trainer/units/spare.py). Judged from the event log: each restart says it took the
spare, the spare's unit restored its checkpoint and contributed again, its boot (restart →
first inner step) is a fraction of the same run's cold start, a replacement spare was
started, and no process of the run outlives it. The replacement's own use is the same code
path (and the simulator models both: docs/SIMULATOR.md).
The cold path stays covered by suites/cluster/test_train_cluster.py (a LocalCluster with
no spares) and the docker backend."""
from __future__ import annotations

import os
import statistics
from pathlib import Path

import pytest

from diloco_chaos.harness import eventlog
from diloco_chaos.harness.backends.runner import run_scenario
from diloco_chaos.harness.scenarios.scenario import scenario_from_dict

pytestmark = [pytest.mark.cluster, pytest.mark.slow]


def _scenario():
    return scenario_from_dict({
        "name": "spares", "seed": 2,
        # spares: on by default; a pool of one here (two by default), so that the second of
        # two restarts at once takes a spare that is not ready yet
        "cluster": {"learners": 2, "spare_pool": 1},
        "train": {"task": "markov", "steps": 2000, "duration": "22s", "end_grace": "0s", "batch_size": 16},
        # two restarts at once: the first takes the spare; the second its replacement, which
        # is still in its delay and must boot at once (trainer/units/spare.py), not after it
        "faults": [{"kind": "kill_unit", "target": "learner-1", "at": "5s", "down_for": "1s"},
                   {"kind": "kill_unit", "target": "learner-0", "at": "5s", "down_for": "1s"}]})


def cold_start_s(log) -> float:
    """The run's cold start: from the harness's launch to the end of each first-incarnation
    learner's first inner step, the median."""
    firsts = {}
    for e in log.of("step"):  # in time order: each learner's first is its first incarnation's
        if e["src"].startswith("learner-"):
            firsts.setdefault(e["src"], e["t"])
    return statistics.median(t - log.header["t_launch"] for t in firsts.values())


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
    assert sorted(e["start"] for e in ups) == ["spare", "spare_booting"], ups
    # both restarts are recoveries, also one whose process never wrote a line by the end (a
    # CI run under load: the second boot took longer than the 8 s a 14 s run left it; now 16 s)
    first, second = sorted(result.summary["recovery"], key=lambda r: r["start"])
    # back from its checkpoint and merged again, stepping in a fraction of this run's own
    # cold start (launch → the end of the first inner step, median of the learners: Python,
    # JAX, the task, the compile; 5.8 s measured on a new machine, its spare boot 0.10 s).
    # Relative, so a slow or busy machine slows both sides alike.
    cold = cold_start_s(log)
    assert first["start"] == "spare" and first["recovery_s"] is not None and first["boot_s"] < 0.5 * cold, (first, cold)
    # the replacement, handed the second identity during its 3 s delay, booted at once and
    # not after the delay (before the fix it did not boot within a 14 s run's remaining 9 s):
    # the spare's own line says which way its delay ended (in seconds the two are not
    # apart enough to tell on a loaded machine: a boot there took 6.9 s); and it stepped,
    # merged again
    assert second["start"] == "spare_booting" and second["recovery_s"] is not None, second
    spare_out = (result.run_dir / "stdout" / "spare-learner-2.log").read_text(errors="replace")
    assert "taken during its delay: booting at once" in spare_out, spare_out[-500:]
    # each restored a checkpoint if one was finalized before its kill: a checkpoint_saved line
    # says when its save *started* (orbax writes in the background; the CI once killed
    # learner-0 after its step-50 line, before that write ended) and which save was durable
    # then. On loaded cores a learner may have none by its kill and rightly start from Θ0.
    for unit in ("learner-0", "learner-1"):
        killed = min(e["t"] for e in log.of("unit_down", src=unit) if e.get("reason") == "killed")
        durable = max((e["durable"] for e in log.of("checkpoint_saved", src=unit) if e["t"] < killed), default=0)
        restored = log.of("checkpoint_restored", src=unit)
        assert (restored[0]["step"] >= durable) if restored else durable == 0, (unit, durable, restored)
    stdout = result.run_dir / "stdout"
    # the spare's stdout is the unit's incarnation's (the crash tail reads it), and a
    # replacement spare was started for each restart
    assert (stdout / f"{first['unit']}.1.log").resolve().name == "spare-learner-1.log"
    assert (stdout / f"{second['unit']}.1.log").resolve().name == "spare-learner-2.log"
    assert (stdout / "spare-learner-3.log").exists()
    assert not _processes_of(result.run_dir)  # units, the used spare and its replacement
