"""harness/judging/checks.py: each safety check on a hand-made log that passes and on one that
breaks it (a duplicated merge line, a version going backwards, a NaN, ...), the
expectation checks, and compose."""
from __future__ import annotations

import math

import pytest
from log_builder import LogBuilder

from harness.judging import checks
from harness.judging.checks import Result, compose, expect_checks
from harness.judging.metrics import compute


def rounds(b: LogBuilder, times, learner="learner-0", shard="syncer-0"):
    """One merged contribution (seq = index) per time: merge + round_commit lines."""
    for seq, t in enumerate(times, 1):
        b.merge(t, learner, seq, 1, shard=shard)
    return b


# --- merged_at_most_once -------------------------------------------------------------------------


def test_merged_at_most_once():
    b = rounds(LogBuilder(learners=1).up(0, "syncer-0"), (1, 2, 3))
    assert checks.merged_at_most_once(b.log()).valid is True
    # the same (learner-0, 0, seq 2, fragment 0) merged again, in a later round
    b.merge(4, "learner-0", 2, 1)
    r = checks.merged_at_most_once(b.log())
    assert (r.valid, r.value) == (False, 1)
    assert r.details["violations"][0]["key"] == ["learner-0", 0, 2, 0]
    assert r.details["violations"][0]["versions"] == [2, 4]


def test_merged_again_across_a_shard_restart():
    # seq 3 merged at version 3, shard killed before that round was durable: it restores
    # version 2, and seq 3 (resent) is merged again at version 3: no double count in Θ.
    def run(restored_version):
        b = rounds(LogBuilder(learners=1).up(0, "syncer-0"), (1, 2, 3))
        b.add(2.5, "syncer-0", "checkpoint_saved", versions={"0": 2})
        b.down(4, "syncer-0").respawn(5, "syncer-0")
        b.add(5.1, "syncer-0", "checkpoint_restored", step=2, versions={"0": restored_version})
        b.up(5.2, "syncer-0", inc=1)
        b.version[("syncer-0", 0)] = restored_version
        b.merge(6, "learner-0", 3, 1)
        return checks.merged_at_most_once(b.log())

    lost = run(2)
    assert lost.valid is True and len(lost.details["remerged_after_loss"]) == 1
    kept = run(3)  # the first merge survived the restart: merging it again counts it twice
    assert kept.valid is False


# --- progress_merged_once ------------------------------------------------------------------------


def _contributions(spans, merged=None, learners=1, **kw):
    """learner-0 sends one Contribution per (from_step, to_step) in `spans` (seq 1, 2, …) at
    t = 1, 2, …: its contribute line, then its send; the seqs in `merged` (default: all) are
    merged right after, each in its own round (version 1, 2, …)."""
    b = LogBuilder(learners=learners, **kw).up(0, "syncer-0").up(0, "learner-0")
    for seq, (a, z) in enumerate(spans, 1):
        b.contribute(seq, "learner-0", seq, a, z).send(seq, "learner-0", seq, z - a)
        if merged is None or seq in merged:
            b.merge(seq + 0.5, "learner-0", seq, z - a, staleness=0)
    return b


def test_progress_merged_once_old_behaviour_fails():
    # The old learner: no update between two sends, both Δs against the same base. Seq 1
    # holds steps 1-6, seq 2 steps 1-12; both merged: steps 1-6 reached Θ twice.
    r = checks.progress_merged_once(_contributions([(0, 6), (0, 12)]).log())
    assert (r.valid, r.value, r.bound) == (False, 1, 0)
    assert r.details["overlap_steps"] == 6
    assert r.details["violations"] == [{"learner": "learner-0", "incarnation": 0, "fragment": 0, "seqs": [1, 2],
                                        "steps": [1, 6], "overlap_steps": 6, "t": 2}]


def test_progress_merged_once_new_behaviour_passes():
    # re-anchored after seq 1's answer: seq 2 holds steps 7-12
    r = checks.progress_merged_once(_contributions([(0, 6), (6, 12)]).log())
    assert (r.valid, r.value) == (True, 0)
    assert r.details["contributions"] == 2 and r.details["merges"] == 2
    # a third Δ re-measured from step 3 (overlapping both): two pairs, 4 + 3 steps
    bad = checks.progress_merged_once(_contributions([(0, 6), (6, 12), (2, 9)]).log())
    assert (bad.valid, bad.value, bad.details["overlap_steps"]) == (False, 2, 7)
    assert {(tuple(v["seqs"]), tuple(v["steps"])) for v in bad.details["violations"]} == {
        ((1, 3), (3, 6)), ((2, 3), (7, 9))}


