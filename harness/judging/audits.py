"""Audits: each shard's arithmetic redone by the judge, from the log's evidence, in the judge's
own arithmetic (harness/judging/spec.py), never the trainer's.

- weights_match_staleness  every merge's staleness (version − 1 − base) and weight, recomputed
- progress_staleness_bounded every inner step a merged Δ holds was made on a copy of Θ[p] at
                           most 2·max_staleness versions older than the merge (the learner's
                           copy and step lines, not the Δ's claimed base)
- quorum_respected         every decoupled round merged ≥ K contributions
- grace_respected          a round that committed before its grace ended merged every learner the
                           shard counted live and not closed
- commits_audited          every commit's Θ[p] chain (the digest before = the digest the last
                           commit left), and every sampled commit redone: weights, fleet share,
                           warm-up, merge (mean / RDA), outer step, against Θ[p] and the outer
                           state after
- copies_consistent        every learner's copy of Θ[p] at version v is a Θ[p] its shard held
                           at v (fp32 broadcasts), or the copy the shard recorded it sending
                           (compressed broadcasts, where the error is carried, never grown)
- deltas_reexecuted        every merged Δ rebuilt from its learner's record of what the inner
                           steps it claims did (the `contribute` line's `progress`, kept beside
                           the core: trainer/numerics/tally.py) and compared with the Δ the shard merged
                           (its commit_audit): a Δ holding more, less or other progress fails
- inner_steps_reexecuted   (harness/judging/inner_steps.py) every sampled inner step of a learner
                           redone from the batch the judge draws, in its own optimizer arithmetic
- guard_decisions          every Δ the corrupt guard judged, judged again from the shard's
                           history of accepted sizes
- restores_faithful        (harness/judging/restores.py) what a restarted unit loaded is what
                           the save it names wrote, and that save is the newest that had landed
- committed_rounds_kept    (harness/judging/repairs.py) a restarted shard goes on from the newest
                           committed version a greeting learner held (repair from the learners)
- membership_follows_links a learner whose link went down (or that the harness killed) stops
                           counting in the shards' live sets
- starved_learners_reanchor a learner that hears nothing from a shard asks it again in time

What each reads, and whose word it is, is in docs/METRICS.md ("What each check reads").
"""
from __future__ import annotations

import math
from collections import defaultdict

import numpy as np

from diloco_chaos.harness.eventlog import EventLog
from diloco_chaos.harness.judging import spec
from diloco_chaos.harness.judging.check_base import SHOW, Result, _shards
from diloco_chaos.harness.judging.history import is_process_up, learner_names
from diloco_chaos.harness.judging.repairs import committed_rounds_kept
from diloco_chaos.harness.judging.inner_steps import inner_steps_reexecuted
from diloco_chaos.harness.judging.restores import restores_faithful

DILOCO = ("decoupled", "streaming", "sync_diloco")
STEP_RTOL = 1e-3      # a commit's step may differ from the judge's by float32 rounding, far below this
THETA_RTOL = 1e-6     # ... plus the rounding of Θ[p] itself (float32: 6e-8 of each value)
WEIGHT_RTOL = 1e-9


def _mode(log: EventLog) -> str:
    return log.config["diloco"].get("mode", "decoupled")


def _not_applicable(name: str, log: EventLog) -> Result | None:
    if _mode(log) not in DILOCO:
        return Result(name, True, 0, 0, {"why": f"{_mode(log)}: gradients, not progress; not applicable"})
    return None


# --- weights and quorum ----------------------------------------------------------------------------
def claimed_bases(log: EventLog) -> dict:
    """(learner, incarnation, fragment, seq) -> the base version its learner sent the Δ from:
    its `contribute` line's (the learner's word), lowered to the oldest base of every Δ
    combined into it (`drop reason=combined` lines, the learner's outbox's and the shard's:
    a sum of Δs is as stale as its oldest part)."""
    inc: dict[str, int] = {}
    own: dict[tuple, int] = {}
    for e in log.events:
        if is_process_up(e):
            inc[e["src"]] = int(e["incarnation"])
        elif e["kind"] == "contribute" and e["src"] in inc:
            own[(e["src"], inc[e["src"]], e["fragment"], e["seq"])] = int(e["base_version"])
    return _oldest_of_combined(log, own)


def _oldest_of_combined(log: EventLog, own: dict) -> dict:
    """`own` (a version per Δ key) lowered, for each Δ, to the least over the Δs combined into
    it (`drop reason=combined` lines, the learner's outbox's and the shard's)."""
    into: dict[tuple, list] = defaultdict(list)
    for e in log.of("drop"):
        if e.get("reason") == "combined" and "by_seq" in e:
            key = (e["learner"], e["incarnation"], e["fragment"])
            into[key + (e["by_seq"],)].append(key + (e["seq"],))

    def least(key, depth=0):
        parts = [own.get(key)] + ([least(k, depth + 1) for k in into.get(key, ())] if depth < 64 else [])
        parts = [b for b in parts if b is not None]
        return min(parts) if parts else None
    return {k: b for k in set(own) | set(into) if (b := least(k)) is not None}


