"""harness/judging/checks.py: the expectation checks (goodput, recovery, rejoin) on
metrics from hand-made logs, compose, and the note on a run that ended before its faults."""
from __future__ import annotations

import pytest
from log_builder import LogBuilder

from diloco_chaos.harness.judging import checks
from diloco_chaos.harness.judging.check_base import Result, compose
from diloco_chaos.harness.judging.checks import expect_checks
from diloco_chaos.harness.judging.metrics import compute


# --- expectations and compose --------------------------------------------------------------------


def _recovering_run(merge_at: float | None, t_end: float = 20.0):
    """1 learner killed at 5, respawned at 8; its new incarnation's first merge at merge_at."""
    b = LogBuilder(learners=1, t_end=t_end).up(0, "learner-0")
    b.train("learner-0", 4, merged={1, 2})
    b.down(5, "learner-0").respawn(8, "learner-0").up(9, "learner-0", inc=1, step=4)
    if merge_at is not None:
        b.send(merge_at, "learner-0", 1, 1, inc=1).merge(merge_at, "learner-0", 1, 1, inc=1)
    return compute(b.log())


def test_expect_checks():
    m = _recovering_run(14.0)                     # goodput (4 + 0) / 20 = 0.2, recovery 6 s
    rs = {r.name: r for r in expect_checks({"goodput_min": 0.1, "uptime_min": None, "loss_parity_max": 0.05,
                                            "recovery_max_s": 10.0}, m)}
    assert set(rs) == {"goodput_min", "loss_parity_max", "recovery_max_s"}  # None: not checked
    assert (rs["goodput_min"].valid, rs["goodput_min"].value) == (True, pytest.approx(0.2))
    assert rs["loss_parity_max"].valid is None      # no reference run: unknown
    assert (rs["recovery_max_s"].valid, rs["recovery_max_s"].value) == (True, pytest.approx(6.0))
    assert expect_checks({"goodput_min": 0.3, "recovery_max_s": 5.0}, m)[0].valid is False
    assert expect_checks({"recovery_max_s": 5.0}, m)[0].valid is False
    with pytest.raises(ValueError, match="goodput_mni"):
        expect_checks({"goodput_mni": 0.5}, m)


def test_recovery_expectation_never_and_censored():
    # never merged again, 12 s of run left after the restart at 8 (≥ the 10 s bound): fails
    never = expect_checks({"recovery_max_s": 10.0}, _recovering_run(None, t_end=20.0))[0]
    assert never.valid is False and len(never.details["never"]) == 1
    # the run ended 4 s after the restart: it might still have recovered in time: unknown
    censored = expect_checks({"recovery_max_s": 10.0}, _recovering_run(None, t_end=12.0))[0]
    assert censored.valid is None and len(censored.details["censored"]) == 1
    no_restart = compute(LogBuilder(learners=1).log())
    assert expect_checks({"recovery_max_s": 10.0}, no_restart)[0].valid is None


def _rejoining_run(merged: set, steps: int, H: int = 4):
    """1 learner killed at 5, respawned at 8 (restores step 4); its new incarnation steps
    `steps` times from t = 10, a Contribution every 2 steps (seq k after step 2k), the
    seqs in `merged` merged; H = `H`."""
    b = LogBuilder(learners=1, t_end=10.0 + steps + 1).up(0, "learner-0")
    b.header["config"]["diloco"]["sync_every"] = H
    b.train("learner-0", 4, merged={1, 2})
    b.down(5, "learner-0").respawn(8, "learner-0").up(9, "learner-0", inc=1, step=4)
    b.train("learner-0", steps, inc=1, start=4, t0=10.0, merged=merged)
    return compute(b.log())


def test_rejoin_expectation():
    # first merged seq 1 went out with the incarnation's 2nd step: 2 / H(4) = 0.5 cycles
    r = expect_checks({"rejoin_cycles_max": 1.0}, _rejoining_run({1, 2}, 6))[0]
    assert (r.name, r.valid, r.value, r.bound) == ("rejoin_cycles_max", True, pytest.approx(0.5), 1.0)
    # seq 1 was lost, seq 3 (its 6th step) merged: 1.5 cycles, over a bound of 1, under 2
    late = _rejoining_run({3}, 8)
    assert expect_checks({"rejoin_cycles_max": 1.0}, late)[0].valid is False
    assert expect_checks({"rejoin_cycles_max": 1.0}, late)[0].details["late"][0]["rejoin_steps"] == 6
    assert expect_checks({"rejoin_cycles_max": 2.0}, late)[0].valid is True
    # never merged: 9 steps run > (1 + 1) × 4 fails; 8 steps might still land: unknown
    assert expect_checks({"rejoin_cycles_max": 1.0}, _rejoining_run(set(), 9))[0].valid is False
    assert expect_checks({"rejoin_cycles_max": 1.0}, _rejoining_run(set(), 8))[0].valid is None
    no_restart = compute(LogBuilder(learners=1).log())
    assert expect_checks({"rejoin_cycles_max": 1.0}, no_restart)[0].valid is None


def test_compose():
    t, f, u = Result("a", True), Result("b", False), Result("c", None)
    assert compose([t, t]).valid is True
    assert compose([t, u]).valid is None
    assert compose([u, f, t]).valid is False
    c = compose([t, f, u])
    assert (c.value, c.details["failed"], c.details["unknown"]) == (1, ["b"], ["c"])
    assert compose([]).valid is True
    assert c.to_dict()["details"]["checks"] == [["a", True], ["b", False], ["c", None]]


def test_a_run_that_ended_before_its_faults_says_so():
    from diloco_chaos.harness.judging.judge import faults_seen

    sched = [{"kind": "kill_unit", "target": "learner-1", "at_s": t, "down_for_s": 5.0} for t in (2.0, 30.0, 50.0)]
    b = LogBuilder(t_start=100.0, t_end=123.0, schedule=sched)
    b.add(102.0, "harness", "fault_start", id=0, fault=sched[0], via="SIGKILL")
    b.add(102.0, "learner-1", "fault_start", id=9, fault=sched[0])  # not the harness's: not counted
    seen = faults_seen(b.log())
    assert seen == {"faults_scheduled": 3, "faults_applied": 1, "run_s": 23.0, "stop_kills": None}
    note = checks.faults_note(seen)
    assert note.startswith("only 1 of the 3 scheduled faults happened: the run ended after 23 s")
    assert checks.faults_note({**seen, "faults_applied": 3}) is None
    assert checks.faults_note({}) is None  # a summary from before these keys


def test_units_sigkilled_after_their_stop_grace_are_noted():
    from diloco_chaos.harness.judging.judge import faults_seen

    kills = [{"unit": "learner-1", "incarnation": 2, "grace_s": 8.0}]
    seen = faults_seen(LogBuilder(t_start=0.0, t_end=10.0, stop_kills=kills).log())
    assert checks.stop_note(seen) == (
        "learner-1 (incarnation 2) did not leave within 8 s of the run's SIGTERM and was SIGKILLed: what a unit "
        "does on a stop (a learner's closing contribution, its final save) is missing from the run's end (a unit "
        "still starting cannot act on the signal)")
    two = checks.stop_note({"stop_kills": kills + [{"unit": "syncer-0", "incarnation": 0, "grace_s": 5.0}]})
    assert two.startswith("learner-1 (incarnation 2), syncer-0 (incarnation 0) did not leave within 8 s") and \
        "were SIGKILLed" in two
    assert checks.stop_note({"stop_kills": []}) is None and checks.stop_note({}) is None