def test_progress_merged_once_combined_and_superseded():
    # seq 1 (steps 1-6) is summed into seq 2 (7-12), which is merged: both reached Θ once
    ok = _contributions([(0, 6), (6, 12)], merged={2})
    ok.shard_drop(1.8, "learner-0", 1, "combined", by_seq=2)
    r = checks.progress_merged_once(ok.log())
    assert (r.valid, r.value) == (True, 0)
    # summed, but seq 2 re-measured from step 0: steps 1-6 are in the sum twice
    twice = _contributions([(0, 6), (0, 12)], merged={2})
    twice.shard_drop(1.8, "learner-0", 1, "combined", by_seq=2)
    r = checks.progress_merged_once(twice.log())
    assert (r.valid, r.value, r.details["overlap_steps"]) == (False, 1, 6)
    # combined into a contribution that was itself merged earlier: transitively, seq 1 → 2 → 3
    chain = _contributions([(0, 4), (4, 8), (0, 12)], merged={3})
    chain.shard_drop(1.8, "learner-0", 1, "combined", by_seq=2).shard_drop(2.8, "learner-0", 2, "combined", by_seq=3)
    r = checks.progress_merged_once(chain.log())
    assert (r.valid, r.value, r.details["overlap_steps"]) == (False, 2, 8)  # seq 3 with 1 (1-4) and 2 (5-8)
    # superseded = replaced: the newer Δ against the same base stands for the older's steps
    rep = _contributions([(0, 6), (0, 12)], merged={2})
    rep.shard_drop(1.8, "learner-0", 1, "superseded", by_seq=2)
    r = checks.progress_merged_once(rep.log())
    assert (r.valid, r.details["replaced"]) == (True, 1)


def test_progress_merged_once_what_did_not_reach_the_model():
    # seq 1 dropped as stale (never merged), seq 2 re-measured from step 0 and merged: once
    stale = _contributions([(0, 6), (0, 12)], merged={2})
    stale.shard_drop(1.2, "learner-0", 1, "stale", staleness=5, max_staleness=4)
    assert checks.progress_merged_once(stale.log()).valid is True
    # seq 1's round was lost in a shard crash (restored version 0 < 1): its steps left Θ
    crash = _contributions([(0, 6)])
    crash.down(1.7, "syncer-0").respawn(1.8, "syncer-0")
    crash.add(1.85, "syncer-0", "checkpoint_restored", step=0, versions={"0": 0}).up(1.9, "syncer-0", inc=1)
    crash.version[("syncer-0", 0)] = 0
    crash.contribute(2, "learner-0", 2, 0, 12).send(2, "learner-0", 2, 12).merge(2.5, "learner-0", 2, 12)
    r = checks.progress_merged_once(crash.log())
    assert (r.valid, r.details["lost_in_crash"]) == (True, 1)
    # a new incarnation counts its steps from 0 again: 1-6 of incarnation 1 are other steps
    b = _contributions([(0, 6)])
    b.down(3, "learner-0").respawn(4, "learner-0").up(4.5, "learner-0", inc=1)
    b.contribute(5, "learner-0", 1, 0, 6).send(5, "learner-0", 1, 6, inc=1).merge(5.5, "learner-0", 1, 6, inc=1)
    assert checks.progress_merged_once(b.log()).valid is True


def test_progress_merged_once_unknown_and_not_applicable():
    old = rounds(LogBuilder(learners=1).up(0, "syncer-0"), (1, 2))  # merges, no contribute line
    r = checks.progress_merged_once(old.log())
    assert r.valid is None and "contribute" in r.details["why"]
    assert checks.progress_merged_once(LogBuilder(learners=1).log()).valid is True  # nothing merged
    dp = rounds(LogBuilder(mode="dp", learners=1).up(0, "syncer-0"), (1, 2))
    assert checks.progress_merged_once(dp.log()).valid is True


# --- global_loss_regression ---------------------------------------------------------------------


