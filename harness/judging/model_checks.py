"""Checks on what reached the model (docs/METRICS.md; docs/PROTOCOL.md "Bounded staleness"):
each piece of a learner's progress at most once (`progress_merged_once`, from the learners'
`contribute` lines; `delta_bases_advance`, from the shards' own lines alone), the global
model's loss curve (`global_loss_regression`), merge staleness within a bound
(`staleness_bounded`), what waits unsent on the links (`link_buffers_bounded`).
Pure functions of the event log, as every check; `harness.judging.checks` re-exports them."""
from __future__ import annotations

import math

from diloco_chaos.harness.judging.check_base import SHOW, Result, _judge, _lost_merges, _shards, shard_lives
from diloco_chaos.harness.eventlog import EventLog
from diloco_chaos.harness.judging.history import histories, window
from diloco_chaos.trainer.protocol.protocol_base import DP_MODES


ABSORBED = ("combined", "superseded")  # shard drop reasons: the contribution went on inside by_seq's


def absorptions(log: EventLog, known: set) -> dict[tuple, tuple]:
    """(learner, incarnation, seq, fragment) of a contribution a shard or an outbox dropped
    `combined` / `superseded` -> ((learner, incarnation, by_seq, fragment), reason): the
    contribution its progress went on in. by_seq carries no incarnation; it is the first
    one ≥ the older's in which (learner, by_seq, fragment) is in `known` (a newer
    contribution's key is higher)."""
    incs: dict[tuple, list] = {}  # (learner, seq, fragment) -> incarnations it was seen in
    for k in known:
        incs.setdefault((k[0], k[2], k[3]), []).append(k[1])
    out: dict[tuple, tuple] = {}
    for e in log.of("drop"):
        if e.get("reason") not in ABSORBED or e.get("by_seq") is None:
            continue
        learner, inc, seq, p, by = e.get("learner"), e.get("incarnation"), e.get("seq"), e.get("fragment"), e["by_seq"]
        if inc is None or seq is None:
            continue
        cands = sorted(i for i in incs.get((learner, by, p), ()) if (i, by) > (inc, seq))
        out[(learner, inc, seq, p)] = ((learner, cands[0] if cands else inc, by, p), e["reason"])
    return out


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
    known = seen | set(spans)
    absorbed = absorptions(log, known)
    known |= set(absorbed)

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


RISE_MAX = 0.25   # nats above the best so far; fault-free runs rise ≤ 0.09 between snapshots
END_MAX = 0.1     # nats: the final model's loss above the best the run reached
WARMUP = 0.2      # share of the window [t_start, t_end] whose rises are not judged


def delta_bases_advance(log: EventLog) -> Result:
    """Every Δ a shard merged from a learner incarnation for fragment p was measured from a
    Θ[p] the learner took after its previous merged Δ of p went out: a newer version, or
    the same version taken again (the k-th merged Δ from one base needs k takes of it:
    sends of that version to the learner, since its incarnation's link came up, logged
    before the Δ arrived: a fetch that re-anchored it, possibly crossing the previous Δ on
    the wire; the first take may predate this shard life, or be Θ0); and its base is a
    version of Θ[p] the shard sent that learner (or Θ0, version 0).

    Evidence: the shard's own lines only: its `merge` lines (the base_version in the
    messages it received), its `recv` and `link_up` lines, and its `send` lines (which
    versions of Θ[p] it sent whom, and when). Nothing the learner logged about itself is
    read, so a learner that re-sends its drift since one base while its `contribute` lines
    look right (planted bug `resend_drift`) cannot hide: a Δ after a merged one holds only
    new progress if the learner was re-anchored in between; two Δs from one base with no
    re-anchoring carry the first one's progress twice. Per shard incarnation (a restarted
    shard may hand out lower versions again; what it sent counts across its incarnations
    for the base's origin). dp modes exchange gradients: valid, not applicable."""
    mode = log.config["diloco"]["mode"]
    if mode in DP_MODES:
        return Result("delta_bases_advance", True, 0, 0, {"why": f"{mode}: gradients, not progress; not applicable"})
    bad, merges, unsent = [], 0, []
    for shard in _shards(log):
        # a log whose shard wrote no send lines (hand-made, or cut) cannot say what it sent
        says_sends = bool(log.of("send", src=shard))
        if not says_sends:
            unsent.append(shard)
        # positions in the shard's own lines (its order is exact where times tie)
        sent: dict[tuple, dict] = {}  # (learner, fragment) -> {version: [(life, where this shard sent it)]}
        for life in shard_lives(log, shard):
            last: dict[tuple, list] = {}  # (learner, incarnation, fragment) -> [base, Δs merged from it, free takes]
            received: dict[tuple, int] = {}  # (learner, incarnation, seq, fragment) -> where this shard got it
            link_up: dict[str, int] = {}  # learner -> where its link last came up
            heard: dict[tuple, int] = {}  # (learner, incarnation) -> its link's start, as this shard first heard it
            for i, e in enumerate(life.events):
                kind = e["kind"]
                if kind == "send" and e.get("msg") in ("FragmentUpdate", "FragmentDelta"):
                    sent.setdefault((e["peer"], int(e["fragment"])), {}).setdefault(int(e["version"]), []).append(
                        (life.n, i))
                elif kind == "link_up":
                    link_up[e.get("peer")] = i
                elif kind == "recv":
                    who = (e.get("learner", e.get("peer")), e.get("incarnation"))
                    heard.setdefault(who, link_up.get(who[0], i))
                    if e.get("msg") == "Contribution":
                        received.setdefault((e.get("learner"), e.get("incarnation"), e.get("seq"), e.get("fragment")), i)
                elif kind == "merge" and e.get("base_version") is not None:
                    merges += 1
                    p, b = int(e["fragment"]), int(e["base_version"])
                    key, times = (e["learner"], e["incarnation"], p), sent.get((e["learner"], p), {})
                    got = received.get((e["learner"], e["incarnation"], e.get("seq"), p), i)
                    since = heard.get((e["learner"], e["incarnation"]), -1)
                    takes = sum(1 for n, j in times.get(b, ()) if n == life.n and since <= j < got)
                    why = None
                    if key in last and b < last[key][0]:
                        why = f"base {b} is older than its previous merged Δ's base {last[key][0]}"
                    elif key in last and b == last[key][0]:
                        last[key][1] += 1
                        if last[key][1] > takes + last[key][2]:
                            why = (f"base {b}, the same as its previous merged Δ's: Δ {last[key][1]} from Θ[{p}]@{b}, "
                                   f"which this shard sent it {takes} time(s) before it arrived")
                    else:
                        if says_sends and b != 0 and b not in times:
                            why = f"base {b}: a version of Θ[{p}] this shard never sent {e['learner']}"
                        # its first take of b: a send of this life, else one from before it (or Θ0)
                        last[key] = [b, 1, 0 if takes else 1]
                    if why is not None:
                        bad.append({"shard": shard, "learner": e["learner"], "incarnation": e["incarnation"],
                                    "fragment": p, "seq": e.get("seq"), "base_version": b, "t": e["t"], "why": why})
    return _judge("delta_bases_advance", bad, merges=merges,
                  **({"sends_not_logged": unsent} if unsent else {}))


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


