"""harness/judging/metrics.py's time accounting (goodput and each badput class, step lag,
recovery) on small hand-made event logs; every expected number is worked out by hand in the
comments; the logs come from `LogBuilder` (log_builder.py)."""
from __future__ import annotations

from diloco_chaos.harness.judging.metrics import BADPUT, compute
from log_builder import LogBuilder
from metrics_helpers import approx, total


def test_goodput_one_learner_dies():
    # 10 s run, 2 learners, P = 1, steps of 1 s (step k spans [k-1, k]).
    # learner-0: steps 1..10, every contribution merged -> 10 s productive.
    # learner-1: steps 1..4; seq 1 (steps 1-2) merged, seq 2 (steps 3-4) never; SIGKILLed
    # at 4.5, never back -> productive 2, lost 2, other 0.5 ([4, 4.5]), dead 5.5 ([4.5, 10]).
    b = LogBuilder(learners=2).up(0, "syncer-0").up(0, "learner-0").up(0, "learner-1")
    b.train("learner-0", 10, merged={1, 2, 3, 4, 5})
    b.train("learner-1", 4, merged={1})
    b.down(4.5, "learner-1")
    m = compute(b.log())
    assert m.allocated_s == approx(20.0)
    assert m.productive_s == approx(12.0)
    assert m.goodput == approx(0.6)                    # 12 / 20
    assert m.badput_s["lost"] == approx(2.0)
    assert m.badput_s["dead"] == approx(5.5)
    assert m.badput_s["other"] == approx(0.5)
    assert m.badput["dead"] == approx(0.275)           # 5.5 / 20
    assert m.badput_s["startup"] == approx(0.0)        # both stepped from t = 0
    assert total(m) == approx(1.0)
    assert m.learner_goodput == {"learner-0": approx(1.0), "learner-1": approx(0.2)}
    assert m.restarts == 0 and m.recovery == ()
    assert m.steps == 14 and m.merges == 6 and m.commits == 6 and m.step_lag == 0


def test_fragment_share():
    # P = 2, 1 learner, 4 s. Fragment 0 (seq 1, steps 1-2) is merged, fragment 1 (seq 2,
    # steps 1-4) is not: steps 1, 2 are half productive -> 2 × 1 s × 1/2 = 1 s; lost 3 s.
    b = LogBuilder(learners=1, fragments=2, t_end=4.0).up(0, "learner-0")
    for k in range(1, 5):
        if k == 2:
            b.send(k, "learner-0", 1, 2, fragment=0).merge(k, "learner-0", 1, 2, fragment=0)
        if k == 4:
            b.send(k, "learner-0", 2, 4, fragment=1)
        b.step(k, "learner-0", k)
    m = compute(b.log())
    assert m.fragments == 2
    assert m.productive_s == approx(1.0) and m.goodput == approx(0.25)
    assert m.badput_s["lost"] == approx(3.0)
    assert total(m) == approx(1.0)


def test_superseded_contribution_counted_by_merge_c_steps():
    # The shard merged seq 2 with c_steps 4: it carries seq 1's 2 steps too (same base),
    # so all 4 steps are productive although seq 1 itself has no merge line.
    b = LogBuilder(learners=1, t_end=4.0).up(0, "learner-0")
    b.step(1, "learner-0", 1).send(2, "learner-0", 1, 2).step(2, "learner-0", 2).step(3, "learner-0", 3)
    b.add(3.5, "syncer-0", "drop", what="contribution", fragment=0, learner="learner-0", incarnation=0, seq=1,
          reason="superseded", by_seq=2)
    b.send(4, "learner-0", 2, 2).merge(4, "learner-0", 2, c_steps=4).step(4, "learner-0", 4)
    m = compute(b.log())
    assert m.productive_s == approx(4.0) and m.goodput == approx(1.0)
    assert m.dropped == {"superseded": 1}