def _curve(losses, final=True, t_end=100.0):
    """Snapshot global evals at t = 10, 30, 50, … of a [0, t_end] run; the last loss is the
    final eval (written after the run, at t_end + 1) when `final`."""
    b = LogBuilder(learners=1, t_end=t_end)
    *snaps, last = losses
    for i, loss in enumerate(snaps):
        b.global_eval(10.0 + 20.0 * i, loss)
    b.global_eval(t_end + 1.0, last, snapshot=not final)
    return b


def test_global_loss_regression_damaged_model_fails():
    # 4.0 2.5 1.9 1.75 1.72, final 3.2: the final rises 3.2 − 1.72 = 1.48 above the best so
    # far (> 0.25) and ends 1.48 above the best (> 0.1)
    r = checks.global_loss_regression(_curve([4.0, 2.5, 1.9, 1.75, 1.72, 3.2]).log())
    assert (r.valid, r.value, r.bound) == (False, pytest.approx(1.48), 0.25)
    d = r.details
    assert d["worst"] == {"at_s": 101.0, "loss": 3.2, "best_so_far": 1.72, "rise": pytest.approx(1.48),
                          "final": True}
    assert (d["final"], d["best"], d["end_excess"], d["points"]) == (3.2, 1.72, pytest.approx(1.48), 6)
    assert [v.get("end", False) for v in d["violations"]] == [False, True]


def test_global_loss_regression_healthy_model_passes():
    r = checks.global_loss_regression(_curve([4.0, 2.5, 1.9, 1.75, 1.73, 1.72]).log())
    assert (r.valid, r.value) == (True, 0.0)                 # it only fell
    assert (r.details["end_excess"], r.details["best"]) == (0.0, 1.72)
    # a fault-free bump as measured on docker: 1.72 → 1.81 between snapshots, final 1.75
    bump = checks.global_loss_regression(_curve([4.0, 2.5, 1.72, 1.81, 1.75]).log())
    assert (bump.valid, bump.value, bump.details["end_excess"]) == (True, pytest.approx(0.09), pytest.approx(0.03))


def test_global_loss_regression_warmup_end_and_bounds():
    # 4.0 at 5 s, 4.5 at 15 s: a rise of 0.5 inside the first 20 % of the 100 s window, not
    # judged; then 2.0 and a final 1.9: nothing judged rose
    b = LogBuilder(learners=1, t_end=100.0)
    b.global_eval(5.0, 4.0).global_eval(15.0, 4.5).global_eval(50.0, 2.0).global_eval(101.0, 1.9, snapshot=False)
    r = checks.global_loss_regression(b.log())
    assert (r.valid, r.details["warmup_until_s"]) == (True, 20.0)
    assert r.value == 0.0
    # rises 0.2 (within 0.25) but ends 0.2 above its best (over 0.1): fails on the end
    end = checks.global_loss_regression(_curve([4.0, 2.0, 1.7, 1.9]).log())
    assert (end.valid, end.value) == (False, pytest.approx(0.2))
    assert end.details["violations"] == [{"end": True, "final": 1.9, "best": 1.7, "end_excess": pytest.approx(0.2),
                                          "end_max": 0.1}]
    assert checks.global_loss_regression(_curve([4.0, 2.0, 1.7, 1.9]).log(), end_max=0.3).valid is True
    # a diverged model (non-finite loss) is an infinite rise
    assert checks.global_loss_regression(_curve([4.0, 2.0, math.nan, 1.9]).log()).valid is False
    # without a final eval the last snapshot stands for the end
    nofinal = checks.global_loss_regression(_curve([4.0, 2.0, 1.7, 1.72], final=False).log())
    assert (nofinal.valid, nofinal.details["final_from"]) == (True, "snapshot")


def test_global_loss_regression_unknown_with_few_points():
    b = LogBuilder(learners=1).global_eval(5, 2.0).global_eval(11, 1.9, snapshot=False)
    r = checks.global_loss_regression(b.log())
    assert (r.valid, r.details["points"]) == (None, 2)
    assert checks.global_loss_regression(LogBuilder(learners=1).log()).valid is None


# --- versions_monotonic -------------------------------------------------------------------------


