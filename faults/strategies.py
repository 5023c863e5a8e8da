"""Hypothesis strategies for fault schedules, bounded by a run's shape.

    @given(schedules(RunShape(learners=4, run_s=10.0), kinds=("kill_unit", "partition")))
    def test_something(schedule): ...

Every schedule drawn is valid by construction: `faults.schedule.validate(schedule,
shape)` passes. Candidates are drawn one by one and a candidate that would clash
with the faults kept so far (the overlap table, slices left, the load cap) is left
out rather than rejected, so no example is ever thrown away.

Shrinking goes toward fewer, shorter, later and milder faults: the list shrinks
toward empty; a duration is drawn as a count of ticks above the minimum; a start
as a count of ticks *before the latest start*; a kind from the mildest one; a
speed toward 1, a bandwidth toward the highest, a latency toward the lowest, a
partition toward one direction, a kill toward coming back. Times are on a grid of
`tick_s` (default 0.1 s), so a shrunk schedule reads as round numbers in TOML.
"""
from __future__ import annotations

import math
from typing import Sequence

try:
    from hypothesis import strategies as st
except ImportError as e:  # an optional part (the property tests' and `bench sim`'s)
    raise ImportError(f"fault-schedule strategies need hypothesis ({e}); "
                      "install it with: pip install 'diloco-chaos[properties]'") from None

from diloco_chaos.faults.failures import FailureProcess
from diloco_chaos.faults.kinds import FAULT_KINDS, Corrupt, Fault, KillSyncer, KillUnit, Partition, Wan
from diloco_chaos.faults.kinds.partition import MILDEST_FIRST as DIRECTIONS
from diloco_chaos.faults.schedule import RunShape, Schedule, validate


def kind_order() -> tuple[str, ...]:
    """Every registered kind, in the order the strategies sample from: the kinds drawn by
    default (`drawn_by_default`), then those drawn only where a property names them; in each,
    by `severity`, mildest first (Hypothesis shrinks a sampled kind toward the front), the
    kinds without one after, in the registry's order (faults/kinds/__init__.py)."""
    def rank(kind: str) -> tuple:
        cls = FAULT_KINDS[kind]
        return not cls.drawn_by_default, cls.severity is None, cls.severity or 0

    return tuple(sorted(FAULT_KINDS, key=rank))  # sorted() is stable: ties keep the registry's order


def drawn_kinds() -> tuple[str, ...]:
    """The kinds a strategy draws where no kinds are given: every registered one that says
    `drawn_by_default` (a kind added as a module is drawn too, after the ranked ones)."""
    return tuple(k for k in kind_order() if FAULT_KINDS[k].drawn_by_default)


# as they stand once the built-in kinds are registered (the property suites read them)
KINDS = drawn_kinds()
ALL_KINDS = kind_order()
# the weak spots `weak_spots` builds a schedule around (suites/unit/test_fault_space.py)
WEAK_SPOTS = ("latency_storm", "bandwidth_storm", "partition_storm", "long_cut_with_kill", "long_shard_outage")


def _ticks(lo_s: float, hi_s: float, tick_s: float) -> tuple[int, int]:
    return math.ceil(lo_s / tick_s - 1e-9), math.floor(hi_s / tick_s + 1e-9)


def _seconds(ticks: int, tick_s: float) -> float:
    # ticks / (1 / tick_s) keeps 0.1-grids exact in repr (37 / 10 = 3.7, 37 * 0.1 = 3.7000000000000006)
    return ticks / round(1 / tick_s) if 1 / tick_s == round(1 / tick_s) else ticks * tick_s


