"""The token-fate ledger: where every token a learner trained went (from the log alone).

A learner unit's inner step trains on `tokens` tokens (its `step` line). For each fragment
p the learner core counts the tokens since p was last cut, and a cut is one of:
- a `contribute` line (the Δ of p sent with `tokens`): the tokens' fate is the
  contribution's: **merged** into a committed round (directly, or `combined` into /
  `superseded` by a later contribution that was), **dropped** by the shard (stale,
  corrupt, empty, future_base, zero_weight, old_seq), **lost** (the link dropped it, or the
  shard died holding it, or a crash lost the round that merged it), or **in flight** at
  the end (pending in a round, or never answered);
- a `discard` line (a take threw p's local progress away: a fetch, an overwrite, or progress
  too stale to keep): **superseded**, by its `why`.
What no cut took when the incarnation ended is **lost** with the dead unit, or **in
flight** (unsent) when its `done` line says it stopped cleanly.

So, per learner incarnation and fragment, the fates partition the steps it trained. The
unit is the token: a fragment's share of a token is 1/P, so each learner's fates sum to its
tokens trained. `tokens_conserved` checks what can break that: a cut claiming other tokens
than its steps trained (a counter bug), a contribution merged twice, a merge whose
`c_tokens` is not the sum of the contributions it holds, a contribution the learner
corrupted (a `corrupt` line: silent data corruption) merged. docs/METRICS.md has the details.
"""
from __future__ import annotations

from collections import defaultdict

from diloco_chaos.harness.judging.check_base import SHOW, Result, _lost_merges
from diloco_chaos.harness.eventlog import EventLog
from diloco_chaos.harness.judging.history import fragment_count, histories, is_process_up, learner_names, window
from diloco_chaos.harness.judging.model_checks import absorptions
from diloco_chaos.trainer.protocol.protocol_base import DP_MODES

FATES = ("merged", "superseded", "lost", "dropped", "in_flight")
SHARD_DROPS = {"Contribution", "contribution"}  # the `what` of a shard's drop of a contribution


def ledger(log: EventLog) -> dict | None:
    """{fates, fragments, learners: {name: {trained, merged, …, why: {fate: {cause: tokens}}}},
    total, violations}; None when no learner trained a step."""
    return _Ledger(log).build()


def tokens_conserved(log: EventLog) -> Result:
    """Every token trained ends in exactly one fate: no cut claims other tokens than its steps
    trained, no contribution is merged twice, every merge's c_tokens is the sum of the
    contributions in it. Unknown for a log whose contribute lines carry no tokens."""
    book = _Ledger(log).build()
    if book is None:
        return Result("tokens_conserved", True, 0, 0, {"why": "no step trained"})
    if book.get("unknown"):
        return Result("tokens_conserved", None, None, 0, {"why": book["unknown"]})
    bad = book["violations"]
    total = book["total"]
    return Result("tokens_conserved", not bad, len(bad), 0,
                  {"violations": bad[:SHOW], "trained": total["trained"],
                   **{f: total[f] for f in FATES}})


