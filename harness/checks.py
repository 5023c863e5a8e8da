"""Checks: judging a run's event log afterwards, in Jepsen's shape (checker.clj).

A check is a pure function `log -> Result` (metrics-based ones take `Metrics`); a
Result says valid True / False / None ("unknown": the log cannot tell), with the
observed value, the bound it was held to and details (the first offending lines).
`compose` merges results: any False makes it False, else any None makes it None.

    results = safety_checks(log, metrics) + expect_checks({"goodput_min": 0.8}, metrics)
    compose(results).valid

Safety checks: merged_at_most_once, progress_merged_once, versions_monotonic, no_nan,
durable_rounds_kept, no_global_downtime, global_loss_regression, staleness_bounded.
Exact definitions: docs/METRICS.md.
"""
from __future__ import annotations

import math
from dataclasses import asdict, dataclass, field
from typing import Any, Iterable

from harness.eventlog import EventLog
from harness.history import (DP_MODES, clip, histories, intersect, is_process_up, learner_names, minus, norm,
                             window)
from harness.metrics import Metrics, commit_gaps

SHOW = 10  # offending lines kept in details


@dataclass(frozen=True)
class Result:
    name: str
    valid: bool | None
    value: Any = None
    bound: Any = None
    details: dict = field(default_factory=dict)

    def to_dict(self) -> dict:
        return asdict(self)


def compose(results: Iterable[Result], name: str = "all") -> Result:
    rs = list(results)
    failed = [r.name for r in rs if r.valid is False]
    unknown = [r.name for r in rs if r.valid is None]
    valid = False if failed else (None if unknown else True)
    return Result(name, valid, value=len(failed), bound=0,
                  details={"failed": failed, "unknown": unknown, "checks": [[r.name, r.valid] for r in rs]})


def _judge(name: str, bad: list, bound=0, **details) -> Result:
    return Result(name, not bad, len(bad), bound, {"violations": bad[:SHOW], **details})


# --- shard incarnations ------------------------------------------------------------------------


@dataclass
class ShardLife:
    n: int                      # incarnation (-1: lines before any unit_up)
    restored: dict | None       # {fragment: version} of its checkpoint_restored, None = fresh
    events: list


def shard_lives(log: EventLog, shard: str) -> list[ShardLife]:
    """A shard's lines cut at its own unit_up lines. A checkpoint_restored belongs to the
    incarnation whose unit_up follows it (trainer/syncer.py restores, then logs unit_up),
    or to the current one if it comes after its unit_up and before its first round."""
    lives = [ShardLife(-1, None, [])]
    pending, ended = None, False
    for e in log.events:
        if e["src"] != shard:
            continue
        if is_process_up(e):
            lives.append(ShardLife(int(e["incarnation"]), pending, [e]))
            pending, ended = None, False
        elif e["kind"] == "checkpoint_restored":
            v = {int(p): int(x) for p, x in (e.get("versions") or {}).items()}
            cur = lives[-1]
            if (cur.n >= 0 and not ended and cur.restored is None
                    and not any(x["kind"] in ("merge", "round_commit") for x in cur.events)):
                cur.restored = v
            else:
                pending = v
        else:
            if e["kind"] == "unit_down" and e.get("reason") != "paused":
                ended = True
            lives[-1].events.append(e)
    return lives if lives[0].events else lives[1:]


def _shards(log: EventLog) -> list[str]:
    topo = (log.header.get("topology") or {}).get("shards") or {}
    learners = set(learner_names(log))
    seen = {e["src"] for e in log.of("merge", "round_commit", "checkpoint_saved", "checkpoint_restored")
            if e["src"] not in learners and e["src"] != "harness"}
    return sorted(set(topo) | seen)


# --- safety ------------------------------------------------------------------------------------


