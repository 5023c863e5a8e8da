"""The fault space CI explores reaches the weak spots (storms on every link, a long
one-way cut together with a kill or a shard crash, a long shard outage, SDC at several
sizes and signs), measured, not hoped: each weak spot's rate among the draws of the
strategies the CI property tests use (2,000 derandomized draws each, which take no
simulation), times those tests' examples under the ci profile, is the number of times one
CI run meets it. Each must be ≥ 2 (a CI run misses one with probability ≤ e⁻² ≈ 14 %;
every run draws afresh, so over a week of CI runs each is met many times); the figures
are printed (`pytest -s`) so a change to the strategies that starves one shows here
first. Measured when written: uniform draws alone met a storm on every link 1.0-1.9
times a run, hence `weak_spots` (faults/strategies.py) and its property test; now 4.2-15
a run, SDC 4.4-9 a run. The SDC the guard cannot see (×10, ×−1; ×100 on some draws) is
a fixed case in suites/properties/test_safety.py, and the sizes near the bound (×10 to
×100) are drawn by `near_bound_sdc` for a property of their own (every draw is one).
One-way cuts of one learner's links in each direction and crashes of learners and shards
early and late in the window are counted too (REACH_SPOTS).

The window is the property suites' (suites/properties/sim_cases.py WINDOW: 6.5 s, 3
learners, 2 shards); "long" is ≥ 2.5 s, over a third of it (24 cycles of the 300-step
staleness base are drawn by its own strategy, faults/strategies.py `link_faults`)."""
from __future__ import annotations

from collections import Counter

from hypothesis import HealthCheck, Phase, given, settings

from diloco_chaos.faults.schedule import LinkTarget
from diloco_chaos.faults.strategies import schedules, weak_spots
from diloco_chaos.harness.bench.sim import PROPERTY_WINDOW

DRAWS = 2000
LONG_S = 2.5


def _end(f) -> float:
    return f.at_s + (f.length_s if f.length_s is not None else 1e9)


def _overlap(a, b) -> bool:
    return a.at_s < _end(b) and b.at_s < _end(a)


def _every_link(f) -> bool:
    return f.target.startswith("link:") and LinkTarget.parse(f.target).every


WEAK_SPOTS = {
    "latency storm on every link": lambda fs: any(f.kind == "wan" and _every_link(f) and f.latency_ms >= 100 for f in fs),
    "bandwidth storm on every link": lambda fs: any(f.kind == "wan" and _every_link(f) and f.bandwidth_kbps is not None
                                                    and f.bandwidth_kbps <= 1000 for f in fs),
    "partition of every link": lambda fs: any(f.kind == "partition" and _every_link(f) for f in fs),
    "long one-way cut with a kill": lambda fs: any(
        c.kind == "partition" and c.direction != "both" and c.length_s >= LONG_S
        and any(k.kind in ("kill_unit", "kill_syncer") and _overlap(c, k) for k in fs) for c in fs),
    "long shard outage": lambda fs: any(f.kind == "kill_syncer" and f.length_s >= LONG_S for f in fs),
}
SDC_SPOTS = {
    "SDC ×1000": lambda fs: any(f.kind == "corrupt" and f.mode == "scale" and abs(f.factor) == 1000 for f in fs),
    "SDC sign flip (×−1000)": lambda fs: any(f.kind == "corrupt" and f.mode == "scale" and f.factor < 0 for f in fs),
    "SDC bit flips": lambda fs: any(f.kind == "corrupt" and f.mode == "bitflip" for f in fs),
    "SDC non-finite": lambda fs: any(f.kind == "corrupt" and f.mode == "nonfinite" for f in fs),
    "SDC with a kill": lambda fs: any(c.kind == "corrupt" and any(k.kind == "kill_unit" and _overlap(c, k) for k in fs)
                                      for c in fs),
}