def made_on(log: EventLog) -> dict:
    """(learner, incarnation, fragment, seq) -> the oldest version of the learner's copy of Θ[p]
    that any inner step the Δ claims was made on (None where a claimed step came before the
    life's first copy of p: a restored θ, not judged). From the learner's `copy` lines (each
    take of Θ[p], whose digest copies_consistent holds to the shard's) and `step` lines, in
    the order the learner wrote them: a copy taken after step k's line is what steps k + 1, …
    were made on. Not the `contribute` line's base: a Δ can claim a newer base than its
    oldest steps were made on (progress kept across takes), and that is what this measures."""
    own: dict[tuple, int | None] = {}
    for learner in learner_names(log):
        # steps in the core's count (from 0 in each incarnation, as contribute lines give them);
        # a life's step lines count on from the step its restore named (its unit_up `step`)
        inc, step, since, copies = 0, 0, 0, defaultdict(list)  # copies[p]: [(first step made on it, version)]
        for e in log.events:
            if e["src"] != learner:
                continue
            kind = e["kind"]
            if is_process_up(e):
                inc, step, since, copies = int(e["incarnation"]), 0, int(e.get("step") or 0), defaultdict(list)
            elif kind == "step":
                step = int(e["step"]) - since
            elif kind == "copy":
                copies[int(e["fragment"])].append((step + 1, int(e["version"])))
            elif kind == "contribute" and int(e["to_step"]) > int(e["from_step"]):
                p, first, last = int(e["fragment"]), int(e["from_step"]) + 1, int(e["to_step"])
                held = [v for s, v in copies[p] if s <= first]
                versions = [v for s, v in copies[p] if first < s <= last] + held[-1:]
                own[(learner, inc, p, e["seq"])] = min(versions) if held else None
    unknown = {k for k, v in own.items() if v is None}
    lowered = _oldest_of_combined(log, {k: v for k, v in own.items() if v is not None})
    return {**lowered, **{k: None for k in unknown}}


def weights_match_staleness(log: EventLog) -> Result:
    """Every merge's base is the one its learner sent the Δ from (the oldest of the Δs combined
    into it: `claimed_bases`, the learners' contribute lines), its staleness version − 1 −
    that base, and its weight the judge's (spec.weight) of its (c_tokens, c_steps,
    staleness). A merge with no contribute line behind it is judged on its own base."""
    if na := _not_applicable("weights_match_staleness", log):
        return na
    d, bad, n, unclaimed = log.config["diloco"], [], 0, 0
    bases = claimed_bases(log)
    for e in log.of("merge"):
        n += 1
        claimed = bases.get((e["learner"], e["incarnation"], e["fragment"], e["seq"]))
        if claimed is None:
            unclaimed += 1
        elif claimed != e["base_version"]:
            bad.append({"shard": e["src"], "learner": e["learner"], "seq": e["seq"], "fragment": e["fragment"],
                        "version": e["version"], "base_version": e["base_version"], "claimed_base": claimed,
                        "why": f"merged as from version {e['base_version']}; its learner sent it (and what was "
                               f"combined into it) from {claimed}"})
            continue
        s = spec.staleness(e["version"], e["base_version"])
        want = spec.weight(e["c_tokens"], e["c_steps"], s, d.get("weighting", "tokens"), d.get("staleness_discount", True))
        if e["staleness"] != s or not math.isclose(e["weight"], want, rel_tol=WEIGHT_RTOL):
            bad.append({"shard": e["src"], "learner": e["learner"], "seq": e["seq"], "fragment": e["fragment"],
                        "version": e["version"], "staleness": e["staleness"], "expected_staleness": s,
                        "weight": e["weight"], "expected": want})
    return Result("weights_match_staleness", not bad, len(bad), 0,
                  {"violations": bad[:SHOW], "merges": n, "without_contribute_line": unclaimed})


