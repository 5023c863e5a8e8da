"""Metrics of one run, computed from its event log only (DESIGN.md "Metrics and checks").

    m = compute(eventlog.read(run_dir), reference=eventlog.read(ref_dir))
    m.goodput, m.badput, m.uptime, m.recovery, m.loss_parity, m.to_dict()

Pure functions of the log: nothing here reads process internals, files or clocks.
Exact definitions, and what they miss, are in docs/METRICS.md; the short form:

Every learner's window [t_start, t_end] is split, without overlap, into productive
time and badput buckets (goodput + the badput fractions sum to 1). Spans, each minus
the ones before it:
- dead: harness `unit_down` (killed / rollback / exited) → the next `unit_up`; a process
  replaced by a new incarnation without such a line is dead from the last line it wrote.
- paused: `unit_down` reason paused → `unit_up` reason resumed.
- startup: the unit becoming available (t_start, or its restart) → its first step.
- finished: the last step of an incarnation whose `done` says finished → t_end.
- recovery (DiLoCo modes): a restart → the incarnation's first `merge`, less the
  productive step time inside it. Per restart (`Recovery`) it splits into boot (restart →
  first step) and rejoin (first step → first merge, also in inner steps and fragment
  cycles of H steps: the design's "contributing again within one fragment cycle").
- waiting_on_sync: `blocked` on → off (dp without such lines: the gaps between steps).
Step time (dt, less what of [t − dt, t] fell outside the window, in a dead / paused
span or in waiting_on_sync: a dp learner's dt spans its whole iteration, wait included):
- DiLoCo modes: productive for fragment p when a `merge` of (learner, incarnation,
  seq, p) covers the step (the merge's c_steps steps up to the step that sent seq):
  dt × (merged share of the P fragments) is productive; stale for p when the covering
  merge's staleness exceeded the run's `diloco.max_staleness` (> 0), or when a shard
  dropped that contribution with reason stale (the send's c_steps steps up to it): that
  share goes to `stale`; the rest lost (or recovery).
- dp modes: steps an incarnation logged beyond a later incarnation's start step are
  rolled_back, the rest productive.
- other: the remainder (between steps: eval, checkpoint saves, loop overhead).
"""
from __future__ import annotations

import math
import statistics
from collections import Counter, defaultdict
from dataclasses import asdict, dataclass

from diloco_chaos.harness.eventlog import EventLog
from diloco_chaos.harness.intervals import clip, measure, minus, norm
from diloco_chaos.harness.judging.history import (UnitHistory, first_step_start, fragment_count, histories,
                                                 learner_names, step_lag, window)
from diloco_chaos.harness.judging.losses import batch_losses, excess_loss_ratio, final_loss, loss_floor, mean_ci, parity_ci
from diloco_chaos.harness.judging.ledger import ledger
from diloco_chaos.harness.judging.model_checks import global_loss_regression
from diloco_chaos.harness.judging.pace import pace
from diloco_chaos.harness.judging.participation import participation
from diloco_chaos.harness.judging.recovery import first_merges, recoveries
from diloco_chaos.trainer.protocol.protocol_base import DP_MODES

BADPUT = ("startup", "waiting_on_sync", "rolled_back", "lost", "stale", "recovery", "paused", "dead", "finished",
          "other")
# A commit gap above max(floor, GAP_FACTOR × median gap) is downtime. The floor is 1 s in
# virtual time (the sim) and 2 s on real processes, which share this machine's cores: a
# replacement unit's boot (Python, JAX, a restore, a compile) starves the others. Measured
# on docker syncer-crash runs: commit gaps up to 0.50 s here and 1.03 s on the CI machine,
# inside the restarted shard's boot, with every contribution sent in time (the syncer was
# not scheduled); a protocol stall (a round that cannot form) lasts until the fault ends.
GAP_FACTOR, GAP_MIN_S, GAP_MIN_WALL_S = 3.0, 1.0, 2.0
RATE_WINDOW_S = 1.0
# badput that is CPU-bound work off the protocol: a slower or busier machine makes it
# longer by its pace (the units' start and restarts, evals and saves between steps)
PACED_BADPUT = ("startup", "recovery", "other")

# --- goodput and badput -----------------------------------------------------------------------