def merged_at_most_once(log: EventLog) -> Result:
    """No (learner, incarnation, seq, fragment) in two `merge` lines, on any shard and across
    shard restarts. One exception: a merge whose round the shard lost in a crash (its next
    incarnation restored a lower version of that fragment) may be merged again."""
    first: dict[tuple, tuple] = {}
    bad, relost = [], []
    for shard in _shards(log):
        lives = shard_lives(log, shard)
        for j, life in enumerate(lives):
            for e in life.events:
                if e["kind"] != "merge":
                    continue
                key = (e["learner"], e["incarnation"], e["seq"], e["fragment"])
                if key not in first:
                    first[key] = (shard, j, e)
                    continue
                s0, j0, e0 = first[key]
                lost = s0 == shard and any((later.restored or {}).get(e["fragment"], 0) < e0["version"]
                                           for later in lives[j0 + 1:j + 1])
                (relost if lost else bad).append({"key": list(key), "t": e["t"], "shard": shard,
                                                  "versions": [e0["version"], e["version"]]})
                first[key] = (shard, j, e)
    return _judge("merged_at_most_once", bad, merges=len(log.of("merge")), remerged_after_loss=relost[:SHOW])


def _lost_merges(log: EventLog) -> set[int]:
    """id() of every merge line whose round its shard lost in a crash: a later incarnation of
    that shard restored a lower version of the fragment than the merge made."""
    out = set()
    for shard in _shards(log):
        lives = shard_lives(log, shard)
        for j, life in enumerate(lives):
            for e in life.events:
                if e["kind"] == "merge" and any((later.restored or {}).get(e["fragment"], 0) < e["version"]
                                                for later in lives[j + 1:]):
                    out.add(id(e))
    return out


ABSORBED = ("combined", "superseded")  # shard drop reasons: the contribution went on inside by_seq's


