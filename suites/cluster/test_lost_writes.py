"""A slow disk, then a host crash, under a syncer shard's checkpoints, on real processes: the
`disk_slow` and `lost_writes` faults through the runner, done by the harness's FUSE layer
(harness/backends/ckptfs: root and /dev/fuse) over syncer-0's checkpoint folder and over the
shards' journal folder. From 3 s every write and fsync of syncer-0's saves is 300 ms late (a
save of its state then takes seconds, so none lands after the slow-down begins); at 7 s its
host crashes: killed, and whatever it wrote and never fsynced is gone (the save it was writing;
with the planted `journal_unsynced`, its whole commit journal). It restarts at 9 s.

Without a bug every check holds: it restores its newest intact save and takes the rounds it
committed since from its learners' copies, which its fsynced journal vouches for
(committed_rounds_kept). With `journal_unsynced` the crash takes the journal, no copy can be
vouched for, and the rounds since its last save are rolled back: committed_rounds_kept fails."""
from __future__ import annotations

import os
import shutil
from pathlib import Path

import pytest

from diloco_chaos.harness import eventlog
from diloco_chaos.harness.backends import runner
from diloco_chaos.harness.scenarios.scenario import scenario_from_dict
from diloco_chaos.trainer.units.shell import BUGS_ENV

pytestmark = [pytest.mark.cluster, pytest.mark.slow,
              pytest.mark.skipif(os.geteuid() != 0 or not os.path.exists("/dev/fuse") or shutil.which("go") is None,
                                 reason="the FUSE layer needs root, /dev/fuse and Go (to build it)")]

SLOW_THEN_CRASH = {
    "name": "slow-disk-then-crash", "seed": 6,
    "cluster": {"learners": 3, "shards": 2},
    "train": {"task": "markov", "steps": 320, "duration": "40s"},
    "faults": [{"kind": "disk_slow", "target": "syncer-0", "at": "3s", "duration": "6s", "latency_ms": 300},
               {"kind": "lost_writes", "target": "syncer-0", "at": "7s", "down_for": "2s"}],
}


# the bug's run is nightly (CI's time; its simulator proof runs in CI)
@pytest.mark.parametrize("bugs", ["", pytest.param("journal_unsynced", marks=pytest.mark.nightly)])
def test_a_slow_disk_then_a_host_crash_on_real_processes(bugs, tmp_path, monkeypatch):
    monkeypatch.setenv(BUGS_ENV, bugs)
    result = runner.run_scenario(scenario_from_dict(SLOW_THEN_CRASH), tmp_path, live=False)
    mounts = Path("/proc/mounts").read_text()
    for folder in (result.run_dir / "ckpt" / "syncer-0", result.run_dir / "journal"):
        assert str(folder) not in mounts  # the layers are gone, what was written is back in place
    assert any(p.name.isdigit() for p in (result.run_dir / "ckpt" / "syncer-0").iterdir())
    log = eventlog.read(result.run_dir)
    assert result.summary["faults_applied"] == 2, result.summary
    lost = log.of("writes_lost", src="harness")
    assert len(lost) == 1 and lost[0]["unit"] == "syncer-0", lost
    by = {c["name"]: c for c in result.summary["checks"]}
    if not bugs:
        # fsynced with each commit: the file survives, and at most its last line, the commit being
        # written when the host died (between its write and its fsync), is lost; a CI run lost one
        # there (journal_truncated 1), and every check held: the learners' copies repaired it
        assert lost[0]["journal_lost"] == 0 and lost[0]["journal_lines_lost"] <= 1, lost
        bad = {n: c for n, c in by.items() if c["valid"] is False}
        assert not bad, bad
        assert by["committed_rounds_kept"]["details"]["restarts"] == 1, by["committed_rounds_kept"]
        assert by["restore_latest_intact"]["details"]["restarts_judged"] == 1, by["restore_latest_intact"]
        # its restore was seconds old (no save landed on the slow disk): it went on from the
        # learners' copies, past it. (A round committed in the instant before the crash, whose
        # answers no learner got, is no learner's to give back: the check owes only what a
        # learner held; a run measured it: committed 63, went on from 62.)
        from diloco_chaos.harness.judging.check_base import resumed, shard_lives

        lives = shard_lives(log, "syncer-0")
        restored, went_on = lives[1].restored or {}, resumed(lives, 1)
        repaired = {e["fragment"] for e in lives[1].events if e["kind"] == "repaired"}
        assert repaired and all(went_on[p] > restored.get(p, 0) for p in repaired), (restored, went_on, repaired)
    else:
        assert lost[0]["journal_lost"] == 1 and lost[0]["journal_lines_lost"] >= 3, lost  # never fsynced: gone
        r = by["committed_rounds_kept"]
        assert r["valid"] is False and {v["shard"] for v in r["details"]["violations"]} == {"syncer-0"}, r
