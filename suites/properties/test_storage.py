"""A full disk under a syncer shard, in the simulator (disk_full: its saves fail while it
lasts), then a crash of that shard: it must have gone on committing, reported nothing of a
failed save durable, and restart from the last save that landed before the disk filled.
The base: the property base (quadratic, 60 steps, 3 learners, 2 shards), syncer-0's disk
full at 3 s for 2 s, syncer-0 killed at 4.5 s for 0.5 s. Planted `durable_on_failure` (a
failed save taken for a landed one, trainer/protocol/syncer_driver.py): the shard tells its learners
that rounds are durable which its restart then does not have (durable_rounds_kept), and its
restore is older than the newest save it says landed (restores_faithful)."""
from __future__ import annotations

import pytest

from diloco_chaos.faults.kinds import KillSyncer
from diloco_chaos.faults.kinds.corrupt_checkpoint import CorruptCheckpoint
from diloco_chaos.faults.kinds.disk_full import DiskFull
from diloco_chaos.faults.kinds.disk_slow import DiskSlow
from diloco_chaos.faults.kinds.lost_writes import LostWrites
from diloco_chaos.harness.judging import checks
from sim_cases import reported, scenario, simulate_case

FAULTS = (DiskFull("syncer-0", 3.0, duration_s=2.0), KillSyncer("syncer-0", 4.5, down_for_s=0.5))


def _all_hold(case) -> dict:
    """Every safety check and no_crash hold over the case (a failure reported with its
    schedule); the safety checks by name."""
    results = checks.safety_checks(case.log, case.metrics)
    with reported(case, "safety"):
        for r in results:
            case.check(r, unknown_ok=True)
        case.check(checks.no_crash(case.log))
    return {r.name: r for r in results}


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
    _all_hold(case)


def test_a_failed_save_taken_for_a_landed_one_is_caught():
    """Measured: saves 6-8 fail on the full disk, the bug reports them landed; the restart
    restores save 5: 2 rounds acknowledged durable are gone, and the restore is older than
    the newest save the shard said landed."""
    case = _case({"durable_on_failure"})
    by = {r.name: r for r in checks.safety_checks(case.log, case.metrics)}
    assert by["durable_rounds_kept"].valid is False, by["durable_rounds_kept"].to_dict()
    assert by["restores_faithful"].valid is False, by["restores_faithful"].to_dict()


# --- a damaged checkpoint (corrupt_checkpoint): the restore must pass it over ---------------
# syncer-0 killed at 4 s, its newest sealed save damaged while it is down, restarted 0.5 s
# later: it restores the newest intact save (one older), and every check holds.
DAMAGE = ("flip", "truncate", "manifest")


def _damaged(damage: str, bugs=()):
    faults = (CorruptCheckpoint("syncer-0", 4.0, down_for_s=0.5, damage=damage),)
    return simulate_case(scenario(faults, quorum=1), bugs=set(bugs))


@pytest.mark.parametrize("damage", DAMAGE)
def test_a_shard_whose_newest_checkpoint_is_damaged_restores_the_newest_intact_one(damage):
    case = _damaged(damage)
    hit = case.log.of("checkpoint_damaged", src="harness")
    assert hit and hit[0]["step"] is not None and len(hit[0]["sealed"]) >= 2, hit
    shard = [e for e in case.log.events if e["src"] == "syncer-0"]
    skipped = [e for e in shard if e["kind"] == "checkpoint_skipped"]
    restored = [e for e in shard if e["kind"] == "checkpoint_restored"]
    assert [e["step"] for e in skipped] == [hit[0]["step"]]
    assert restored[0]["step"] == hit[0]["sealed"][-2]  # the save before the damaged one
    by = _all_hold(case)
    assert by["checkpoint_integrity"].details["restores_after_damage"] == 1
    assert by["restore_latest_intact"].details["restarts_judged"] == 1


def test_a_restore_that_does_not_verify_is_caught():
    """Planted `restore_unverified` (the restart loads the newest save as it is): with a
    flipped byte it loads the damaged save; checkpoint_integrity names it (the harness's own
    record of what it damaged), restore_latest_intact too (not the newest intact one)."""
    case = _damaged("flip", {"restore_unverified"})
    by = {r.name: r for r in checks.safety_checks(case.log, case.metrics)}
    assert by["checkpoint_integrity"].valid is False, by["checkpoint_integrity"].to_dict()
    assert by["restore_latest_intact"].valid is False, by["restore_latest_intact"].to_dict()
    assert by["restores_faithful"].valid is False  # what it loaded is not what that save wrote