def progress_merged_once(log: EventLog) -> Result:
    """No inner step of a learner incarnation reaches the model twice for one fragment.

    Each learner `contribute` line says which of its incarnation's steps its Δ holds:
    [from_step + 1, to_step]. A contribution reached the model when its (learner,
    incarnation, seq, fragment) was merged (in a round its shard did not lose in a crash),
    or a shard dropped it `combined` into (or `superseded` by) a contribution `by_seq` that
    reached the model (transitively). Per (learner, incarnation, fragment), the intervals
    of the contributions that reached the model must not overlap. A `superseded`
    contribution was replaced, not summed: its Δ was thrown away and the replacing Δ (which,
    against the same base, holds the same steps) stands for it, so its own interval is left
    out. Unknown for a log with merges and no `contribute` line (written before them);
    valid with no merge (nothing reached the model twice); dp modes exchange gradients, not
    progress since an anchor: valid, not applicable."""
    mode = log.config["diloco"]["mode"]
    if mode in DP_MODES:
        return Result("progress_merged_once", True, 0, 0, {"why": f"{mode}: gradients, not progress; not applicable"})
    merges = log.of("merge")
    t1 = window(log)[1]
    spans: dict[tuple, tuple] = {}  # (learner, incarnation, seq, fragment) -> (from_step, to_step, t)
    for name, h in histories(log, t1).items():
        for inc in h.incs:
            for e in inc.events:
                if e["kind"] == "contribute":
                    key = (name, e.get("incarnation", inc.n), e["seq"], e["fragment"])
                    spans[key] = (int(e["from_step"]), int(e["to_step"]), e["t"])
    if not merges:
        return Result("progress_merged_once", True, 0, 0, {"why": "no merge in this log", "contributions": len(spans)})
    if not spans:
        return Result("progress_merged_once", None, None, 0,
                      {"why": "no contribute lines: a log from before they were written", "merges": len(merges)})
    lost = _lost_merges(log)
    merged = {(e["learner"], e["incarnation"], e["seq"], e["fragment"]) for e in merges if id(e) not in lost}
    seen = {(e["learner"], e["incarnation"], e["seq"], e["fragment"]) for e in merges}
    # older -> (newer, reason): by_seq carries no incarnation; it is the first one ≥ the
    # older's in which (learner, by_seq, fragment) was seen (a newer contribution's key is higher)
    known = seen | set(spans)
    incs: dict[tuple, list] = {}  # (learner, seq, fragment) -> incarnations it was seen in
    for k in known:
        incs.setdefault((k[0], k[2], k[3]), []).append(k[1])
    absorbed: dict[tuple, tuple] = {}
    for e in log.of("drop"):
        if e.get("reason") not in ABSORBED or e.get("by_seq") is None:
            continue
        learner, inc, seq, p, by = e.get("learner"), e.get("incarnation"), e.get("seq"), e.get("fragment"), e["by_seq"]
        if inc is None or seq is None:
            continue
        cands = sorted(i for i in incs.get((learner, by, p), ()) if (i, by) > (inc, seq))
        absorbed[(learner, inc, seq, p)] = ((learner, cands[0] if cands else inc, by, p), e["reason"])
        known.add((learner, inc, seq, p))

    def reached(key) -> tuple[bool, bool]:
        """(its progress reached the model, only through merges and `combined` hops)."""
        summed, hops = True, set()
        while key not in merged:
            if key in hops or key not in absorbed:
                return False, False
            hops.add(key)
            key, why = absorbed[key]
            summed = summed and why == "combined"
        return True, summed

    groups: dict[tuple, list] = {}
    replaced = unattributed = 0
    for key in known:
        ok, summed = reached(key)
        if not ok:
            continue
        if not summed:
            replaced += 1
            continue
        if key not in spans:
            unattributed += key in merged  # a merged contribution whose contribute line is missing
            continue
        a, b, t = spans[key]
        if b > a:
            groups.setdefault((key[0], key[1], key[3]), []).append((a + 1, b, key[2], t))
    bad, steps, pairs = [], 0, 0
    for (learner, inc, p), ivs in sorted(groups.items()):
        active: list = []
        for lo, hi, seq, t in sorted(ivs):
            active = [x for x in active if x[1] >= lo]
            for lo0, hi0, seq0, t0 in active:
                n = min(hi, hi0) - lo + 1
                pairs, steps = pairs + 1, steps + n
                bad.append({"learner": learner, "incarnation": inc, "fragment": p, "seqs": sorted([seq0, seq]),
                            "steps": [lo, min(hi, hi0)], "overlap_steps": n, "t": max(t, t0)})
            active.append((lo, hi, seq, t))
    return Result("progress_merged_once", not bad, pairs, 0,
                  {"violations": bad[:SHOW], "overlap_steps": steps, "merges": len(merges),
                   "contributions": len(spans), "replaced": replaced, "unattributed": unattributed,
                   "lost_in_crash": len(lost)})


