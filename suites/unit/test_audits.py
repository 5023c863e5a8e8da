"""The audits (harness/judging/audits.py) on hand-made logs: values a person can check by hand,
each check once holding and once failing for the reason it is named for."""
from __future__ import annotations

import base64

import numpy as np
from log_builder import LogBuilder

from diloco_chaos.harness.judging import audits, spec


def _b64(x) -> dict:
    x = np.asarray(x, np.float32)
    return {"dtype": "float32", "shape": list(x.shape), "b64": base64.b64encode(x.tobytes()).decode()}


def _config(b: LogBuilder, **diloco) -> LogBuilder:
    b.header["config"]["diloco"].update({"weighting": "tokens", "staleness_discount": True, "merge": "mean",
                                         "fleet_share": False, "guard_factor": 30.0, "starve_cycles": 2,
                                         "sync_every": 2, **diloco})
    b.header["config"]["outer"] = {"lr": 0.5, "momentum": 0.0, "nesterov": True, "warmup": 0}
    return b


def _merge(b, t, learner, seq, version, base, weight, c_tokens=32, c_steps=2):
    return b.add(t, "syncer-0", "merge", fragment=0, version=version, learner=learner, incarnation=0, seq=seq,
                 base_version=base, staleness=version - 1 - base, weight=weight, c_steps=c_steps, c_tokens=c_tokens)


def test_weights_by_hand_and_a_stale_merge_weighed_as_fresh():
    # c_tokens 32, c_steps 2: 32² / 2 = 512; staleness 3: 512 / √4 = 256
    ok = _merge(_merge(_config(LogBuilder()), 1.0, "learner-0", 1, 1, 0, 512.0), 2.0, "learner-1", 1, 4, 0, 256.0)
    assert audits.weights_match_staleness(ok.log()).valid is True
    bad = _merge(_config(LogBuilder()), 2.0, "learner-1", 1, 4, 0, 512.0).log()
    r = audits.weights_match_staleness(bad)
    assert r.valid is False and r.details["violations"][0]["expected"] == 256.0


def _commit(b, t, before, after, deltas, weights, version=1, digest=True):
    theta, theta2 = np.array(before, np.float32), np.array(after, np.float32)
    fields = {"live": ["learner-0", "learner-1"], "closed": [], "closing": False}
    if digest:
        fields.update(before=spec.digest([theta]), digest=spec.digest([theta2]))
    b.add(t, "syncer-0", "round_commit", fragment=0, version=version, n=len(deltas), tokens=32, **fields)
    return b.add(t, "syncer-0", "commit_audit", fragment=0, version=version, merge="mean",
                 weights=list(weights), theta=_b64(theta), trace=_b64(np.zeros(0)), theta_after=_b64(theta2),
                 trace_after=_b64(np.zeros(0)), deltas=[_b64(d) for d in deltas], sample=None, size=2,
                 shapes=[[2]])


def test_a_commit_redone_by_hand_and_one_that_dropped_a_delta():
    """Θ = (1, 2); Δs (0.2, 0) and (0, 0.4), equal weight: mean (0.1, 0.2); outer lr 0.5:
    Θ' = (0.95, 1.9). A shard that left out the second Δ moved Θ to (0.9, 2.0)."""
    def log(after):
        b = _config(LogBuilder())
        _merge(b, 1.0, "learner-0", 1, 1, 0, 512.0)
        _merge(b, 1.0, "learner-1", 1, 1, 0, 512.0)
        return _commit(b, 1.0, [1, 2], after, [[0.2, 0], [0, 0.4]], [512.0, 512.0]).log()

    assert audits.commits_audited(log([0.95, 1.9])).valid is True
    r = audits.commits_audited(log([0.9, 2.0]))
    assert r.valid is False and "the judge's step" in r.details["violations"][0]["why"]


def test_a_commit_that_does_not_start_where_the_last_one_ended_breaks_the_chain():
    b = _config(LogBuilder())
    for v in (1, 2):
        _merge(b, float(v), "learner-0", v, v, v - 1, 512.0)
    _commit(b, 1.0, [1, 2], [0.9, 2.0], [[0.2, 0]], [512.0], version=1)
    _commit(b, 2.0, [5, 5], [4.9, 5.0], [[0.2, 0]], [512.0], version=2)  # Θ jumped between commits
    r = audits.commits_audited(b.log())
    assert r.valid is False and "is not what the last commit" in r.details["violations"][0]["why"]


