"""Fault model and schedules (faults/): round trips, validation, overlaps, timeline,
and the failure process's determinism, rate and Llama 3 mix."""
from __future__ import annotations

import json
import math

import pytest
from hypothesis import given
from hypothesis import strategies as st

from diloco_chaos.faults.failures import CAUSES, LLAMA3_COUNTS, FailureProcess
from diloco_chaos.faults.fields import FieldError
from diloco_chaos.faults.overlaps import conflict, links_intersect
from diloco_chaos.faults.kinds import Corrupt, FAULT_KINDS, KillSlice, KillSyncer, KillUnit, Partition, PauseUnit, Reset, SlowUnit, Truncate, Wan, fault_from_dict
from diloco_chaos.faults.schedule import RunShape, Schedule, ScheduleError, expand_links, validate

ONE_OF_EACH = [
    KillUnit("learner-1", 20.0, down_for_s=15.0),
    KillUnit("learner-0", 5.0, down_for_s=None),
    KillSlice("learner-2", 10.0, duration_s=5.0, slices=1),
    PauseUnit("learner-3", 1.5, duration_s=2.0),
    SlowUnit("learner-1", 0.0, duration_s=60.0, speed=0.5, period_ms=100.0),
    KillSyncer("syncer-0", 25.0, down_for_s=10.0),
    Wan("link:*", 20.0, duration_s=None, bandwidth_kbps=500.0, latency_ms=40.0, jitter_ms=10.0),
    Partition("link:learner-2~syncer-0", 30.0, duration_s=10.0, direction="upstream"),
    Reset("link:learner-2", 3.0, duration_s=1.0),
    Truncate("link:learner-1", 4.0, duration_s=2.0, bytes=4096),
    Corrupt("learner-2", 12.0, duration_s=10.0, mode="bitflip", flips=4),
]
_TARGET_OF_ROLE = {"learner": "learner-1", "syncer": "syncer-0", "link": "link:learner-1"}
# a kind added since (docs/ARCHITECTURE.md "Adding a fault kind"): its defaults make its example
ONE_OF_EACH += [cls(_TARGET_OF_ROLE[cls.roles[0]], 1.0, **{cls.length_field: 2.0})
                for kind, cls in FAULT_KINDS.items() if kind not in {f.kind for f in ONE_OF_EACH}]
UNITS = [f"learner-{i}" for i in range(4)]


def test_every_kind_has_an_example():
    assert {f.kind for f in ONE_OF_EACH} == set(FAULT_KINDS) and len(ONE_OF_EACH) == len(FAULT_KINDS) + 1


@pytest.mark.parametrize("fault", ONE_OF_EACH, ids=lambda f: f.kind)
def test_dict_round_trip_through_json(fault):
    d = json.loads(json.dumps(fault.to_dict()))
    assert d["kind"] == fault.kind and fault_from_dict(d) == fault


def test_end_times_by_hand():
    assert KillUnit("learner-1", 20, down_for_s=15).end_s == 35.0
    assert KillUnit("learner-1", 20, down_for_s=None).end_s is None
    assert Wan("link:*", 20, latency_ms=5).end_s is None
    assert PauseUnit("learner-0", 1.5, duration_s=2).end_s == 3.5
    assert KillUnit("learner-1", 20, 15).at_s == 20.0 and isinstance(KillUnit("learner-1", 20, 15).at_s, float)