def max_staleness(log: EventLog) -> int:
    """The run's staleness bound (`diloco.max_staleness`, versions of a fragment); 0 = none."""
    return int((log.config.get("diloco") or {}).get("max_staleness") or 0)


def stale_drops(log: EventLog) -> set[tuple]:
    """(learner, incarnation, seq, fragment) of every contribution a shard dropped as too stale."""
    return {(e.get("learner"), e.get("incarnation"), e.get("seq"), e.get("fragment")) for e in log.of("drop")
            if e.get("reason") == "stale" and str(e.get("what", e.get("msg", ""))).lower() == "contribution"}


def coverage(log: EventLog, hs: dict[str, UnitHistory], lag: int) -> dict[tuple, set]:
    """(learner, incarnation, step) -> the fragments whose merged contributions include it
    (within the staleness bound, see `covered`)."""
    return covered(log, hs, lag)[0]


def covered(log: EventLog, hs: dict[str, UnitHistory], lag: int) -> tuple[dict[tuple, set], dict[tuple, set]]:
    """((learner, incarnation, step) -> fragments whose contribution covering the step was
    merged within the staleness bound, same key -> fragments whose contribution was merged
    past the bound or dropped as stale). A merge covers its c_steps steps up to the step
    that sent the contribution; a stale drop the send's own c_steps."""
    bound = max_staleness(log)
    merged: dict[tuple, dict] = {}
    fresh: set[tuple] = set()
    for e in log.of("merge"):
        key = (e["learner"], e["incarnation"], e["seq"], e["fragment"])
        merged[key] = e
        if not (bound and e.get("staleness") is not None and int(e["staleness"]) > bound):
            fresh.add(key)
    dropped = stale_drops(log)
    good: dict[tuple, set] = defaultdict(set)
    stale: dict[tuple, set] = defaultdict(set)
    for name, h in hs.items():
        for inc in h.incs:
            for e, before in inc.sends:
                if e["msg"] != "Contribution":
                    continue
                key = (name, e.get("incarnation", inc.n), e.get("seq"), e.get("fragment"))
                m = merged.get(key)
                if m is not None:
                    n, into = int(m["c_steps"]), (good if key in fresh else stale)
                elif key in dropped:
                    n, into = int(e.get("c_steps") or 0), stale
                else:
                    continue
                k = inc.start_step + before + 1 + lag  # the step that sent it
                for s in range(max(inc.start_step + 1, k - n + 1), k + 1):
                    into[(name, inc.n, s)].add(e["fragment"])
    return good, stale


def rolled_back(h: UnitHistory) -> set[tuple[int, int]]:
    """dp: (incarnation, step) of steps a later incarnation started below (it rolled them back)."""
    out, floor = set(), math.inf
    for inc in reversed(h.incs):
        out |= {(inc.n, e["step"]) for e in inc.steps if e["step"] > floor}
        floor = min(floor, inc.start_step)
    return out