def test_copies_against_the_shards_record():
    theta = [np.array([1.0, 2.0], np.float32)]
    d = spec.digest(theta)
    b = _config(LogBuilder())
    b.add(1.0, "syncer-0", "round_commit", fragment=0, version=1, n=1, tokens=1, before="0" * 16, digest=d)
    b.add(1.1, "learner-0", "copy", fragment=0, version=1, digest=d, via="whole")
    assert audits.copies_consistent(b.log()).valid is True
    b.add(1.2, "learner-1", "copy", fragment=0, version=1, digest="f" * 16, via="whole")
    r = audits.copies_consistent(b.log())
    assert r.valid is False and r.details["violations"][0]["learner"] == "learner-1"


def test_a_compressed_delta_may_not_leave_the_copy_further_from_theta():
    b = _config(LogBuilder(), broadcast_compression="int4")
    b.add(1.0, "syncer-0", "held", learner="learner-0", fragment=0, version=1, from_version=0, digest="a" * 16,
          theta_rms=1.0, gap=0.1, error=0.2)
    b.add(1.1, "learner-0", "copy", fragment=0, version=1, digest="a" * 16, via="delta")
    r = audits.copies_consistent(b.log())
    assert r.valid is False and "further than before" in r.details["violations"][0]["why"]


def _guard(b, t, rms, c_steps, accepted, theta_rms=10.0):
    return b.add(t, "syncer-0", "guard", fragment=0, learner="learner-0", incarnation=0, seq=int(t), rms=rms,
                 c_steps=c_steps, theta_rms=theta_rms, factor=30.0, accepted=accepted)


def test_guard_decisions_redone_by_hand():
    """Four accepted sizes of 0.01 per step: the bound is 30 × 0.01 = 0.3 per step. A Δ of
    1.2 over 6 steps (0.2 per step) is within it; one of 2.4 over 6 (0.4) is over it."""
    def log(size, accepted):
        b = _config(LogBuilder())
        for t in (1.0, 2.0, 3.0, 4.0):
            _guard(b, t, 0.06, 6, True)
        return _guard(b, 5.0, size, 6, accepted).log()

    assert audits.guard_decisions(log(1.2, True)).valid is True
    assert audits.guard_decisions(log(2.4, False)).valid is True
    dropped = audits.guard_decisions(log(1.2, False))   # an honest Δ dropped (its whole size judged)
    assert dropped.valid is False and dropped.details["violations"][0]["expected"] is True
    let_in = audits.guard_decisions(log(2.4, True))     # a Δ over the bound let in
    assert let_in.valid is False and let_in.details["violations"][0]["bound"] == 30 * 0.01


def test_a_restore_must_load_what_its_save_wrote_and_the_newest_that_landed():
    def log(restored_step, digests):
        b = _config(LogBuilder())
        for n, dg in ((1, "a"), (2, "b")):
            b.add(float(n), "syncer-0", "checkpoint_started", number=n, versions={"0": n},
                  digests={"theta": {"0": dg * 16}, "outer": {"0": "0" * 16}})
            b.add(n + 0.5, "syncer-0", "checkpoint_saved", versions={"0": n}, number=n)
        b.up(3.0, "syncer-0", inc=1)
        return b.add(3.1, "syncer-0", "checkpoint_restored", step=restored_step, versions={"0": 2},
                     digests={"theta": {"0": digests * 16}, "outer": {"0": "0" * 16}}).log()

    assert audits.restores_faithful(log(2, "b")).valid is True
    mixed = audits.restores_faithful(log(2, "a"))           # names save 2, loaded save 1's Θ
    assert mixed.valid is False and mixed.details["violations"][0]["differs"] == ["theta[0]"]
    older = audits.restores_faithful(log(1, "a"))           # save 2 had landed
    assert older.valid is False and older.details["violations"][0]["newest_landed"] == 2


def test_a_shard_that_keeps_a_dead_learner_live():
    b = _config(LogBuilder())
    b.add(0.5, "syncer-0", "link_up", peer="learner-0").add(0.5, "syncer-0", "link_up", peer="learner-1")
    live = ["learner-0", "learner-1"]
    b.add(1.0, "syncer-0", "round_commit", fragment=0, version=1, n=1, tokens=1, live=live)
    b.add(2.0, "syncer-0", "link_down", peer="learner-1").down(2.0, "learner-1")
    b.add(3.0, "syncer-0", "round_commit", fragment=0, version=2, n=1, tokens=1, live=["learner-0"])
    assert audits.membership_follows_links(b.log()).valid is True
    b.add(4.0, "syncer-0", "round_commit", fragment=0, version=3, n=1, tokens=1, live=live)
    r = audits.membership_follows_links(b.log())
    assert r.valid is False and "learner-1" in r.details["violations"][0]["why"]