def _stale_run(max_staleness):
    # 1 learner, P = 1, 6 s, steps 1..6 (lines at 1..6). seq 1 (steps 1-2) merged fresh;
    # seq 2 (steps 3-4) dropped by the shard as stale (3 versions behind, bound 2); seq 3
    # (steps 5-6) merged 3 versions behind.
    b = LogBuilder(learners=1, t_end=6.0).up(0, "syncer-0").up(0, "learner-0")
    if max_staleness is not None:
        b.header["config"]["diloco"]["max_staleness"] = max_staleness
    for k in range(1, 7):
        if k == 2:
            b.send(k, "learner-0", 1, 2).merge(k, "learner-0", 1, 2)
        if k == 4:
            b.send(k, "learner-0", 2, 2).shard_drop(k, "learner-0", 2, "stale", staleness=3, max_staleness=2)
        if k == 6:
            b.send(k, "learner-0", 3, 2).merge(k, "learner-0", 3, 2, staleness=3)
        b.step(k, "learner-0", k)
    return compute(b.log())


def test_stale_contributions_are_stale_badput():
    # bound 2: seq 2 dropped stale and seq 3 merged past the bound -> steps 3-6 stale (4 s),
    # only steps 1-2 productive (2 s), nothing lost
    m = _stale_run(2)
    assert m.productive_s == approx(2.0) and m.goodput == approx(2 / 6)
    assert m.badput_s["stale"] == approx(4.0) and m.badput_s["lost"] == approx(0.0)
    assert m.badput["stale"] == approx(4 / 6)
    assert total(m) == approx(1.0)
    assert m.dropped == {"stale": 1}
    assert list(m.to_dict()["badput"]) == list(BADPUT) and "stale" in m.to_dict()["badput_s"]
    assert BADPUT.index("stale") == BADPUT.index("lost") + 1
    # no bound (0): a merge is never stale, the dropped seq 2 still is (the shard said so)
    m0 = _stale_run(0)
    assert (m0.productive_s, m0.badput_s["stale"], m0.badput_s["lost"]) == (approx(4.0), approx(2.0), approx(0.0))
    assert _stale_run(None).badput_s["stale"] == approx(2.0)
    assert total(m0) == approx(1.0)


def _restart_run() -> LogBuilder:
    """test_recovery_after_restart's run (its comment works the figures out)."""
    b = LogBuilder(learners=1, t_end=20.0).up(0, "learner-0")
    b.train("learner-0", 4, merged={1, 2})
    b.down(5, "learner-0").respawn(8, "learner-0")
    b.add(8.9, "learner-0", "checkpoint_restored", step=4).up(9, "learner-0", inc=1, step=4)
    return b.train("learner-0", 10, inc=1, start=4, t0=10.0, merged={2, 3, 4})


def test_stale_steps_inside_a_recovery_window():
    # test_recovery_after_restart's run, where the restarted incarnation's seq 1 (steps 5-6,
    # sent at 12, inside the recovery window [10, 14]) is dropped as stale: those 2 s go to
    # stale, out of recovery (4 − 2 productive − 2 stale = 0); the rest as before
    b = _restart_run()
    b.shard_drop(12.5, "learner-0", 1, "stale", inc=1, staleness=5, max_staleness=4)
    m = compute(b.log())
    assert m.badput_s == {**dict.fromkeys(BADPUT, approx(0.0)), "dead": approx(3.0), "startup": approx(2.0),
                          "stale": approx(2.0), "lost": approx(2.0), "other": approx(1.0)}
    assert m.productive_s == approx(10.0) and total(m) == approx(1.0)