def test_versions_monotonic_passes_across_a_restore():
    b = rounds(LogBuilder(learners=1).up(0, "syncer-0"), (1, 2, 3))
    b.add(3.5, "syncer-0", "checkpoint_saved", versions={"0": 2})
    b.down(4, "syncer-0").respawn(5, "syncer-0")
    b.add(5.1, "syncer-0", "checkpoint_restored", step=1, versions={"0": 2}).up(5.2, "syncer-0", inc=1)
    b.version[("syncer-0", 0)] = 2
    b.merge(6, "learner-0", 4, 1)               # version 3 again: the lost round's number reused
    assert b.events[-1]["version"] == 3
    r = checks.versions_monotonic(b.log())
    assert r.valid is True, r.details


def test_versions_going_backwards_or_skipping_fail():
    b = rounds(LogBuilder(learners=1).up(0, "syncer-0"), (1, 2))
    b.merge(3, "learner-0", 3, 1, version=1)    # back to 1 after 2
    r = checks.versions_monotonic(b.log())
    assert r.valid is False
    assert {(v["kind"], v["version"], v["expected"]) for v in r.details["violations"]} == {
        ("merge", 1, 3), ("round_commit", 1, 3)}
    skip = rounds(LogBuilder(learners=1).up(0, "syncer-0"), (1,))
    skip.merge(2, "learner-0", 2, 1, version=3)
    assert checks.versions_monotonic(skip.log()).valid is False
    # a restarted shard that restored nothing must start again from 1
    fresh = rounds(LogBuilder(learners=1).up(0, "syncer-0"), (1, 2))
    fresh.down(3, "syncer-0").up(4, "syncer-0", inc=1)
    fresh.merge(5, "learner-0", 3, 1)            # continues at 3 as if nothing was lost
    assert checks.versions_monotonic(fresh.log()).valid is False


def test_versions_per_fragment_and_shard():
    b = LogBuilder(learners=1, fragments=2, shards=("syncer-0", "syncer-1"))
    b.up(0, "syncer-0").up(0, "syncer-1")
    b.merge(1, "learner-0", 1, 1, fragment=0, shard="syncer-0")
    b.merge(2, "learner-0", 2, 1, fragment=1, shard="syncer-1")
    b.merge(3, "learner-0", 3, 1, fragment=0, shard="syncer-0")
    assert [e["version"] for e in b.events if e["kind"] == "merge"] == [1, 1, 2]
    assert checks.versions_monotonic(b.log()).valid is True


# --- no_nan ---------------------------------------------------------------------------------------


def test_no_nan():
    b = LogBuilder(learners=1).step(1, "learner-0", 1, loss=2.5).add(2, "learner-0", "eval", step=1, loss=2.4)
    assert checks.no_nan(b.log()).valid is True
    b.step(3, "learner-0", 2, loss=math.nan).add(4, "harness", "eval", loss=math.inf, step=2, **{"global": True})
    r = checks.no_nan(b.log())
    assert (r.valid, r.value) == (False, 2)
    assert [(v["src"], v["loss"]) for v in r.details["violations"]] == [("learner-0", "nan"), ("harness", "inf")]


# --- durable_rounds_kept -------------------------------------------------------------------------


def _restart(restored: dict | None):
    b = rounds(LogBuilder(learners=1).up(0, "syncer-0"), (1, 2, 3))
    b.add(3.5, "syncer-0", "checkpoint_saved", versions={"0": 3})
    b.down(4, "syncer-0").respawn(5, "syncer-0")
    if restored is not None:
        b.add(5.1, "syncer-0", "checkpoint_restored", step=3, versions=restored)
    return checks.durable_rounds_kept(b.up(5.2, "syncer-0", inc=1).log())


def test_durable_rounds_kept():
    ok = _restart({"0": 3})
    assert (ok.valid, ok.details["restarts"]) == (True, 1)
    lost = _restart({"0": 2})                     # version 3 was acknowledged durable
    assert lost.valid is False
    assert lost.details["violations"] == [{"shard": "syncer-0", "incarnation": 1, "fragment": 0,
                                           "restored": 2, "durable": 3}]
    assert _restart(None).valid is False          # restored nothing: 0 < 3
    no_restart = rounds(LogBuilder(learners=1).up(0, "syncer-0"), (1, 2))
    assert checks.durable_rounds_kept(no_restart.log()).valid is True


# --- no_global_downtime ---------------------------------------------------------------------------


