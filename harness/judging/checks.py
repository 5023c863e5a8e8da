"""Checks: judging a run's event log afterwards, in Jepsen's shape (checker.clj).

A check is a pure function `log -> Result` (metrics-based ones take `Metrics`); a
Result says valid True / False / None ("unknown": the log cannot tell), with the
observed value, the bound it was held to and details (the first offending lines).
`compose` merges results: any False makes it False, else any None makes it None.

    results = safety_checks(log, metrics) + expect_checks({"goodput_min": 0.8}, metrics)
    compose(results).valid

Safety checks: merged_at_most_once, progress_merged_once, delta_bases_advance, versions_monotonic, no_nan,
durable_rounds_kept, no_global_downtime, global_loss_regression, link_buffers_bounded,
tokens_conserved (harness/judging/ledger.py), staleness_bounded (the model's: harness/judging/model_checks.py).
Exact definitions: docs/METRICS.md.
"""
from __future__ import annotations

import json
import math
from collections import Counter
from dataclasses import asdict

# the Result vocabulary (check_base.py) and the checks on what reached the model
# (model_checks.py) live beside this file
from diloco_chaos.faults.overlaps import LinkTarget
from diloco_chaos.faults.kinds import FAULT_KINDS
from diloco_chaos.harness.judging.audits import audit_checks
from diloco_chaos.harness.judging.storage import storage_checks
from diloco_chaos.harness.judging.check_base import SHOW, Result, _judge, _shards, resumed, shard_lives
from diloco_chaos.harness.eventlog import EventLog
from diloco_chaos.harness.intervals import clip, intersect, minus, norm
from diloco_chaos.harness.judging.history import histories, learner_names, window
from diloco_chaos.harness.judging.ledger import tokens_conserved
from diloco_chaos.harness.judging.metrics import Metrics, commit_gaps
from diloco_chaos.harness.judging.pace import pace
from diloco_chaos.harness.judging.model_checks import (END_MAX, RISE_MAX, delta_bases_advance, global_loss_regression,
                                          link_buffers_bounded, progress_merged_once, staleness_bounded)

# --- safety ------------------------------------------------------------------------------------


def merged_at_most_once(log: EventLog) -> Result:
    """No (learner, incarnation, seq, fragment) in two `merge` lines, on any shard and across
    shard restarts. One exception: a merge whose round the shard lost in a crash (its next
    incarnation restored a lower version of that fragment) may be merged again."""
    first: dict[tuple, tuple] = {}
    bad, relost = [], []
    for shard in _shards(log):
        lives = shard_lives(log, shard)
        went_on = [resumed(lives, k) for k in range(len(lives))]
        for j, life in enumerate(lives):
            for e in life.events:
                if e["kind"] != "merge":
                    continue
                key = (e["learner"], e["incarnation"], e["seq"], e["fragment"])
                if key not in first:
                    first[key] = (shard, j, e)
                    continue
                s0, j0, e0 = first[key]
                lost = s0 == shard and any(went_on[k].get(e["fragment"], 0) < e0["version"]
                                           for k in range(j0 + 1, j + 1))
                (relost if lost else bad).append({"key": list(key), "t": e["t"], "shard": shard,
                                                  "versions": [e0["version"], e["version"]]})
                first[key] = (shard, j, e)
    return _judge("merged_at_most_once", bad, merges=len(log.of("merge")), remerged_after_loss=relost[:SHOW])


def versions_monotonic(log: EventLog) -> Result:
    """Per shard incarnation and fragment, every merge and round_commit carries version
    last + 1 (a commit then makes it the last); an incarnation starts from the versions its
    checkpoint_restored names, else from 0, and a `repaired` line makes its version the last
    (whether that repair was faithful is committed_rounds_kept's to judge)."""
    bad = []
    for shard in _shards(log):
        for life in shard_lives(log, shard):
            last = dict(life.restored or {})
            for e in life.events:
                if e["kind"] == "repaired":
                    last[int(e["fragment"])] = int(e["version"])
                if e["kind"] not in ("merge", "round_commit"):
                    continue
                p, want = e["fragment"], last.get(e["fragment"], 0) + 1
                if e["version"] != want:
                    bad.append({"shard": shard, "incarnation": life.n, "fragment": p, "kind": e["kind"],
                                "version": e["version"], "expected": want, "t": e["t"]})
                if e["kind"] == "round_commit":
                    last[p] = e["version"]
    return _judge("versions_monotonic", bad)