def _lagged(b: LogBuilder, unit, n, merged, dt=1.0):
    """The same training as LogBuilder.train, written the way trainer/units/learner.py writes it:
    step k's line comes after step k+1 ran (metrics reach the host one step late), so the
    Contribution sent in step k precedes the lines of steps k-1 and k."""
    for k in range(1, n + 1):
        t = k * dt
        if k % 2 == 0:
            b.send(t, unit, k // 2, 2)
            if k // 2 in merged:
                b.merge(t, unit, k // 2, 2)
        if k > 1:
            b.step(t, unit, k - 1, dt)
    b.step(n * dt, unit, n, dt)


def test_step_lag_detected_and_same_goodput():
    # learner-0 writes lines on time, learner-1 one step late; both ran steps 1-6 with
    # seqs 1, 2 merged and seq 3 not: 4 s productive each, 2 s lost each, in both layouts.
    on_time = LogBuilder(learners=1, t_end=6.0).up(0, "learner-0")
    on_time.train("learner-0", 6, merged={1, 2})
    late = LogBuilder(learners=1, t_end=6.0).up(0, "learner-0")
    _lagged(late, "learner-0", 6, merged={1, 2})
    a, b = compute(on_time.log()), compute(late.log())
    assert (a.step_lag, b.step_lag) == (0, 1)
    assert a.productive_s == approx(4.0) and b.productive_s == approx(4.0)
    assert a.badput_s["lost"] == approx(2.0) and b.badput_s["lost"] == approx(2.0)
    # the first step started at t(line 1) − dt(1) − lag·dt(2) = 2 − 1 − 1 = 0: no startup
    assert b.badput_s["startup"] == approx(0.0)


def test_dp_rollback():
    # dp, 2 learners, 10 s. Both step 1..4 (lines at 1..4, dt 1), checkpoint at step 2.
    # learner-0 is killed at 4.5, learner-1 taken down with it (rollback); both respawn at 6,
    # restore step 2 and log unit_up at 6.5, then steps 3..5 with lines at 7.5, 8.5, 9.5.
    # Per learner: rolled back = old steps 3, 4 = 2 s; productive = 2 + 3 = 5 s;
    # dead [4.5, 6] = 1.5; startup [6, 6.5] = 0.5; other [4, 4.5] + [9.5, 10] = 1.
    b = LogBuilder(mode="dp", learners=2)
    for u in ("learner-0", "learner-1"):
        b.up(0, u)
        for k in range(1, 5):
            b.step(k, u, k)
            if k == 2:
                b.add(k, u, "checkpoint_saved", step=2)
        b.down(4.5, u, "killed" if u == "learner-0" else "rollback")
        b.respawn(6, u).add(6.4, u, "checkpoint_restored", step=2).up(6.5, u, inc=1, step=2)
        for j, k in enumerate(range(3, 6)):
            b.step(7.5 + j, u, k)
    m = compute(b.log())
    assert m.productive_s == approx(10.0) and m.goodput == approx(0.5)
    assert m.badput_s == {**dict.fromkeys(BADPUT, approx(0.0)), "rolled_back": approx(4.0), "dead": approx(3.0),
                          "startup": approx(1.0), "other": approx(2.0)}
    assert total(m) == approx(1.0)
    assert m.restarts == 2
    assert [(r.unit, r.incarnation, r.t_s, r.recovery_s) for r in m.recovery] == [
        ("learner-0", 1, 6.0, None), ("learner-1", 1, 6.0, None)]  # no merge lines in this log


def test_dp_step_lag_from_gradstep():
    # dp as trainer/units/learner.py writes it: the GradStep of step k (field step = k − 1, the
    # steps applied before it) is sent at t = k, before the line of step k − 1; steps of 1 s.
    b = LogBuilder(mode="dp", learners=1, t_end=4.0).up(0, "learner-0")
    for k in range(1, 5):
        b.add(k, "learner-0", "send", peer="syncer-0", bytes=10, msg="GradStep", learner="learner-0",
              incarnation=0, seq=k, fragment=0, step=k - 1, c_tokens=100)
        if k > 1:
            b.step(k, "learner-0", k - 1)
    b.step(4, "learner-0", 4)
    m = compute(b.log())
    assert m.step_lag == 1
    assert m.goodput == approx(1.0) and m.badput_s["startup"] == approx(0.0)


def test_dp_waiting_from_step_gaps():
    # dp without blocked lines: step lines at 1, 3, 5 with dt 1 -> gaps [1, 2] and [3, 4]
    # are waiting on the mean: 2 s of a 5 s run; 3 s productive.
    b = LogBuilder(mode="dp", learners=1, t_end=5.0).up(0, "learner-0")
    for k, t in enumerate((1, 3, 5), 1):
        b.step(t, "learner-0", k)
    m = compute(b.log())
    assert m.badput_s["waiting_on_sync"] == approx(2.0) and m.goodput == approx(0.6)


def test_dp_dt_spanning_the_wait():
    # trainer/units/learner.py times a dp step over its whole iteration: 2 iterations [0, 2] and
    # [2, 4] (dt 2 each), each blocked on the mean for its second half. Waiting 2 s, and the
    # steps count only the other 2 s: goodput 0.5, not 1.
    b = LogBuilder(mode="dp", learners=1, t_end=4.0).up(0, "learner-0")
    for k in (1, 2):
        b.add(2 * k - 1, "learner-0", "blocked", on=True, reason="dp_mean", step=k - 1)
        b.add(2 * k, "learner-0", "blocked", on=False, reason="dp_mean", step=k - 1)
        b.step(2 * k, "learner-0", k, dt=2.0)
    m = compute(b.log())
    assert m.badput_s["waiting_on_sync"] == approx(2.0) and m.goodput == approx(0.5)
    assert total(m) == approx(1.0)


def test_blocked_lines_are_waiting():
    # streaming, 6 s: steps 1, 2 (lines at 1, 2), blocked from 2 to 4, steps 3, 4 (lines 5, 6).
    # One Contribution (steps 1-4) merged: productive 4, waiting 2.
    b = LogBuilder(mode="streaming", learners=1, t_end=6.0).up(0, "learner-0")
    b.step(1, "learner-0", 1).step(2, "learner-0", 2)
    b.add(2, "learner-0", "blocked", on=True, reason="in_flight", step=2)
    b.add(4, "learner-0", "blocked", on=False, reason="in_flight", step=2)
    b.step(5, "learner-0", 3).send(6, "learner-0", 1, 4).merge(6, "learner-0", 1, 4).step(6, "learner-0", 4)
    m = compute(b.log())
    assert m.badput_s["waiting_on_sync"] == approx(2.0) and m.goodput == approx(4 / 6)


def test_paused_time_is_not_step_time():
    # 7 s: steps 1, 2 (lines 1, 2); paused [2, 4]; step 3 started at 2 and ended at 5 (dt 3
    # includes the pause, so it counts 3 − 2 = 1 s); steps 4, 5 at 6, 7. All merged.
    b = LogBuilder(learners=1, t_end=7.0).up(0, "learner-0")
    b.step(1, "learner-0", 1).step(2, "learner-0", 2)
    b.down(2, "learner-0", "paused").add(4, "learner-0", "unit_up", reason="resumed")
    b.step(5, "learner-0", 3, dt=3.0).step(6, "learner-0", 4)
    b.send(7, "learner-0", 1, 5).merge(7, "learner-0", 1, 5).step(7, "learner-0", 5)
    m = compute(b.log())
    assert m.badput_s["paused"] == approx(2.0)
    assert m.productive_s == approx(5.0) and m.goodput == approx(5 / 7)
    assert total(m) == approx(1.0)


def test_recovery_after_restart():
    # 1 learner, 20 s, P = 1. Incarnation 0: steps 1-4 (lines 1..4), seqs 1, 2 merged.
    # Killed at 5, respawned at 8, restores step 4, unit_up at 9; steps 5..14 with lines at
    # 11..20 (the first starts at 10). Its seq 1 (steps 5-6) is never merged; seq 2 (steps
    # 7-8) is merged at 14, seqs 3, 4 (steps 9-12) too; seq 5 (13-14) is not.
    #   recovery_s = 14 − 8 = 6 (restart → first merged contribution)
    #   dead [5, 8] = 3; startup [8, 10] = 2; recovery window [10, 14] = 4 minus the
    #   productive steps 7, 8 inside it = 2; productive 4 + 2 + 4 = 10; lost = 13, 14 = 2;
    #   other = [4, 5] = 1.
    b = _restart_run()
    m = compute(b.log())
    assert [(r.unit, r.incarnation, r.t_s, r.recovery_s) for r in m.recovery] == [("learner-0", 1, 8.0, 6.0)]
    assert m.recovery_max_s == approx(6.0)
    # boot: restart 8 → first step's start 10 = 2 s; rejoin: 10 → merge at 14 = 4 s; the
    # merged seq 2 went out with the incarnation's 4th step (steps 5-8); no H in the header
    r = m.recovery[0]
    assert (r.boot_s, r.rejoin_s, r.rejoin_steps, r.rejoin_cycles) == (approx(2.0), approx(4.0), 4, None)
    assert r.boot_s + r.rejoin_s == approx(r.recovery_s)
    b.header["config"]["diloco"]["sync_every"] = 8  # H = 8: 4 steps are half a fragment cycle
    m8 = compute(b.log())
    assert m8.recovery[0].rejoin_cycles == approx(0.5) and m8.rejoin_cycles_max == approx(0.5)
    assert m.badput_s == {**dict.fromkeys(BADPUT, approx(0.0)), "dead": approx(3.0), "startup": approx(2.0),
                          "recovery": approx(2.0), "lost": approx(2.0), "other": approx(1.0)}
    assert m.productive_s == approx(10.0) and m.goodput == approx(0.5)
    assert m.restarts == 1


def test_a_respawn_that_never_came_up_is_a_recovery_that_never_ended():
    # 1 learner, 20 s: steps 1-4 merged, killed at 5, respawned at 8 by the harness, and its
    # process never wrote a line by the end (a boot slower than the rest of the run, or a
    # hang before its first line). It is a restart all the same: recovery_s None, never
    # booted, incarnation 1; dead [5, 20] = 15 s. Before, no process line meant no Recovery
    # at all, and a recovery bound could not see a restart that never came up.
    # Time: dead [5, 8] = 3 (down to the respawn), startup [8, 20] = 12 (booting to the
    # end), other [4, 5] = 1; productive steps 1-4 = 4.
    b = LogBuilder(learners=1, t_end=20.0).up(0, "learner-0")
    b.train("learner-0", 4, merged={1, 2})
    b.down(5, "learner-0").respawn(8, "learner-0")
    m = compute(b.log())
    assert [(r.unit, r.incarnation, r.t_s, r.recovery_s, r.boot_s) for r in m.recovery] == \
        [("learner-0", 1, 8.0, None, None)]
    assert m.badput_s == {**dict.fromkeys(BADPUT, approx(0.0)), "dead": approx(3.0), "startup": approx(12.0),
                          "other": approx(1.0)}
    assert m.productive_s == approx(4.0) and total(m) == approx(1.0)


def test_death_without_a_harness_line():
    # killed by something other than the injector (no unit_down): steps 1-3 (lines 1..3),
    # then a new incarnation's unit_up at 6. Dead from its last line: [3, 6] = 3 s.
    b = LogBuilder(learners=1, t_end=8.0).up(0, "learner-0")
    b.train("learner-0", 3, merged={1})
    b.up(6, "learner-0", inc=1).step(7, "learner-0", 1).step(8, "learner-0", 2)
    m = compute(b.log())
    assert m.badput_s["dead"] == approx(3.0)
    assert m.recovery[0].t_s == approx(6.0) and m.recovery[0].recovery_s is None
    r = m.recovery[0]  # stepped from 6 (line at 7, dt 1) but never merged
    assert (r.boot_s, r.rejoin_s, r.rejoin_steps) == (approx(0.0), None, None) and m.rejoin_cycles_max is None
    assert total(m) == approx(1.0)