def learner_time(h: UnitHistory, t0: float, t1: float, *, dp: bool, lag: int, share, first_merge,
                 stale_share=None) -> dict:
    """Seconds of [t0, t1] in each bucket for one learner (see the module docstring).
    share(unit, incarnation, step): the productive share of a step's time; stale_share: the
    share that went into too stale contributions (none if not given)."""
    dead = clip(h.dead, t0, t1)
    paused = minus(clip(h.paused, t0, t1), dead)
    gone = norm(dead + paused)
    startup, fin, recov, blocked = [], [], [], []
    for i, inc in enumerate(h.incs):
        avail = t0 if i == 0 else inc.restart_t
        first = first_step_start(inc, lag)
        startup.append((avail, max(avail, inc.end_t if first is None else first)))
        if inc.done:
            fin.append((inc.steps[-1]["t"] if inc.steps else inc.end_t, t1))
        if not dp and inc.n >= 1:
            recov.append((inc.restart_t, first_merge.get((h.unit, inc.n), inc.end_t)))
        if inc.blocked or not dp:
            blocked += inc.blocked
        else:  # dp without blocked lines: the gaps between applied steps
            blocked += [(a["t"], b["t"] - b["dt"]) for a, b in zip(inc.steps, inc.steps[1:])]
    if not h.incs:
        startup.append((t0, t1))
    if h.unborn is not None:  # respawned and never came up: booting to the end
        startup.append((h.unborn[0], t1))
    taken = list(gone)  # each bucket is what is left after the ones before it

    def bucket(iv):
        out = minus(clip(iv, t0, t1), taken)
        taken.extend(out)
        return out

    startup, fin, recov, waiting = bucket(startup), bucket(fin), bucket(recov), bucket(blocked)
    rb = rolled_back(h) if dp else set()
    # dp logs a step's dt over the whole iteration, the wait for the mean included
    not_stepping = norm(gone + waiting)
    sec = dict.fromkeys(("productive",) + BADPUT, 0.0)
    stepped_in_recovery = 0.0  # productive and stale step time inside recovery windows
    for inc in h.incs:
        for e in inc.steps:
            dt = measure(minus(clip([(e["t"] - e["dt"], e["t"])], t0, t1), not_stepping))
            if dp:
                sec["rolled_back" if (inc.n, e["step"]) in rb else "productive"] += dt
                continue
            good = dt * share(h.unit, inc.n, e["step"])
            late = dt * stale_share(h.unit, inc.n, e["step"]) if stale_share else 0.0
            sec["productive"] += good
            sec["stale"] += late
            if any(a <= e["t"] <= b for a, b in recov):
                stepped_in_recovery += good + late
            else:
                sec["lost"] += max(0.0, dt - good - late)
    sec.update(dead=measure(dead), paused=measure(paused), startup=measure(startup), finished=measure(fin),
               waiting_on_sync=measure(waiting), recovery=max(0.0, measure(recov) - stepped_in_recovery))
    # startup is estimated from the first step line; where estimates overlap, the remainder
    # would go negative: take it back from the estimated buckets so the sum stays exact
    deficit = sum(sec.values()) - (t1 - t0)
    for k in ("startup", "recovery", "waiting_on_sync"):
        take = min(max(deficit, 0.0), sec[k])
        sec[k] -= take
        deficit -= take
    sec["other"] = max(0.0, -deficit)
    return sec


# --- uptime ------------------------------------------------------------------------------------


def commit_gaps(log: EventLog, pace: float = 1.0) -> tuple[list[float], float]:
    """Sorted round_commit times (every shard) and the downtime bound max(floor × pace,
    3 × median gap); the floor: 2 s on real processes (the log's tier "cluster"), else 1 s.
    The floor is CPU-bound work off the protocol (a replacement's boot starving the others),
    so it is scaled by the run's measured pace (harness/judging/pace.py); the median gap
    is the run's own and needs no scaling."""
    ts = sorted(e["t"] for e in log.of("round_commit"))
    gaps = [b - a for a, b in zip(ts, ts[1:])]
    floor = (GAP_MIN_WALL_S if log.header.get("tier") == "cluster" else GAP_MIN_S) * pace
    return ts, max(floor, GAP_FACTOR * statistics.median(gaps)) if gaps else floor


# --- the record --------------------------------------------------------------------------------


@dataclass(frozen=True)
class LinkBytes:
    learner: str
    shard: str
    up_bytes: int                # learner → shard (the learner's send lines)
    down_bytes: int              # shard → learner (the learner's recv lines)
    mean_Bps: float
    peak_Bps: float              # busiest RATE_WINDOW_S window from t_start, both directions