def test_a_learner_that_never_asks_again():
    """starve_cycles 2, H = 2: silent for 2 × 2 + 2 slack cycles × 2 = 8 steps at most."""


def test_a_learner_killed_with_its_shard_is_not_a_link_the_shard_missed():
    """A CI draw: syncer-0 and learner-0 killed in the same instant, the learner back first.
    The dead shard saw no link go down; its restart holds none. A learner killed while the
    shard is up and seen by nobody stays a violation."""
    def log(shard_dies):
        b = _config(LogBuilder())
        b.add(0.5, "syncer-0", "link_up", peer="learner-0")
        b.add(1.0, "syncer-0", "round_commit", fragment=0, version=1, n=1, tokens=1, live=["learner-0"])
        if shard_dies:
            b.down(2.0, "syncer-0")
        b.down(2.0, "learner-0").up(2.5, "learner-0", inc=1)
        b.up(3.0, "syncer-0", inc=1).add(3.1, "syncer-0", "link_up", peer="learner-0")
        return b.log()
    assert audits.membership_follows_links(log(shard_dies=True)).valid is True
    r = audits.membership_follows_links(log(shard_dies=False))
    assert r.valid is False and r.details["violations"][0]["up_again"] == 2.5
    def log(hello_at):
        b = _config(LogBuilder(learners=1))
        b.up(0.0, "learner-0").add(0.1, "learner-0", "link_up", peer="syncer-0")
        b.add(0.2, "learner-0", "recv", peer="syncer-0", msg="FragmentUpdate", fragment=0, version=0)
        for s in range(1, 12):
            b.step(float(s), "learner-0", s)
            b.add(s + 0.5, "learner-0", "recv", peer="syncer-0", msg="RoundOpen", fragment=0, version=s)
            if s == hello_at:
                b.add(s + 0.6, "learner-0", "send", peer="syncer-0", msg="Hello", bytes=10)
        return b.log()

    assert audits.starved_learners_reanchor(log(hello_at=5)).valid is True
    r = audits.starved_learners_reanchor(log(hello_at=None))  # RoundOpens answer nothing of its own
    assert r.valid is False and r.details["violations"][0]["step"] == 9


# --- deltas_reexecuted: a Δ against the steps it claims ---------------------------------------------------
def _delta_log(merged, progress=(-0.3, 0.1), c_steps=2, c_tokens=200, combined=None):
    """learner-0 steps 1..2 (100 tokens each) change fragment 0 by (+0.1, −0.05) then (+0.2, −0.05):
    its Δ is minus the sum, (−0.3, 0.1), claimed over steps 0 → 2. The shard merges `merged`."""
    b = _config(LogBuilder())
    b.up(0.0, "learner-0")
    b.step(1.0, "learner-0", 1)
    b.add(2.0, "learner-0", "contribute", fragment=0, seq=1, base_version=0, from_step=0, to_step=2, steps=2,
          tokens=200, progress=_b64(progress))
    b.step(2.0, "learner-0", 2)
    if combined:
        b.add(2.5, "learner-0", "contribute", fragment=0, seq=2, base_version=0, from_step=2, to_step=3, steps=1,
              tokens=100, progress=_b64(combined))
        b.step(2.5, "learner-0", 3)
        b.add(2.6, "syncer-0", "drop", what="contribution", fragment=0, learner="learner-0", incarnation=0, seq=1,
              reason="combined", by_seq=2)
    _merge(b, 3.0, "learner-0", 2 if combined else 1, 1, 0, 1.0, c_tokens=c_tokens, c_steps=c_steps)
    return _commit(b, 3.0, [1, 2], [1, 2], [merged], [1.0], digest=False).log()