@pytest.mark.parametrize("make, field, fragment", [
    (lambda: KillUnit("learner-x", 1, 2), "target", "learner-N"),
    (lambda: KillUnit("syncer-0", 1, 2), "target", "kill_unit cannot target 'syncer-0'"),
    (lambda: KillSyncer("learner-0", 1, 2), "target", "syncer-N"),
    (lambda: Partition("learner-0", 1, 2), "target", "link:*"),
    (lambda: Partition("link:learner-01", 1, 2), "target", "link:learner-N"),
    (lambda: KillUnit("learner-0", -1, 2), "at_s", ">= 0 seconds"),
    (lambda: KillUnit("learner-0", math.nan, 2), "at_s", "out of range"),
    (lambda: KillUnit("learner-0", 1, 0), "down_for_s", "> 0 seconds"),
    (lambda: KillSyncer("syncer-0", 1, None), "down_for_s", "expected a number"),
    (lambda: PauseUnit("learner-0", 1, duration_s=-2), "duration_s", "> 0"),
    (lambda: KillSlice("learner-0", 1, 2, slices=0), "slices", ">= 1"),
    (lambda: KillSlice("learner-0", 1, 2, slices=1.0), "slices", "whole number"),
    (lambda: SlowUnit("learner-0", 1, 2, speed=1.0), "speed", "(0, 1)"),
    (lambda: SlowUnit("learner-0", 1, 2, speed=0.5, period_ms=1), "period_ms", "[10, 10000]"),
    (lambda: Wan("link:*", 1, bandwidth_kbps=4), "bandwidth_kbps", ">= 8"),
    (lambda: Wan("link:*", 1, latency_ms=10, jitter_ms=20), "jitter_ms", "latency_ms = 10.0"),
    (lambda: Wan("link:*", 1), "bandwidth_kbps", "changes nothing"),
    (lambda: Partition("link:*", 1, 2, direction="sideways"), "direction", "both, upstream, downstream"),
    (lambda: Truncate("link:*", 1, 2, bytes=0), "bytes", ">= 1"),
    (lambda: KillUnit("learner-0", True, 2), "at_s", "expected a number"),
])
def test_validation_names_the_field_and_the_valid_range(make, field, fragment):
    with pytest.raises(FieldError) as e:
        make()
    assert e.value.field == field and fragment in str(e.value)


def test_fault_from_dict_rejects_unknown_kinds_and_fields():
    with pytest.raises(ValueError, match="did you mean 'kill_unit'"):
        fault_from_dict({"kind": "kill_units", "target": "learner-0", "at_s": 1})
    with pytest.raises(ValueError, match="did you mean 'down_for_s'"):
        fault_from_dict({"kind": "kill_unit", "target": "learner-0", "at_s": 1, "down_for": 3})


# ------------------------------------------------------------------ overlaps
def test_conflict_table():
    kill = KillUnit("learner-1", 10, 10)  # [10, 20)
    assert "already down" in conflict(KillUnit("learner-1", 15, 1), kill)
    assert conflict(KillUnit("learner-1", 20, 1), kill) is None  # starts as the other ends
    assert conflict(KillUnit("learner-2", 15, 1), kill) is None  # another unit
    assert "paused while it is down" in conflict(PauseUnit("learner-1", 12, 1), kill)
    assert "SIGSTOP/SIGCONT" in conflict(PauseUnit("learner-1", 12, 1), SlowUnit("learner-1", 0, 60, speed=0.5))
    assert conflict(KillSlice("learner-1", 0, 60), PauseUnit("learner-1", 12, 1)) is None
    assert conflict(Partition("link:learner-1", 12, 5), kill) is None  # links and processes are apart
    assert "one link" in conflict(Partition("link:*", 0, 30), Partition("link:learner-1~syncer-0", 12, 5))
    assert conflict(Partition("link:*", 0, 30), Reset("link:learner-1", 12, 5)) is None
    assert "already down" in conflict(KillSyncer("syncer-0", 1, 10), KillSyncer("syncer-0", 5, 10))
    assert conflict(KillSyncer("syncer-0", 1, 10), KillSyncer("syncer-1", 5, 10)) is None
    assert "already down" in conflict(KillUnit("learner-1", 100, 1), KillUnit("learner-1", 1, None))


@pytest.mark.parametrize("a, b, shared", [
    ("link:*", "link:learner-3~syncer-1", True),
    ("link:learner-1", "link:learner-1~syncer-0", True),
    ("link:learner-1~syncer-0", "link:learner-1~syncer-1", False),
    ("link:learner-1", "link:learner-2", False),
    ("link:learner-1~syncer-0", "link:learner-1~syncer-0", True),
])
def test_links_intersect(a, b, shared):
    assert links_intersect(a, b) == links_intersect(b, a) == shared


