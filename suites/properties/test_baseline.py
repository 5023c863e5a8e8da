"""An always-on bug is in the reference too: loss parity (a faulted run against a
fault-free run of the same code) cannot see it. The known-good baseline can
(harness/judging/baseline.py): the fault-free final loss of this property base, recorded
from trusted code and kept in harness/scenarios/baselines.json.

Planted bug `damped_outer` (the shard's outer step moves Θ by half the merged
pseudo-gradient, as a wrong normaliser would): fault-free the base ends at 0.62 where
known-good code ends at 0.406 (+53 %). Against its own fault-free reference a run with
the bug and a 10 s downstream cut is within the staleness suite's excess bound; against
the baseline it fails. Known-good code lands on the baseline (the simulator is
deterministic)."""
from __future__ import annotations

from diloco_chaos.faults.kinds import Partition
from diloco_chaos.harness.bench.sim import LEARNING_BASE
from diloco_chaos.harness.judging import baseline, losses
from diloco_chaos.harness.scenarios.scenario import scenario_from_dict
from test_staleness import LOSS_EXCESS, excess, link_case

BASE = scenario_from_dict(LEARNING_BASE)  # still learning at its end: a converged base forgives this bug

CUT = [Partition("link:learner-1", 5.0, duration_s=10.0, direction="downstream")]


def _judged(case):
    final, _ = losses.final_loss(case.log)
    return baseline.check(final, baseline.stored(BASE, "sim"))


def test_known_good_code_lands_on_its_baseline():
    assert baseline.stored(BASE, "sim") is not None, \
        f"no baseline for {baseline.key(BASE, 'sim')}: record one from trusted code (baseline.record)"
    r = _judged(link_case(base=BASE))
    assert r.valid is True and abs(r.value) < 1e-3, r


def test_an_always_on_bug_passes_parity_and_fails_the_baseline():
    bug = frozenset({"damped_outer"})
    reference, faulted = link_case(bugs=bug, base=BASE), link_case(CUT, bugs=bug, base=BASE)
    # its own reference has the bug too: judged against it, the cut costs what a cut costs
    assert excess(faulted) <= LOSS_EXCESS * excess(reference)
    for case in (reference, faulted):
        r = _judged(case)
        assert r.valid is False and r.value > 0.3, r  # +53 % over the known-good baseline