def progress_staleness_bounded(log: EventLog) -> Result:
    """Every inner step a merged Δ holds was made on a copy of Θ[p] at most 2·max_staleness
    versions before the version the merge built on (`made_on`: the learner's copy and step
    lines, not its contribute line's base). The shard drops a Δ whose claimed base is more
    than max_staleness behind; a learner keeps progress across a take only while the copy
    its oldest step was made on is at most max_staleness behind the version taken (docs/
    PROTOCOL.md "Bounded staleness"): together, 2·max_staleness. Progress made on a copy
    150 versions old and sent as a fresh Δ (staleness laundered through a re-anchor) fails."""
    name = "progress_staleness_bounded"
    if na := _not_applicable(name, log):
        return na
    bound = 2 * int(log.config["diloco"].get("max_staleness") or 0)
    if not bound:
        return Result(name, True, 0, 0, {"why": "max_staleness 0: no bound to hold"})
    made, bad, n, unjudged, worst = made_on(log), [], 0, 0, 0
    for e in log.of("merge"):
        v = made.get((e["learner"], e["incarnation"], e["fragment"], e["seq"]))
        if v is None:
            unjudged += 1
            continue
        n, stale = n + 1, e["version"] - 1 - v
        worst = max(worst, stale)
        if stale > bound:
            bad.append({"shard": e["src"], "learner": e["learner"], "seq": e["seq"], "fragment": e["fragment"],
                        "version": e["version"], "claimed_base": e["base_version"], "made_on": v,
                        "why": f"merged into version {e['version'] - 1} with steps made on a copy of version "
                               f"{v}: {stale} versions stale, bound {bound}"})
    if unjudged and not n:
        return Result(name, None, None, bound, {"why": "no merged Δ's steps have copy lines to judge them by",
                                                "unjudged": unjudged})
    return Result(name, not bad, len(bad), bound, {"violations": bad[:SHOW], "merges": n, "unjudged": unjudged,
                                                   "worst": worst})


def quorum_k(log: EventLog) -> int:
    return int(log.config["diloco"].get("quorum", 1)) if _mode(log) == "decoupled" else 1


def quorum_respected(log: EventLog) -> Result:
    """Decoupled mode: every round_commit merged ≥ K contributions (the other modes: ≥ 1)."""
    k = quorum_k(log)
    bad = [{"src": e["src"], "fragment": e["fragment"], "version": e["version"], "n": e["n"], "t": e["t"]}
           for e in log.of("round_commit") if e["n"] < k]
    return Result("quorum_respected", not bad, len(bad), k, {"violations": bad[:SHOW]})


GRACE_EPS_S = 1e-6  # a commit at its deadline is on time (float rounding of quorum_at + grace)


def grace_respected(log: EventLog) -> Result:
    """A decoupled round commits before its grace ends only when every learner the shard
    counts live and not closed is in it (docs/PROTOCOL.md "Rounds"): every round_commit
    earlier than quorum_at + its grace — the judge's, at least CLOSE_HOLD_S for a round
    holding a closed learner's Δ — merged all of live − closed (its merge lines). The
    grace itself and the live and closed sets are the shard's word (membership_follows_links
    audits live against the links); which learners the round merged and the hold for a
    closing round are the judge's."""
    name = "grace_respected"
    if _mode(log) != "decoupled":
        return Result(name, True, 0, 0, {"why": f"{_mode(log)}: rounds wait for every learner; not applicable"})
    merged = defaultdict(set)
    for m in log.of("merge"):
        merged[(m["src"], m["fragment"], m["version"])].add(m["learner"])
    bad, early, n = [], 0, 0
    for e in log.of("round_commit"):  # `at`, quorum_at: the shard's own clock (a process's monotonic one)
        if e.get("quorum_at") is None or e.get("grace_s") is None or "live" not in e or "at" not in e:
            continue
        n += 1
        ins = merged[(e["src"], e["fragment"], e["version"])]
        closed = set(e.get("closed") or ())
        grace = max(float(e["grace_s"]), spec.CLOSE_HOLD_S if closed & ins else 0.0)
        if float(e["at"]) >= float(e["quorum_at"]) + grace - GRACE_EPS_S:
            continue
        early += 1
        missing = sorted(set(e["live"]) - closed - ins)
        if missing:
            bad.append({"shard": e["src"], "fragment": e["fragment"], "version": e["version"], "t": e["t"],
                        "missing": missing, "why": f"committed {float(e['quorum_at']) + grace - float(e['at']):.3f} s before "
                                                   f"its grace ended without {', '.join(missing)}"})
    detail = {"violations": bad[:SHOW], "rounds": n, "early": early}
    if log.of("round_commit") and not n:
        return Result(name, None, None, 0, {**detail, "why": "no round_commit line carries its commit time and "
                                                             "sets (a log from before they did)"})
    return Result(name, not bad, len(bad), 0, detail)


# --- commits ----------------------------------------------------------------------------------------
def _lives(log: EventLog, src: str) -> list[list[dict]]:
    """A unit's lines cut at its own unit_up lines."""
    lives: list[list[dict]] = [[]]
    for e in log.events:
        if e["src"] == src:
            if is_process_up(e):
                lives.append([])
            lives[-1].append(e)
    return [life for life in lives if life]


def _restored_digests(e: dict) -> dict:
    """{fragment: digest} of a shard's checkpoint_restored line, where it carries them."""
    theta = (e.get("digests") or {}).get("theta") or {}
    return {int(p): d for p, d in theta.items()}


