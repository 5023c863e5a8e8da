"""The run's pace (harness/judging/pace.py) and the checks it scales, by hand: a bound in
seconds of CPU-bound work off the protocol is held × the pace the run measured, so a slow
or busy runner does not FAIL a healthy run, and the raw figure is reported beside it."""
from __future__ import annotations

import pytest

from diloco_chaos.harness.judging import checks, metrics
from diloco_chaos.harness.judging.pace import REFERENCE_LAUNCH_S, REFERENCE_START_S, pace

from log_builder import LogBuilder, rounds


def _run(start_s: float, gap: float = 0.0, tier: str = "cluster", backend: str = "local", own: bool = True):
    """Two units up `start_s` after the launch, one learner stepping every 0.1 s (steps of
    0.05 s: the rest is `other` badput) and committing every 0.1 s for 2 s, then one gap
    of `gap` s to the end."""
    end = 2.0 + gap
    b = LogBuilder(learners=1, t_end=end, t_launch=-start_s, tier=tier)
    b.header["topology"]["backend"] = {"name": backend}
    b.up(0, "syncer-0").up(0, "learner-0")
    for e in b.events:  # each unit's own process start, as trainer/units/shell.py process_started reads it
        if own:
            e["started"] = -start_s
    for k in range(int(end * 10) + 1):
        b.step(0.1 * k, "learner-0", k, dt=0.05)
    rounds(b, [0.1 * k for k in range(1, 21)] + [end])
    return b.log()


def test_pace_is_the_cold_start_against_the_reference_machines():
    ref = REFERENCE_START_S
    assert pace(_run(2 * ref))["pace"] == pytest.approx(2.0)            # twice as long to start
    assert pace(_run(2 * ref))["start_s"] == pytest.approx(2 * ref)
    assert pace(_run(0.5 * ref))["pace"] == 1.0                        # faster: the bounds stay
    assert pace(_run(3 * ref, tier="sim"))["pace"] == 1.0              # virtual time
    # on any backend: what started the process is not in it
    assert pace(_run(3 * ref, backend="docker"))["pace"] == pytest.approx(3.0)
    # a log from before `started`: from the harness's launch, against that backend's reference
    docker = REFERENCE_LAUNCH_S["docker"]
    assert pace(_run(3 * docker, backend="docker", own=False))["pace"] == pytest.approx(3.0)


def test_units_starting_together_on_fewer_cores_are_not_a_slow_machine():
    # two units on one core start in twice one unit's time on any machine: that is the run's
    # shape, not the machine's pace (a 2-core machine: no correction; a first warm spare
    # starting with them counts as a third)
    ref = REFERENCE_START_S
    log = _run(2 * ref)
    log.header["cpus"] = 1
    assert pace(log)["pace"] == 1.0 and pace(log)["start_raw_s"] == pytest.approx(2 * ref)
    log.header["cpus"] = 2
    assert pace(log)["pace"] == pytest.approx(2.0)
    log.header["topology"]["backend"]["spares"] = ["learner"]
    assert pace(log)["pace"] == pytest.approx(2.0 / 1.5) and pace(log)["start_s"] == pytest.approx(2 * ref / 1.5)


def test_the_downtime_floor_scales_with_the_pace():
    # a 3 s gap: over the 2 s floor at the reference pace (a stall), under it at pace 2 (a
    # busy runner whose units took twice as long to start), and over it again at 4.5 s
    ref = REFERENCE_START_S
    at_ref, slow = checks.no_global_downtime(_run(ref, 3.0)), checks.no_global_downtime(_run(2 * ref, 3.0))
    assert (at_ref.valid, at_ref.bound) == (False, pytest.approx(2.0))
    assert (slow.valid, slow.bound) == (True, pytest.approx(4.0))
    assert slow.details["pace"] == pytest.approx(2.0) and slow.details["bound_at_reference_pace_s"] == pytest.approx(2.0)
    # (reachable from settle_s = the bound after the first step: 4 s of the 7 s gap, 5 s)
    assert checks.no_global_downtime(_run(2 * ref, 7.0)).valid is False
    # the simulator's floor is not scaled
    assert checks.no_global_downtime(_run(2 * ref, 1.5, tier="sim")).valid is False


def test_goodput_and_recovery_bounds_scale_with_the_pace():
    ref = REFERENCE_START_S
    m = metrics.compute(_run(2 * ref))
    assert m.pace == pytest.approx(2.0)
    # the CPU-bound badput off the protocol, at the reference pace: half of it is given back
    cpu = sum(m.badput_s[k] for k in metrics.PACED_BADPUT)
    assert cpu > 0
    assert m.goodput_paced == pytest.approx((m.productive_s + cpu / 2) / m.allocated_s)
    g = checks.expect_checks({"goodput_min": m.goodput_paced - 1e-9}, m)[0]
    assert g.valid is True and g.value == m.goodput_paced and g.details == {"goodput_raw": m.goodput, "pace": m.pace}
    assert checks.expect_checks({"goodput_min": m.goodput_paced + 1e-6}, m)[0].valid is False
    # at pace 1 goodput_min judges the goodput itself
    m1 = metrics.compute(_run(ref))
    assert m1.goodput_paced == pytest.approx(m1.goodput)
    r = checks.expect_checks({"recovery_max_s": 5.0}, m)[0]
    assert r.bound == pytest.approx(10.0) and r.details["bound_raw_s"] == 5.0
