"""harness/judging/checks.py, the checks on what reached the global model: each on a
hand-made log that passes and on one that breaks it (a duplicated merge line, a Δ's steps
merged twice, a version going backwards, a durable round lost in a restart)."""
from __future__ import annotations

from log_builder import LogBuilder, rounds

from diloco_chaos.harness.judging import checks


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