@dataclass(frozen=True)
class Metrics:
    mode: str
    learners: int
    fragments: int
    t_start: float
    t_end: float
    duration_s: float
    allocated_s: float
    productive_s: float
    goodput: float
    badput_s: dict
    badput: dict                 # fractions of allocated_s; with goodput they sum to 1
    learner_goodput: dict
    uptime: float
    uptime_s: float
    commit_gap_bound_s: float
    downtime: tuple              # (from_s, to_s) gaps between commits above the bound
    recovery: tuple              # of Recovery
    recovery_max_s: float | None
    rejoin_cycles_max: float | None  # the largest Recovery.rejoin_cycles
    recovery_cycles_median: float | None  # the median Recovery.recovery_cycles (restart → first merge, in cycles)
    final_loss: float | None
    final_loss_from: str | None  # "global" (the harness's eval of Θ) or "learners"
    reference_loss: float | None
    loss_parity: float | None
    loss_parity_ci: list | None  # paired bootstrap 95 % interval of loss_parity (harness/judging/losses.py)
    final_loss_ci: list | None   # bootstrap 95 % interval of final_loss over its eval batches
    excess_loss_ratio: float | None  # (L − floor) / (L_ref − floor)
    loss_floor: float | None
    floor_gap: float | None
    links: tuple                 # of LinkBytes
    bytes_total: int
    mean_Bps: float
    peak_Bps: float
    bytes_per_token: float | None
    staleness_hist: dict
    staleness_max: int | None
    staleness_mean: float | None
    steps: int
    tokens: int
    merges: int
    commits: int
    dropped: dict                # contributions dropped, by reason
    restarts: int                # every unit (learners and shards)
    step_lag: int
    participation: dict | None = None  # learners merged per committed round (harness/judging/participation.py)
    ledger: dict | None = None  # the token-fate ledger: where each learner's tokens went (harness/judging/ledger.py)
    # the run's measured pace (harness/judging/pace.py): 1.0 in the simulator and at or above
    # the reference machine's; the units' cold start it was measured from
    pace: float = 1.0
    pace_start_s: float | None = None
    # goodput with the CPU-bound badput off the protocol (startup, recovery, other) at the
    # reference pace: what goodput_min judges (the raw goodput beside it)
    goodput_paced: float | None = None
    # how late the shards read the learners' Δs: a Contribution's `send` line at its learner to
    # its `recv` line at the shard, in seconds (median, p90, max, n). A shard that falls behind
    # its learners (CPU-bound) shows here before it shows in the loss (docs/BENCHMARKS.md)
    uplink_lag_s: dict | None = None
    # the fault-free reference's own worst judged rise of its global loss (the value of its
    # global_loss_regression): how much the training rises without faults, which this
    # run's global_loss_regression allows on top of its bound (None: no reference)
    reference_rise: float | None = None

    def to_dict(self) -> dict:
        d = asdict(self)
        d["staleness_hist"] = {str(k): v for k, v in sorted(self.staleness_hist.items())}
        d["downtime"] = [list(g) for g in self.downtime]
        return d


def _median(xs: list) -> float | None:
    return statistics.median(xs) if xs else None