def test_every_shard_kill_lists_its_checkpoints_for_restore_latest_intact():
    """A plain kill_syncer: the harness lists the shard's folder at the kill, and the restart
    is judged against it (the newest sealed save)."""
    case = simulate_case(scenario((KillSyncer("syncer-0", 4.0, down_for_s=0.5),), quorum=1))
    listed = case.log.of("checkpoints_listed", src="harness")
    assert listed and listed[0]["sealed"], listed
    by = {r.name: r for r in checks.safety_checks(case.log, case.metrics)}
    assert by["restore_latest_intact"].valid is True and by["restore_latest_intact"].details["restarts_judged"] == 1


REPAIR = (DiskFull("syncer-0", 2.0, duration_s=3.5), KillSyncer("syncer-0", 5.0, down_for_s=0.5))


def test_a_shard_killed_seconds_after_its_last_checkpoint_loses_no_committed_round():
    """syncer-0's disk is full from 2 s, and it is killed at 5 s: its last save landed about
    3 s before. Its restart asks a learner for the newest copy of each fragment its
    journal names, takes it, and goes on from there: every round it committed is kept
    (measured: restored at version 5, repaired to 19 and 21; 2,400 tokens merged of 2,880
    trained, 1,312 with no_repair)."""
    from diloco_chaos.harness.judging.check_base import _lost_merges, resumed, shard_lives

    case = simulate_case(scenario(REPAIR))
    lives = shard_lives(case.log, "syncer-0")
    saved = [e["t"] for e in lives[0].events if e["kind"] == "checkpoint_saved"]
    killed = [e["t"] for e in case.log.of("unit_down") if e["src"] == "syncer-0" and e.get("reason") == "killed"]
    assert killed[0] - max(saved) >= 2.9, (saved[-2:], killed)
    last = {}
    for e in lives[0].events:
        if e["kind"] == "round_commit":
            last[e["fragment"]] = e["version"]
    assert [e for e in lives[1].events if e["kind"] == "repaired"], "no repair"
    went_on = resumed(lives, 1)
    assert all(went_on[p] >= v > lives[1].restored[p] for p, v in last.items()), (last, went_on, lives[1].restored)
    assert not _lost_merges(case.log)
    by = _all_hold(case)
    assert by["committed_rounds_kept"].details["restarts"] == 1


def test_a_shard_that_does_not_repair_from_its_learners_is_caught():
    """Planted `no_repair`: the restart answers with what it restored; every round since its
    last save is rolled back, though a learner held them: committed_rounds_kept fails."""
    case = simulate_case(scenario(REPAIR), bugs={"no_repair"})
    by = {r.name: r for r in checks.safety_checks(case.log, case.metrics)}
    r = by["committed_rounds_kept"]
    assert r.valid is False and {v["shard"] for v in r.details["violations"]} == {"syncer-0"}, r.to_dict()
    assert min(v["lost_rounds"] for v in r.details["violations"]) >= 5, r.to_dict()


# syncer-1 killed at 1.7 s for 2.1 s, then again at 5.4 s while its repair request was on
# its way (CI's random draw, seed 1 of test_safety, found it)
KILLED_WHILE_ASKING = (KillSyncer("syncer-1", 1.7, down_for_s=2.1), KillSyncer("syncer-1", 5.4, down_for_s=0.5))


@pytest.mark.parametrize("bugs", [(), ("no_repair",)])
def test_a_shard_killed_while_its_repair_is_asked_is_judged_by_its_next_life(bugs):
    """The first restart asks learner-2 for fragment 1 at version 4 (its restore: 3) and is
    killed before the copy comes: it committed nothing, so it lost nothing; the second
    restart asks again and is judged (committed_rounds_kept once failed the first life).
    With no_repair the second life goes on from its restore: the check still fails."""
    from diloco_chaos.harness.judging.check_base import shard_lives

    case = simulate_case(scenario(KILLED_WHILE_ASKING, quorum=2), bugs=set(bugs))
    lives = shard_lives(case.log, "syncer-1")
    assert len(lives) == 3 and bool([e for e in lives[1].events if e["kind"] == "repair_asked"]) == (not bugs)
    assert not [e for e in lives[1].events if e["kind"] == "round_commit"]
    r = {r.name: r for r in checks.safety_checks(case.log, case.metrics)}["committed_rounds_kept"]
    if bugs:
        assert r.valid is False and {v["incarnation"] for v in r.details["violations"]} == {2}, r.to_dict()
    else:
        assert r.valid is True, r.to_dict()
        _all_hold(case)