def versions_monotonic(log: EventLog) -> Result:
    """Per shard incarnation and fragment, every merge and round_commit carries version
    last + 1 (a commit then makes it the last); an incarnation starts from the versions its
    checkpoint_restored names, else from 0."""
    bad = []
    for shard in _shards(log):
        for life in shard_lives(log, shard):
            last = dict(life.restored or {})
            for e in life.events:
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
    or restored earlier."""
    bad, restarts = [], 0
    for shard in _shards(log):
        durable: dict[int, int] = {}
        for life in shard_lives(log, shard):
            if life.n >= 1:
                restarts += 1
                got = life.restored or {}
                for p, v in sorted(durable.items()):
                    if got.get(p, 0) < v:
                        bad.append({"shard": shard, "incarnation": life.n, "fragment": p,
                                    "restored": got.get(p, 0), "durable": v})
            for p, v in (life.restored or {}).items():
                durable[p] = max(durable.get(p, 0), v)
            for e in life.events:
                if e["kind"] == "checkpoint_saved" and "versions" in e:
                    for p, v in e["versions"].items():
                        durable[int(p)] = max(durable.get(int(p), 0), int(v))
    return _judge("durable_rounds_kept", bad, restarts=restarts)


LINK_FAULTS = ("partition", "reset", "truncate")


def quorum_k(log: EventLog) -> int:
    d, m = log.config["diloco"], len(learner_names(log))
    return {"decoupled": int(d.get("quorum", 1)), "elastic_dp": 1}.get(d["mode"], m)


def reachable(log: EventLog, settle_s: float) -> list[tuple[float, float]]:
    """When ≥ K learners could contribute and a shard could merge: a learner counts from
    settle_s after its incarnation's first step line to its end (killed, or still running
    at t_end; one that finished its steps: its last step line), not while
    paused, nor while a partition / reset / truncate fault is on one of its links (and
    settle_s after); a shard from settle_s after its unit_up to its unit_down."""
    t0, t1 = window(log)
    hs = histories(log, t1)
    faults: dict = {}  # fault id -> [start, end, fault]
    for e in log.of("fault_start", "fault_end", src="harness"):
        f = e.get("fault") or {}
        if f.get("kind") in LINK_FAULTS and e["kind"] == "fault_start":
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
               if f.get("target", "").removeprefix("link:").split("~")[0] in ("*", name)]
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


def no_global_downtime(log: EventLog, bound_s: float | None = None, settle_s: float | None = None) -> Result:
    """No stretch longer than bound_s (default: the uptime gap bound) without a round_commit
    on any shard while a quorum was reachable (see `reachable`; settle_s defaults to bound_s)."""
    t0, t1 = window(log)
    commits, gap_bound = commit_gaps(log)
    bound = gap_bound if bound_s is None else bound_s
    q = reachable(log, bound if settle_s is None else settle_s)
    edges = [t0] + [c for c in commits if t0 < c < t1] + [t1]
    worst, bad = 0.0, []
    for a, b in zip(edges, edges[1:]):
        longest = max((y - x for x, y in intersect([(a, b)], q)), default=0.0)
        worst = max(worst, longest)
        if longest > bound:
            bad.append({"from_s": a - t0, "to_s": b - t0, "reachable_s": longest})
    r = _judge("no_global_downtime", bad, bound, k=quorum_k(log), reachable_s=sum(y - x for x, y in q))
    return Result(r.name, r.valid, worst, bound, r.details)


RISE_MAX = 0.25   # nats above the best so far; fault-free runs rise ≤ 0.09 between snapshots
END_MAX = 0.1     # nats: the final model's loss above the best the run reached
WARMUP = 0.2      # share of the window [t_start, t_end] whose rises are not judged


def global_curve(log: EventLog) -> list[tuple[float, float, bool]]:
    """(t, loss, final) of the global model along the run: the harness's `eval` lines with
    `global` and `snapshot` in time order, then the last `global` one without `snapshot`
    (the final model), whatever its time."""
    glob = [e for e in log.of("eval", src="harness") if e.get("global")]
    snaps = sorted((e for e in glob if e.get("snapshot")), key=lambda e: e["t"])
    finals = [e for e in glob if not e.get("snapshot")]
    out = [(float(e["t"]), _loss(e), False) for e in snaps]
    if finals:
        out.append((float(finals[-1]["t"]), _loss(finals[-1]), True))
    return out


def _loss(e: dict) -> float:
    v = e.get("loss")
    return float(v) if isinstance(v, (int, float)) and math.isfinite(v) else math.inf


def global_loss_regression(log: EventLog, rise_max: float = RISE_MAX, end_max: float = END_MAX,
                           warmup: float = WARMUP) -> Result:
    """The global model's held-out loss never rises more than `rise_max` nats above its best
    so far once the warm-up is over, and the final model ends within `end_max` nats of the
    best. Points: `global_curve`; the best so far is over every earlier point, warm-up
    included; rises are judged at points at or after t_start + warmup × (t_end − t_start),
    and always at the final one. A non-finite loss is an infinite rise. value = the worst
    judged rise (0 if the curve only fell); unknown with fewer than 3 points (dp modes:
    the harness evaluates only the final model)."""
    curve = global_curve(log)
    t0, t1 = window(log)
    if len(curve) < 3:
        return Result("global_loss_regression", None, None, rise_max,
                      {"why": f"{len(curve)} global eval point(s), 3 needed", "points": len(curve)})
    judged_from = t0 + warmup * (t1 - t0)
    best, worst, at, bad = math.inf, -math.inf, None, []
    for i, (t, loss, fin) in enumerate(curve):
        if i and (fin or t >= judged_from):
            rise = loss - best
            if rise > worst:
                worst, at = rise, {"at_s": t - t0, "loss": loss, "best_so_far": best, "rise": rise, "final": fin}
            if rise > rise_max:
                bad.append({"at_s": t - t0, "loss": loss, "best_so_far": best, "rise": rise, "final": fin})
        best = min(best, loss)
    final = curve[-1][1]
    excess = final - best
    if excess > end_max:
        bad.append({"end": True, "final": final, "best": best, "end_excess": excess, "end_max": end_max})
    return Result("global_loss_regression", not bad, max(worst, 0.0), rise_max, {
        "violations": bad[:SHOW], "worst": at, "final": final, "final_from": "final" if curve[-1][2] else "snapshot",
        "best": best, "end_excess": excess, "end_max": end_max, "warmup_until_s": judged_from - t0,
        "points": len(curve), "curve": [[round(t - t0, 3), loss] for t, loss, _ in curve]})


def staleness_bounded(log: EventLog, max_staleness: int) -> Result:
    """Every merge's staleness (rounds since its base version) is ≤ max_staleness."""
    merges = log.of("merge")
    bad = [{"learner": e["learner"], "fragment": e["fragment"], "seq": e["seq"], "staleness": e["staleness"],
            "t": e["t"]} for e in merges if e.get("staleness") is not None and e["staleness"] > max_staleness]
    worst = max((e["staleness"] for e in merges if e.get("staleness") is not None), default=None)
    return Result("staleness_bounded", not bad, worst, max_staleness, {"violations": bad[:SHOW]})


