"""disk_full on containers: the shard's checkpoint folder is the host's small tmpfs, bind
mounted into its container with the run folder (mounted before the container starts, so
the bind carries it); the host fills it and the kernel answers the container's writes with
ENOSPC. The run of suites/cluster/test_full_disk.py, its no-bug case, on the docker backend:
syncer-1's newest checkpoint is damaged by the host in the folder its container binds, and
its new container passes it over; syncer-0's new container repairs from the learners (its
journal in the run folder the containers bind)."""
from __future__ import annotations

import os
from pathlib import Path

import pytest

from diloco_chaos.harness import eventlog
from diloco_chaos.harness.backends import runner
from diloco_chaos.harness.scenarios.scenario import scenario_from_dict
from suites.cluster.test_full_disk import STORAGE, _repaired_from_the_learners

pytestmark = [pytest.mark.docker, pytest.mark.cluster]


@pytest.mark.skipif(os.geteuid() != 0, reason="disk_full mounts a small filesystem: root only")
# nightly (67 s): CI runs disk_full then a crash on processes (suites/cluster/test_full_disk.py)
# and this file's slow disk and host crash in containers
@pytest.mark.nightly
def test_disk_full_then_a_crash_in_containers(tmp_path):
    s = scenario_from_dict({**STORAGE, "cluster": {**STORAGE["cluster"], "backend": "docker"}})
    result = runner.run_scenario(s, tmp_path, live=False)
    log = eventlog.read(result.run_dir)
    failed = [e for e in log.of("checkpoint_failed") if e["src"] == "syncer-0"]
    assert failed and all("No space left" in e["error"] or "RESOURCE_EXHAUSTED" in e["error"] for e in failed)
    assert result.summary["faults_applied"] == 3, result.summary
    damaged = log.of("checkpoint_damaged", src="harness")
    skipped = [e for e in log.of("checkpoint_skipped") if e["src"] == "syncer-1"]
    assert damaged and [e["step"] for e in skipped] == [damaged[0]["step"]], (damaged, skipped)
    bad = {c["name"]: c for c in result.summary["checks"] if c["valid"] is False}
    assert not bad, bad
    _repaired_from_the_learners(log)
    assert str(result.run_dir) not in Path("/proc/mounts").read_text()


@pytest.mark.nightly  # the same FUSE layers on processes run in CI (suites/cluster/test_lost_writes.py)
@pytest.mark.skipif(os.geteuid() != 0 or not os.path.exists("/dev/fuse"), reason="the FUSE layer needs root and /dev/fuse")
def test_a_slow_disk_then_a_host_crash_in_containers(tmp_path):
    """disk_slow and lost_writes on containers: syncer-0's checkpoint folder and the journals'
    folder are the host's FUSE layers, bound into the containers (a bind of the mount point
    goes through the layer); its new container restores and repairs from the learners."""
    from suites.cluster.test_lost_writes import SLOW_THEN_CRASH

    s = scenario_from_dict({**SLOW_THEN_CRASH, "cluster": {**SLOW_THEN_CRASH["cluster"], "backend": "docker"}})
    result = runner.run_scenario(s, tmp_path, live=False)
    log = eventlog.read(result.run_dir)
    assert result.summary["faults_applied"] == 2, result.summary
    lost = log.of("writes_lost", src="harness")
    assert len(lost) == 1 and lost[0]["journal_lines_lost"] == 0, lost
    bad = {c["name"]: c for c in result.summary["checks"] if c["valid"] is False}
    assert not bad, bad
    assert [e for e in log.of("repaired") if e["src"] == "syncer-0"], "no repair"
    mounts = Path("/proc/mounts").read_text()
    assert str(result.run_dir) not in mounts