def _bandwidth(log: EventLog, learners: set, t0: float, t1: float):
    dur = max(t1 - t0, 1e-9)
    per = defaultdict(lambda: [0, 0, Counter()])
    total = Counter()
    for e in log.of("send", "recv"):
        if e["src"] not in learners or not e.get("bytes") or not t0 <= e["t"] <= t1:
            continue
        row = per[(e["src"], e["peer"])]
        row[0 if e["kind"] == "send" else 1] += int(e["bytes"])
        w = int((e["t"] - t0) // RATE_WINDOW_S)
        row[2][w] += int(e["bytes"])
        total[w] += int(e["bytes"])
    links = tuple(LinkBytes(a, b, up, down, (up + down) / dur, max(w.values(), default=0) / RATE_WINDOW_S)
                  for (a, b), (up, down, w) in sorted(per.items()))
    return links, sum(total.values()), max(total.values(), default=0) / RATE_WINDOW_S


def compute(log: EventLog, reference: EventLog | None = None) -> Metrics:
    t0, t1 = window(log)
    dur = max(t1 - t0, 0.0)
    mode = log.config["diloco"]["mode"]
    dp = mode in DP_MODES
    names = learner_names(log)
    P = fragment_count(log)
    hs = histories(log, t1)
    lag = step_lag(hs)
    cover, late = covered(log, hs, lag)
    firsts = first_merges(log)

    def share(unit, n, step):
        return len(cover.get((unit, n, step), ())) / P

    def stale_share(unit, n, step):  # a fragment merged fresh for the step is not stale for it
        return len(late.get((unit, n, step), set()) - cover.get((unit, n, step), set())) / P

    per = {n: learner_time(hs.get(n, UnitHistory(n)), t0, t1, dp=dp, lag=lag, share=share,
                           first_merge=firsts, stale_share=stale_share) for n in names}
    alloc = len(names) * dur
    sec = {k: sum(p[k] for p in per.values()) for k in ("productive",) + BADPUT}

    paced = pace(log)
    commits, bound = commit_gaps(log, paced["pace"])
    up = clip([(a, b) for a, b in zip(commits, commits[1:]) if b - a <= bound], t0, t1)
    down = tuple((a - t0, b - t0) for a, b in zip(commits, commits[1:]) if b - a > bound)

    recs = recoveries(log, {n: hs[n] for n in names if n in hs}, lag, t0, firsts)
    done = [r.recovery_s for r in recs if r.recovery_s is not None]

    loss, loss_from = final_loss(log)
    ref = final_loss(reference)[0] if reference is not None else None
    ref_rise = global_loss_regression(reference).value if reference is not None else None
    floor = loss_floor(log.header)

    links, total_bytes, peak = _bandwidth(log, set(names), t0, t1)
    steps = [e for e in log.of("step") if e["src"] in names]
    tokens = sum(int(e.get("tokens") or 0) for e in steps)
    window_tokens = sum(int(e.get("tokens") or 0) for e in steps if t0 <= e["t"] <= t1)
    merges = log.of("merge")
    stale = Counter(int(e["staleness"]) for e in merges if e.get("staleness") is not None)
    dropped = Counter(
        e.get("reason") or "not_sent" for e in log.of("drop")
        if str(e.get("what", e.get("msg", ""))).lower() in ("contribution", "gradstep"))

    return Metrics(
        mode=mode, learners=len(names), fragments=P, t_start=t0, t_end=t1, duration_s=dur,
        allocated_s=alloc, productive_s=sec["productive"],
        goodput=sec["productive"] / alloc if alloc else 0.0,
        badput_s={k: sec[k] for k in BADPUT}, badput={k: (sec[k] / alloc if alloc else 0.0) for k in BADPUT},
        learner_goodput={n: (p["productive"] / dur if dur else 0.0) for n, p in per.items()},
        uptime=measure(up) / dur if dur else 0.0, uptime_s=measure(up), commit_gap_bound_s=bound,
        downtime=down, recovery=recs, recovery_max_s=max(done) if done else None,
        rejoin_cycles_max=max((r.rejoin_cycles for r in recs if r.rejoin_cycles is not None), default=None),
        recovery_cycles_median=_median([r.recovery_cycles for r in recs if r.recovery_cycles is not None]),
        final_loss=loss, final_loss_from=loss_from, reference_loss=ref,
        loss_parity=(loss - ref) / ref if loss is not None and ref else None,
        loss_parity_ci=parity_ci(batch_losses(log), batch_losses(reference) if reference is not None else None),
        final_loss_ci=mean_ci(batch_losses(log)) if loss_from == "global" else None,
        excess_loss_ratio=excess_loss_ratio(loss, ref, floor),
        loss_floor=floor, floor_gap=None if loss is None or floor is None else loss - floor,
        links=links, bytes_total=total_bytes, mean_Bps=total_bytes / dur if dur else 0.0, peak_Bps=peak,
        bytes_per_token=total_bytes / window_tokens if window_tokens else None,
        staleness_hist=dict(stale), staleness_max=max(stale) if stale else None,
        staleness_mean=(sum(k * v for k, v in stale.items()) / sum(stale.values())) if stale else None,
        steps=len(steps), tokens=tokens, merges=len(merges), commits=len(commits), dropped=dict(dropped),
        restarts=sum(1 for h in hs.values() for inc in h.incs if inc.n >= 1), step_lag=lag,
        participation=participation(log), ledger=ledger(log), uplink_lag_s=uplink_lag(log), reference_rise=ref_rise,
        pace=paced["pace"], pace_start_s=paced["start_s"],
        goodput_paced=(sec["productive"] + sum(sec[k] for k in PACED_BADPUT) * (1 - 1 / paced["pace"])) / alloc
        if alloc else 0.0)


def uplink_lag(log: EventLog) -> dict | None:
    """{median, p90, max, n} of the seconds from a learner's `send` of a Contribution to the
    shard's `recv` of it (one host's clock: a multi-host run's clocks may differ); None
    without such pairs."""
    sent = {(e["src"], e.get("incarnation"), e["seq"]): e["t"] for e in log.of("send")
            if e.get("msg") == "Contribution" and "seq" in e}
    lags = sorted(e["t"] - sent[k] for e in log.of("recv") if e.get("msg") == "Contribution"
                  and (k := (e.get("learner"), e.get("incarnation"), e.get("seq"))) in sent)
    if not lags:
        return None
    return {"median": round(lags[len(lags) // 2], 4), "p90": round(lags[int(0.9 * (len(lags) - 1))], 4),
            "max": round(lags[-1], 4), "n": len(lags)}