def no_nan(log: EventLog) -> Result:
    """Every loss in `step` and `eval` lines is a finite number."""
    bad = [{"src": e["src"], "kind": e["kind"], "step": e.get("step"), "loss": str(e.get("loss")), "t": e["t"]}
           for e in log.of("step", "eval")
           if not isinstance(e.get("loss"), (int, float)) or not math.isfinite(e["loss"])]
    return _judge("no_nan", bad, losses=len(log.of("step", "eval")))


def durable_rounds_kept(log: EventLog) -> Result:
    """After a shard restart, every fragment's restored version (0 if it restored nothing)
    is ≥ the highest version that shard logged durable before: in a checkpoint_saved line,
    or restored earlier — except what only a save the harness damaged on disk held
    (`checkpoint_damaged`, corrupt_checkpoint: that save is gone; the newest intact one is
    owed)."""
    damaged_at: dict[tuple[str, int], float] = {}  # (shard, save) -> when the harness first damaged it
    for e in log.of("checkpoint_damaged", src="harness"):
        if e.get("step") is not None:
            key = (e["unit"], int(e["step"]))
            damaged_at[key] = min(damaged_at.get(key, e["t"]), e["t"])
    bad, restarts = [], 0
    for shard in _shards(log):
        held: list[tuple[float, int | None, dict]] = []  # (when, save number, versions) made durable
        for e in log.events:
            if e["src"] == shard and e["kind"] in ("checkpoint_saved", "checkpoint_restored") and "versions" in e:
                number = e.get("number") if e["kind"] == "checkpoint_saved" else e.get("step")
                held.append((e["t"], None if number is None else int(number),
                             {int(p): int(v) for p, v in e["versions"].items()}))
        for life in shard_lives(log, shard):
            if life.n < 1:
                continue
            restarts += 1
            t0 = life.events[0]["t"]
            durable: dict[int, int] = {}
            for t, number, versions in held:
                if t >= t0:
                    continue
                if damaged_at.get((shard, number), float("inf")) < t0:
                    continue
                for p, v in versions.items():
                    durable[p] = max(durable.get(p, 0), v)
            got = life.restored or {}
            for p, v in sorted(durable.items()):
                if got.get(p, 0) < v:
                    bad.append({"shard": shard, "incarnation": life.n, "fragment": p,
                                "restored": got.get(p, 0), "durable": v})
    return _judge("durable_rounds_kept", bad, restarts=restarts)


LINK_FAULTS = tuple(k for k, c in FAULT_KINDS.items() if c.cuts_link)  # partition, reset, truncate, ...


def quorum_k(log: EventLog) -> int:
    d, m = log.config["diloco"], len(learner_names(log))
    return {"decoupled": int(d.get("quorum", 1)), "elastic_dp": 1}.get(d["mode"], m)


# A learner slowed below this speed is not counted ready by no_global_downtime: its own
# clock runs at `speed`, so its fragment cycle is 1/speed longer (0.15: a 0.6 s cycle takes
# 4 s), and the bound is set for units at speed. At 0.5 a cycle is at most twice as long,
# inside the bound (found by a CI draw: the one reachable unit slowed to 0.15, K = 1).
SLOW_READY = 0.5