def _stall(after_4=None):
    """2 learners step 1..10 (lines at 1..10); the shard commits at 1..4 and then never
    again. after_4(builder) adds what happened at 4."""
    b = LogBuilder(learners=2, t_end=10.0).up(0, "syncer-0")
    for u in ("learner-0", "learner-1"):
        b.up(0, u)
        for k in range(1, 11):
            b.step(k, u, k)
    rounds(b, (1, 2, 3, 4))
    if after_4:
        after_4(b)
    return checks.no_global_downtime(b.log())


def test_no_global_downtime_catches_a_stall():
    # commits 1 s apart: bound max(1, 3 × 1) = 3 s; both learners are stepping until 10
    # with nothing committed after 4: 6 s without a round while K = 1 was reachable.
    r = _stall()
    assert r.valid is False and r.bound == pytest.approx(3.0)
    assert r.value == pytest.approx(6.0)
    assert r.details["violations"] == [{"from_s": 4.0, "to_s": 10.0, "reachable_s": pytest.approx(6.0)}]


def test_the_downtime_floor_is_longer_on_real_processes():
    # commits every 0.1 s, then one gap: the bound is the floor (3 × 0.1 s is below it):
    # 1 s in the sim's virtual time, 2 s on real processes sharing the machine's cores
    # (a replacement unit's boot starves the others). A 1.5 s gap is a stall in the sim
    # and load on processes; a 2.5 s gap is a stall on both.
    def judged(tier, gap):
        end = 2.0 + gap
        b = LogBuilder(learners=1, t_end=end).up(0, "syncer-0").up(0, "learner-0")
        b.header["tier"] = tier
        for k in range(int(end * 10) + 1):
            b.step(0.1 * k, "learner-0", k)
        rounds(b, [0.1 * k for k in range(1, 21)] + [end])
        return checks.no_global_downtime(b.log())

    sim, wall = judged("sim", 1.5), judged("cluster", 1.5)
    assert (sim.bound, wall.bound) == (pytest.approx(1.0), pytest.approx(2.0))
    assert sim.valid is False and wall.valid is True
    assert judged("cluster", 2.5).valid is False


def test_no_global_downtime_excuses_dead_and_partitioned_learners():
    def kill_both(b):
        b.events = [e for e in b.events if not (e["kind"] == "step" and e["t"] > 4)]
        b.down(4.2, "learner-0").down(4.2, "learner-1")

    assert _stall(kill_both).valid is True

    def partition_all(b):
        f = {"kind": "partition", "target": "link:*", "at_s": 4.0, "duration_s": 6.0, "direction": "both"}
        b.add(4.0, "harness", "fault_start", id=0, fault=f)

    assert _stall(partition_all).valid is True

    def partition_one(b):  # K = 1: learner-1 could still reach the shard
        f = {"kind": "partition", "target": "link:learner-0", "at_s": 4.0, "duration_s": 6.0}
        b.add(4.0, "harness", "fault_start", id=0, fault=f)

    assert _stall(partition_one).valid is False


def test_no_global_downtime_quorum_depends_on_mode():
    # learner-1 paused from 4 on. Decoupled (K = 1): learner-0 alone is a quorum, the stall
    # fails. Streaming (K = M = 2): no quorum without learner-1, the stall is excused.
    def pause_learner_1(b, mode):
        b.header["config"]["diloco"]["mode"] = mode
        b.events = [e for e in b.events if not (e["src"] == "learner-1" and e["kind"] == "step" and e["t"] > 4)]
        b.down(4.0, "learner-1", "paused")

    assert checks.quorum_k(LogBuilder(mode="streaming").log()) == 2
    assert checks.quorum_k(LogBuilder(mode="decoupled", quorum=1).log()) == 1
    assert _stall(lambda b: pause_learner_1(b, "decoupled")).valid is False
    assert _stall(lambda b: pause_learner_1(b, "streaming")).valid is True


# --- staleness_bounded ----------------------------------------------------------------------------


def test_staleness_bounded():
    b = LogBuilder(learners=1)
    for seq, s in enumerate((0, 1, 3), 1):
        b.merge(seq, "learner-0", seq, 1, staleness=s)
    assert checks.staleness_bounded(b.log(), 3).valid is True
    r = checks.staleness_bounded(b.log(), 2)
    assert (r.valid, r.value, r.bound) == (False, 3, 2)
    assert len(r.details["violations"]) == 1