def test_expand_links():
    shape = RunShape(learners=2, run_s=60, shards=2)
    assert expand_links("link:*", shape) == ["learner-0~syncer-0", "learner-0~syncer-1",
                                             "learner-1~syncer-0", "learner-1~syncer-1"]
    assert expand_links("link:learner-1", shape) == ["learner-1~syncer-0", "learner-1~syncer-1"]
    assert expand_links("link:learner-1~syncer-0", shape) == ["learner-1~syncer-0"]


def test_a_link_target_is_parsed_once_and_read_the_same_everywhere():
    from diloco_chaos.faults.overlaps import LinkTarget
    every, one, pair = (LinkTarget.parse(t) for t in ("link:*", "link:learner-1", "link:learner-1~syncer-0"))
    assert (every.every, one, pair) == (True, LinkTarget("learner-1"), LinkTarget("learner-1", "syncer-0"))
    assert [every.reaches("learner-3"), one.reaches("learner-1"), one.reaches("learner-2")] == [True, True, False]
    units, shards = ["learner-0", "learner-1"], ["syncer-0"]
    assert [every.exists(units, shards), pair.exists(units, shards)] == [True, True]
    assert not LinkTarget.parse("link:learner-1~syncer-1").exists(units, shards)
    assert not LinkTarget.parse("link:learner-2").exists(units, shards)


SHAPE = RunShape(learners=4, run_s=60, slices=2, shards=1)


@pytest.mark.parametrize("faults, index, field, fragment", [
    ([KillUnit("learner-4", 1, 2)], 0, "target", "valid: learner-0..learner-3"),
    ([KillSyncer("syncer-1", 1, 2)], 0, "target", "valid: syncer-0"),
    ([Reset("link:learner-1~syncer-1", 1, 2)], 0, "target", "M in 0..0"),
    ([KillUnit("learner-1", 60, 2)], 0, "at_s", "at or past the end of the run (60s)"),
    ([KillSlice("learner-1", 1, 2, slices=2)], 0, "slices", "valid: 1..1"),
    ([KillUnit("learner-1", 30, 5), KillUnit("learner-1", 10, 30)], 0, "at_s", "when fault 1 ends"),
    ([KillSlice("learner-1", 10, 20), KillSlice("learner-1", 15, 1)], 1, "at_s", "lose 2 of its 2 slices"),
    ([Wan("link:*", 0, latency_ms=5), Wan("link:learner-0", 10, 5, latency_ms=100)], 1, "at_s", "toxic"),
])
def test_validate_reports_the_later_fault(faults, index, field, fragment):
    with pytest.raises(ScheduleError) as e:
        validate(faults, SHAPE)
    assert (e.value.index, e.value.field) == (index, field) and fragment in str(e.value)


def test_kill_slice_needs_two_slices_and_allows_disjoint_losses():
    with pytest.raises(ScheduleError, match="has 1 slice"):
        validate([KillSlice("learner-0", 1, 2)], RunShape(learners=4, run_s=60))
    four = RunShape(learners=1, run_s=60, slices=4)
    # [0,10) and [20,30) never overlap each other, so [5,25) never sees 3 slices down.
    validate([KillSlice("learner-0", 0, 10), KillSlice("learner-0", 20, 10), KillSlice("learner-0", 5, 20, slices=2)],
             four)


def test_timeline_sorted_ends_before_starts():
    s = Schedule((PauseUnit("learner-1", 25, 5), KillUnit("learner-1", 10, 15),
                  Wan("link:*", 0, None, bandwidth_kbps=2000))).validate(SHAPE)
    assert [f.kind for f in s] == ["wan", "kill_unit", "pause_unit"]
    assert [(t, what, f.kind) for t, what, f in s.timeline()] == [
        (0.0, "start", "wan"), (10.0, "start", "kill_unit"), (25.0, "end", "kill_unit"),
        (25.0, "start", "pause_unit"), (30.0, "end", "pause_unit")]
    assert Schedule.from_dicts(json.loads(json.dumps(s.to_dicts()))) == s


