"""A full disk under a syncer shard, in the simulator (disk_full: its saves fail while it
lasts), then a crash of that shard: it must have gone on committing, reported nothing of a
failed save durable, and restart from the last save that landed before the disk filled.
The base: the property base (quadratic, 60 steps, 3 learners, 2 shards), syncer-0's disk
full at 3 s for 2 s, syncer-0 killed at 4.5 s for 0.5 s. Planted `durable_on_failure` (a
failed save taken for a landed one, trainer/syncer_driver.py): the shard tells its learners
that rounds are durable which its restart then does not have (durable_rounds_kept), and its
restore is older than the newest save it says landed (restores_faithful)."""
from __future__ import annotations

from diloco_chaos.faults.kinds import KillSyncer
from diloco_chaos.faults.kinds.disk_full import DiskFull
from diloco_chaos.harness.judging import checks
from sim_cases import reported, scenario, simulate_case

FAULTS = (DiskFull("syncer-0", 3.0, duration_s=2.0), KillSyncer("syncer-0", 4.5, down_for_s=0.5))


def _case(bugs=()):
    return simulate_case(scenario(FAULTS, quorum=1), bugs=set(bugs))


def test_a_shard_whose_disk_fills_commits_on_and_restarts_from_its_last_landed_save():
    case = _case()
    shard = [e for e in case.log.events if e["src"] == "syncer-0"]
    failed = [e for e in shard if e["kind"] == "checkpoint_failed"]
    full = [e for e in case.log.of("fault_start") if e["fault"]["kind"] == "disk_full"]
    assert failed and full, "no save failed while the disk was full"
    t_full = full[0]["t"]
    landed = [e for e in shard if e["kind"] == "checkpoint_saved"]
    assert all(not (t_full < e["t"] < failed[-1]["t"]) for e in landed), "a save landed on a full disk"
    assert any(e["kind"] == "round_commit" and t_full < e["t"] < failed[-1]["t"] for e in shard), \
        "the shard stopped committing while its disk was full"
    restored = [e for e in shard if e["kind"] == "checkpoint_restored"]
    last_landed = max(e["number"] for e in landed if e["t"] < restored[0]["t"])
    assert restored[0]["step"] == last_landed  # the newest save that landed, not a failed one
    with reported(case, "safety"):
        for r in checks.safety_checks(case.log, case.metrics):
            case.check(r, unknown_ok=True)
        case.check(checks.no_crash(case.log))


def test_a_failed_save_taken_for_a_landed_one_is_caught():
    """Measured: saves 6-8 fail on the full disk, the bug reports them landed; the restart
    restores save 5: 2 rounds acknowledged durable are gone, and the restore is older than
    the newest save the shard said landed."""
    case = _case({"durable_on_failure"})
    by = {r.name: r for r in checks.safety_checks(case.log, case.metrics)}
    assert by["durable_rounds_kept"].valid is False, by["durable_rounds_kept"].to_dict()
    assert by["restores_faithful"].valid is False, by["restores_faithful"].to_dict()