def test_a_delta_is_rebuilt_from_the_steps_it_claims():
    assert audits.deltas_reexecuted(_delta_log([-0.3, 0.1])).valid is True
    # one more step's progress than claimed (the last Δ's steps sent again): (−0.5, 0.15)
    r = audits.deltas_reexecuted(_delta_log([-0.5, 0.15]))
    assert r.valid is False and "its steps 2 made" in r.details["violations"][0]["why"]
    # the right Δ with a claim of steps it was not made over (3 steps, 300 tokens)
    r = audits.deltas_reexecuted(_delta_log([-0.3, 0.1], c_steps=3, c_tokens=300))
    assert r.valid is False and "the steps it was made over are 2, with 200 tokens" in r.details["violations"][0]["why"]
    # a combine merges both Δs under the later seq: judged against both claims' steps
    ok = _delta_log([-0.4, 0.3], c_steps=3, c_tokens=300, combined=(-0.1, 0.2))
    assert audits.deltas_reexecuted(ok).valid is True
    # no record of the steps: UNKNOWN, not a pass
    b = _config(LogBuilder())
    b.add(2.0, "learner-0", "contribute", fragment=0, seq=1, base_version=0, from_step=0, to_step=2, steps=2,
          tokens=200, progress=None)
    _merge(b, 3.0, "learner-0", 1, 1, 0, 1.0, c_tokens=200, c_steps=2)
    assert audits.deltas_reexecuted(_commit(b, 3.0, [1, 2], [1, 2], [[-0.3, 0.1]], [1.0], digest=False).log()).valid is None
    # a lossy uplink: not applicable, said so
    lossy = _config(LogBuilder(), compression="int8")
    r = audits.deltas_reexecuted(lossy.log())
    assert r.valid is True and "not applicable" in r.details["why"]


def test_a_delta_that_took_two_combines_is_judged_against_all_three_claims():
    """A process run's shape (found on processes, a correct learner failed the check): seq 1
    (steps 0 → 2, Δ (−0.3, 0.1)) waits at the shard; seq 2 (2 → 3, (−0.1, 0.2)) waits in the
    learner's outbox and is summed into seq 3 (3 → 4, (0.05, 0.05)) there; the shard then sums
    seq 1 into seq 3 and merges (−0.35, 0.35) over 4 steps, 400 tokens. The judge counted one
    combine per merged seq and said "made over 3 steps, with 300 tokens"."""
    b = _config(LogBuilder())
    b.up(0.0, "learner-0")
    b.step(1.0, "learner-0", 1)
    b.add(2.0, "learner-0", "contribute", fragment=0, seq=1, base_version=0, from_step=0, to_step=2, steps=2,
          tokens=200, progress=_b64((-0.3, 0.1)))
    b.step(2.0, "learner-0", 2)
    b.add(2.5, "learner-0", "contribute", fragment=0, seq=2, base_version=0, from_step=2, to_step=3, steps=1,
          tokens=100, progress=_b64((-0.1, 0.2)))
    b.step(2.5, "learner-0", 3)
    b.add(2.7, "learner-0", "contribute", fragment=0, seq=3, base_version=0, from_step=3, to_step=4, steps=1,
          tokens=100, progress=_b64((0.05, 0.05)))
    b.add(2.71, "learner-0", "drop", what="contribution", fragment=0, learner="learner-0", incarnation=0, seq=2,
          reason="combined", by_seq=3, where="outbox")
    b.step(2.7, "learner-0", 4)
    b.add(2.8, "syncer-0", "drop", what="contribution", fragment=0, learner="learner-0", incarnation=0, seq=1,
          reason="combined", by_seq=3)
    _merge(b, 3.0, "learner-0", 3, 1, 0, 1.0, c_tokens=400, c_steps=4)
    log = _commit(b, 3.0, [1, 2], [1, 2], [[-0.35, 0.35]], [1.0], digest=False).log()
    r = audits.deltas_reexecuted(log)
    assert r.valid is True, r.to_dict()
    wrong = _commit(_merge(b, 3.0, "learner-0", 3, 1, 0, 1.0, c_tokens=400, c_steps=4), 3.0, [1, 2], [1, 2],
                    [[-0.4, 0.15]], [1.0], digest=False).log()  # seq 2's part left out
    assert audits.deltas_reexecuted(wrong).valid is False