def _redo(a: dict, merges: list[dict], commit: dict, log: EventLog) -> str | None:
    """One sampled commit redone in the judge's arithmetic: None, or what disagrees."""
    d, outer = log.config["diloco"], log.config["outer"]
    weights = [spec.weight(m["c_tokens"], m["c_steps"], spec.staleness(m["version"], m["base_version"]),
                           d.get("weighting", "tokens"), d.get("staleness_discount", True)) for m in merges]
    if len(a["deltas"]) != len(merges):
        return f"{len(a['deltas'])} Δs in the audit, {len(merges)} merge lines"
    if not np.allclose(a["weights"], weights, rtol=WEIGHT_RTOL):
        return f"weights {a['weights']} ≠ the judge's {weights}"
    closing = bool(commit.get("closing"))
    if a["merge"] not in (("mean",) if closing else (d["merge"], "mean")):
        return f"merge kind {a['merge']!r} (closing {closing}, configured {d['merge']!r})"
    pool = set(commit.get("live") or ()) | set(commit.get("closed") or ()) | {m["learner"] for m in merges}
    scale = (spec.fleet_share(d, len({m["learner"] for m in merges}), len(pool))
             * spec.warm(d, outer, int(a["version"]) - 1, closing))
    theta, trace = spec.arrays_of([a["theta"]])[0], spec.arrays_of([a["trace"]])[0]
    deltas = spec.arrays_of(a["deltas"])
    if a.get("sample") is None:
        if commit.get("before") and _leaf_digest(theta, a) != commit["before"]:
            return "the audit's Θ[p] is not the Θ[p] the round_commit line names (before)"
        merged = spec.merge([[x] for x in deltas], weights, a["merge"])[0]
    else:  # a sample of coordinates: the norms over the whole fragment are the shard's
        live = [(w, x, n) for w, x, n in zip(weights, deltas, a["norms"]) if w > 0]
        total = sum(w for w, _, _ in live)
        if a["merge"] == "mean":
            merged = sum(w / total * np.asarray(x, np.float64) for w, x, _ in live)
        else:
            radius = sum(w / total * n for w, _, n in live)
            direction = sum(w / total * np.asarray(x, np.float64) / n for w, x, n in live if n > 1e-12)
            dn = a.get("direction_norm") or 0.0
            merged = np.zeros(theta.shape) if dn <= 1e-12 else direction * (radius / dn)
    want_theta, want_trace = spec.outer_step([theta], [trace] if trace.size else [], [scale * merged], outer)
    got = spec.arrays_of([a["theta_after"]])[0].astype(np.float64)
    step_j, step_s = want_theta[0] - theta, got - theta
    err = float(np.linalg.norm(step_s - step_j))
    tol = STEP_RTOL * float(np.linalg.norm(step_j)) + THETA_RTOL * float(np.linalg.norm(theta)) + 1e-12
    if not err <= tol:
        return (f"Θ[p] moved {float(np.linalg.norm(step_s)):.6g}, the judge's step {float(np.linalg.norm(step_j)):.6g}; "
                f"they differ by {err:.3g} (tolerance {tol:.3g}; scale {scale:.4g}, {len(merges)} Δs, {a['merge']})")
    if want_trace:  # the same tolerance, on the trace's own scale (m' = μ·m + g may cancel to ~0)
        t_got = spec.arrays_of([a["trace_after"]])[0].astype(np.float64)
        t_err = float(np.linalg.norm(t_got - want_trace[0]))
        t_tol = STEP_RTOL * (float(np.linalg.norm(want_trace[0])) + float(np.linalg.norm(trace))
                             + float(np.linalg.norm(scale * merged))) + 1e-12
        if not t_err <= t_tol:
            return (f"the outer momentum after the step is not the judge's: off by {t_err:.3g} "
                    f"(tolerance {t_tol:.3g})")
    if a.get("sample") is None and commit.get("digest") and _leaf_digest(got.astype(np.float32), a) != commit["digest"]:
        return "the audit's Θ[p] after is not the Θ[p] the round_commit line names (digest)"
    return None


def _leaf_digest(flat: np.ndarray, a: dict) -> str:
    """The digest of a flattened fragment cut back into its leaves."""
    leaves, at = [], 0
    for shape in a.get("shapes") or [[flat.size]]:
        n = int(np.prod(shape)) if shape else 1
        leaves.append(np.asarray(flat[at:at + n], np.float32).reshape(shape))
        at += n
    return spec.digest(leaves)