# syncer-0's disk slow from 1 s (each of a save's writes and fsyncs 200 ms late: a save takes
# ~5 s, so none lands after the first), then its host crashes at 5 s: the save it was writing
# is gone with it, and so is whatever it had not fsynced
CRASH = (DiskSlow("syncer-0", 1.0, duration_s=6.0, latency_ms=200.0), LostWrites("syncer-0", 5.0, down_for_s=0.5))


def test_a_slow_disk_then_a_host_crash_loses_no_committed_round():
    """The journal is fsynced with each commit, before its answers go out, so the crash
    takes nothing a learner could hold: the restart repairs from the learners past its old
    save and every check holds."""
    case = simulate_case(scenario(CRASH))
    lost = case.log.of("writes_lost", src="harness")
    assert [(e["unit"], e["journal_lost"], e["journal_truncated"], e["journal_lines_lost"]) for e in lost] == \
        [("syncer-0", 0, 0, 0)]
    assert [e for e in case.log.of("repaired") if e["src"] == "syncer-0"], "no repair"
    by = _all_hold(case)
    assert by["committed_rounds_kept"].details["restarts"] == 1
    assert by["restore_latest_intact"].details["restarts_judged"] == 1


def test_a_journal_a_host_crash_can_take_is_caught():
    """Planted `journal_unsynced` (the journal flushed, never fsynced): the host crash takes
    the whole file, the restart cannot vouch for any learner's copy, and the rounds since
    its last save are rolled back: committed_rounds_kept fails."""
    case = simulate_case(scenario(CRASH), bugs={"journal_unsynced"})
    lost = case.log.of("writes_lost", src="harness")
    assert lost and lost[0]["journal_lost"] == 1 and lost[0]["journal_lines_lost"] > 5, lost
    by = {r.name: r for r in checks.safety_checks(case.log, case.metrics)}
    r = by["committed_rounds_kept"]
    assert r.valid is False and {v["shard"] for v in r.details["violations"]} == {"syncer-0"}, r.to_dict()


@pytest.mark.nightly
def test_the_storage_builtin_holds_on_the_simulator():
    """The built-in `storage` (a full disk, then a torn, a bit-flipped and a manifest-less
    checkpoint under restarts of both shards, a slow disk and a host crash), on the simulator at its own seed: each
    restart passes its damaged save over and restores the newest intact one, and every
    safety check holds (125-136 s on 2 cores alone, 304 s beside the other CI worker:
    nightly; each damage kind's CI test above runs the same path on the small task)."""
    from diloco_chaos.harness.scenarios.scenario import load_scenario

    case = simulate_case(load_scenario("storage"))
    damaged = case.log.of("checkpoint_damaged", src="harness")
    assert [(e["unit"], e["damage"]) for e in damaged] == [
        ("syncer-0", "truncate"), ("syncer-1", "flip"), ("syncer-1", "manifest")], damaged
    assert all(e["step"] is not None for e in damaged), damaged
    skipped = {(e["src"], e["step"]) for e in case.log.of("checkpoint_skipped")}
    assert {(e["unit"], e["step"]) for e in damaged} <= skipped, (damaged, skipped)
    assert case.log.of("checkpoint_failed"), "no save failed on the full disk"
    lost = case.log.of("writes_lost", src="harness")  # the host crash at 24 s took nothing fsynced
    assert [(e["unit"], e["journal_lines_lost"]) for e in lost] == [("syncer-0", 0)], lost
    by = _all_hold(case)
    # syncer-0's host-crash restart is its second after a damage: 4 restores judged by each
    assert by["checkpoint_integrity"].details["restores_after_damage"] == 4
    assert by["restore_latest_intact"].details["restarts_judged"] == 4
