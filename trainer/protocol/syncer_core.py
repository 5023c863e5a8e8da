"""SyncerCore: one syncer shard as a sans-IO state machine (docs/PROTOCOL.md, "Syncer").

The shard owns some fragments. Per fragment p it holds the global Θ[p], the outer
optimizer state, version[p] and, while an outer round is open, the pending
contributions. Every event is a method `(state, now, ...) -> (state, actions)`; the
state is immutable (dicts inside are never mutated: each transition builds new ones).

An outer round for p (decoupled mode; streaming and sync_diloco use K = M and no grace):

  idle ──contribution──▶ collecting ──K distinct learners──▶ grace ──deadline or all live in──▶ commit ─▶ idle
                          (round_open)       (SetTimer at quorum + grace)          (merge, outer step, version+1,
                                                                                     Θ[p] to live, SaveCheckpoint)

  grace = γ · max(0, τ·ξ_step − ξ_quorum − ξ_sync)

ξ_step and ξ_sync are EMAs of what learners report in their contributions, ξ_quorum of
(quorum time − round open time), all shard-wide; ξ_quorum takes the current round's
observation before the grace is computed. In "dp" / "elastic_dp" a round collects one
GradStep per learner and answers each with the token-weighted mean (GradMean).

Bounded staleness (decoupled mode; docs/PROTOCOL.md "Bounded staleness"):
- a contribution staler than `max_staleness` versions (version[p] − its base_version) is
  not merged, whoever else is in the round: it is dropped (`drop reason=stale`) and
  the learner gets the current Θ[p] whole, to re-anchor on (bug `relative_discount`:
  no bound, only the discount inside the round, which a round of one cancels);
- a commit goes to every live learner (`downlink = "all"`), or only to the learners it
  merged (`"answer"`: each takes Θ[p] once per cycle, M times fewer bytes down; with
  `keep_local`, docs/PROTOCOL.md "Downlink"); any Θ[p] taken after a learner's send
  answers it, and the links keep only the newest unsent whole Θ[p] per learner;
- a second contribution of the same learner in one open round (after a re-anchor) is
  summed into it (`drop reason=combined`): their steps are disjoint.

Aligned rounds (decoupled, `align`; docs/PROTOCOL.md "Aligned rounds"): a round's opening
goes to every other live learner as a RoundOpen(p, version); a learner due soon joins it,
and the grace window lasts at least ALIGN_WAIT_STEPS inner-step times for it to arrive.

All math is injected (`SyncerMath`), so this file imports neither JAX nor the optimizer.
"""
from __future__ import annotations

import math
from dataclasses import replace

from diloco_chaos.trainer.protocol import guard
from diloco_chaos.trainer.protocol.messages import (Contribution, FragmentDelta, FragmentUpdate, GradStep, Hello,
                                                    Repair, RepairRequest, RoundOpen, held_copies)
from diloco_chaos.trainer.protocol.protocol_base import (DILOCO_MODES, DP_MODES, MODES, IllegalTransition, Journal, Log,
                                                         SaveCheckpoint, Send, SetTimer, UnexpectedMessage,
                                                         UnknownFragment, UnknownPeer, ema)
from diloco_chaos.trainer.protocol.syncer_dp import SyncerDP
from diloco_chaos.trainer.protocol.syncer_types import (Pending, Repairing, Round, SyncerConfig, SyncerMath,
                                                        SyncerState)

SNAPSHOT_FORMAT = 1
# `align`: a round's grace window lasts at least this many inner-step times (ξ_step), so the
# learners a RoundOpen reaches mid-step can finish that step and join
ALIGN_WAIT_STEPS = 4.0
# a round holding a closing Δ (trainer/protocol/learner_close.py) waits this long for every live learner
CLOSE_HOLD_S = 8.0
# repair from the learners: how long a restarted shard waits for the copy it asked for
# before it gives up and answers with what it restored
REPAIR_WAIT_S = 10.0
# a restarted shard's first round of each fragment waits this long past its quorum for every
# learner of the run to be back (their reconnects spread over the links' backoff, up to 1 s):
# committed with the first one alone, the next fetch of the others is 2+ versions ahead and
# throws away all they made while the shard was down (11 % of the tokens of syncer-crash on
# processes)
RESTART_HOLD_S = 1.5


def _without(d: dict, key) -> dict:
    return {k: v for k, v in d.items() if k != key}