def commits_audited(log: EventLog) -> Result:
    """Every commit continues its fragment's chain (the digest of Θ[p] before it is the digest
    the shard's previous commit, or its restore, left) and every commit_audit line redone in
    the judge's arithmetic agrees with the Θ[p] (and outer state) the shard ended with."""
    if na := _not_applicable("commits_audited", log):
        return na
    bad, chained, redone, commits = [], 0, 0, 0
    for shard in _shards(log):
        for life in _lives(log, shard):
            last: dict = {}
            commit_of: dict = {}
            merges = defaultdict(list)  # (fragment, version) -> this incarnation's merge lines
            for e in life:
                if e["kind"] == "merge":
                    merges[(e["fragment"], e["version"])].append(e)
                elif e["kind"] == "checkpoint_restored":
                    last.update(_restored_digests(e))
                elif e["kind"] == "repaired":  # a learner's copy taken (committed_rounds_kept judges it)
                    last[e["fragment"]] = e["digest"]
                elif e["kind"] == "round_commit":
                    commits += 1
                    p = e["fragment"]
                    commit_of[(p, e["version"])] = e
                    if "before" in e and p in last:
                        chained += 1
                        if e["before"] != last[p]:
                            bad.append({"shard": shard, "fragment": p, "version": e["version"], "t": e["t"],
                                        "why": f"Θ[p] before this commit ({e['before']}) is not what the last "
                                               f"commit or restore left ({last[p]})"})
                    if "digest" in e:
                        last[p] = e["digest"]
                elif e["kind"] == "commit_audit":
                    key = (e["fragment"], e["version"])
                    commit = commit_of.get(key, {})
                    why = _redo(e, merges.get(key, []), commit, log)
                    redone += 1
                    if why:
                        bad.append({"shard": shard, "fragment": key[0], "version": key[1], "t": e["t"], "why": why})
    if commits and not chained and not redone:
        return Result("commits_audited", None, None, 0, {"why": "no commit evidence in this log (digests, audits)",
                                                          "commits": commits})
    return Result("commits_audited", not bad, len(bad), 0, {"violations": bad[:SHOW], "commits": commits,
                                                            "chained": chained, "redone": redone})


# --- copies -----------------------------------------------------------------------------------------------
def copies_consistent(log: EventLog) -> Result:
    """A learner's copy of Θ[p] at version v (its `copy` line's digest) is a Θ[p] a shard held at
    v (its round_commit digests, before and after, and its restores), or, for a copy rebuilt
    from a compressed delta, the copy the shard recorded it sending (`held`; a whole update of
    a learner's copy too). Compressed broadcasts: no delta leaves the copy further from Θ[p]
    than the copy it corrected (int8, int4, bf16: |x̂ − x| ≤ |x| per value; sparse: unbounded)."""
    if na := _not_applicable("copies_consistent", log):
        return na
    known, held = defaultdict(set), defaultdict(set)
    for e in log.of("round_commit"):
        if "digest" in e:
            known[(e["fragment"], e["version"])].add(e["digest"])
            known[(e["fragment"], e["version"] - 1)].add(e["before"])
    for e in log.of("checkpoint_restored"):
        versions = {int(p): int(v) for p, v in (e.get("versions") or {}).items()}
        for p, dg in _restored_digests(e).items():
            if p in versions:
                known[(p, versions[p])].add(dg)
    bad = []
    kind = log.config["diloco"].get("broadcast_compression", "fp32")
    for e in log.of("held"):
        held[(e["learner"], e["fragment"], e["version"])].add(e["digest"])
        if kind != "sparse" and not e["error"] <= e["gap"] * (1 + 1e-6) + 1e-12:
            bad.append({"shard": e["src"], "learner": e["learner"], "fragment": e["fragment"], "version": e["version"],
                        "why": f"the delta left the copy {e['error']:.3g} from Θ[p], further than before it ({e['gap']:.3g})"})
    learners = set(learner_names(log))
    checked = unverified = 0
    for e in log.of("copy"):
        if e["src"] not in learners:
            continue
        key = (e["fragment"], e["version"])
        mine = held.get((e["src"], *key), set())
        ok = mine if e["via"] == "delta" else known.get(key, set()) | mine
        if not ok:
            unverified += 1
            continue
        checked += 1
        if e["digest"] not in ok:
            bad.append({"learner": e["src"], "fragment": key[0], "version": key[1], "t": e["t"], "via": e["via"],
                        "digest": e["digest"], "shard_has": sorted(ok)[:3]})
    if not checked and not bad:
        copies = len(log.of("copy"))
        return Result("copies_consistent", None, None, 0,
                      {"why": "no learner copy the shards' lines name" if copies else "no copy lines in this log",
                       "unverified": unverified})
    return Result("copies_consistent", not bad, len(bad), 0,
                  {"violations": bad[:SHOW], "checked": checked, "unverified": unverified, "broadcasts": kind})