def test_a_combined_delta_is_as_stale_as_its_oldest_part():
    """learner-0 sends seq 1 from version 0 and seq 2 from version 1; the shard sums them
    (drop seq 1 `combined` by seq 2) and merges the sum at version 3: its base is 0 (staleness
    2), whatever the newer part's. A merge line naming base 1 is the shard's mistake (found
    in a red-team pass: the outbox's combiner keeping the newer Δ's base weighs the sum as
    fresher, and the check took the shard's base on its word)."""
    def log(merged_base):
        b = LogBuilder()
        b.header["config"]["diloco"].update(weighting="uniform", staleness_discount=False)
        b.up(0.0, "learner-0").contribute(1.0, "learner-0", 1, 0, 2, base_version=0)
        b.contribute(2.0, "learner-0", 2, 2, 4, base_version=1)
        b.shard_drop(2.5, "learner-0", 1, "combined", by_seq=2)
        b.add(3.0, "syncer-0", "merge", fragment=0, version=3, learner="learner-0", incarnation=0, seq=2,
              base_version=merged_base, staleness=3 - 1 - merged_base, weight=1.0, c_steps=4, c_tokens=400)
        return b.log()

    assert audits.claimed_bases(log(0))[("learner-0", 0, 0, 2)] == 0
    good, bad = audits.weights_match_staleness(log(0)), audits.weights_match_staleness(log(1))
    assert good.valid is True and good.details["without_contribute_line"] == 0, good.to_dict()
    assert bad.valid is False and bad.details["violations"][0]["claimed_base"] == 0, bad.to_dict()


def test_progress_made_on_an_old_copy_is_as_stale_as_that_copy():
    """max_staleness 2 (bound 2 × 2 = 4). learner-0 holds Θ[0] at version 1, steps 1-3, and
    takes version 7 after step 3 (a starved link's answer); it steps 4-5 and sends steps 0 → 5
    claiming base 7. Merged at version 8 (into 7): steps 1-3 were made on version 1, 6 versions
    before: stale beyond 4, whatever the claimed base says (staleness 0). A learner that threw
    steps 1-3 away (its Δ claims 3 → 5 only) holds the bound; so does a take of version 4
    (3 versions: within the bound)."""
    def log(from_step=0, taken=7):
        b = _config(LogBuilder(), max_staleness=2)
        b.up(0.0, "learner-0").add(0.1, "learner-0", "copy", fragment=0, version=1, digest="a", via="whole")
        for s in (1, 2, 3):
            b.step(float(s), "learner-0", s)
        b.add(3.5, "learner-0", "copy", fragment=0, version=taken, digest="b", via="whole")
        b.step(4.0, "learner-0", 4).step(5.0, "learner-0", 5)
        b.contribute(5.5, "learner-0", 1, from_step, 5, base_version=taken)
        b.add(6.0, "syncer-0", "merge", fragment=0, version=taken + 1, learner="learner-0", incarnation=0, seq=1,
              base_version=taken, staleness=0, weight=1.0, c_steps=5 - from_step, c_tokens=100)
        return b.log()

    assert audits.made_on(log())[("learner-0", 0, 0, 1)] == 1
    bad = audits.progress_staleness_bounded(log())
    assert bad.valid is False and bad.details["violations"][0]["made_on"] == 1, bad.to_dict()
    assert bad.details["violations"][0]["claimed_base"] == 7 and bad.bound == 4
    thrown = audits.progress_staleness_bounded(log(from_step=3))
    assert thrown.valid is True and thrown.details["worst"] == 0, thrown.to_dict()
    near = audits.progress_staleness_bounded(log(taken=4))
    assert near.valid is True and near.details["worst"] == 3, near.to_dict()

    # a restarted life: its step lines count on from the restored step 50, its contribute
    # lines from 0 (the core's count): steps 1-2 of incarnation 1 were made on version 9
    b = _config(LogBuilder(), max_staleness=2)
    b.up(0.0, "learner-0").add(0.1, "learner-0", "copy", fragment=0, version=1, digest="a", via="whole")
    b.step(1.0, "learner-0", 1)
    b.up(5.0, "learner-0", inc=1, step=50).add(5.1, "learner-0", "copy", fragment=0, version=9, digest="c", via="whole")
    b.step(6.0, "learner-0", 51).step(7.0, "learner-0", 52)
    b.contribute(7.5, "learner-0", 1, 0, 2, base_version=9)
    b.add(8.0, "syncer-0", "merge", fragment=0, version=10, learner="learner-0", incarnation=1, seq=1,
          base_version=9, staleness=0, weight=1.0, c_steps=2, c_tokens=200)
    assert audits.made_on(b.log())[("learner-0", 1, 0, 1)] == 9
    assert audits.progress_staleness_bounded(b.log()).details["worst"] == 0