def same_batches(log: EventLog, curve: list[tuple[float, float, bool]]) -> list[tuple[float, float, bool]]:
    """The curve with its final point on the snapshots' batches: the snapshots evaluate
    the first `task.eval_batches` held-out batches, the final eval more (`final_eval_batches`,
    the parity interval's), the first of which are the same (docs/TASKS.md). Compared
    as they are, a task whose batches differ in difficulty would show a rise (or hide
    one) that is only the sample; the final eval's `batch_losses` give the same-batch loss."""
    if not curve or not curve[-1][2]:
        return curve
    finals = [e for e in log.of("eval", src="harness") if e.get("global") and not e.get("snapshot")]
    losses = finals[-1].get("batch_losses") if finals else None
    k = ((log.header.get("config") or {}).get("task") or {}).get("eval_batches")
    if not losses or not isinstance(k, int) or not 0 < k < len(losses):
        return curve
    t, _, _ = curve[-1]
    head = [float(x) for x in losses[:k]]
    loss = sum(head) / k if all(math.isfinite(x) for x in head) else math.inf
    return curve[:-1] + [(t, loss, True)]


def global_loss_regression(log: EventLog, rise_max: float = RISE_MAX, end_max: float = END_MAX,
                           warmup: float = WARMUP, allowance: float = 0.0) -> Result:
    """The global model's held-out loss never rises more than `rise_max` nats above its best
    so far once the warm-up is over (more than `rise_max` + `allowance`: the worst rise its
    fault-free reference run had on its own, `Metrics.reference_rise`, a rise the training
    makes without faults), and the final model ends within `end_max` nats of the
    best. Points: `global_curve`; the best so far is over every earlier point, warm-up
    included; rises are judged at points at or after t_start + warmup × (t_end − t_start),
    and always at the final one. A non-finite loss is an infinite rise. value = the worst
    judged rise (0 if the curve only fell); unknown with fewer than 3 points (dp modes:
    the harness evaluates only the final model). The final point is on the snapshots'
    batches (`same_batches`).

    A data-parallel rollback (the harness's `unit_down` lines with reason `rollback`: the
    job restarts from its last checkpoint, by design) starts the best so far afresh at
    the first point after it: what dp loses there is progress, judged by goodput, not a
    regression of the model. (So a dp bug that rolls back further than it should is not
    seen here.)"""
    curve = same_batches(log, global_curve(log))
    t0, t1 = window(log)
    rollbacks = sorted({float(e["t"]) for e in log.of("unit_down") if e.get("reason") == "rollback"})
    if len(curve) < 3:
        return Result("global_loss_regression", None, None, rise_max,
                      {"why": f"{len(curve)} global eval point(s), 3 needed", "points": len(curve)})
    judged_from = t0 + warmup * (t1 - t0)
    allowed = rise_max + max(allowance, 0.0)
    best, worst, at, bad = math.inf, -math.inf, None, []
    for i, (t, loss, fin) in enumerate(curve):
        if i and any(curve[i - 1][0] < r <= t for r in rollbacks):
            best = math.inf  # rolled back since the previous point: judged from here on
        if i and best < math.inf and (fin or t >= judged_from):
            rise = loss - best
            if rise > worst:
                worst, at = rise, {"at_s": t - t0, "loss": loss, "best_so_far": best, "rise": rise, "final": fin}
            if rise > allowed:
                bad.append({"at_s": t - t0, "loss": loss, "best_so_far": best, "rise": rise, "final": fin})
        best = min(best, loss)
    final = curve[-1][1]
    excess = final - best
    if excess > end_max:
        bad.append({"end": True, "final": final, "best": best, "end_excess": excess, "end_max": end_max})
    return Result("global_loss_regression", not bad, max(worst, 0.0), allowed, {
        "violations": bad[:SHOW], "rise_max": rise_max, "reference_rise": allowance, "worst": at, "final": final, "final_from": "final" if curve[-1][2] else "snapshot",
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