# --- the corrupt guard ------------------------------------------------------------------------------------
def guard_decisions(log: EventLog) -> Result:
    """Every Δ a shard's guard judged (its `guard` lines: the Δ's rms, steps and Θ[p]'s rms),
    judged again by the judge's rule (spec.guard_accepts) against the judge's own history of
    that shard incarnation's accepted sizes: an accepted Δ over the bound, or a dropped one
    within it, fails; so does a line whose `recent_max` (the largest size per step the shard
    remembers, the bound's base) is not the judge's, whether or not a decision flipped (a
    history kept in other units moves the bound where no drawn corruption may fall). The
    sizes are the shard's word; the history and the bound are not."""
    if na := _not_applicable("guard_decisions", log):
        return na
    if _mode(log) != "decoupled":  # streaming / sync_diloco rounds need every unit: the guard is off
        return Result("guard_decisions", True, 0, 0, {"why": f"{_mode(log)}: no corrupt guard"})
    factor = float(log.config["diloco"].get("guard_factor") or 0.0)
    bad, judged = [], 0
    for shard in _shards(log):
        for life in _lives(log, shard):
            seen: tuple = ()
            for e in life:
                if e["kind"] != "guard":
                    continue
                judged += 1
                size = float(e["rms"])
                want = spec.guard_accepts(size, e["c_steps"], seen, float(e["theta_rms"]), factor)
                judged_max = max(seen) if len(seen) >= spec.GUARD_WARMUP else None
                if "recent_max" in e and factor and not _same(e["recent_max"], judged_max):
                    bad.append({"shard": shard, "learner": e["learner"], "seq": e["seq"], "fragment": e["fragment"],
                                "t": e["t"], "recent_max": e["recent_max"], "expected_recent_max": judged_max,
                                "why": "the shard's remembered largest size per step is not the judge's"})
                elif want != e["accepted"]:
                    bad.append({"shard": shard, "learner": e["learner"], "seq": e["seq"], "fragment": e["fragment"],
                                "t": e["t"], "accepted": e["accepted"], "expected": want,
                                "rms_per_step": size / max(e["c_steps"], 1),
                                "bound": factor * judged_max if judged_max is not None else None})
                if want:
                    seen = spec.guard_remember(seen, size, e["c_steps"])
    if not judged:
        why = "no guard in this run" if not factor else "no guard lines in this log"
        return Result("guard_decisions", True if not factor or not log.of("merge") else None, 0, 0, {"why": why})
    return Result("guard_decisions", not bad, len(bad), 0, {"violations": bad[:SHOW], "judged": judged})


def _same(a, b) -> bool:
    return (a is None) == (b is None) and (a is None or math.isclose(float(a), float(b), rel_tol=WEIGHT_RTOL))


# --- liveness -------------------------------------------------------------------------------------------------
KILLED = ("killed", "preempted", "crashed")
END_SETTLE_S = 2.0  # a kill this close to the run's end may not reach a shard's lines before it stops


def membership_follows_links(log: EventLog) -> Result:
    """A dead learner stops counting toward quorums and fleet shares: (1) no shard's
    round_commit lists a learner in `live` after that shard's link_down line for it (until its
    link_up), and (2) every learner the harness killed while a shard held its link is seen
    down by that shard (a link_down line before the learner's next unit_up; kills within
    END_SETTLE_S of the run's end are not judged). The kills are the harness's lines; the
    links and the live sets the shard's."""
    if na := _not_applicable("membership_follows_links", log):
        return na
    learners = set(learner_names(log))
    t_end = log.header.get("t_end", log.events[-1]["t"] if log.events else 0.0)
    bad, commits, kills = [], 0, 0
    for shard in _shards(log):
        linked: set = set()      # learners whose link this shard holds, by its own lines
        waiting: dict = {}       # learner -> the harness's kill line this shard has not yet seen down
        for e in log.events:
            src, kind = e["src"], e["kind"]
            if src == shard and kind in ("link_up", "link_down") and e.get("peer") in learners:
                (linked.add if kind == "link_up" else linked.discard)(e["peer"])
                if kind == "link_down":
                    waiting.pop(e["peer"], None)
            elif src == shard and (is_process_up(e) or kind == "unit_down"):
                linked, waiting = set(), {}  # a dead or restarted shard holds no link, sees none go down
            elif src == shard and kind == "round_commit" and "live" in e:
                commits += 1
                ghosts = sorted(set(e["live"]) - linked)
                if ghosts:
                    bad.append({"shard": shard, "t": e["t"], "fragment": e["fragment"], "version": e["version"],
                                "live": e["live"], "why": f"counts {', '.join(ghosts)} live after its link went down"})
            elif src in learners and kind == "unit_down" and e.get("reason") in KILLED:
                kills += 1
                if src in linked and t_end - e["t"] >= END_SETTLE_S:
                    waiting[src] = e
            elif src in learners and is_process_up(e) and src in waiting:
                kill = waiting.pop(src)
                bad.append({"shard": shard, "learner": src, "killed_at": kill["t"], "up_again": e["t"],
                            "why": "the shard never saw the killed learner's link go down"})
        bad += [{"shard": shard, "learner": who, "killed_at": kill["t"],
                 "why": "the shard never saw the killed learner's link go down"} for who, kill in waiting.items()]
    if not commits and not kills:
        return Result("membership_follows_links", None, None, 0, {"why": "no commits with live sets in this log"})
    return Result("membership_follows_links", not bad, len(bad), 0,
                  {"violations": bad[:SHOW], "commits": commits, "kills": kills})


STARVE_SLACK_CYCLES = 2  # the core looks when a fragment of the shard comes due (once a cycle), then once more