# ------------------------------------------------------------------ failure process
def test_same_seed_same_faults_and_longer_runs_extend_shorter_ones():
    fp = FailureProcess(mtbi_s=300, chips_per_unit=8, repair_s=10, seed=12)
    assert fp.draw(UNITS, 80) == fp.draw(UNITS, 80)
    assert fp.draw(UNITS, 80) != FailureProcess(300, 8, 10, seed=13).draw(UNITS, 80)
    short, long_ = fp.interruptions(UNITS, 40), fp.interruptions(UNITS, 400)
    assert long_[:len(short)] == short and len(long_) > len(short)


def test_rate_matches_mtbi_per_chip():
    # 4 units x 8 chips, one interruption per chip every 100 s, over 1e5 s:
    # expected 32,000, Poisson sd 179; 3% is more than 5 sd.
    fp = FailureProcess(mtbi_s=100, chips_per_unit=8, repair_s=1, seed=0)
    got = fp.interruptions(UNITS, 100_000)
    assert len(got) == pytest.approx(100_000 * 4 * 8 / 100, rel=0.03)
    per_unit = [sum(i.unit == u for i in got) for u in UNITS]
    assert max(per_unit) - min(per_unit) < 0.06 * len(got) / 4  # units are hit uniformly
    times = [i.t_s for i in got]
    assert times == sorted(times) and 0 <= times[0] and times[-1] < 100_000


def test_llama3_mix_proportions():
    assert sum(LLAMA3_COUNTS.values()) == 409  # 419 less the causes with 2 each
    fp = FailureProcess(mtbi_s=1, chips_per_unit=8, repair_s=1, seed=1)  # ~40,000 draws
    got = fp.interruptions(UNITS, 1250)
    n = len(got)
    for cause, count in LLAMA3_COUNTS.items():
        p = count / 409
        seen = sum(i.cause == cause for i in got)
        assert abs(seen - n * p) < 5 * math.sqrt(n * p * (1 - p)) + 1, cause
    assert {CAUSES[c].kind for c in LLAMA3_COUNTS} == {"kill_slice", "kill_unit", "partition", "slow_unit", "corrupt"}


def test_causes_map_to_faults():
    one = dict(units=["learner-0"], run_s=1000)
    fp = lambda mix, **kw: FailureProcess(mtbi_s=50, chips_per_unit=1, repair_s=8, mix=mix, **kw)  # noqa: E731
    assert {type(f) for f in fp({"faulty_gpu": 1}).draw(**one)} == {KillUnit}  # S = 1: the whole unit
    assert {type(f) for f in fp({"faulty_gpu": 1}).draw(**one, slices=2)} == {KillSlice}
    maint = fp({"host_maintenance": 1}).draw(**one)
    assert maint and all(f.down_for_s == 24.0 for f in maint)  # 3 x repair
    assert all(f.down_for_s == 2.0 for f in fp({"software_bug": 1}).draw(**one))  # repair / 4
    assert all(f.speed == 0.5 and f.duration_s == 8 for f in fp({"thermal": 1}).draw(**one))
    assert all(f.target == "link:learner-0" for f in fp({"nic": 1, "network": 1}).draw(**one))
    assert {f.kind for f in fp({"pause_unit": 1, "reset": 1}).draw(**one)} == {"pause_unit", "reset"}
    sdc = fp({"silent_data_corruption": 1}).draw(**one)  # wrong contributions, not a dead unit
    assert sdc and all(f.kind == "corrupt" and f.mode == "scale" and f.duration_s == 8 for f in sdc)