def reachable(log: EventLog, settle_s: float) -> list[tuple[float, float]]:
    """When ≥ K learners could contribute and a shard could merge: a learner counts from
    settle_s after its incarnation's first step line to its end (killed, or still running
    at t_end; one that finished its steps: its last step line), not while
    paused, nor while a partition / reset / truncate fault is on one of its links, nor
    while it is slowed below SLOW_READY (a slow_unit fault; settle_s after each); a shard
    from settle_s after its unit_up to its unit_down."""
    t0, t1 = window(log)
    hs = histories(log, t1)
    faults: dict = {}  # fault id -> [start, end, fault]
    for e in log.of("fault_start", "fault_end", src="harness"):
        f = e.get("fault") or {}
        slowed = f.get("kind") == "slow_unit" and float(f.get("speed", 1.0)) < SLOW_READY
        if (f.get("kind") in LINK_FAULTS or slowed) and e["kind"] == "fault_start":
            faults[e["id"]] = [e["t"], t1, f]
        elif e.get("id") in faults:
            faults[e["id"]][1] = e["t"]
    names = learner_names(log)
    ready = []
    for name in names:
        h = hs.get(name)
        if h is None:
            continue
        up = [(i.steps[0]["t"] + settle_s, i.steps[-1]["t"] if i.done else i.end_t) for i in h.incs if i.steps]
        cut = [(a, b + settle_s) for a, b, f in faults.values()
               if (f.get("target") == name if f.get("kind") == "slow_unit"
                   else LinkTarget.parse(f.get("target", "")).reaches(name))]
        ready.append(minus(up, norm(h.dead + h.paused + cut)))
    lives = [i for s in _shards(log) if s in hs for i in hs[s].incs]
    shards = norm((i.up_t + settle_s, i.end_t) for i in lives) if lives else [(t0, t1)]  # no lines: up
    k, points = quorum_k(log), []
    for iv in ready:
        points += [(a, 1) for a, _ in iv] + [(b, -1) for _, b in iv]
    out, count, since = [], 0, None
    for t, d in sorted(points):
        count += d
        if count >= k and since is None:
            since = t
        elif count < k and since is not None:
            out.append((since, t))
            since = None
    return intersect(clip(out, t0, t1), shards)


def throttled(log: EventLog) -> list[tuple[float, float, float]]:
    """When too few learners had a fast link for a round to commit at the run's pace:
    (from, to, crossing_s) for each fault that set a link's bandwidth or latency (`wan`,
    `latency_spike`: the harness's fault_start / fault_end lines) on the links of more than
    M − K learners, with crossing_s the time the largest Δ the learners sent (their
    Contribution `send` lines' bytes) needs over it: bytes × 8 / bandwidth, plus the
    latency and jitter both ways. `to` is the heal plus that time (a Δ sent just before
    the heal still crosses at the old rate)."""
    t0, t1 = window(log)
    names, k = learner_names(log), quorum_k(log)
    size = max((int(e.get("bytes") or 0) for e in log.of("send") if e.get("msg") == "Contribution"), default=0)
    spans: dict = {}
    for e in log.of("fault_start", "fault_end", src="harness"):
        f = e.get("fault") or {}
        if e["kind"] == "fault_start" and ("bandwidth_kbps" in f or "latency_ms" in f) and f.get("kind") not in LINK_FAULTS:
            hit = sum(1 for n in names if LinkTarget.parse(f.get("target", "")).reaches(n))
            if len(names) - hit < k:
                kbps = float(f.get("bandwidth_kbps") or 0)
                wire = size * 8 / (kbps * 1000) if kbps > 0 else 0.0
                crossing = wire + 2 * (float(f.get("latency_ms") or 0) + float(f.get("jitter_ms") or 0)) / 1000
                spans[e["id"]] = [e["t"], t1, crossing]
        elif e["kind"] == "fault_end" and e.get("id") in spans:
            spans[e["id"]][1] = e["t"]
    return [(a, min(b + c, t1), c) for a, b, c in spans.values()]