def starved_learners_reanchor(log: EventLog) -> Result:
    """A learner that hears nothing from a shard (no line it `recv`s from it but RoundOpens,
    which answer nothing of its own) for `diloco.starve_cycles` fragment cycles, while its link
    to that shard is up, asks the shard again (a Hello it sends, or tries to) within
    STARVE_SLACK_CYCLES more cycles; after an unanswered Hello the wait doubles, as the rule
    says (docs/PROTOCOL.md). Counted in the learner's own inner steps (its `step` lines), so a
    slow machine does not move the bound. The learner's own lines, but not its own verdict:
    the check never reads its `starved` lines."""
    mode = _mode(log)
    d = log.config["diloco"]
    starve, H = int(d.get("starve_cycles") or 0), int(d.get("sync_every") or 0)
    if mode != "decoupled" or not starve or not H:
        return Result("starved_learners_reanchor", True, 0, 0, {"why": f"{mode}, starve_cycles {starve}: no rule"})
    shards, learners = set(_shards(log)), set(learner_names(log))
    bad, silences = [], 0
    for learner in sorted(learners):
        step, linked, heard, asked = 0, set(), {}, {}
        for e in log.events:
            if e["src"] != learner:
                continue
            kind, peer = e["kind"], e.get("peer")
            if is_process_up(e):
                step, linked, heard, asked = int(e.get("step") or 0), set(), {}, {}
            elif kind == "step":
                step = int(e["step"])
                for shard in sorted(linked):
                    since = max(heard.get(shard, step), asked.get(shard, (step, 0))[0])
                    tries = asked.get(shard, (0, 0))[1]
                    bound = starve * H * (2 if tries else 1) + STARVE_SLACK_CYCLES * H
                    if step - since > bound:
                        silences += 1
                        bad.append({"learner": learner, "shard": shard, "t": e["t"], "step": step,
                                    "silent_since_step": since, "bound_steps": bound,
                                    "why": f"heard nothing from {shard} for {step - since} steps and did not ask again"})
                        asked[shard] = (step, tries)  # one violation per silence
            elif peer in shards and kind == "link_up":
                linked.add(peer)
                heard[peer] = step
            elif peer in shards and kind == "link_down":
                linked.discard(peer)
            elif peer in shards and kind == "recv" and e.get("msg") != "RoundOpen":
                heard[peer], asked[peer] = step, (step, 0)
            elif peer in shards and kind in ("send", "drop") and e.get("msg") == "Hello":
                silences += 1
                asked[peer] = (step, asked.get(peer, (step, 0))[1] + 1)
    return Result("starved_learners_reanchor", not bad, len(bad), 0, {"violations": bad[:SHOW], "asked": silences})


# --- Δs against the steps they claim ------------------------------------------------------------------
DELTA_RTOL = 1e-3     # a Δ against the sum of its steps' changes: float32 rounding, far below this
DELTA_ATOL = 1e-5     # ... plus the rounding of the takes between them (× ‖Θ[p]‖ of the sample)


def _claims(log: EventLog) -> tuple[dict, set, int]:
    """(learner, incarnation, seq) -> (its Δ's `progress` by the tally or None where not recorded,
    its claimed steps to_step − from_step, the tokens its life's step lines give those steps or
    None), the keys the `corrupt` fault touched, and the number of contribute lines."""
    claims, corrupt, n = {}, set(), 0
    combined = {}
    for learner in learner_names(log):
        for life in _lives(log, learner):
            inc = next((e.get("incarnation") for e in life if is_process_up(e) and "incarnation" in e), None)
            # the core's step -> its tokens, this life's step lines (a step's line follows the Δ it
            # ends; the lines count from the restored step, the core from 0)
            since = next((e.get("step") or 0 for e in life if is_process_up(e) and "incarnation" in e), 0)
            tokens = {e["step"] - since: e.get("tokens", 0) for e in life if e["kind"] == "step"}
            for e in life:
                if e["kind"] == "contribute":
                    n += 1
                    x = e.get("progress")
                    span = range(e["from_step"] + 1, e["to_step"] + 1)
                    made = sum(tokens[s] for s in span) if all(s in tokens for s in span) else None
                    claims[(learner, inc, e["seq"])] = (None if x is None else spec.arrays_of([x])[0], len(span), made)
                elif e["kind"] == "corrupt":
                    corrupt.add((learner, inc, e["seq"]))
    # a combine (a learner's outbox, or a shard holding two unmerged Δs of one learner) sends
    # or merges old + new under the new seq (trainer/numerics/wiring.py logged_combiner, combine); one Δ
    # can take several: the outbox's (seq 136 into 138) and then the shard's (133 into 138)
    for e in log.of("drop"):
        if e.get("reason") == "combined" and "by_seq" in e:
            combined.setdefault((e["learner"], e["incarnation"], e["by_seq"]), []).append(
                (e["learner"], e["incarnation"], e["seq"]))
    whole: dict = {}

    def total(key, depth=0):
        """key's own claim plus every claim combined into it, nested combines too."""
        if key in whole or depth > 64:
            return whole.get(key)
        a, sa, ta = claims[key]
        for old in combined.get(key, ()):
            if old in claims and (part := total(old, depth + 1)) is not None:
                b, sb, tb = part
                a, sa, ta = (None if a is None or b is None else a + b, sa + sb,
                             None if ta is None or tb is None else ta + tb)
            if old in corrupt or any(k in corrupt for k in combined.get(old, ())):
                corrupt.add(key)
        whole[key] = (a, sa, ta)
        return whole[key]
    for key in sorted(combined, key=lambda k: k[2]):
        if key in claims:
            total(key)
    return {**claims, **whole}, corrupt, n