class _Ledger:
    def __init__(self, log: EventLog):
        self.log = log
        self.P = fragment_count(log)
        self.bad: list[dict] = []
        # token-fragments per learner and fate (exact integers), and per (fate, cause)
        self.book: dict[str, dict] = {}
        self.why: dict[str, dict] = {}

    def build(self) -> dict | None:
        log = self.log
        hs = histories(log, window(log)[1])
        names = [n for n in learner_names(log) if n in hs]
        if not any(inc.steps for n in names for inc in hs[n].incs):
            return None
        mode = log.config["diloco"]["mode"]
        contributes = [e for n in names for inc in hs[n].incs for e in inc.events if e["kind"] == "contribute"]
        if mode not in DP_MODES and (any("tokens" not in e for e in contributes)
                                     or (log.of("merge") and not contributes)):
            return {"unknown": "contribute lines without token counts: a log from before the ledger"}
        self.fate = self._contribution_fates(hs, names) if mode not in DP_MODES else {}
        for n in names:
            self.book[n] = {"trained": 0, **{f: 0 for f in FATES}}
            self.why[n] = defaultdict(lambda: defaultdict(int))
            for inc in hs[n].incs:
                self._incarnation(n, inc, dp=mode in DP_MODES)
        return self._result(names, mode)

    # --- the learner's side: cuts of each fragment's token counter ---------------------------
    def _incarnation(self, name: str, inc, dp: bool) -> None:
        steps = {int(e["step"]): int(e.get("tokens") or 0) for e in inc.steps}
        if dp:  # a dp step line comes after its mean was applied: every step is in the model
            self._book(name, "merged", "dp_step", sum(steps.values()) * self.P)
            self.book[name]["trained"] += sum(steps.values()) * self.P
            return
        # the core counts its steps from 0 in each incarnation; step lines count from the
        # checkpoint the incarnation restored (start_step)
        start = inc.start_step
        cuts: dict[int, list] = defaultdict(list)
        for e in inc.events:
            if e["kind"] in ("contribute", "discard"):
                at = start + int(e["to_step"] if e["kind"] == "contribute" else e["step"])
                cuts[int(e["fragment"])].append((at, int(e["tokens"]), e))
        # Step lines a kill cut off: their tokens from the cut that holds them. A step's line
        # is written after the next step (never waiting on the device), and a Δ leaves during
        # the step it ends, so a kill right after it takes the lines of that step and the one
        # before: at most two, at the end of an incarnation that did not end cleanly.
        logged = max(steps, default=start)
        for p in range(self.P):
            pos = start
            for at, tokens, _ in cuts[p]:
                missing = [s for s in range(pos + 1, at + 1) if s not in steps]
                tail = not inc.done and len(missing) == 2 and missing == [at - 1, at] and at - 1 > logged
                if (len(missing) == 1 and missing[0] == at) or tail:
                    left = tokens - sum(steps.get(s, 0) for s in range(pos + 1, at + 1))
                    for i, s in enumerate(missing):
                        steps[s] = left // len(missing) + (left % len(missing) if i == len(missing) - 1 else 0)
                pos = max(pos, at)
        last = max(steps, default=start)
        # decoupled, keeping local progress: each Δ holds exactly the steps since the last cut
        # (from_step + 1 … to_step), so its token count must be theirs too
        own = self.log.config["diloco"].get("mode") == "decoupled" and self.log.config["diloco"].get("keep_local")
        self.book[name]["trained"] += sum(steps.values()) * self.P
        for p in range(self.P):
            pos = start
            for at, tokens, e in cuts[p]:
                held = sum(steps.get(s, 0) for s in range(pos + 1, at + 1))
                lo = start + int(e["from_step"]) if own and e["kind"] == "contribute" else pos
                inside = held if lo == pos else sum(steps.get(s, 0) for s in range(lo + 1, at + 1))
                if at < pos or held != tokens or inside != tokens:
                    self.bad.append({"learner": name, "incarnation": inc.n, "fragment": p, "kind": e["kind"],
                                     "seq": e.get("seq"), "steps": [lo + 1, at], "claimed": tokens,
                                     "trained": inside, "t": e["t"]})
                if e["kind"] == "discard":
                    self._book(name, "superseded", e.get("why", "fetch"), held)
                else:
                    fate, cause = self.fate.get((name, e.get("incarnation", inc.n), e["seq"], p),
                                                ("in_flight", "unanswered"))
                    self._book(name, fate, cause, held)
                pos = max(pos, at)
            tail = sum(steps.get(s, 0) for s in range(pos + 1, last + 1))
            self._book(name, *(("in_flight", "unsent_at_end") if inc.done else ("lost", "dead_learner")), tail)

    def _book(self, name: str, fate: str, cause: str, amount: int) -> None:
        if amount:
            self.book[name][fate] += amount
            self.why[name][fate][cause] += amount

    # --- the shards' side: what became of each contribution -----------------------------------
    def _contribution_fates(self, hs: dict, names: list) -> dict[tuple, tuple]:
        log = self.log
        sent: dict[tuple, dict] = {}
        for n in names:
            for inc in hs[n].incs:
                for e in inc.events:
                    if e["kind"] == "contribute":
                        sent[(n, e.get("incarnation", inc.n), e["seq"], int(e["fragment"]))] = e
        lost_ids = _lost_merges(log)
        merges: dict[tuple, list] = defaultdict(list)
        for e in log.of("merge"):
            merges[(e["learner"], e["incarnation"], e["seq"], int(e["fragment"]))].append(e)
        absorbed = absorptions(log, set(sent) | set(merges))
        shards = set((log.header.get("topology") or {}).get("shards") or {})
        dropped, on_link = {}, set()
        for e in log.of("drop"):
            key = (e.get("learner"), e.get("incarnation"), e.get("seq"), e.get("fragment"))
            if e["src"] in shards and e.get("what") in SHARD_DROPS and e.get("reason") not in ("combined", "superseded"):
                dropped.setdefault(key, e["reason"])
            elif e["src"] in names and e.get("msg") == "Contribution":  # the link refused the frame
                on_link.add(key)
        ups = defaultdict(list)
        for e in log.events:
            if e["src"] in shards and is_process_up(e):
                ups[e["src"]].append(e["t"])
        owner = {int(p): s for s, ps in ((log.header.get("topology") or {}).get("shards") or {}).items() for p in ps}

        def follow(key: tuple) -> tuple:  # along combined / superseded hops to a merge or an end
            hops = set()
            while not merges.get(key) and key in absorbed and key not in hops:
                hops.add(key)
                key = absorbed[key][0]
            return key

        corrupt = {(e["src"], e.get("incarnation"), e.get("seq"), e.get("fragment")): e for e in log.of("corrupt")}
        out: dict[tuple, tuple] = {}
        held = defaultdict(int)  # each merge's c_tokens: the tokens of the contributions it holds
        for key, e in sent.items():
            end = follow(key)
            held[end] += int(e["tokens"])
            kept = [m for m in merges.get(end, []) if id(m) not in lost_ids]
            if kept:
                out[key] = ("merged", "merged")
                if key in corrupt:  # silent data corruption got past the shard's guard
                    self.bad.append({"learner": key[0], "incarnation": key[1], "seq": key[2], "fragment": key[3],
                                     "kind": "corrupt_merged", "mode": corrupt[key].get("mode"),
                                     "versions": [m["version"] for m in kept], "t": kept[0]["t"]})
                if len(kept) > 1 and end == key:
                    self.bad.append({"learner": key[0], "incarnation": key[1], "seq": key[2], "fragment": key[3],
                                     "kind": "merged_twice", "versions": [m["version"] for m in kept], "t": kept[1]["t"]})
            elif merges.get(end):
                out[key] = ("lost", "round_lost_in_shard_crash")
            elif end in dropped:
                out[key] = ("dropped", dropped[end])
            elif end in on_link or key in on_link:
                out[key] = ("lost", "link")
            elif any(t > e["t"] for t in ups.get(owner.get(key[3]), [])[1:]):
                out[key] = ("lost", "dead_shard")
            else:
                out[key] = ("in_flight", "pending_at_end")
        for key, ms in merges.items():
            if key in sent and ms and int(ms[0].get("c_tokens", held[key])) != held[key]:
                self.bad.append({"learner": key[0], "incarnation": key[1], "seq": key[2], "fragment": key[3],
                                 "kind": "merge_tokens", "merged_c_tokens": ms[0]["c_tokens"],
                                 "contributed": held[key], "t": ms[0]["t"]})
        return out

    def _result(self, names: list, mode: str) -> dict:
        P = self.P

        def tok(x: int) -> float:
            return round(x / P, 3)
        learners = {}
        total = {"trained": 0, **{f: 0 for f in FATES}}
        for n in names:
            b = self.book[n]
            if sum(b[f] for f in FATES) != b["trained"]:
                self.bad.append({"learner": n, "kind": "fates_do_not_sum", "trained": tok(b["trained"]),
                                 "fates": tok(sum(b[f] for f in FATES))})
            learners[n] = {"trained": tok(b["trained"]), **{f: tok(b[f]) for f in FATES},
                           "why": {f: {c: tok(v) for c, v in sorted(cs.items())} for f, cs in self.why[n].items()}}
            for k in total:
                total[k] += b[k]
        return {"unit": "tokens", "fragments": P, "mode": mode, "fates": list(FATES), "learners": learners,
                "total": {k: tok(v) for k, v in total.items()},
                "share": {f: (total[f] / total["trained"] if total["trained"] else None) for f in FATES},
                "violations": self.bad}