def test_safety_checks_list():
    log = rounds(LogBuilder(learners=1, t_end=4.0).up(0, "syncer-0"), (1, 2, 3)).log()
    names = [r.name for r in checks.safety_checks(log)]
    assert names == ["merged_at_most_once", "progress_merged_once", "versions_monotonic", "no_nan",
                     "durable_rounds_kept", "no_global_downtime", "global_loss_regression", "link_buffers_bounded",
                     "tokens_conserved"]
    assert [r.name for r in checks.safety_checks(log, max_staleness=4)][-1] == "staleness_bounded"
    # global_loss_regression's bounds go through
    damaged = _curve([4.0, 2.5, 1.9, 1.75, 1.72, 3.2]).log()
    by = {r.name: r for r in checks.safety_checks(damaged)}
    assert (by["global_loss_regression"].valid, by["global_loss_regression"].bound) == (False, 0.25)
    by = {r.name: r for r in checks.safety_checks(damaged, rise_max=1.5, end_max=1.5)}
    assert (by["global_loss_regression"].valid, by["global_loss_regression"].bound) == (True, 1.5)


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
    from harness.judging.judge import faults_seen

    sched = [{"kind": "kill_unit", "target": "learner-1", "at_s": t, "down_for_s": 5.0} for t in (2.0, 30.0, 50.0)]
    b = LogBuilder(t_start=100.0, t_end=123.0, schedule=sched)
    b.add(102.0, "harness", "fault_start", id=0, fault=sched[0], via="SIGKILL")
    b.add(102.0, "learner-1", "fault_start", id=9, fault=sched[0])  # not the harness's: not counted
    seen = faults_seen(b.log())
    assert seen == {"faults_scheduled": 3, "faults_applied": 1, "run_s": 23.0}
    note = checks.faults_note(seen)
    assert note.startswith("only 1 of the 3 scheduled faults happened: the run ended after 23 s")
    assert checks.faults_note({**seen, "faults_applied": 3}) is None
    assert checks.faults_note({}) is None  # a summary from before these keys


def _buffers(unsent_by_end: dict, frame: int = 1000, link_buffer=()):
    """A log whose `done` lines carry the buffer counters: {(src, peer): unsent_max}."""
    b = LogBuilder(learners=2, t_end=4.0)
    log = b.log()
    events = [{"t": 1.0, "src": "learner-0", "kind": "send", "peer": "syncer-0", "bytes": frame, "msg": "Contribution"}]
    for (src, peer), most in unsent_by_end.items():
        events.append({"t": 3.0, "src": src, "kind": "done", "links": {peer: {"unsent_max": most, "superseded": 0}}})
    events += [{"t": 2.0, "src": s, "kind": "link_buffer", "peer": p, "unsent_bytes": n} for s, p, n in link_buffer]
    header = {**log.header, "topology": {"learners": ["learner-0", "learner-1"], "shards": {"syncer-0": [0, 1, 2]}}}
    return type(log)(header, sorted(log.events + events, key=lambda e: e["t"]))


def test_link_buffers_bounded_allows_the_held_bytes_and_a_frame_per_key():
    # bound = held 10,000 + (3 fragments of syncer-0 + a Hello + the frame being written) × 1,000 = 15,000
    ok = checks.link_buffers_bounded(_buffers({("syncer-0", "learner-0"): 15_000, ("learner-0", "syncer-0"): 900}),
                                     held_bytes=10_000)
    assert (ok.valid, ok.value, ok.bound) == (True, 15_000, 15_000)
    # a backlog of every commit (the unbounded_outbox behaviour): 40 frames waiting
    bad = checks.link_buffers_bounded(_buffers({("syncer-0", "learner-1"): 900},
                                               link_buffer=[("syncer-0", "learner-1", 50_000)]), held_bytes=10_000)
    assert (bad.valid, bad.value) == (False, 50_000)
    assert bad.details["violations"] == [{"src": "syncer-0", "peer": "learner-1", "unsent_max": 50_000, "bound": 15_000}]


def test_link_buffers_bounded_is_unknown_without_counters():
    log = rounds(LogBuilder(learners=1, t_end=4.0).up(0, "syncer-0"), (1, 2, 3)).log()
    assert checks.link_buffers_bounded(log).valid is None