def test_a_fleet_failure_is_priced_by_policy_on_the_same_draw():
    """The fleet model's chip failure: a DiLoCo learner pauses for `repair` (detect + reshard),
    data-parallel restarts (a kill the injector extends to every member) for `restart`; the
    interruptions are one draw for both."""
    fp = FailureProcess(mtbi_s=40, chips_per_unit=1, repair_s=3, restart_s=12, mix="fleet", seed=5)
    ddl, dp = fp.draw(UNITS, 200), fp.draw(UNITS, 200, dp=True)
    assert ddl and {f.kind for f in ddl} == {"pause_unit"} and all(f.duration_s == 3 for f in ddl)
    assert dp and {f.kind for f in dp} == {"kill_unit"} and all(f.down_for_s == 12 for f in dp)
    times = {(i.t_s, i.unit) for i in fp.interruptions(UNITS, 200)}
    assert {(f.at_s, f.target) for f in ddl + dp} <= times  # both from the one draw (overlaps dropped per policy)
    with pytest.raises(FieldError) as e:  # the dp price has no default
        FailureProcess(mtbi_s=40, chips_per_unit=1, repair_s=3, mix={"chip_failure": 1, "kill_unit": 1})
    assert e.value.field == "restart_s"
    assert FailureProcess(**json.loads(json.dumps(fp.to_dict()))) == fp


@given(seed=st.integers(0, 2**32), slices=st.integers(1, 3), repair_s=st.floats(0.5, 40))
def test_drawn_faults_always_validate(seed, slices, repair_s):
    fp = FailureProcess(mtbi_s=60, chips_per_unit=8, repair_s=repair_s, seed=seed, start_s=2)
    explicit = [KillUnit("learner-1", 10, 20), Wan("link:*", 0, None, latency_ms=30)]
    drawn = fp.draw(UNITS, 90, slices=slices, avoid=explicit)
    validate(explicit + drawn, RunShape(learners=4, run_s=90, slices=slices))
    assert all(f.at_s >= 2 for f in drawn)
    assert not any(f.target == "learner-1" and 10 <= f.at_s < 30 for f in drawn)


@pytest.mark.parametrize("kw, field, fragment", [
    (dict(mix="llama2"), "mix", "did you mean 'llama3'"),
    (dict(mix={"gpu": 1}), "mix", "unknown cause or kind 'gpu'"),
    (dict(mix={"kill_unit": -1}), "mix", "a number >= 0"),
    (dict(mix={"kill_unit": 0}), "mix", "sum to 0"),
    (dict(mtbi_s=0), "mtbi_s", "> 0 seconds"),
    (dict(chips_per_unit=0), "chips_per_unit", ">= 1"),
])
def test_failure_process_validation(kw, field, fragment):
    with pytest.raises(FieldError) as e:
        FailureProcess(**{"mtbi_s": 60, "chips_per_unit": 8, "repair_s": 5, **kw})
    assert e.value.field == field and fragment in str(e.value)


def test_failure_process_dict_round_trip():
    fp = FailureProcess(mtbi_s=60, chips_per_unit=8, repair_s=5, mix={"kill_unit": 3, "partition": 1}, seed=4)
    assert fp.weights() == {"kill_unit": 0.75, "partition": 0.25}
    assert FailureProcess(**json.loads(json.dumps(fp.to_dict()))) == fp


def test_fault_end_is_logged_before_the_undo_acts():
    """A resumed unit steps at once: its first line must not precede the fault's end (a real
    run logged a step 2 ms before a `fault_end` written after SIGCONT returned)."""
    from diloco_chaos.faults.kinds import PauseUnit
    from diloco_chaos.harness.run.injector import Injector

    log: list[str] = []

    class Cluster:  # what the injector calls for pause_unit; resuming makes the unit step
        def mechanism(self, kind):
            return kind

        def pause(self, unit):
            return None

        def resume(self, unit):
            log.append(f"step {unit}")

    inj = Injector(Cluster(), RunShape(learners=2, run_s=10), lambda kind, src, **f: log.append(kind))
    fault = PauseUnit(target="learner-1", at_s=1.0, duration_s=2.0)
    inj.start(fault)
    inj.end(fault)
    assert log == ["fault_start", "unit_down", "fault_end", "step learner-1", "unit_up"]