HELD_BYTES = 352 * 1024  # a thin link's kernel send queue + Toxiproxy, measured at 16 kbit/s (docs/PROTOCOL.md)


def link_buffers_bounded(log: EventLog, held_bytes: int | None = None) -> Result:
    """What waits unsent on any link (each end's `done` line `links.*.unsent_max`, and its
    `link_buffer` lines) stays within a few fragments whatever the link's speed: what the
    kernel and the proxy hold (`held_bytes`; the sim's own figure from its header) plus one
    whole frame per key that can wait on that link (each fragment of the shard, a Hello)
    and the frame being written. The frame size is the largest `send` line's `bytes`.
    Unknown when the log has no buffer counters (an older log)."""
    if held_bytes is None:
        sim = log.header.get("sim") or {}
        held_bytes = round(sim["held_kib"] * 1024) if "held_kib" in sim else HELD_BYTES
    shards = (log.header.get("topology") or {}).get("shards") or {}
    frame = max((int(e.get("bytes") or 0) for e in log.of("send")), default=0)
    peak: dict = {}
    for e in log.of("done"):
        for peer, st in (e.get("links") or {}).items():
            if isinstance(st, dict) and "unsent_max" in st:
                key = (e["src"], peer)
                peak[key] = max(peak.get(key, 0), int(st["unsent_max"]))
    for e in log.of("link_buffer"):
        key = (e["src"], e["peer"])
        peak[key] = max(peak.get(key, 0), int(e.get("unsent_bytes") or 0))
    if not peak:
        return Result("link_buffers_bounded", None, None, None, {"why": "no link buffer counters in the log"})
    bad, worst, bounds = [], max(peak.values()), {}
    for (src, peer), most in sorted(peak.items()):
        shard = src if src in shards else peer
        bound = held_bytes + (len(shards.get(shard, ())) + 2) * frame
        bounds[f"{src}~{peer}"] = bound
        if most > bound:
            bad.append({"src": src, "peer": peer, "unsent_max": most, "bound": bound})
    r = _judge("link_buffers_bounded", bad, max(bounds.values()), held_bytes=held_bytes, frame_bytes=frame,
               peaks={f"{a}~{b}": v for (a, b), v in sorted(peak.items())})
    return Result(r.name, r.valid, worst, r.bound, r.details)