def no_global_downtime(log: EventLog, bound_s: float | None = None, settle_s: float | None = None) -> Result:
    """No stretch longer than bound_s (default: the uptime gap bound, its floor scaled by the
    run's measured pace: harness/judging/pace.py) without a round_commit on any shard while
    a quorum was reachable (see `reachable`; settle_s defaults to bound_s). A stretch that
    overlaps a slowed WAN on too many learners' links (`throttled`) may be longer by the
    time a Δ needs to cross it: no round can commit before its first Δ arrives (the
    built-in wan-brownout: 181 kB Δs over 250 kbit/s, 5.8 s, where the run's own gaps
    gave a bound of 1 s)."""
    t0, t1 = window(log)
    paced = pace(log)
    commits, gap_bound = commit_gaps(log, paced["pace"])
    bound = gap_bound if bound_s is None else bound_s
    q = reachable(log, bound if settle_s is None else settle_s)
    slow = throttled(log)
    edges = [t0] + [c for c in commits if t0 < c < t1] + [t1]
    worst, bad = 0.0, []
    for a, b in zip(edges, edges[1:]):
        longest = max((y - x for x, y in intersect([(a, b)], q)), default=0.0)
        worst = max(worst, longest)
        extra = max((c for x, y, c in slow if x < b and a < y), default=0.0)
        if longest > bound + extra:
            bad.append({"from_s": a - t0, "to_s": b - t0, "reachable_s": longest, **({"crossing_s": extra} if extra else {})})
    r = _judge("no_global_downtime", bad, bound, k=quorum_k(log), reachable_s=sum(y - x for x, y in q),
               pace=paced["pace"], bound_at_reference_pace_s=commit_gaps(log)[1] if bound_s is None else bound,
               throttled=[{"from_s": x - t0, "to_s": y - t0, "crossing_s": c} for x, y, c in slow][:SHOW])
    return Result(r.name, r.valid, worst, bound, r.details)


def safety_checks(log: EventLog, metrics: Metrics | None = None, *, max_staleness: int | None = None,
                  downtime_bound_s: float | None = None, rise_max: float | None = None,
                  end_max: float | None = None) -> list[Result]:
    """Every safety check; staleness_bounded only when a bound is given (it has no default).
    rise_max / end_max: global_loss_regression's bounds (None: RISE_MAX / END_MAX)."""
    out = [merged_at_most_once(log), progress_merged_once(log), delta_bases_advance(log), versions_monotonic(log),
           no_nan(log),
           durable_rounds_kept(log), no_global_downtime(log, downtime_bound_s),
           global_loss_regression(log, RISE_MAX if rise_max is None else rise_max,
                                  END_MAX if end_max is None else end_max,
                                  allowance=(metrics.reference_rise or 0.0) if metrics is not None else 0.0),
           link_buffers_bounded(log), tokens_conserved(log), *audit_checks(log), *storage_checks(log)]
    if max_staleness is not None:
        out.append(staleness_bounded(log, max_staleness))
    return out


# --- expectations (a scenario's [expect] table) -------------------------------------------------


def _at_least(name: str, value, bound) -> Result:
    return Result(name, None if value is None else value >= bound, value, bound)


def _at_most(name: str, value, bound) -> Result:
    return Result(name, None if value is None else value <= bound, value, bound)


def _parity(m: Metrics, bound: float) -> Result:
    """The final loss within `bound` of the fault-free reference's, judged on the paired
    interval of the parity: PASS when its upper end is ≤ bound, FAIL when its lower end is
    over, UNKNOWN in between (the eval cannot tell). Two-sided: a faulted run whose whole
    interval lies more than `bound` *below* its fault-free reference FAILs as suspect (a
    run cannot gain that much from faults: a reference that broke, another eval, or a run
    that trained on more than its budget). A log without batch losses (written before
    they existed) is judged on the point value, and says so."""
    if m.loss_parity is None:
        return Result("loss_parity_max", None, None, bound)
    ci = m.loss_parity_ci
    low, high = (m.loss_parity, m.loss_parity) if ci is None else ci
    if high < -bound:
        return Result("loss_parity_max", False, m.loss_parity, bound,
                      {"ci": ci, "why": f"suspect: {-high:.1%} or more below its fault-free reference, "
                                        f"more than the bound {bound:.1%}"})
    if ci is None:
        return Result("loss_parity_max", m.loss_parity <= bound, m.loss_parity, bound,
                      {"why": "no per-batch eval losses on both sides: judged on the point value"})
    valid = True if ci[1] <= bound else (False if ci[0] > bound else None)
    return Result("loss_parity_max", valid, m.loss_parity, bound, {"ci": ci})