def rates(strategy, spots: dict) -> dict[str, float]:
    hits, n = Counter(), [0]

    @settings(max_examples=DRAWS, derandomize=True, database=None, deadline=None, phases=[Phase.generate],
              suppress_health_check=list(HealthCheck))
    @given(strategy)
    def draw(schedule):
        n[0] += 1
        for name, hit in spots.items():
            hits[name] += bool(hit(schedule.faults))

    draw()
    return {name: hits[name] / n[0] for name in spots}


def _met(per_run: dict) -> None:
    print("\n".join(f"  {name}: {times:.1f} per CI run" for name, times in per_run.items()))
    starved = {name: round(times, 2) for name, times in per_run.items() if times < 2}
    assert not starved, f"weak spots a CI run meets fewer than twice: {starved}"


def test_ci_draws_reach_storms_long_cuts_with_kills_and_long_shard_outages():
    # suites/properties/test_safety.py: test_decoupled_is_safe_under_any_schedule (40) and its
    # two variants (20 each) draw uniformly, 80 examples a CI run (about 1-2 of each storm:
    # too few alone); test_decoupled_is_safe_at_the_weak_spots draws `weak_spots` (20)
    uniform = rates(schedules(PROPERTY_WINDOW, max_faults=5), WEAK_SPOTS)
    built = rates(weak_spots(PROPERTY_WINDOW), WEAK_SPOTS)
    _met({name: uniform[name] * 80 + built[name] * 20 for name in WEAK_SPOTS})


def test_ci_draws_reach_every_kind_of_sdc():
    # test_safety.py: test_the_guard_keeps_every_corrupt_contribution_out (60 examples)
    r = rates(schedules(PROPERTY_WINDOW, ("corrupt", "kill_unit", "partition", "slow_unit"), max_faults=4,
                        min_at_s=3.0), SDC_SPOTS)
    _met({name: rate * 60 for name, rate in r.items()})


# issue 53 item 7: what makes each defence and liveness rule work, met by CI's draws too
THIRD_S = PROPERTY_WINDOW.run_s / 3
REACH_SPOTS = {
    # on some links, not all: the other learners keep the rounds going
    "long one-way cut upstream (its Δs lost, its answers arrive)": lambda fs: any(
        f.kind == "partition" and f.direction == "upstream" and f.length_s >= LONG_S and not _every_link(f)
        for f in fs),
    "long one-way cut downstream (its Δs merged, no answer)": lambda fs: any(
        f.kind == "partition" and f.direction == "downstream" and f.length_s >= LONG_S and not _every_link(f)
        for f in fs),
    "learner killed early (first third)": lambda fs: any(f.kind == "kill_unit" and f.at_s < THIRD_S for f in fs),
    "learner killed late (last third)": lambda fs: any(f.kind == "kill_unit" and f.at_s >= 2 * THIRD_S for f in fs),
    "shard crashed early (first third)": lambda fs: any(f.kind == "kill_syncer" and f.at_s < THIRD_S for f in fs),
    "shard crashed late (last third)": lambda fs: any(f.kind == "kill_syncer" and f.at_s >= 2 * THIRD_S for f in fs),
    # the storage nemesis: a damaged checkpoint of each kind (checkpoint_integrity, restore_latest_intact)
    **{f"checkpoint damaged ({d})": (lambda d: lambda fs: any(f.kind == "corrupt_checkpoint" and f.damage == d
                                                               for f in fs))(d) for d in ("flip", "truncate", "manifest")},
}


def test_ci_draws_reach_one_way_cuts_both_ways_and_crashes_early_and_late():
    # the same 80 uniform + 20 weak-spot examples a CI run draws (above); a one-way cut
    # upstream exercises starved_learners_reanchor, downstream membership and the resend
    # rules; a late crash leaves no time to catch up (what the loss checks must then see)
    uniform = rates(schedules(PROPERTY_WINDOW, max_faults=5), REACH_SPOTS)
    built = rates(weak_spots(PROPERTY_WINDOW), REACH_SPOTS)
    _met({name: uniform[name] * 80 + built[name] * 20 for name in REACH_SPOTS})