def deltas_reexecuted(log: EventLog) -> Result:
    """Every Δ a shard merged and sampled (its commit_audit, in its merge lines' order) equals
    minus the sum of what its learner's inner steps from_step+1 .. to_step changed on that
    fragment (the learner's `progress`: trainer/numerics/tally.py, recorded around each step, outside
    the core's take and keep rules). The judge's arithmetic: the difference against
    DELTA_RTOL of the claimed progress plus DELTA_ATOL of Θ[p]. Δs the `corrupt` fault
    damaged are left out (guard_decisions and tokens_conserved judge those). Not applicable
    where a Δ is not its steps' sum by design: data-parallel modes, mixing α > 0 without
    keep_local, lossy uplinks (the error feedback carries the last Δ's rounding)."""
    name = "deltas_reexecuted"
    if na := _not_applicable(name, log):
        return na
    d = log.config["diloco"]
    if d.get("compression", "fp32") != "fp32":
        return Result(name, True, 0, 0, {"why": f"uplink {d['compression']}: a Δ carries the last one's rounding "
                                               "(error feedback); not applicable"})
    if not d.get("keep_local", True) and float(d.get("mixing", 0.0)) > 0:
        return Result(name, True, 0, 0, {"why": "mixing α > 0 without keep_local: a take moves θ[p] by the mix; "
                                               "not applicable"})
    claims, corrupt, claimed = _claims(log)
    bad, rebuilt, unrecorded, damaged, merged, worst = [], 0, 0, 0, 0, 0.0
    for shard in _shards(log):
        for life in _lives(log, shard):
            merges = defaultdict(list)
            for e in life:
                if e["kind"] == "merge":
                    merges[(e["fragment"], e["version"])].append(e)
                elif e["kind"] == "commit_audit":
                    ms = merges.get((e["fragment"], e["version"]), [])
                    theta = spec.arrays_of([e["theta"]])[0].astype(np.float64)
                    for m, x in zip(ms, spec.arrays_of(e["deltas"])):
                        merged += 1
                        key = (m["learner"], m["incarnation"], m["seq"])
                        if key in corrupt:
                            damaged += 1
                            continue
                        want, steps, tokens = claims.get(key, (None, None, None))
                        where = {"shard": shard, "learner": key[0], "incarnation": key[1], "seq": key[2],
                                 "fragment": e["fragment"], "version": e["version"], "t": e["t"]}
                        if steps is not None and (m["c_steps"] != steps or tokens not in (None, m["c_tokens"])):
                            bad.append({**where, "why": f"it claims {m['c_steps']} steps and {m['c_tokens']} tokens; "
                                                        f"the steps it was made over are {steps}, with {tokens} tokens"})
                        if want is None or want.shape != x.shape:
                            unrecorded += 1
                            continue
                        rebuilt += 1
                        err = float(np.linalg.norm(x.astype(np.float64) - want))
                        tol = DELTA_RTOL * float(np.linalg.norm(want)) + DELTA_ATOL * float(np.linalg.norm(theta)) + 1e-12
                        worst = max(worst, err / tol)
                        if not err <= tol:
                            bad.append({**where, "why": f"the merged Δ is {float(np.linalg.norm(x)):.6g} long, its steps "
                                               f"{m['c_steps']} made {float(np.linalg.norm(want)):.6g}; they differ by "
                                               f"{err:.3g} (tolerance {tol:.3g})"})
    detail = {"violations": bad[:SHOW], "rebuilt": rebuilt, "merged_sampled": merged, "unrecorded": unrecorded,
              "corrupted": damaged, "contributions": claimed, "worst_of_tolerance": round(worst, 4)}
    if (merged or log.of("merge")) and not rebuilt and not bad:
        return Result(name, None, None, 0, {**detail, "why": "no merged Δ has a record of its steps" if merged
                                            else "no commit_audit lines: the merged Δs are not in this log"})
    return Result(name, not bad, len(bad), 0, detail)


def audit_checks(log: EventLog) -> list[Result]:
    return [weights_match_staleness(log), quorum_respected(log), grace_respected(log), commits_audited(log),
            copies_consistent(log), progress_staleness_bounded(log),
            deltas_reexecuted(log), inner_steps_reexecuted(log), guard_decisions(log), restores_faithful(log),
            committed_rounds_kept(log), membership_follows_links(log), starved_learners_reanchor(log)]