def _recovery(m: Metrics, bound_raw: float) -> Result:
    """Each restart's recovery_s ≤ bound, the bound × the run's measured pace (a restart's
    boot is CPU-bound work: harness/judging/pace.py). A restart that never recovered fails
    when the run went on ≥ bound after it, or when it crashed (it never will); closer to
    the end it is unknown (censored)."""
    bound = bound_raw * m.pace
    if not m.recovery:
        return Result("recovery_max_s", None, None, bound,
                      {"why": "no restart in this run", "pace": m.pace, "bound_raw_s": bound_raw})
    late = [asdict(r) for r in m.recovery if r.recovery_s is not None and r.recovery_s > bound]
    never = [asdict(r) for r in m.recovery if r.recovery_s is None and (r.crashed or m.duration_s - r.t_s >= bound)]
    censored = [asdict(r) for r in m.recovery
                if r.recovery_s is None and not r.crashed and m.duration_s - r.t_s < bound]
    valid = False if late or never else (None if censored else True)
    return Result("recovery_max_s", valid, m.recovery_max_s, bound,
                  {"late": late, "never": never, "censored": censored, "pace": m.pace, "bound_raw_s": bound_raw})


def _goodput(m: Metrics, bound: float) -> Result:
    """Goodput ≥ bound, judged on `goodput_paced`: the run's goodput with its CPU-bound
    badput off the protocol (startup, recovery, other) at the reference machine's pace
    (harness/judging/pace.py); the same as the raw goodput at pace 1 and in the simulator."""
    value = m.goodput if m.goodput_paced is None else m.goodput_paced
    return Result("goodput_min", value >= bound, value, bound, {"goodput_raw": m.goodput, "pace": m.pace})


def _rejoin(m: Metrics, bound: float) -> Result:
    """Each restart's first merged contribution went out within `bound` fragment cycles
    (H inner steps each) of its first step: the design's rejoin claim, in steps, so the
    machine's speed does not enter. A restart never merged fails once it ran a cycle past
    the bound (time for the commit to land), or once it crashed; before that it is unknown
    (censored)."""
    if not m.recovery:
        return Result("rejoin_cycles_max", None, None, bound, {"why": "no restart in this run"})
    late = [asdict(r) for r in m.recovery if r.rejoin_cycles is not None and r.rejoin_cycles > bound]
    unmerged = [r for r in m.recovery if r.rejoin_steps is None]
    ran_out = [r.crashed or bool(r.sync_every and r.steps_run > (bound + 1) * r.sync_every) for r in unmerged]
    never = [asdict(r) for r, out in zip(unmerged, ran_out) if out]
    censored = [asdict(r) for r, out in zip(unmerged, ran_out) if not out]
    valid = False if late or never else (None if censored else True)
    return Result("rejoin_cycles_max", valid, m.rejoin_cycles_max, bound,
                  {"late": late, "never": never, "censored": censored})


EXPECT = {
    "goodput_min": _goodput,
    "uptime_min": lambda m, b: _at_least("uptime_min", m.uptime, b),
    "loss_parity_max": _parity,
    "recovery_max_s": _recovery,
    "rejoin_cycles_max": _rejoin,
    # mean learners merged per committed round (unknown when nothing was committed)
    "participation_min": lambda m, b: _at_least("participation_min", (m.participation or {}).get("mean"), b),
}


def expect_checks(expect: dict, metrics: Metrics) -> list[Result]:
    """One Result per threshold set in `expect` (None = not checked); a missing metric
    (loss parity without a reference run, recovery without a restart) gives valid None."""
    unknown = sorted(set(expect) - set(EXPECT))
    if unknown:
        raise ValueError(f"expect: unknown key(s) {unknown}; valid: {sorted(EXPECT)}")
    return [EXPECT[k](metrics, v) for k, v in expect.items() if v is not None]