@st.composite
def wan_settings(draw, max_latency_ms: int = 200, min_bandwidth_kbps: int = 64) -> dict:
    """A WAN profile's keywords (`bandwidth_kbps`, `latency_ms`, `jitter_ms`), for
    faults.kinds.Wan and the harness's LinkProfile alike; at least one of bandwidth
    and latency is set. Shrinks toward 0 ms latency, no jitter, the highest bandwidth."""
    latency = draw(st.integers(0, max_latency_ms))
    jitter = draw(st.integers(0, latency // 2))
    steps = 8  # bandwidth: 1 Gbit/s down to min_bandwidth_kbps over powers of two
    top = 1_000_000
    k = draw(st.integers(0 if latency else 1, steps))  # 0 = unlimited
    bandwidth = None if k == 0 else max(min_bandwidth_kbps, top >> (2 * k))
    return {"bandwidth_kbps": None if bandwidth is None else float(bandwidth),
            "latency_ms": float(latency), "jitter_ms": float(jitter)}


@st.composite
def faults(draw, shape: RunShape, kinds: Sequence[str] | None = None, *, min_at_s: float = 0.0,
           max_at_s: float | None = None, min_duration_s: float = 0.5, max_duration_s: float = 5.0,
           tick_s: float = 0.1, never: bool = False) -> Fault:
    """One fault of `kinds` (default: `drawn_kinds()`) in `shape`, starting in [min_at_s, max_at_s] (default: the
    run's end), lasting [min_duration_s, max_duration_s]; `never`: a kill_unit may
    never come back. It is valid on its own (not against other faults)."""
    kinds = drawn_kinds() if kinds is None else kinds
    known = kind_order()
    usable = [k for k in known if k in kinds and FAULT_KINDS[k].fits(shape)]
    if not usable:
        raise ValueError(f"no fault kind of {list(kinds)} fits {shape}; valid: {', '.join(known)}")
    kind = draw(st.sampled_from(usable))
    target = draw(st.sampled_from(shape.targets(FAULT_KINDS[kind].roles)))
    lo, hi = _ticks(min_at_s, shape.run_s if max_at_s is None else max_at_s, tick_s)
    hi = min(hi, math.ceil(shape.run_s / tick_s) - 1)  # strictly before the end
    at = _seconds(hi - draw(st.integers(0, max(0, hi - lo))), tick_s)  # shrinks toward later
    dlo, dhi = _ticks(min_duration_s, max_duration_s, tick_s)
    length = _seconds(dlo + draw(st.integers(0, max(0, dhi - dlo))), tick_s)  # toward shorter
    return FAULT_KINDS[kind].draw(draw, shape, target, at, length, never=never)


def unit_seconds(f: Fault, shape: RunShape, until_s: float | None = None, recovery_s: float = 0.0) -> float:
    """How much learner time `f` takes away, in learner-seconds up to `until_s` (default:
    the run's end), each hit also losing `recovery_s` (a restart, a reconnect, the local
    progress a fetch overwrites): its kind's `learner_seconds` (faults/kinds/): a kill or
    pause the whole unit's, a slow one (1 − speed) of it, a lost slice its share, a syncer
    kill or a link fault every learner it cuts off; a wan fault 0 (it slows traffic, not
    learners)."""
    end = shape.run_s if until_s is None else until_s
    span = max(0.0, min(end, math.inf if f.end_s is None else f.end_s) - f.at_s)
    span += recovery_s if span > 0 else 0.0
    return f.learner_seconds(span, shape)


def fault_load(fs: Sequence[Fault], shape: RunShape, until_s: float | None = None, recovery_s: float = 0.0) -> float:
    """The share of all learner time the faults take away (see `unit_seconds`), in [0, ...)."""
    end = shape.run_s if until_s is None else until_s
    return sum(unit_seconds(f, shape, end, recovery_s) for f in fs) / (shape.learners * end)


def _fits(f: Fault, kept: list[Fault], shape: RunShape) -> bool:
    try:
        validate([*kept, f], shape)
    except ValueError:
        return False
    return True


@st.composite
def schedules(draw, shape: RunShape, kinds: Sequence[str] | None = None, *, max_faults: int = 4,
              max_load: float | None = None, **fault_kw) -> Schedule:
    """A valid schedule of up to `max_faults` faults (see `faults` for the keywords);
    `max_load` caps `fault_load` (a fault that would pass it is left out)."""
    kept: list[Fault] = []
    for f in draw(st.lists(faults(shape, kinds, **fault_kw), max_size=max_faults)):
        if _fits(f, kept, shape) and (max_load is None or fault_load([*kept, f], shape) <= max_load):
            kept.append(f)
    return Schedule(tuple(kept))


@st.composite
def weak_spots(draw, shape: RunShape, *, max_others: int = 2, long_s: float = 2.5, tick_s: float = 0.1) -> Schedule:
    """A schedule built around one weak spot of the protocol, where a uniform draw rarely
    goes (measured: a CI run of the uniform properties met a storm on every link about
    once): a latency, bandwidth or partition storm on every link, a long one-way cut of
    one learner with a kill of a unit or a shard inside it, or a long shard outage
    (`long_s` and more); then up to `max_others` faults of any kind that fit beside it."""
    spot = draw(st.sampled_from(WEAK_SPOTS))
    run_ticks = math.ceil(shape.run_s / tick_s) - 1

    def span(lo_s: float, hi_s: float) -> tuple[float, float]:  # (at, length), inside the run
        lo, hi = _ticks(lo_s, min(hi_s, shape.run_s - tick_s), tick_s)
        length = lo + draw(st.integers(0, max(0, hi - lo)))
        return _seconds(draw(st.integers(0, max(0, run_ticks - length))), tick_s), _seconds(length, tick_s)

    if spot == "latency_storm":
        at, length = span(1.0, 4.0)
        latency = draw(st.integers(100, 400))
        core = [Wan("link:*", at, duration_s=length, latency_ms=float(latency),
                    jitter_ms=float(draw(st.integers(0, latency // 2))))]
    elif spot == "bandwidth_storm":
        at, length = span(1.0, 4.0)
        core = [Wan("link:*", at, duration_s=length, bandwidth_kbps=float(draw(st.sampled_from([64, 256, 1000]))))]
    elif spot == "partition_storm":
        at, length = span(0.5, 3.0)
        core = [Partition("link:*", at, duration_s=length, direction=draw(st.sampled_from(DIRECTIONS)))]
    elif spot == "long_cut_with_kill":
        at, length = span(long_s, 2 * long_s)
        cut = Partition(f"link:{draw(st.sampled_from(shape.units))}", at, duration_s=length,
                        direction=draw(st.sampled_from(DIRECTIONS[:2])))
        k_at = _seconds(_ticks(at, at + length, tick_s)[0] + draw(st.integers(0, _ticks(0, length - tick_s, tick_s)[1])),
                        tick_s)
        down = _seconds(_ticks(0.5, 3.0, tick_s)[0] + draw(st.integers(0, 25)), tick_s)
        kill = (KillSyncer(draw(st.sampled_from(shape.syncers)), k_at, down_for_s=down) if draw(st.booleans())
                else KillUnit(draw(st.sampled_from(shape.units)), k_at, down_for_s=down))
        core = [cut] + ([kill] if _fits(kill, [cut], shape) else [])
    else:  # long_shard_outage
        at, length = span(long_s, 2 * long_s)
        core = [KillSyncer(draw(st.sampled_from(shape.syncers)), at, down_for_s=length)]
    kept = [f for f in core]
    for f in draw(st.lists(faults(shape), max_size=max_others)):
        if _fits(f, kept, shape):
            kept.append(f)
    return Schedule(tuple(kept))


NEAR_BOUND_FACTORS = (10.0, -10.0, 30.0, 100.0, -100.0)  # inside, at and past the guard's 30x history bound


@st.composite
def near_bound_sdc(draw, shape: RunShape, *, max_others: int = 2, tick_s: float = 0.1) -> Schedule:
    """Silent data corruption at the sizes the guard's Θ-size bound does not already stop
    (x10 to x100, either sign: a Δ a few to a hundred times its honest size), on one learner
    for 1-2.5 s (several of its Δs: the guard's history sees the corrupt ones too), from 3 s
    (after the guard's warm-up), with up to `max_others` kills, shard crashes or partitions
    that fit beside it. The uniform draws' SDC is x1000 (faults/kinds/corrupt.py SDC_FACTORS),
    which the Θ-size bound alone keeps out."""
    run_ticks = math.ceil(shape.run_s / tick_s) - 1
    length = draw(st.integers(10, 25))
    at = draw(st.integers(30, max(30, run_ticks - length)))
    sdc = Corrupt(draw(st.sampled_from(shape.units)), _seconds(at, tick_s), duration_s=_seconds(length, tick_s),
                  factor=draw(st.sampled_from(NEAR_BOUND_FACTORS)))
    kept = [sdc]
    for f in draw(st.lists(faults(shape, ("kill_unit", "kill_syncer", "partition"), min_at_s=2.0),
                           max_size=max_others)):
        if _fits(f, kept, shape):
            kept.append(f)
    return Schedule(tuple(kept))


@st.composite
def failure_processes(draw, shape: RunShape, *, min_mtbi_s: float = 60.0, max_mtbi_s: float = 3600.0,
                      max_repair_s: float = 10.0, mixes: Sequence[str] = ("llama3",)) -> FailureProcess:
    """A seeded failure process for `shape` (its draw is valid: FailureProcess.draw drops
    clashes). Shrinks toward the longest mtbi (fewest interruptions), the shortest repair,
    seed 0 and a start at the run's end."""
    mtbi = max_mtbi_s / 2 ** draw(st.integers(0, max(0, int(math.log2(max_mtbi_s / min_mtbi_s)))))
    repair = 0.5 + draw(st.integers(0, max(0, int((max_repair_s - 0.5) * 2)))) / 2
    mix = draw(st.sampled_from(list(mixes) + ["kinds"]))
    if mix == "kinds":
        kinds = draw(st.lists(st.sampled_from(["kill_unit", "pause_unit", "slow_unit", "partition", "reset"]),
                              min_size=1, max_size=3, unique=True))
        mix = tuple((k, 1.0) for k in kinds)
    start = math.floor(shape.run_s) - draw(st.integers(0, max(0, math.floor(shape.run_s) - 1)))
    return FailureProcess(mtbi_s=mtbi, chips_per_unit=draw(st.integers(1, 8)), repair_s=repair, mix=mix,
                          seed=draw(st.integers(0, 2**16)), start_s=float(start))


@st.composite
def link_faults(draw, shape: RunShape, cycle_s: float, *, kinds: Sequence[str] = ("wan", "partition"),
                min_cycles: int = 4, max_cycles: int = 24, max_latency_cycles: int = 8,
                tick_s: float = 0.1) -> Schedule:
    """One fault on one learner's links, sized in fragment cycles (`cycle_s` seconds: H
    inner steps), the regime where staleness shows: a one-way or two-way partition, or a
    starved link (latency up to `max_latency_cycles` cycles each way, bandwidth down to
    64 bytes per cycle). Shrinks toward the shortest, mildest fault on one link."""
    learner = draw(st.integers(0, shape.learners - 1))
    one = draw(st.integers(0, shape.shards))  # shards: every link of the learner
    target = f"link:learner-{learner}" + ("" if one == shape.shards else f"~syncer-{one}")
    length = _seconds(round(draw(st.integers(min_cycles, max_cycles)) * cycle_s / tick_s), tick_s)
    latest = max(0.0, shape.run_s - length)
    at = _seconds(round(draw(st.floats(0.0, 1.0)) * latest / tick_s), tick_s)
    if draw(st.sampled_from(tuple(kinds))) == "partition":
        return Schedule((Partition(target, at, duration_s=length, direction=draw(st.sampled_from(DIRECTIONS))),))
    latency_ms = float(round(draw(st.integers(0, max_latency_cycles)) * cycle_s * 1000 / 2))
    per_cycle = draw(st.sampled_from((None, 1 << 16, 4096, 1024, 256, 64)))  # bytes per cycle, None: no cap
    kbps = None if per_cycle is None else max(8.0, round(per_cycle * 8 / cycle_s / 1000, 1))
    if kbps is None and not latency_ms:
        latency_ms = float(round(cycle_s * 1000))
    return Schedule((Wan(target, at, duration_s=length, bandwidth_kbps=kbps, latency_ms=latency_ms),))