def safety_checks(log: EventLog, metrics: Metrics | None = None, *, max_staleness: int | None = None,
                  downtime_bound_s: float | None = None, rise_max: float | None = None,
                  end_max: float | None = None) -> list[Result]:
    """Every safety check; staleness_bounded only when a bound is given (it has no default).
    rise_max / end_max: global_loss_regression's bounds (None: RISE_MAX / END_MAX)."""
    out = [merged_at_most_once(log), progress_merged_once(log), versions_monotonic(log), no_nan(log),
           durable_rounds_kept(log), no_global_downtime(log, downtime_bound_s),
           global_loss_regression(log, RISE_MAX if rise_max is None else rise_max,
                                  END_MAX if end_max is None else end_max),
           link_buffers_bounded(log)]
    if max_staleness is not None:
        out.append(staleness_bounded(log, max_staleness))
    return out


# --- expectations (a scenario's [expect] table) -------------------------------------------------


def _at_least(name: str, value, bound) -> Result:
    return Result(name, None if value is None else value >= bound, value, bound)


def _at_most(name: str, value, bound) -> Result:
    return Result(name, None if value is None else value <= bound, value, bound)


def _recovery(m: Metrics, bound: float) -> Result:
    """Each restart's recovery_s ≤ bound. A restart that never recovered fails when the run
    went on ≥ bound after it; closer to the end it is unknown (censored)."""
    if not m.recovery:
        return Result("recovery_max_s", None, None, bound, {"why": "no restart in this run"})
    late = [asdict(r) for r in m.recovery if r.recovery_s is not None and r.recovery_s > bound]
    never = [asdict(r) for r in m.recovery if r.recovery_s is None and m.duration_s - r.t_s >= bound]
    censored = [asdict(r) for r in m.recovery if r.recovery_s is None and m.duration_s - r.t_s < bound]
    valid = False if late or never else (None if censored else True)
    return Result("recovery_max_s", valid, m.recovery_max_s, bound,
                  {"late": late, "never": never, "censored": censored})


def _rejoin(m: Metrics, bound: float) -> Result:
    """Each restart's first merged contribution went out within `bound` fragment cycles
    (H inner steps each) of its first step: the design's rejoin claim, in steps, so the
    machine's speed does not enter. A restart never merged fails once it ran a cycle past
    the bound (time for the commit to land); before that it is unknown (censored)."""
    if not m.recovery:
        return Result("rejoin_cycles_max", None, None, bound, {"why": "no restart in this run"})
    late = [asdict(r) for r in m.recovery if r.rejoin_cycles is not None and r.rejoin_cycles > bound]
    unmerged = [r for r in m.recovery if r.rejoin_steps is None]
    never = [asdict(r) for r in unmerged if r.sync_every and r.steps_run > (bound + 1) * r.sync_every]
    censored = [asdict(r) for r in unmerged if not (r.sync_every and r.steps_run > (bound + 1) * r.sync_every)]
    valid = False if late or never else (None if censored else True)
    return Result("rejoin_cycles_max", valid, m.rejoin_cycles_max, bound,
                  {"late": late, "never": never, "censored": censored})


EXPECT = {
    "goodput_min": lambda m, b: _at_least("goodput_min", m.goodput, b),
    "uptime_min": lambda m, b: _at_least("uptime_min", m.uptime, b),
    "loss_parity_max": lambda m, b: _at_most("loss_parity_max", m.loss_parity, b),
    "recovery_max_s": _recovery,
    "rejoin_cycles_max": _rejoin,
}


def expect_checks(expect: dict, metrics: Metrics) -> list[Result]:
    """One Result per threshold set in `expect` (None = not checked); a missing metric
    (loss parity without a reference run, recovery without a restart) gives valid None."""
    unknown = sorted(set(expect) - set(EXPECT))
    if unknown:
        raise ValueError(f"expect: unknown key(s) {unknown}; valid: {sorted(EXPECT)}")
    return [EXPECT[k](metrics, v) for k, v in expect.items() if v is not None]


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

