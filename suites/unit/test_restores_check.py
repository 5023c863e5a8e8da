"""restores_faithful (harness/judging/restores.py) on hand-made logs: a shard's save lines
(checkpoint_started: number, versions, digests; checkpoint_saved: the landing) and a
learner's (checkpoint_saved: step, durable, digests) against their checkpoint_restored."""
from __future__ import annotations

from diloco_chaos.harness.judging.restores import restores_faithful
from log_builder import LogBuilder

# two saves of syncer-0 (one fragment): what each held, by hand
SAVE = {1: {"theta": {"0": "t1"}, "outer": {"0": "o1"}}, 2: {"theta": {"0": "t2"}, "outer": {"0": "o2"}}}
VERSIONS = {1: {"0": 1}, 2: {"0": 2}}


def _shard_log(restored: int, digests: dict | None, versions: dict | None = None, landed=(1, 2), started=(1, 2)):
    """syncer-0 starts saves 1 and 2 (its lines record those in `started`), logs the landings
    in `landed`, is killed at 3 s and restores save `restored` with `digests` loaded."""
    b = LogBuilder().up(0.0, "syncer-0")
    for n in (1, 2):
        if n in started:
            b.add(n, "syncer-0", "checkpoint_started", number=n, versions=VERSIONS[n], digests=SAVE[n])
        if n in landed:
            b.add(n + 0.5, "syncer-0", "checkpoint_saved", number=n, versions=VERSIONS[n])
    b.down(3.0, "syncer-0").respawn(3.5, "syncer-0")
    extra = {} if digests is None else {"digests": digests}
    b.add(4.0, "syncer-0", "checkpoint_restored", step=restored, versions=versions or VERSIONS[restored], **extra)
    return b.up(4.0, "syncer-0", inc=1).log()


def test_a_restore_of_the_newest_landed_save_as_written_passes():
    r = restores_faithful(_shard_log(2, SAVE[2]))
    assert (r.valid, r.value, r.details["restores"], r.details["checked"]) == (True, 0, 1, 1)


def test_a_save_that_landed_unlogged_may_be_restored():
    """Save 2 landed while the shard was being killed (no checkpoint_saved line): its
    checkpoint_started digests still judge the restore."""
    assert restores_faithful(_shard_log(2, SAVE[2], landed=(1,))).valid is True


def test_a_restore_that_loads_a_stale_outer_state_fails():
    """Names save 2, Θ and versions of save 2, the momentum of save 1 (restore_stale_outer)."""
    r = restores_faithful(_shard_log(2, {"theta": {"0": "t2"}, "outer": {"0": "o1"}}))
    assert (r.valid, r.value) == (False, 1)
    v = r.details["violations"][0]
    assert (v["unit"], v["restored"], v["differs"]) == ("syncer-0", 2, ["outer[0]"])


def test_a_restore_that_loads_another_save_than_it_names_fails():
    """Names save 2, loads save 1 whole (restore_oldest): digests and versions differ."""
    r = restores_faithful(_shard_log(2, SAVE[1], versions=VERSIONS[1]))
    assert r.valid is False and r.details["violations"][0]["differs"] == ["outer[0]", "theta[0]", "versions"]


def test_a_restore_of_an_older_save_than_had_landed_fails():
    """Loads save 1 faithfully, but save 2 had landed."""
    r = restores_faithful(_shard_log(1, SAVE[1]))
    assert r.valid is False and r.details["violations"][0]["newest_landed"] == 2


def test_a_restore_of_a_save_never_recorded_fails():
    r = restores_faithful(_shard_log(2, SAVE[2], landed=(1,), started=(1,)))
    assert r.valid is False and "no earlier line" in r.details["violations"][0]["why"]


def test_no_restore_passes_with_zero():
    r = restores_faithful(LogBuilder().up(0.0, "syncer-0").up(0.0, "learner-0").log())
    assert (r.valid, r.value) == (True, 0) and "no unit restored" in r.details["why"]


def test_a_log_from_before_digests_is_unknown():
    r = restores_faithful(_shard_log(2, None))
    assert r.valid is None and r.details["unverified"] == 1


def _learner_log(restored_step: int, params: str, opt: str):
    """learner-0 saves at steps 10 (durable 0), 20 (durable 10) and 30 (durable 20: 20
    had landed); killed; restores step `restored_step` with these digests loaded."""
    b = LogBuilder(learners=1).up(0.0, "learner-0")
    for i, step in enumerate((10, 20, 30)):
        b.add(1.0 + i, "learner-0", "checkpoint_saved", step=step, durable=10 * i,
              digests={"params": f"p{step}", "opt": f"s{step}"})
    b.down(4.0, "learner-0").respawn(4.5, "learner-0")
    b.add(5.0, "learner-0", "checkpoint_restored", step=restored_step, digests={"params": params, "opt": opt})
    return b.up(5.0, "learner-0", inc=1, step=restored_step).log()


def test_a_learner_restore_is_judged_the_same_way():
    assert restores_faithful(_learner_log(30, "p30", "s30")).valid is True  # 30 landed unlogged
    assert restores_faithful(_learner_log(20, "p20", "s20")).valid is True  # the newest logged landing
    wrong = restores_faithful(_learner_log(30, "p30", "s20"))               # the inner state of another save
    assert wrong.valid is False and wrong.details["violations"][0]["differs"] == ["opt"]
    older = restores_faithful(_learner_log(10, "p10", "s10"))               # 20 had landed
    assert older.valid is False and older.details["violations"][0]["newest_landed"] == 20
