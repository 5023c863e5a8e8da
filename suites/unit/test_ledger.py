"""The token-fate ledger (harness/judging/ledger.py) on hand-made logs, the numbers worked out by
hand: every step trains 100 tokens; a fragment's share of a token is 1/P."""
from __future__ import annotations

import pytest

from diloco_chaos.harness.judging.ledger import ledger, tokens_conserved
from suites.unit.log_builder import LogBuilder


def steps(b: LogBuilder, unit: str, lo: int, hi: int, t0: float) -> None:
    for s in range(lo, hi + 1):
        b.step(t0 + s * 0.1, unit, s)


def two_learners() -> LogBuilder:
    """learner-0: 6 steps; seq 1 (steps 1-2) merged, seq 2 (3-4) dropped stale, 5-6 unsent
    at a clean end. learner-1: step 1 thrown away by a fetch, seq 1 (2-3) sent and never
    answered; killed; incarnation 1 restores step 2, seq 1 (3-4) merged, step 5 dies with it."""
    b = LogBuilder(learners=2)
    b.up(0.0, "syncer-0").up(0.0, "learner-0").up(0.0, "learner-1")
    b.contribute(0.21, "learner-0", 1, 0, 2, tokens=200).merge(0.3, "learner-0", 1, 2)
    b.contribute(0.41, "learner-0", 2, 2, 4, tokens=200).shard_drop(0.5, "learner-0", 2, "stale")
    steps(b, "learner-0", 1, 6, 0.0)
    b.add(0.7, "learner-0", "done", step=6, finished=True)
    b.discard(1.11, "learner-1", 1, 1, 100)
    b.contribute(1.31, "learner-1", 1, 1, 3, tokens=200)
    steps(b, "learner-1", 1, 3, 1.0)
    b.down(1.5, "learner-1").respawn(2.0, "learner-1")
    b.up(2.1, "learner-1", inc=1, step=2)
    # the core counts its steps from 0 in each incarnation: core steps 1-2 are steps 3-4
    b.contribute(2.41, "learner-1", 1, 0, 2, tokens=200).merge(2.5, "learner-1", 1, 2, inc=1)
    steps(b, "learner-1", 3, 5, 2.1)
    return b


def test_every_token_has_one_fate_and_the_fates_sum_to_the_tokens_trained():
    book = ledger(two_learners().log())
    l0, l1 = book["learners"]["learner-0"], book["learners"]["learner-1"]
    assert (l0["trained"], l0["merged"], l0["dropped"], l0["in_flight"], l0["lost"], l0["superseded"]) == \
        (600, 200, 200, 200, 0, 0)
    assert l0["why"]["dropped"] == {"stale": 200} and l0["why"]["in_flight"] == {"unsent_at_end": 200}
    # 300 trained by each incarnation: 100 superseded + 200 in flight; 200 merged + 100 lost
    assert (l1["trained"], l1["superseded"], l1["in_flight"], l1["merged"], l1["lost"]) == (600, 100, 200, 200, 100)
    assert l1["why"]["lost"] == {"dead_learner": 100} and l1["why"]["in_flight"] == {"pending_at_end": 200}
    assert book["total"] == {"trained": 1200, "merged": 400, "superseded": 100, "lost": 100, "dropped": 200,
                             "in_flight": 400}
    assert book["share"]["merged"] == 400 / 1200
    r = tokens_conserved(two_learners().log())
    assert r.valid is True and r.details["trained"] == 1200


def test_a_fragment_holds_one_pth_of_each_token():
    # P = 2: fragment 0 sends steps 1-2 (200), fragment 1 steps 1-4 (400), both merged;
    # fragment 0's steps 3-4 are unsent at the end: merged (200 + 400) / 2, in flight 200 / 2
    b = LogBuilder(learners=1, fragments=2)
    b.up(0.0, "syncer-0").up(0.0, "learner-0")
    b.contribute(0.21, "learner-0", 1, 0, 2, fragment=0, tokens=200).merge(0.3, "learner-0", 1, 2, fragment=0)
    b.contribute(0.41, "learner-0", 2, 0, 4, fragment=1, tokens=400).merge(0.5, "learner-0", 2, 4, fragment=1)
    steps(b, "learner-0", 1, 4, 0.0)
    b.add(0.6, "learner-0", "done", step=4, finished=True)
    row = ledger(b.log())["learners"]["learner-0"]
    assert (row["trained"], row["merged"], row["in_flight"]) == (400, 300, 100)


@pytest.mark.parametrize("last_line", [3, 2])
def test_the_step_lines_a_kill_cut_off_are_recovered_from_the_contribution_holding_them(last_line):
    # step 3's line waits for step 4; step 4's Δ leaves during step 4: a SIGKILL right after
    # the send takes step 4's line, or both (seen on docker, when the run's end killed units)
    b = LogBuilder(learners=1)
    b.up(0.0, "syncer-0").up(0.0, "learner-0")
    steps(b, "learner-0", 1, last_line, 0.0)
    b.contribute(0.41, "learner-0", 1, 0, 4, tokens=400).merge(0.5, "learner-0", 1, 4)
    b.down(0.6, "learner-0")
    row = ledger(b.log())["learners"]["learner-0"]
    assert (row["trained"], row["merged"], row["lost"]) == (400, 400, 0)
    assert tokens_conserved(b.log()).valid is True


def test_three_missing_lines_or_two_before_a_clean_end_are_a_violation():
    for last_line, clean in ((1, False), (2, True)):
        b = LogBuilder(learners=1)
        b.up(0.0, "syncer-0").up(0.0, "learner-0")
        steps(b, "learner-0", 1, last_line, 0.0)
        b.contribute(0.41, "learner-0", 1, 0, 4, tokens=400).merge(0.5, "learner-0", 1, 4)
        if clean:
            b.add(0.6, "learner-0", "done", step=4, finished=True)
        else:
            b.down(0.6, "learner-0")
        assert tokens_conserved(b.log()).valid is False, (last_line, clean)