class SyncerCore:
    # message type -> (handler, modes in which it is legal)
    _HANDLERS = {
        Hello: ("_on_hello", MODES),
        Contribution: ("_on_contribution", DILOCO_MODES),
        Repair: ("_on_repair", DILOCO_MODES),
        GradStep: ("_on_grad_step", DP_MODES),
    }

    def __init__(self, config: SyncerConfig, math: SyncerMath):
        if config.mode in DP_MODES and math.average is None:
            raise ValueError(f"mode {config.mode!r} needs SyncerMath.average")
        self.config, self.math = config, math
        self._dp = SyncerDP(math)  # the data-parallel baselines' side, a collaborator

    def init(self, theta: dict) -> SyncerState:
        """Θ[p] for every owned p (the run's initial parameters), at version 0."""
        frags = self.config.fragments
        if missing := set(frags) - set(theta):
            raise ValueError(f"init needs Θ for every owned fragment; missing {sorted(missing)}")
        digest = self.math.digest([a for p in frags for a in theta[p]]) if self.math.digest else ""
        return SyncerState(theta={p: list(theta[p]) for p in frags},
                           outer={p: self.math.outer_init(theta[p]) for p in frags},
                           version=dict.fromkeys(frags, 0), durable=dict.fromkeys(frags, 0), theta0=digest)

    # --- events -----------------------------------------------------------------------------
    def learner_connected(self, state: SyncerState, now: float, learner: str):
        self._known(learner)
        return replace(state, live=state.live | {learner}), []

    def learner_disconnected(self, state: SyncerState, now: float, learner: str):
        """The live set shrinks: a round waiting for 'all live learners' may now commit."""
        self._known(learner)
        held = {k: v for k, v in state.held.items() if k[0] != learner}  # it fetches afresh
        live = state.live if "sticky_membership" in self.config.bugs else state.live - {learner}  # planted
        state, actions = replace(state, live=live, held=held), []
        for p, r in sorted(state.repairing.items()):  # it will not answer, or hear the answer
            if learner in r.waiting:
                state, more = self._repair_next(state, now, p, {k: v for k, v in r.waiting.items() if k != learner},
                                                asked_gone=r.learner == learner)
                actions += more
        for p in sorted(state.rounds):
            state, more = self._advance(state, now, p)
            actions += more
        return state, actions

    def receive(self, state: SyncerState, now: float, sender: str, msg):
        handler, modes = self._HANDLERS.get(type(msg), (None, ()))
        if self.config.mode not in modes:
            raise UnexpectedMessage(f"shard {self.config.shard} ({self.config.mode}) never receives "
                                    f"{type(msg).__name__}")
        if msg.learner != sender:
            raise UnknownPeer(f"{type(msg).__name__} signed {msg.learner!r} arrived from {sender!r}")
        self._known(sender)
        return getattr(self, handler)(state, now, msg)

    def timer(self, state: SyncerState, now: float, key: str):
        """A grace window may have expired. Timers of rounds already closed are harmless."""
        kind, _, p = key.partition(":")
        if kind not in ("grace", "repair") or not p.isdigit():
            raise IllegalTransition(f"unknown timer {key!r}")
        p = self._owned(int(p))
        if kind == "repair":
            r = state.repairing.get(p)
            if r is None or now < r.deadline:
                return state, []
            return self._repair_failed(state, p, "no answer")
        return self._advance(state, now, p)

    def durable(self, state: SyncerState, now: float, versions: dict):
        """The shell saved a snapshot holding these versions: they survive a restart."""
        for p, v in versions.items():
            if v > state.version[self._owned(p)]:
                raise IllegalTransition(f"fragment {p}: version {v} reported durable, only "
                                        f"{state.version[p]} committed")
        durable = {p: max(v, versions.get(p, v)) for p, v in state.durable.items()}
        return replace(state, durable=durable), [Log("checkpoint_saved", {"versions": dict(versions)})]

    # --- the durable part -------------------------------------------------------------------
    def snapshot(self, state: SyncerState) -> dict:
        """Θ, outer states, versions, who was merged last and who closed: the checkpoint."""
        merged: dict = {}
        for (learner, p), (inc, seq) in sorted(state.last_merged.items()):
            merged.setdefault(learner, {})[str(p)] = [inc, seq]
        return {"format": SNAPSHOT_FORMAT, "shard": self.config.shard,
                "fragments": {str(p): {"version": state.version[p], "theta": list(state.theta[p]),
                                       "outer": state.outer[p]} for p in self.config.fragments},
                "last_merged": merged, "closed": sorted(state.closed)}

    def restore(self, snap: dict) -> SyncerState:
        """A restarted shard: the snapshot's versions are durable; rounds and links start empty."""
        cfg = self.config
        if snap.get("format") != SNAPSHOT_FORMAT or snap.get("shard") != cfg.shard:
            raise ValueError(f"snapshot of shard {snap.get('shard')!r} format {snap.get('format')}, "
                             f"expected shard {cfg.shard!r} format {SNAPSHOT_FORMAT}")
        frags = {int(p): f for p, f in snap["fragments"].items()}
        if set(frags) != set(cfg.fragments):
            raise ValueError(f"snapshot holds fragments {sorted(frags)}, shard owns {list(cfg.fragments)}")
        version = {p: int(f["version"]) for p, f in frags.items()}
        return SyncerState(theta={p: list(f["theta"]) for p, f in frags.items()},
                           outer={p: f["outer"] for p, f in frags.items()}, version=version,
                           durable=dict(version), closed=frozenset(snap.get("closed", ())),
                           rejoining=frozenset(frags),
                           last_merged={(learner, int(p)): (int(v[0]), int(v[1]))
                                        for learner, d in snap["last_merged"].items() for p, v in d.items()})

    def grace_s(self, state: SyncerState) -> float:
        if self.config.mode != "decoupled":
            return 0.0
        budget = self.config.tau * (state.xi_step or 0.0) - (state.xi_quorum or 0.0) - (state.xi_sync or 0.0)
        if self.config.align:  # the joiners send at the end of the inner step they are in
            return max(self.config.grace_gamma * budget, ALIGN_WAIT_STEPS * (state.xi_step or 0.0))
        return self.config.grace_gamma * max(0.0, budget)

    # --- message handlers -------------------------------------------------------------------
    def _on_hello(self, state: SyncerState, now: float, msg: Hello):
        if self.config.mode in DP_MODES:
            return state, []  # nothing to fetch: dp shards hold no parameters
        state, held_back, actions = self._repair_hello(state, now, msg)
        answer = [p for p in self.config.fragments if p not in held_back]
        held = dict(state.held)
        if self.math.broadcast_delta is not None:  # it now holds Θ exactly
            held.update({(msg.learner, p): (state.version[p], state.theta[p]) for p in answer})
        # a fresh learner holding this shard's Θ0: a fragment still at version 0 goes without params
        same = bool(msg.fresh) and msg.fresh == state.theta0
        return replace(state, held=held, closed=state.closed - {msg.learner}), actions + [
            Send(msg.learner, FragmentUpdate(p, state.version[p], True,
                                             [] if same and state.version[p] == 0 else state.theta[p],
                                             unmoved=self._unmoved(state, p)))
            for p in answer]

    def _unmoved(self, state: SyncerState, p: int) -> bool:
        """No round of p committed since this shard's restart (FragmentUpdate.unmoved)."""
        return p in state.rejoining

    # --- repair from the learners (docs/PROTOCOL.md "Repair from the learners") --------------
    def remember(self, state: SyncerState, entries) -> SyncerState:
        """A restart's journal: the (fragment, version, digest) its earlier incarnations
        committed, oldest first (`Journal` actions, kept apart from the checkpoints). The
        versions past what the restore holds are the ones a learner's copy may repair, if
        its digest is the journal's (a version written again drops the history after it:
        the shard forked there)."""
        journal: dict = {}
        for p, v, digest in entries:
            if p in self.config.fragments:
                journal[p] = {**{u: d for u, d in journal.get(p, {}).items() if u < v}, v: digest}
        journal = {p: {v: d for v, d in js.items() if v > state.version[p]} for p, js in journal.items()}
        rejoining = state.rejoining | (frozenset(self.config.fragments) if entries else frozenset())  # a restart
        return replace(state, journal={p: js for p, js in journal.items() if js}, rejoining=rejoining)

    def _repair_hello(self, state: SyncerState, now: float, msg: Hello):
        """(state, fragments whose answer waits for a repair, actions). A learner's Hello says
        which copies it holds; one at a version past this shard's, whose digest the journal
        names, is asked for (RepairRequest) instead of rolling the learner back, and the
        learner's answer for that fragment waits for the repair (bug `no_repair`: it is not)."""
        if not (state.journal or state.repairing) or "no_repair" in self.config.bugs:
            return state, set(), []
        try:
            claims = held_copies(msg.held)
        except ValueError:
            claims = {}
        held_back, actions = set(), []
        for p in self.config.fragments:
            claim = claims.get(p)
            good = self._verifiable(state, p, claim)
            r = state.repairing.get(p)
            if r is None and not good:
                continue
            held_back.add(p)
            waiting = {**(r.waiting if r else {}), msg.learner: claim if good else None}
            if r is not None and not (good and claim[0] > r.version):
                state = replace(state, repairing={**state.repairing, p: replace(r, waiting=waiting)})
                continue
            state, more = self._ask(state, now, p, msg.learner, claim[0], waiting)
            actions += more
        return state, held_back, actions

    def _verifiable(self, state: SyncerState, p: int, claim) -> bool:
        return (claim is not None and claim[0] > state.version[p]
                and state.journal.get(p, {}).get(claim[0]) == claim[1])

    def _ask(self, state: SyncerState, now: float, p: int, learner: str, version: int, waiting: dict):
        r = Repairing(version, learner, now + REPAIR_WAIT_S, waiting)
        return replace(state, repairing={**state.repairing, p: r}), [
            Log("repair_asked", {"fragment": p, "version": version, "from_version": state.version[p],
                                 "learner": learner}),
            Send(learner, RepairRequest(p, version)), SetTimer(f"repair:{p}", r.deadline)]

    def _repair_next(self, state: SyncerState, now: float, p: int, waiting: dict, asked_gone: bool):
        """A waiting learner left: if it was the one asked, ask the next that holds a
        verifiable copy, else give up."""
        r = state.repairing[p]
        if not asked_gone:
            return replace(state, repairing={**state.repairing, p: replace(r, waiting=waiting)}), []
        claims = sorted((c[0], learner) for learner, c in waiting.items() if self._verifiable(state, p, c))
        if not claims:
            return self._repair_failed(replace(state, repairing={**state.repairing, p: replace(r, waiting=waiting)}),
                                       p, "the learner asked left")
        return self._ask(state, now, p, claims[-1][1], claims[-1][0], waiting)

    def _repair_failed(self, state: SyncerState, p: int, why: str):
        """No repair: the history past the restored version is lost (the journal of p is
        dropped), and every live learner gets Θ[p] as restored."""
        r = state.repairing[p]
        state = replace(state, repairing=_without(state.repairing, p), journal=_without(state.journal, p))
        log = Log("repair_failed", {"fragment": p, "version": r.version, "from_version": state.version[p],
                                    "learner": r.learner, "why": why})
        state, sends = self._answer(state, p, sorted(state.live), whole=True)
        return state, [log] + sends

    def _on_repair(self, state: SyncerState, now: float, msg: Repair):
        """The copy asked for: taken as Θ[p] at its version if its digest is the journal's,
        and sent whole to every live learner (the waiting ones' fetch, the others' update)."""
        p = self._owned(msg.fragment)
        r = state.repairing.get(p)
        drop = {"what": "Repair", "fragment": p, "learner": msg.learner, "version": msg.version}
        if r is None or r.learner != msg.learner or r.version != msg.version:
            return state, [Log("drop", {**drop, "reason": "unasked"})]
        digest = self.math.digest(list(msg.params))
        if digest != state.journal.get(p, {}).get(msg.version):
            state, actions = self._repair_failed(state, p, "its digest is not the journal's")
            return state, [Log("drop", {**drop, "reason": "repair_mismatch"})] + actions
        old = state.version[p]
        later = {u: d for u, d in state.journal.get(p, {}).items() if u > msg.version}  # a newer copy may still greet it
        state = replace(state, theta={**state.theta, p: list(msg.params)}, version={**state.version, p: msg.version},
                        repairing=_without(state.repairing, p),
                        journal={**_without(state.journal, p), **({p: later} if later else {})})
        state, sends = self._answer(state, p, sorted(state.live), whole=True)
        return state, [Log("repaired", {"fragment": p, "version": msg.version, "from_version": old,
                                        "learner": msg.learner, "digest": digest})] + sends + [
            SaveCheckpoint(dict(state.version))]

    def _on_contribution(self, state: SyncerState, now: float, c: Contribution):
        p = self._owned(c.fragment)
        if p in state.repairing:  # made on a Θ[p] the repair replaces; the repair's Θ[p] answers it
            return state, [self._drop(c, "repairing")]
        prev = state.rounds[p].pending.get(c.learner) if p in state.rounds else None
        why = self._seen(state, p, c, prev)
        if why is None and (c.c_steps < 1 or c.c_tokens < 1):
            why = "empty"
        if why is None and c.base_version > state.version[p]:
            why = "future_base"  # Δ against a version this shard never had (lost in a restart)
        guard, judged = None, []
        if why is None:
            state, guard, judged = self._guard(state, p, c)
            why = "corrupt" if guard else None
        stale = state.version[p] - c.base_version
        if (why is None and self.config.mode == "decoupled" and self.config.max_staleness
                and stale > self.config.max_staleness and "relative_discount" not in self.config.bugs):
            why = "stale"
        if why:
            drop = self._drop(c, why)
            if why == "stale":
                drop.fields.update(staleness=stale, max_staleness=self.config.max_staleness)
            if guard:
                drop.fields.update(guard)
            if why in ("duplicate", "old_seq") or self.config.mode != "decoupled" or c.learner not in state.live:
                return state, judged + [drop]
            # not merged: the learner waits for an answer to p, so it gets Θ[p] to re-anchor on
            state, answer = self._answer(state, p, [c.learner], whole=True)
            return state, judged + [drop] + answer
        new = Pending(c.incarnation, c.seq, c.base_version, c.c_steps, c.c_tokens, c.payload, now)
        if prev is not None and self.config.mode == "decoupled" and self.math.combine is not None:
            # the learner contributes p again only after an answer re-anchored it, so the
            # two Δs hold disjoint steps: their sum is its progress, staleness the older's
            # (planted `combine_newer_base`: the newer's, the sum weighed as fresher than it is)
            base = new.base_version if "combine_newer_base" in self.config.bugs else min(new.base_version,
                                                                                          prev.base_version)
            new = replace(new, c_steps=new.c_steps + prev.c_steps, c_tokens=new.c_tokens + prev.c_tokens,
                          base_version=base,
                          payload=self.math.combine(prev.payload, new.payload), combined=prev.combined + (prev.seq,))
        elif prev is not None and prev.base_version == new.base_version:
            # Same base: the newer Δ = Θ_base − θ_m already holds the older one's progress,
            # so it replaces it and the counters add up.
            new = replace(new, c_steps=new.c_steps + prev.c_steps, c_tokens=new.c_tokens + prev.c_tokens)
        cw = self.config.ema_weight
        state = replace(state, xi_step=ema(state.xi_step, c.step_time_s, cw),
                        xi_sync=state.xi_sync if c.last_sync_s is None else ema(state.xi_sync, c.last_sync_s, cw),
                        closed=state.closed | {c.learner} if c.closing else state.closed)
        state, actions = self._add(state, now, p, c.learner, new, prev)
        return state, judged + actions

    # --- rounds -----------------------------------------------------------------------------
    def _add(self, state: SyncerState, now: float, p: int, learner: str, new: Pending, prev: Pending | None):
        actions = []
        if prev is not None:
            actions.append(Log("drop", {"what": "contribution", "fragment": p, "learner": learner,
                                        "incarnation": prev.incarnation, "seq": prev.seq,
                                        "reason": "combined" if prev.seq in new.combined else "superseded",
                                        "by_seq": new.seq}))
        rnd = state.rounds.get(p)
        if rnd is None:
            rnd = Round(opened_at=now, pending={})
            actions.append(Log("round_open", {"fragment": p, "version": state.version[p], "learner": learner}))
            if self.config.align and self.config.mode == "decoupled":  # the others may join it
                actions += [Send(other, RoundOpen(p, state.version[p])) for other in sorted(state.live - {learner})]
        rnd = replace(rnd, pending={**rnd.pending, learner: new})
        state, more = self._advance(replace(state, rounds={**state.rounds, p: rnd}), now, p)
        return state, actions + more

    # --- dp modes (trainer/protocol/syncer_dp.py) -------------------------------------------
    def _on_grad_step(self, state: SyncerState, now: float, g: GradStep):
        p = self._owned(g.fragment)
        prev = state.rounds[p].pending.get(g.learner) if p in state.rounds else None
        why = self._seen(state, p, g, prev)
        if why:
            return state, [self._drop(g, why)] + self._dp.resend(state, p, g)
        return self._add(state, now, p, g.learner, self._dp.pending(g, now), prev)

    def _commit_dp(self, state: SyncerState, now: float, p: int):
        merged, weights, grads = self._dp.mean(state, p)
        state, actions = self._close(state, now, p, weights, [0] * len(merged))
        state, sends = self._dp.answer(state, p, merged, grads)
        return state, actions + sends

    def _advance(self, state: SyncerState, now: float, p: int):
        """The round table: collecting → grace once K learners are in → commit."""
        rnd = state.rounds.get(p)
        if rnd is None:
            return state, []
        if self.config.mode in DP_MODES:
            expected = frozenset(self.config.learners) if self.config.mode == "dp" else state.live
            return self._commit_dp(state, now, p) if expected.issubset(rnd.pending) else (state, [])
        actions = []
        if rnd.quorum_at is None:
            need = 1 if "ignore_quorum" in self.config.bugs else self.config.k
            if len(rnd.pending) < need:
                return state, []
            state = replace(state, xi_quorum=ema(state.xi_quorum, now - rnd.opened_at, self.config.ema_weight))
            rnd = replace(rnd, quorum_at=now, deadline=now + self.grace_s(state))
            actions.append(SetTimer(f"grace:{p}", rnd.deadline))
        if self._closing(state, p) and rnd.deadline < rnd.quorum_at + CLOSE_HOLD_S:
            rnd = replace(rnd, deadline=rnd.quorum_at + CLOSE_HOLD_S)  # closing: hold for the rest
            actions.append(SetTimer(f"grace:{p}", rnd.deadline))
        # (fp32 broadcasts only: with compressed ones a held round made the global model worse,
        # measured: sparse both ways, a shard and a learner killed, 2.00 nats against 1.96 limit)
        rejoin = (p in state.rejoining and self.config.mode == "decoupled" and self.math.broadcast_delta is None
                  and "no_repair" not in self.config.bugs)
        if rejoin and rnd.deadline < rnd.quorum_at + RESTART_HOLD_S:
            rnd = replace(rnd, deadline=rnd.quorum_at + RESTART_HOLD_S)  # a restart: hold for the others' return
            actions.append(SetTimer(f"grace:{p}", rnd.deadline))
        state = replace(state, rounds={**state.rounds, p: rnd})
        back = not rejoin or (set(self.config.learners) - state.closed).issubset(state.live)
        everyone = ((len(rnd.pending) >= len(state.live - state.closed)) if "commit_by_count" in self.config.bugs
                    else (state.live - state.closed).issubset(rnd.pending))  # planted: a count for the set
        if now >= rnd.deadline or (back and everyone):  # a closed one sends no more
            return self._commit(state, now, p)
        return state, actions

    def _commit(self, state: SyncerState, now: float, p: int):
        rnd, v, bugs = state.rounds[p], state.version[p], self.config.bugs
        merged = sorted(rnd.pending.items())
        stale = [v - pc.base_version for _, pc in merged]
        weights = [float(self.math.weight(pc.c_tokens, pc.c_steps, 0 if "stale_as_fresh" in bugs else s))
                   for (_, pc), s in zip(merged, stale)]
        if not sum(weights) > 0:  # nothing to merge: close the round, Θ and version unchanged
            state, answer = self._answer(replace(state, rounds=_without(state.rounds, p)), p,
                                         [learner for learner, _ in merged], whole=True)
            return state, [
                Log("drop", {"what": "contribution", "fragment": p, "learner": learner, "seq": pc.seq,
                             "incarnation": pc.incarnation, "reason": "zero_weight"}) for learner, pc in merged] + answer
        closing = self._closing(state, p)  # its Δs merge by their plain mean (no RDA stretch)
        deltas = [self.math.decode(pc.payload) for _, pc in merged]
        scale = (self._share(state, merged) * self._warm(state, p, closing)
                 * (0.5 if "damped_outer" in bugs else 1.0))
        n = len(deltas) - 1 if "drop_last_delta" in bugs and len(deltas) > 1 else len(deltas)  # planted: off by one
        before = (state.theta[p], state.outer[p])
        theta, outer = self.math.merge_and_step(*before, deltas[:n], weights[:n], scale, closing)
        state = replace(state, theta={**state.theta, p: list(theta)}, outer={**state.outer, p: outer},
                        journal=_without(state.journal, p),  # a new history of p: nothing left to repair
                        rejoining=state.rejoining - {p})
        evidence = self._evidence(state, p, before, closing)
        state, actions = self._close(state, now, p, weights, stale, evidence)
        actions += self._commit_audit(state, p, before, deltas, weights, closing)
        if "digest" in evidence:  # the journal a restart repairs from
            actions.append(Journal(p, state.version[p], evidence["digest"]))
        state, sends = self._answer(state, p, self._recipients(state, merged))
        return state, actions + sends + [SaveCheckpoint(dict(state.version))]

    def _evidence(self, state: SyncerState, p: int, before: tuple, closing: bool) -> dict:
        """What the commit audit reads (harness/judging/audits.py) on the round_commit line:
        who was live and closed, whether a closing Δ was in, and the digests of Θ[p] before
        and after (`state` holds Θ[p] after)."""
        fields = {"live": sorted(state.live), "closed": sorted(state.closed), "closing": closing}
        if self.math.digest is not None:
            fields.update(before=self.math.digest(before[0]), digest=self.math.digest(state.theta[p]))
        return fields

    def _commit_audit(self, state: SyncerState, p: int, before: tuple, deltas: list, weights: list,
                      closing: bool) -> list:
        """Where the math samples it, a `commit_audit` line with Θ[p], the outer state, every Δ
        the merge lines name and the result, for the judge to redo the commit in its own
        arithmetic."""
        sample = None if self.math.audit is None else self.math.audit(
            before[0], before[1], deltas, weights, state.theta[p], state.outer[p], closing)
        return [] if sample is None else [Log("commit_audit", {"fragment": p, "version": state.version[p], **sample})]

    def _recipients(self, state: SyncerState, merged: list) -> list:
        """Who gets a commit's Θ[p]: every live learner, or (downlink "answer", decoupled) the
        live learners it merged: once per fragment cycle, not ~M times (PROTOCOL.md "Downlink")."""
        if self.config.downlink == "answer" and self.config.mode == "decoupled":
            return sorted(learner for learner, _ in merged if learner in state.live)
        return sorted(state.live)

    def _share(self, state: SyncerState, merged: list) -> float:
        """fleet_share: min(1, K / live learners). A round is expected to hold K of the live
        learners (the quorum), so its merged Δ moves Θ by K learners' share of the fleet: outer
        lr 1 is the fleet's average, as in DiLoCo's synchronous outer step, at K = 1 and K = M.
        Without it, at K = 1 M learners' progress adds up to an M times too long step
        (docs/PROTOCOL.md "Keeping local progress"). share_by "merged": the learners the round
        merged / live, for a grace window that gathers more than K (the paper preset). A
        learner that closed and left still counts: its share is in Θ."""
        if not self.config.fleet_share or self.config.mode != "decoupled":
            return 1.0
        learners = {learner for learner, _ in merged}
        n = len(learners) if self.config.share_by == "merged" else self.config.k
        return min(1.0, n / max(len(state.live | learners | state.closed), 1))

    def _closing(self, state: SyncerState, p: int) -> bool:
        """p's open round holds the Δ of a learner that closed (docs/PROTOCOL.md "Closing")."""
        rnd = state.rounds.get(p)
        return bool(rnd and state.closed & rnd.pending.keys())

    def _warm(self, state: SyncerState, p: int, closing: bool) -> float:
        """The outer warm-up: a fragment's first `outer_warmup` outer steps (versions 1 to
        outer_warmup) move Θ[p] by the fleet's average step (lr 1), not past it; then the
        outer lr applies in full. Early on, while the inner lr peaks, a learner whose
        parameters jump onto a Θ[p] moved 30 % past the average (several commits taken at
        once, as a process descheduled on a shared core takes them) can leave its stable
        region (docs/PROTOCOL.md "Outer warm-up"). A round holding a closing Δ steps by the
        average too: the learners' last progress, at the schedule's lowest lr, is mostly noise."""
        if self.config.mode != "decoupled" or not (state.version[p] < self.config.outer_warmup or closing):
            return 1.0
        return self.config.warmup_scale

    def _answer(self, state: SyncerState, p: int, learners: list, whole: bool = False):
        """Θ[p] at its current version to `learners`: whole, or (compressed broadcasts)
        as a FragmentDelta against the copy the learner holds, where the shard knows it."""
        v, theta, send = state.version[p], state.theta[p], self.math.broadcast_delta
        if send is None or whole:
            update = FragmentUpdate(p, v, False, theta, unmoved=self._unmoved(state, p))
            held = dict(state.held)
            if send is not None:  # it will hold Θ exactly
                held.update({(learner, p): (v, theta) for learner in learners})
            return replace(state, held=held), [Send(learner, update) for learner in sorted(learners)]
        held, actions = dict(state.held), []
        # Learners that hold the same copy (the same object: every learner that took the same
        # deltas since its last whole Θ[p]) get the same delta, encoded once: a shard encoding
        # one delta per learner per commit fell behind its learners on a busy machine
        # (docs/BENCHMARKS.md "int4 at H = 6"). `evidence`: the `held` line's figures, per copy.
        memo: dict = {}
        for learner in sorted(learners):
            had = held.get((learner, p))
            if had is None:  # no Hello answered since it connected: the whole fragment
                held[(learner, p)] = (v, theta)
                actions.append(Send(learner, FragmentUpdate(p, v, False, theta)))
                continue
            key = (had[0], id(had[1]))
            if key not in memo:
                payload, copy = send(theta, had[1])
                if "held_as_exact" in self.config.bugs:  # planted: records Θ[p], not the copy the delta builds
                    copy = theta
                memo[key] = (payload, copy, self._held_figures(theta, had[1], copy))
            payload, copy, figures = memo[key]
            held[(learner, p)] = (v, copy)
            if figures:  # the copy it will hold (copies_consistent)
                actions.append(Log("held", {"learner": learner, "fragment": p, "version": v, "from_version": had[0],
                                            **figures}))
            # on a link that falls behind, a chain of deltas of p gives way to the learner's
            # resulting copy, whole, once it would outweigh it (trainer/protocol/outbox.py)
            whole = FragmentUpdate(p, v, False, copy)
            actions.append(Send(learner, FragmentDelta(p, v, had[0], payload), whole=whole))
        return replace(state, held=held), actions

    def _held_figures(self, theta: list, had: list, copy: list) -> dict:
        """The digest of the copy a learner will hold, and how far it and the copy before were
        from Θ[p] (rms): what copies_consistent reads."""
        if self.math.rms is None or self.math.digest is None:
            return {}
        return {"digest": self.math.digest(copy), "theta_rms": self.math.rms(theta),
                "gap": self.math.rms([t - h for t, h in zip(theta, had)]),
                "error": self.math.rms([t - x for t, x in zip(theta, copy)])}

    def _close(self, state: SyncerState, now: float, p: int, weights: list, stale: list, evidence: dict | None = None):
        """Bookkeeping of every commit: version + 1, who was merged, merge/round_commit lines
        (`evidence`: the audit's fields for the round_commit line)."""
        rnd, v = state.rounds[p], state.version[p] + 1
        if "shared_version" in self.config.bugs:  # planted: one counter for the shard, not one per fragment
            v = max(state.version.values()) + 1
        merged = sorted(rnd.pending.items())
        logs = [Log("merge", {"fragment": p, "version": v, "learner": learner, "incarnation": pc.incarnation,
                              "seq": pc.seq, "base_version": pc.base_version, "staleness": s, "weight": w,
                              "c_steps": pc.c_steps, "c_tokens": pc.c_tokens})
                for (learner, pc), w, s in zip(merged, weights, stale)]
        logs.append(Log("round_commit", {
            "fragment": p, "version": v, "n": len(merged), "tokens": sum(pc.c_tokens for _, pc in merged),
            "opened_at": rnd.opened_at, "quorum_at": rnd.quorum_at, "at": now,  # (the shard's clock)
            "grace_s": None if rnd.quorum_at is None else rnd.deadline - rnd.quorum_at, **(evidence or {})}))
        state = replace(state, version={**state.version, p: v}, rounds=_without(state.rounds, p),
                        last_merged={**state.last_merged,
                                     **{(learner, p): (pc.incarnation, pc.seq) for learner, pc in merged}})
        return state, logs

    # --- checks -----------------------------------------------------------------------------
    def _guard(self, state: SyncerState, p: int, c: Contribution) -> tuple[SyncerState, dict | None, list]:
        """Silent data corruption (trainer/protocol/guard.py): (state, why, [guard line]) for a corrupt Δ,
        else (state with its size remembered, None, [guard line]). The `guard` line holds what
        the decision read (the Δ's rms, its steps, Θ[p]'s rms) for the judge to redo it
        (harness/judging/audits.py guard_decisions). Bug `trust_payloads`: no guard; bug
        `guard_ignores_steps`: the bounds judge the Δ's whole size, not its size per inner step."""
        if self.math.rms is None or self.config.mode != "decoupled" or "trust_payloads" in self.config.bugs:
            return state, None, []  # (streaming / sync_diloco rounds need every unit: a drop would stall them)
        size = float(self.math.rms(self.math.decode(c.payload)))
        theta = float(self.math.rms(state.theta[p])) if math.isfinite(size) else 0.0
        steps = 1 if "guard_ignores_steps" in self.config.bugs else c.c_steps  # planted: the Δ's size, not per step
        why = guard.judge(size, steps, state.norms, theta, self.config.guard_factor)
        line = [Log("guard", {"fragment": p, "learner": c.learner, "incarnation": c.incarnation, "seq": c.seq,
                              "rms": size if math.isfinite(size) else str(size), "c_steps": c.c_steps,
                              "theta_rms": theta, "factor": self.config.guard_factor, "accepted": why is None,
                              # the history's largest size per step, the bound's base (None: too few yet)
                              "recent_max": max(state.norms) if len(state.norms) >= guard.GUARD_WARMUP else None})]
        if why is None:
            kept = 1 if "guard_remembers_whole" in self.config.bugs else c.c_steps  # planted: whole sizes kept
            state = replace(state, norms=guard.remember(state.norms, size, kept))
        return state, why, line

    def _seen(self, state: SyncerState, p: int, msg, prev: Pending | None) -> str | None:
        """'duplicate' / 'old_seq' if (incarnation, seq) is not newer than what was merged or
        is pending from this learner for p: each contribution is merged at most once."""
        key = (msg.incarnation, msg.seq)
        last = state.last_merged.get((msg.learner, p))
        if last is not None and key <= last and "merge_twice" not in self.config.bugs:
            return "duplicate" if key == last else "old_seq"
        if prev is not None and key <= (prev.incarnation, prev.seq):
            return "duplicate" if key == (prev.incarnation, prev.seq) else "old_seq"
        return None

    def _drop(self, msg, reason: str) -> Log:
        return Log("drop", {"what": type(msg).__name__, "fragment": msg.fragment, "learner": msg.learner,
                            "incarnation": msg.incarnation, "seq": msg.seq, "reason": reason})

    def _owned(self, p: int) -> int:
        if p not in self.config.fragments:
            raise UnknownFragment(f"shard {self.config.shard} owns fragments {list(self.config.fragments)}, not {p}")
        return p

    def _known(self, learner: str) -> None:
        if learner not in self.config.learners:
            raise UnknownPeer(f"learner {learner!r} is not one of {list(self.config.learners)}")