def verdict(log: EventLog, metrics: Metrics, expect: dict | None, *, lenient: bool = False) -> list[Result]:
    """Every check of one run, for the runner's summary and a report alike: the safety
    checks; the scenario's `expect` thresholds (None: not judged; lenient: an expect table
    this version cannot read is left out instead of raising, as for a log of another
    version); `no_crash` when the log's header says which processes crashed (a log
    without that entry, e.g. a hand-made one, is not judged on it); and `faults_applied`
    when the header holds the schedule."""
    results = safety_checks(log, metrics)
    if expect is not None:
        try:
            results += expect_checks(expect, metrics)
        except ValueError:
            if not lenient:
                raise
    for extra in (no_crash(log), faults_applied(log)):
        if extra is not None:
            results.append(extra)
    return results


def faults_applied(log: EventLog) -> Result | None:
    """Every fault of the run's schedule happened (the harness's `fault_start` lines against the
    schedule in the log's header). A run that ended at its token budget before a fault was due
    did not test what it was asked to: UNKNOWN, not a pass (`--allow-unknown faults_applied`
    accepts it), naming the faults that never started. None for a log without a schedule."""
    schedule = log.header.get("schedule")
    if schedule is None:
        return None
    left = Counter(json.dumps(f, sort_keys=True) for f in schedule)
    for e in log.of("fault_start", src="harness"):
        key = json.dumps(e.get("fault"), sort_keys=True)
        if left[key]:
            left[key] -= 1
    missing = [json.loads(k) for k, n in left.items() for _ in range(n)]
    applied = len(schedule) - len(missing)
    if not missing:
        return Result("faults_applied", True, applied, len(schedule))
    ends = log.header.get("t_end"), log.header.get("t_start")
    run_s = ends[0] - ends[1] if None not in ends else None
    return Result("faults_applied", None, applied, len(schedule), {
        "not_applied": missing[:SHOW], "run_s": run_s,
        "why": f"{len(missing)} of the {len(schedule)} scheduled faults never started: the run ended first "
               "(it ends at its token budget: raise train.steps to keep it running through the schedule)"})


def no_crash(log: EventLog) -> Result | None:
    """No unit died of its own error: the harness's record of the processes that exited
    non-zero without a fault (the simulator's of incarnations an exception ended). None for
    a log whose header keeps no such record (a hand-made one)."""
    crashes = log.header.get("crashes")
    if crashes is None:
        return None
    return Result("no_crash", not crashes, len(crashes), 0, {"crashes": crashes})


def faults_note(summary: dict) -> str | None:
    """Says so when scheduled faults never happened (the run ended first), else None."""
    n, k = summary.get("faults_scheduled"), summary.get("faults_applied")
    if n is None or k is None or k >= n:
        return None
    run_s = summary.get("run_s")
    when = f" after {run_s:.0f} s" if isinstance(run_s, (int, float)) else ""
    return (f"only {k} of the {n} scheduled faults happened: the run ended{when}, before the others "
            "were due (it ends at its token budget; raise train.steps to keep it running through "
            "the schedule)")


def stop_note(summary: dict) -> str | None:
    """Says so when units were SIGKILLed at the run's end, their grace after the SIGTERM spent
    (LocalCluster.record_stop), else None: not a crash, but what a unit does on a stop (a
    learner's closing contribution into Θ, its final save) is missing from the run's end."""
    kills = summary.get("stop_kills") or []
    if not kills:
        return None
    who = ", ".join(f"{k['unit']} (incarnation {k['incarnation']})" for k in kills)
    grace = max(k["grace_s"] for k in kills)
    return (f"{who} did not leave within {grace:g} s of the run's SIGTERM and {'was' if len(kills) == 1 else 'were'} "
            "SIGKILLed: what a unit does on a stop (a learner's closing contribution, its final save) is missing "
            "from the run's end (a unit still starting cannot act on the signal)")