def test_combined_contributions_are_merged_with_the_one_they_went_on_in():
    b = LogBuilder(learners=1)
    b.up(0.0, "syncer-0").up(0.0, "learner-0")
    b.contribute(0.21, "learner-0", 1, 0, 2, tokens=200)
    b.contribute(0.41, "learner-0", 2, 2, 4, tokens=200)
    b.shard_drop(0.45, "learner-0", 1, "combined", by_seq=2)
    b.merge(0.5, "learner-0", 2, 4)  # c_tokens 400: both Δs' tokens
    steps(b, "learner-0", 1, 4, 0.0)
    assert ledger(b.log())["learners"]["learner-0"]["merged"] == 400
    assert tokens_conserved(b.log()).valid is True


def test_lost_on_the_link_and_with_a_dead_shard():
    b = LogBuilder(learners=1)
    b.up(0.0, "syncer-0").up(0.0, "learner-0")
    b.contribute(0.21, "learner-0", 1, 0, 2, tokens=200)
    b.add(0.21, "learner-0", "drop", peer="syncer-0", bytes=0, msg="Contribution", learner="learner-0",
          incarnation=0, seq=1, fragment=0)
    b.contribute(0.41, "learner-0", 2, 2, 4, tokens=200)
    b.down(0.5, "syncer-0").up(0.9, "syncer-0", inc=1)  # it died holding seq 2
    steps(b, "learner-0", 1, 4, 0.0)
    why = ledger(b.log())["learners"]["learner-0"]["why"]["lost"]
    assert why == {"link": 200, "dead_shard": 200}


def test_tokens_conserved_fails_on_a_contribution_merged_twice():
    b = two_learners()
    b.merge(0.35, "learner-0", 1, 2)  # the merge_twice bug: the same seq in a second round
    r = tokens_conserved(b.log())
    assert r.valid is False and r.details["violations"][0]["kind"] == "merged_twice"


def test_tokens_conserved_fails_on_a_counter_claiming_other_tokens_than_its_steps():
    b = LogBuilder(learners=1)
    b.up(0.0, "syncer-0").up(0.0, "learner-0")
    b.contribute(0.21, "learner-0", 1, 0, 2, tokens=300).merge(0.3, "learner-0", 1, 3)  # 2 steps, 300 claimed
    steps(b, "learner-0", 1, 2, 0.0)
    r = tokens_conserved(b.log())
    assert r.valid is False
    assert r.details["violations"][0] == {"learner": "learner-0", "incarnation": 0, "fragment": 0,
                                          "kind": "contribute", "seq": 1, "steps": [1, 2], "claimed": 300,
                                          "trained": 200, "t": 0.21}


def test_tokens_conserved_fails_on_a_merge_counting_other_tokens_than_it_holds():
    b = LogBuilder(learners=1)
    b.up(0.0, "syncer-0").up(0.0, "learner-0")
    b.contribute(0.21, "learner-0", 1, 0, 2, tokens=200).merge(0.3, "learner-0", 1, 5)  # c_tokens 500
    steps(b, "learner-0", 1, 2, 0.0)
    r = tokens_conserved(b.log())
    assert r.valid is False and r.details["violations"][0]["kind"] == "merge_tokens"


def test_unknown_for_logs_from_before_the_ledger_and_dp_steps_are_merged():
    b = LogBuilder(learners=1)
    b.up(0.0, "syncer-0").up(0.0, "learner-0")
    b.contribute(0.21, "learner-0", 1, 0, 2).merge(0.3, "learner-0", 1, 2)
    steps(b, "learner-0", 1, 2, 0.0)
    assert tokens_conserved(b.log()).valid is None
    d = LogBuilder(mode="dp", learners=1)
    d.up(0.0, "learner-0")
    steps(d, "learner-0", 1, 3, 0.0)
    assert ledger(d.log())["learners"]["learner-0"]["merged"] == 300
    assert tokens_conserved(d.log()).valid is True


def test_a_delta_claiming_the_tokens_a_fetch_threw_away_fails():
    """Decoupled, keeping local progress: a Δ holds the steps from_step + 1 … to_step and
    must claim their tokens. The planted bug count_discarded does not reset the counter at a
    fetch (and writes no discard line): seq 1 holds steps 3-4 (200) and claims 400."""
    b = LogBuilder(learners=1)
    b.header["config"]["diloco"]["keep_local"] = True
    b.up(0.0, "syncer-0").up(0.0, "learner-0")
    steps(b, "learner-0", 1, 4, 0.0)
    b.contribute(0.41, "learner-0", 1, 2, 4, tokens=400).merge(0.5, "learner-0", 1, 4)
    r = tokens_conserved(b.log())
    assert r.valid is False and r.details["violations"][0]["steps"] == [3, 4]
    assert r.details["violations"][0]["claimed"] == 400 and r.details["violations"][0]["trained"] == 200
    fixed = LogBuilder(learners=1)  # the same run as the core writes it: a discard at the fetch
    fixed.header["config"]["diloco"]["keep_local"] = True
    fixed.up(0.0, "syncer-0").up(0.0, "learner-0")
    steps(fixed, "learner-0", 1, 4, 0.0)
    fixed.discard(0.21, "learner-0", 2, 2, 200)
    fixed.contribute(0.41, "learner-0", 1, 2, 4, tokens=200).merge(0.5, "learner-0", 1, 2)
    assert tokens_conserved(fixed.log()).valid is True
    row = ledger(fixed.log())["learners"]["learner-0"]
    assert (row["superseded"], row["merged"]) == (200, 200)
