"""LearnerCore: one learner unit's side of the protocol, sans-IO (docs/PROTOCOL.md, "Learner").

The shell runs the inner steps; the core decides what goes over the network and what
happens to the parameters when a global fragment arrives. The parameters are an
opaque object (a JAX pytree in the trainer, a list of numpy arrays in tests), touched
only through the injected `LearnerMath`.

Per fragment p the core keeps base[p] (the last global Θ[p] received) and its version,
c_steps[p] / c_tokens[p] since p was last sent, and the in-flight record (seq, sent_at,
sent_step). Rules:

- after each inner step, if `due_fragment(step)` names p: send Δ = base[p] − θ[p]
  (compressed by `pseudo_grad_payload`), reset p's counters, record p in flight; with
  keep_local the next Δ is measured from θ[p] as sent, or, with error feedback
  (`shard_view`), from θ[p] as the shard reads the lossy Δ, so what it left out goes again;
- on FragmentUpdate(p): θ[p] ← mix(θ[p], Θ[p], α), base[p] ← Θ[p]; if p was awaiting its
  fetch, θ[p] ← Θ[p] (overwrite) and p's counters restart, or, keep_on_fetch and the fetch
  at most keep_gap versions ahead (0: any; the staleness bound below still applies), the
  progress no Δ holds moves onto Θ[p]; last_sync_s = now − sent_at;
- on FragmentDelta(p) (compressed broadcasts): Θ[p] = base[p] + decode(payload) when base[p]
  is at the delta's base_version, then as FragmentUpdate; while p awaits its fetch the
  delta is dropped (the whole fragment is on its way); a delta against another version
  (an update lost with a link) is dropped and the shard's fragments are fetched afresh;
- decoupled, when the link to a shard breaks (`shard_disconnected`): its fragments await
  the fetch the reconnect brings (no Δ into the dead link) and stay `cut` until next
  contributed: a Θ[p] newer than the progress's base taken meanwhile overwrites it;
- after `start` and after every reconnect to a shard, the shard's fragments await a fetch
  (the Hello's rejoin reply, or any newer update) and are not contributed until it comes;
  streaming / sync_diloco send their in-flight contributions to it again (dp its
  unanswered gradients): lost with the old connection, a round of all units would stall;
  and a fragment due while it awaits its fetch goes out the step after the fetch
  (decoupled: if the fetch kept its progress; one the fetch overwrote waits for its next
  turn). After a shard's restart every learner's fetch lands at once: waiting for each
  one's turn let the first commit overwrite the others' outage progress (the `cut` rule);
  sent the step after, they meet in one round (simulator, syncer-0 killed 2.0-3.5 s, 4
  seeds: goodput 0.781-0.985 -> 0.968-0.985, tokens merged 0.80-1.0 -> 0.989-1.0);
- decoupled mode never blocks; streaming / sync_diloco block once a fragment has been in
  flight τ steps; dp / elastic_dp block from `grads_ready` until every GradMean is in.
- bounded staleness (decoupled; docs/PROTOCOL.md "Bounded staleness"): p is contributed
  only once the shard has answered its last contribution of p (any update of p taken
  since: the answer to it, a fetch, a re-anchor after a stale drop). Progress kept across
  a take is thrown away (`discard why=stale`) once the take's version is more than
  max_staleness past the copy its oldest step was made on (`anchor_version`): a starved
  link's answer 150 versions on would otherwise send it as a fresh Δ. A turn that comes
  while p is unanswered is skipped (`drop reason=unanswered`); its steps go on with the
  next Δ, which the answer's overwrite cuts short (counters restart). So every piece of
  local progress is in at most one Δ: each Δ covers the steps from the take of its base
  (`anchor_step`) to its send, logged as a `contribute` line. A shard the learner has
  heard nothing from for `starve_cycles` fragment cycles while p waits is `starved`:
  the learner says so, asks it for its fragments (Hello; again after twice as long) and
  contributes nothing to it until that fetch re-anchors it.
  Bug `cumulative_delta`: no gate (the behaviour before: a learner that hears nothing
  sends its whole drift since the last Θ[p] every turn, and each copy is merged).
  Bug `resend_drift`: the same, with the bookkeeping of the correct code (its `contribute`
  lines claim [previous to_step, step] as if each Δ held only the new steps): only
  evidence the learner does not write can see it (`delta_bases_advance`).
- closing (trainer/protocol/learner_close.py): after the last step `finish` sends what is in no Δ.
- aligned rounds (decoupled, `align`; docs/PROTOCOL.md "Aligned rounds"): on a RoundOpen(p)
  from the shard, a learner whose turn for p is 1 to period / 2 steps away contributes p
  at once, joining that round (`join`), and skips the turn it replaced (`joined`).
- streaming / sync_diloco, a restarted unit (incarnation ≥ 1): once its first fetch is
  in, its fragment schedule is shifted (`phase`) so that the next fragment due is the
  one the others are waiting on: the lowest version, earliest in the cycle. Every round
  needs every unit (K = M), so a unit out of phase with the rest deadlocks the job: it
  waits on a round the others have not reached while they wait on one it has not
  (found by the sim tier: streaming + kill_unit, no commit for 42 s).
  decoupled, a restarted unit: once its first fetch is in, the fragment due soonest goes
  out after its next inner step (`phase`), so it contributes again one step after the fetch.
"""
from __future__ import annotations

from dataclasses import replace

from diloco_chaos.trainer.protocol.learner_close import LearnerClose
from diloco_chaos.trainer.protocol.learner_dp import LearnerDP
from diloco_chaos.trainer.protocol.learner_types import InFlight, LearnerConfig, LearnerMath, LearnerState
from diloco_chaos.trainer.protocol.messages import (Contribution, FragmentDelta, FragmentUpdate, GradMean, Hello,
                                                    Repair, RepairRequest, RoundOpen, SliceControl, held_field)
from diloco_chaos.trainer.protocol.protocol_base import (DILOCO_MODES, DP_MODES, MODES, Block, IllegalTransition, Log,
                                                         NotStarted, Send, SetSlices, Unblock, UnexpectedMessage,
                                                         UnknownFragment, UnknownPeer)

# how many versions ahead of the progress's base a restarted shard's unmoved fetch may be and
# still keep the learners' outage progress although they were cut off by its crash: one
# version (where an answer puts it) and the rounds whose answers a crash can take (each
# link's outbox holds the newest update of a fragment; a run measured copies 1 and 2
# versions behind)
RESTART_GAP = 3



def _put(t: tuple, p: int, value) -> tuple:
    return t[:p] + (value,) + t[p + 1:]


class LearnerCore:
    # message type -> (handler, modes in which it is legal)
    _HANDLERS = {
        FragmentUpdate: ("_on_update", DILOCO_MODES),
        FragmentDelta: ("_on_delta", DILOCO_MODES),
        RoundOpen: ("_on_round_open", DILOCO_MODES),
        RepairRequest: ("_on_repair_request", DILOCO_MODES),
        GradMean: ("_on_grad_mean", DP_MODES),
        SliceControl: ("_on_slices", MODES),
    }

    def __init__(self, config: LearnerConfig, math: LearnerMath):
        if config.mode in DP_MODES and math.grad_payload is None:
            raise ValueError(f"mode {config.mode!r} needs LearnerMath.grad_payload")
        self.config, self.math = config, math
        # the data-parallel baselines' side and the closing contribution, each a collaborator
        self._dp = LearnerDP(config, math)
        self._closing = LearnerClose(config, self._contribute)
        self._offsets, self._period = ({}, 0) if config.mode in DP_MODES else self._cycle()

    def _cycle(self) -> tuple[dict, int]:
        """(p -> the first step ≥ 1 at which p is due, the schedule's period), read off
        `due_fragment` (the core does not know H)."""
        first: dict = {}
        for step in range(1, 1 << 16):
            p = self.math.due_fragment(step)
            if p is None:
                continue
            if p in first:
                if len(first) == len(self.config.owners):
                    return first, step - first[p]
                continue
            first[p] = step
        raise ValueError(f"due_fragment never names every one of {len(self.config.owners)} fragments")

    def init(self, params) -> LearnerState:
        n = len(self.config.owners)
        return LearnerState(params=params, base=tuple(list(self.math.get_fragment(params, p)) for p in range(n)),
                            base_version=(0,) * n, c_steps=(0,) * n, c_tokens=(0,) * n, anchor_step=(0,) * n,
                            anchor_version=(0,) * n, sent_from=(None,) * n)

    @staticmethod
    def params(state: LearnerState):
        return state.params

    def must_wait(self, state: LearnerState) -> bool:
        """True while the shell must not run the next inner step."""
        if self.config.mode in DP_MODES:
            return bool(state.dp_wait)
        if self.config.mode == "decoupled":
            return False
        return any(state.step - f.sent_step >= self.config.tau for f in state.in_flight.values())

    # --- events -----------------------------------------------------------------------------
    def start(self, state: LearnerState, now: float):
        if state.started:
            raise IllegalTransition(f"{self.config.learner} started twice")
        state = replace(state, started=True, awaiting=self._to_fetch(range(len(self.config.owners))),
                        asked={s: (state.step, 0) for s in self.config.shards})
        return state, [Send(s, self._hello(state, s)) for s in self.config.shards]

    def shard_connected(self, state: LearnerState, now: float, shard: str):
        """The link to `shard` is (again) up: fetch its fragments, resend unanswered dp gradients."""
        self._started(state)
        if shard not in self.config.owners:
            raise UnknownPeer(f"{shard!r} owns no fragment; shards: {list(self.config.shards)}")
        mine = [p for p, owner in enumerate(self.config.owners) if owner == shard]
        state = replace(state, awaiting=state.awaiting | self._to_fetch(mine),
                        asked={**state.asked, shard: (state.step, 0)})
        # what went out on the old connection may be lost with it: a round that needs every
        # unit (dp, streaming, sync_diloco) would wait for it forever, so it goes again (a
        # shard that has it already refuses the copy: at most once per seq)
        again = [state.dp_wait[p] for p in mine if p in state.dp_wait]
        if self.config.mode in ("streaming", "sync_diloco"):
            again += [state.in_flight[p].msg for p in mine if p in state.in_flight]
        return state, [Send(shard, m) for m in [self._hello(state, shard)] + again]

    def shard_disconnected(self, state: LearnerState, now: float, shard: str):
        """The link to `shard` broke (the shard died, its connections were reset). Decoupled:
        its fragments await the fetch the reconnect will bring, so a turn that comes while
        the link is down is skipped with its counters running (`drop reason=awaiting_fetch`)
        instead of sent into a dead link, its progress lost with the message. They stay
        `cut` until next contributed: a Θ[p] taken meanwhile that is newer than the
        progress's base means a round committed without it, with other learners' like
        progress made over the same outage, so it is thrown away rather than added again
        (`_take`); no newer (every learner cut off, or a shard restored behind it), it is
        kept. Measured in the simulator (60 steps, inner lr 0.1): a shard killed for 0.5 s
        ended the run at 0.140 (0.167 with the Δs sent into the dead link; fault-free
        0.076). The modes whose rounds need every unit send their in-flight Δs again on
        the reconnect instead (docs/PROTOCOL.md "keep_local")."""
        self._started(state)
        if shard not in self.config.owners:
            raise UnknownPeer(f"{shard!r} owns no fragment; shards: {list(self.config.shards)}")
        if self.config.mode != "decoupled":
            return state, []
        mine = self._to_fetch(p for p, owner in enumerate(self.config.owners) if owner == shard)
        return replace(state, awaiting=state.awaiting | mine, cut=state.cut | mine), []

    def after_inner_step(self, state: LearnerState, now: float, params, tokens: int, step_time_s: float):
        """An inner step finished: `params` are the new local ones."""
        self._started(state)
        if self.must_wait(state):
            raise IllegalTransition(f"{self.config.learner} stepped while it must wait")
        state = replace(state, params=params, step=state.step + 1, step_time_s=step_time_s,
                        c_steps=tuple(c + 1 for c in state.c_steps),
                        c_tokens=tuple(c + tokens for c in state.c_tokens))
        p = None if self.config.mode in DP_MODES else self.math.due_fragment(state.step + state.phase)
        if p is not None and p in state.joined:  # its Δ went out early, into a round it joined
            state, p = replace(state, joined=state.joined - {p}), None
        due = sorted(q for q in state.deferred if q not in state.awaiting and q != p)
        state = replace(state, deferred=state.deferred - set(due))
        if p is not None:
            due.append(self._fragment(p))
        actions: list = []
        for q in due:  # nothing due: τ may still have run out on what is in flight
            state, more = self._contribute(state, now, q)
            actions += more
        return self._check_block(state, actions)

    def receive(self, state: LearnerState, now: float, sender: str, msg):
        handler, modes = self._HANDLERS.get(type(msg), (None, ()))
        if self.config.mode not in modes:
            raise UnexpectedMessage(f"learner ({self.config.mode}) never receives {type(msg).__name__}")
        self._started(state)
        if sender in self.config.shards and (not isinstance(msg, RoundOpen) or "roundopen_heard" in self.config.bugs):
            # (a RoundOpen answers nothing of ours: a learner whose uplink is cut still
            # hears them, and must still find itself starved)
            state = replace(state, heard={**state.heard, sender: state.step},
                            asked={**state.asked, sender: (state.step, 0)})
        return getattr(self, handler)(state, now, sender, msg)

    # --- handlers ---------------------------------------------------------------------------
    def _on_update(self, state: LearnerState, now: float, sender: str, msg: FragmentUpdate):
        p = self._fragment(msg.fragment, sender)
        fetch = p in state.awaiting
        # Θ[p] at the version p's Δ was taken against, from its owner, while that Δ is in
        # flight: the shard dropped it (corrupt, duplicate) and answers with what it holds;
        # taken as the answer (the Δ's progress is gone, what came after it is kept), or p
        # would wait for an answer that has already come and never be contributed again
        answer_to_drop = (not fetch and msg.version == state.base_version[p] and p in state.in_flight
                          and bool(msg.params) and sender == self.config.owners[p])
        if (not fetch and not answer_to_drop and msg.version == state.base_version[p] and msg.params
                and self.math.apply_delta is not None):
            return self._reanchor(state, p, list(msg.params))
        if not fetch and not answer_to_drop and msg.version <= state.base_version[p]:
            return state, [Log("drop", {"what": "FragmentUpdate", "fragment": p, "version": msg.version,
                                        "reason": "old_version"})]
        if not msg.params:  # "your Θ0[p] is current": the answer to a fresh Hello
            if msg.version != 0 or state.base_version[p] != 0:
                raise UnexpectedMessage(f"{self.config.learner}: an update of fragment {p} without params "
                                        f"at version {msg.version}, holding version {state.base_version[p]}")
            return self._take(state, now, p, list(state.base[p]), 0, fetch)
        return self._take(state, now, p, list(msg.params), msg.version, fetch, unmoved=msg.unmoved)

    def _reanchor(self, state: LearnerState, p: int, glob: list):
        """Compressed broadcasts: Θ[p] whole at the version this learner already holds (a
        shard's answer to a dropped Δ, or a Hello's reply, crossing the delta that brought
        that version). The shard now records the learner as holding Θ[p] exactly, so the
        copy becomes it: base[p] ← Θ[p], and θ[p] and the keep_local reference move by the
        same difference (the local progress is kept). Dropping it, as an old version, left
        the copy's quantisation error where the shard's deltas never reach it again: int4
        broadcasts at H = 6 ended up to +34 % above data-parallel (docs/BENCHMARKS.md)."""
        base = state.base[p]
        diff = [g - b for g, b in zip(glob, base)]
        if self.math.rebase is not None:  # θ[p] ← Θ[p] + (θ[p] − base[p])
            params = self.math.rebase(state.params, p, glob, base)
        else:
            mine = self.math.get_fragment(state.params, p)
            params = self.math.set_fragment(state.params, p, [x + d for x, d in zip(mine, diff)])
        ref = state.sent_from[p] if state.sent_from else None
        state = replace(state, params=params, base=_put(state.base, p, glob))
        if ref is not None:
            state = replace(state, sent_from=_put(state.sent_from, p, [r + d for r, d in zip(ref, diff)]))
        gap = max((float(abs(d).max()) for d in diff if getattr(d, "size", 1)), default=0.0)
        return state, [Log("reanchor", {"fragment": p, "version": state.base_version[p], "max_abs_diff": gap}),
                       *self._copy_line(p, state.base_version[p], glob, "reanchor")]

    def _copy_line(self, p: int, version: int, glob: list, via: str) -> list:
        """`copy`: the digest of the Θ[p] this learner now holds as its copy at `version`
        (whole, rebuilt from a delta, or re-anchored), for the check copies_consistent."""
        if self.math.digest is None:
            return []
        return [Log("copy", {"fragment": p, "version": version, "digest": self.math.digest(glob), "via": via})]

    def _on_delta(self, state: LearnerState, now: float, sender: str, msg: FragmentDelta):
        p = self._fragment(msg.fragment, sender)
        why = ("awaiting_fetch" if p in state.awaiting else
               "old_version" if msg.version <= state.base_version[p] else
               "base_mismatch" if msg.base_version != state.base_version[p] else None)
        if why is None and self.math.apply_delta is None:
            raise UnexpectedMessage(f"{self.config.learner} has no apply_delta for a FragmentDelta")
        if why is None:
            return self._take(state, now, p, self.math.apply_delta(state.base[p], list(msg.payload)),
                              msg.version, fetch=False, via="delta")
        drop = Log("drop", {"what": "FragmentDelta", "fragment": p, "version": msg.version,
                            "base_version": msg.base_version, "reason": why})
        if why != "base_mismatch":
            return state, [drop]
        # the copy this delta builds on never arrived: fetch every fragment of that shard afresh
        mine = [q for q, owner in enumerate(self.config.owners) if owner == sender]
        return replace(state, awaiting=state.awaiting | self._to_fetch(mine)), [drop, Send(sender, self._hello(state, sender))]

    def _take(self, state: LearnerState, now: float, p: int, glob: list, version: int, fetch: bool,
              via: str = "whole", unmoved: bool = False):
        """Θ[p] at `version` arrived (whole, or rebuilt from a delta): mix it in, make it the base."""
        flight, sent = state.in_flight.get(p), self._copy_line(p, version, glob, via)
        if flight is not None:
            state = replace(state, last_sync_s=now - flight.sent_at,
                            in_flight={q: f for q, f in state.in_flight.items() if q != p})
        if (fetch and p in state.deferred and version >= state.base_version[p] and state.c_steps[p] >= 1
                and self.config.mode in ("streaming", "sync_diloco")):
            # p's turn came while it awaited this fetch, and its round may be holding every
            # other unit: the progress made against the Θ[p] it holds goes out now, before
            # the fetch replaces it (stale by version − base_version, which the shard weighs)
            state = replace(state, deferred=state.deferred - {p}, awaiting=state.awaiting - {p})
            state, out = self._contribute(state, now, p)
            sent = sent + out
        # progress made while p's link was down, taken onto a Θ[p] that moved on without it:
        # thrown away, not moved onto Θ[p] (its next Δ would go out fresh and add it again
        # on top of the other learners' like progress, merged meanwhile)
        # (a restarted shard's Θ[p] before any round since, a few versions ahead: the versions
        # past base[p] are its commits from before its crash, with nothing of the outage in them)
        restart = unmoved and version - state.base_version[p] <= RESTART_GAP
        stale_cut = p in state.cut and version > state.base_version[p] and not restart
        kept = fetch and not stale_cut and self._keeps_on_fetch(state, p, version, restart)
        # progress whose oldest step was made on a copy more than max_staleness versions behind
        # this Θ[p]: kept, it would go out as a fresh Δ of `version` (a starved link's answer
        # 150 versions on: staleness laundered), and sent with its true base the shard drops it
        # (planted `keep_stale_progress`: the rule left out, as before 2026-11-30)
        too_stale = (self.config.keep_local and self.config.max_staleness > 0 and state.c_steps[p] > 0
                     and version - state.anchor_version[p] > self.config.max_staleness
                     and "keep_stale_progress" not in self.config.bugs)
        overwrite = (fetch and not kept) or stale_cut or too_stale
        if self.config.keep_local and not overwrite:
            # the progress made since p was last contributed (or last taken) is in no Δ yet:
            # it moves onto the new Θ[p] instead of being overwritten
            # (planted `keep_sent_progress`: the keep measured from base[p], so what went out in
            # the last Δ is kept again and goes out twice)
            again = "keep_sent_progress" in self.config.bugs
            ref = state.base[p] if state.sent_from[p] is None or again else state.sent_from[p]
            if self.math.rebase is not None:
                params = self.math.rebase(state.params, p, glob, ref)
            else:
                mine = self.math.get_fragment(state.params, p)
                params = self.math.set_fragment(state.params, p, [g + (x - r) for g, x, r in zip(glob, mine, ref)])
        else:  # α = 0 overwrites: the local fragment is not read (reading it waits for the device)
            local = glob if overwrite or self.config.alpha == 0 else self.math.mix(
                self.math.get_fragment(state.params, p), glob, self.config.alpha)
            params = self.math.set_fragment(state.params, p, local)
        if self.config.keep_local:  # what goes out next is measured from this take
            state = replace(state, sent_from=_put(state.sent_from, p, None))
        if overwrite and self.config.mode == "decoupled":  # nothing kept: its turn comes as scheduled
            state = replace(state, deferred=state.deferred - {p})
        state = replace(state, params=params,
                        base=_put(state.base, p, glob), base_version=_put(state.base_version, p, version),
                        awaiting=state.awaiting - {p})
        if overwrite or not self.config.keep_local:  # kept progress still counts from the last send
            state = replace(state, anchor_step=_put(state.anchor_step, p, state.step),
                            anchor_version=_put(state.anchor_version, p, version))
        if fetch:
            state = replace(state, skipped=state.skipped - {p})
        logs = sent
        # the local progress is overwritten: a fetch not kept, a stale cut, or (without keep_local)
        # every take, whose next Δ is measured from Θ[p] (found by deltas_reexecuted: the next Δ
        # claimed the steps between the send and the take, which it no longer held)
        reset = (overwrite or not self.config.keep_local) and "count_discarded" not in self.config.bugs
        if reset:  # count afresh (the bug: the next Δ claims them)
            if state.c_tokens[p]:  # the token-fate ledger's "superseded" (harness/judging/ledger.py)
                logs = logs + [Log("discard", {"fragment": p, "step": state.step, "steps": state.c_steps[p],
                                               "tokens": state.c_tokens[p], "version": version,
                                               "why": "stale" if too_stale else "fetch" if fetch else "overwritten"})]
            state = replace(state, skipped=state.skipped - {p})
            state = replace(state, c_steps=_put(state.c_steps, p, 0), c_tokens=_put(state.c_tokens, p, 0))
        if fetch and not state.awaiting and not state.phased and self.config.incarnation >= 1:
            more = []
            if self.config.mode in ("streaming", "sync_diloco") and "rejoin_out_of_phase" not in self.config.bugs:
                state, more = self._rephase(state)
            elif self.config.mode == "decoupled":
                state, more = self._rejoin_next_step(state)
            logs = logs + more  # (it replaced `sent`: a deferred contribution's Send was lost)
        if state.closing:  # an answer came: its fragment's closing Δ can go (trainer/protocol/learner_close.py)
            state, more = self.close_ready(state, now)
            logs = logs + more
        return self._check_block(state, logs)

    def _keeps_on_fetch(self, state: LearnerState, p: int, version: int, restart: bool = False) -> bool:
        """A fetch (a reconnect, a starved shard answering, a restart's first) keeps the local
        progress not yet contributed, moved onto the fetched Θ[p] as an answer's is, when
        `keep_on_fetch` and the fetched version is at most `keep_gap` ahead of the one the
        progress was made on, or behind it (trainer/numerics/wiring.py KEEP_GAP: 0, any: the staleness
        bound, `too_stale` in `_take`, throws what is too old, as it does on an answer; a
        starved learner's re-anchoring fetch under a slow WAN was 2-4 versions ahead, and
        throwing it past one version cost wan-brownout 24 % of its tokens: docs/PROTOCOL.md
        "keep_local"). Progress cut off by a broken link while rounds went on is thrown by
        the `cut` rule instead. A restarted shard's Θ[p] before any round since (`unmoved`),
        at most RESTART_GAP versions ahead (`restart`), keeps it even so: those versions are its commits
        from before the crash, whose answers died in its buffers (a round committed as it
        died reached some learners and not others: 130-170 steps of each of three learners'
        outage progress thrown on processes). Further behind, the learner was cut off before
        the crash while rounds went on (its link reset 1.6 s, then the shard killed: 5
        versions), and the others' like progress is in them: thrown, as for a cut."""
        if not (self.config.keep_on_fetch and self.config.keep_local and state.c_steps[p] > 0):
            return False
        if "fetch_discards" in self.config.bugs:  # planted: every fetch throws the progress away
            return False
        gap = version - state.base_version[p]
        return restart or not self.config.keep_gap or gap <= self.config.keep_gap

    def _rephase(self, state: LearnerState):
        """Due next: the fragment with the lowest version, earliest in the cycle (in lockstep
        the rounds commit in cycle order, so that is the round the other units wait on)."""
        nxt = min(self._offsets, key=lambda q: (state.base_version[q], self._offsets[q]))
        phase = (self._offsets[nxt] - (state.step + 1)) % self._period
        return replace(state, phase=phase, phased=True), [
            Log("phase", {"phase": phase, "next_fragment": nxt, "step": state.step,
                          "versions": list(state.base_version)})]

    def _rejoin_next_step(self, state: LearnerState):
        """Decoupled, a restarted unit once its first fetch is in: the schedule moves (by less
        than one fragment's turn) so that the fragment due soonest goes out after the next
        inner step. The unit contributes one step after its fetch instead of up to a turn
        later (nothing waits on it: a decoupled round does not need every unit)."""
        soonest = min(self._offsets, key=lambda q: ((self._offsets[q] - (state.step + state.phase + 1)) % self._period, q))
        if "rejoin_reads_in_flight" in self.config.bugs:  # planted: "re-send what was in flight when it
            # died", read from state the checkpoint never keeps: a KeyError, and the process dies
            state = replace(state, last_sync_s=state.in_flight[soonest].sent_at)
        phase = (self._offsets[soonest] - (state.step + 1)) % self._period
        return replace(state, phase=phase, phased=True), [
            Log("phase", {"phase": phase, "next_fragment": soonest, "step": state.step,
                          "versions": list(state.base_version)})]

    def _on_round_open(self, state: LearnerState, now: float, sender: str, msg: RoundOpen):
        """`align`: another learner opened a round of p. If p's own turn is at most half a
        fragment cycle away (this learner is behind the opener), contribute p now, inside
        that round's grace window; the turn it replaces is skipped (`after_inner_step`).
        Nothing when p is in flight, awaits its fetch or holds no progress, or when its turn
        has just passed (this learner is ahead: its Δ of p opened or joined an earlier
        round). The schedule is not moved: shifting it on every join ratchets the fleet
        ahead (each slot the first jittered learner opens: 40 % more contributions)."""
        p = self._fragment(msg.fragment, sender)
        if (not self.config.align or self.config.mode != "decoupled" or p in state.in_flight
                or p in state.awaiting or p in state.joined or state.c_steps[p] < 1):
            return state, []
        away = (self._offsets[p] - (state.step + state.phase)) % self._period  # steps to p's turn
        if not 1 <= away <= self._period // 2:
            return state, []
        state, sends = self._contribute(replace(state, joined=state.joined | {p}), now, p)
        return state, [Log("join", {"fragment": p, "version": msg.version, "step": state.step,
                                    "early": away})] + sends

    def _on_repair_request(self, state: LearnerState, now: float, sender: str, msg: RepairRequest):
        """A restarted shard asks for the copy of Θ[p] this learner's Hello named: sent as it
        is held (base[p]), if it still holds that version."""
        p = self._fragment(msg.fragment, sender)
        if state.base_version[p] != msg.version:
            return state, [Log("drop", {"what": "RepairRequest", "fragment": p, "version": msg.version,
                                        "reason": "not_held", "holds": state.base_version[p]})]
        return state, [Send(sender, Repair(self.config.learner, self.config.incarnation, p, msg.version,
                                           list(state.base[p])))]

    def _on_slices(self, state: LearnerState, now: float, sender: str, msg: SliceControl):
        return replace(state, live_slices=msg.live_slices), [
            SetSlices(msg.live_slices), Log("slices", {"live_slices": msg.live_slices})]

    # --- dp modes (trainer/protocol/learner_dp.py) ------------------------------------------
    def grads_ready(self, state: LearnerState, now: float, grads, tokens: int):
        """dp modes: send this step's gradient, one GradStep per fragment, and wait for the means."""
        self._started(state)
        state, sends = self._dp.grads_ready(state, grads, tokens)
        return self._check_block(state, sends)

    def _on_grad_mean(self, state: LearnerState, now: float, sender: str, msg: GradMean):
        state, actions, awaited = self._dp.on_grad_mean(state, self._fragment(msg.fragment, sender), msg)
        return self._check_block(state, actions) if awaited else (state, actions)

    # --- the closing contribution (trainer/protocol/learner_close.py) -----------------------
    def finish(self, state: LearnerState, now: float):
        """The unit's last inner step is done: every fragment with progress closes."""
        self._started(state)
        return self._closing.finish(state, now)

    def close_ready(self, state: LearnerState, now: float):
        return self._closing.close_ready(state, now)

    closed = staticmethod(LearnerClose.closed)

    # --- helpers ----------------------------------------------------------------------------
    def _contribute(self, state: LearnerState, now: float, p: int):
        if p in state.awaiting and self.config.mode in ("streaming", "sync_diloco"):
            # a round needs every unit: skipping p's turn would stall it for a whole cycle
            # (and deadlock the units blocked on it): p goes out the step after its fetch
            return replace(state, deferred=state.deferred | {p}), []
        if p in state.awaiting:  # counters keep running; p goes out the step after a fetch that keeps them
            state, more = self._starved(replace(state, deferred=state.deferred | {p}), self.config.owners[p])
            return state, [Log("drop", {"what": "Contribution", "fragment": p, "reason": "awaiting_fetch"})] + more
        if (self.config.mode == "decoupled" and p in state.in_flight
                and not self.config.bugs & {"cumulative_delta", "resend_drift"}):
            # unanswered: a Δ now would be measured from the same base as the one in flight
            # and carry that one's progress again; p waits for its answer (or a fetch)
            state = replace(state, skipped=state.skipped | {p})
            state, more = self._starved(state, self.config.owners[p])
            return state, [Log("drop", {"what": "Contribution", "fragment": p, "reason": "unanswered",
                                        "seq": state.in_flight[p].seq})] + more
        state = replace(state, cut=state.cut - {p})  # what goes out now was made on Θ[p] it holds
        seq = state.seq + 1
        mine = self.math.get_fragment(state.params, p)
        payload = self.math.pseudo_grad_payload(state.base[p], mine)
        if self.config.keep_local:  # (error feedback: θ[p] as the shard will read it; the rest goes out next)
            ref = list(mine) if self.math.shard_view is None else self.math.shard_view(state.base[p], payload)
            state = replace(state, sent_from=_put(state.sent_from, p, ref))
        msg = Contribution(self.config.learner, self.config.incarnation, seq, p, state.base_version[p],
                           state.c_steps[p], state.c_tokens[p], state.step_time_s, state.last_sync_s, payload,
                           closing=state.closing is not None)
        state = replace(state, seq=seq, c_steps=_put(state.c_steps, p, 0), c_tokens=_put(state.c_tokens, p, 0),
                        in_flight={**state.in_flight, p: InFlight(seq, now, state.step, msg)})
        logs = [Log("contribute", {"fragment": p, "seq": seq, "base_version": msg.base_version,
                                   "from_step": state.anchor_step[p], "to_step": state.step,
                                   "steps": msg.c_steps, "tokens": msg.c_tokens}),
                Send(self.config.owners[p], msg)]
        if (self.config.keep_local or "resend_drift" in self.config.bugs) and "cumulative_delta" not in self.config.bugs:
            # what follows this send is the next Δ's (the bugs measure every Δ from base[p];
            # resend_drift still says the next Δ starts here)
            state = replace(state, anchor_step=_put(state.anchor_step, p, state.step),
                            anchor_version=_put(state.anchor_version, p, state.base_version[p]))
        return state, logs

    def _starved(self, state: LearnerState, shard: str):
        """Nothing heard from `shard` for starve_cycles fragment cycles (twice as long after
        a first Hello went unanswered): say so, ask for its fragments again, and contribute
        nothing to it until they re-anchor this learner."""
        if self.config.mode != "decoupled" or not self.config.starve_cycles or "cumulative_delta" in self.config.bugs:
            return state, []
        since, tries = state.asked.get(shard, (0, 0))
        silent = state.step - max(since, state.heard.get(shard, 0))
        # planted `starve_backoff_doubling`: the wait doubles with every unanswered try, not once
        backoff = 2 ** tries if "starve_backoff_doubling" in self.config.bugs else (2 if tries else 1)
        if silent < self.config.starve_cycles * self._period * backoff:
            return state, []
        mine = [p for p, owner in enumerate(self.config.owners) if owner == shard]
        state = replace(state, awaiting=state.awaiting | self._to_fetch(mine),
                        asked={**state.asked, shard: (state.step, tries + 1)})
        heard = state.heard.get(shard)
        return state, [Log("starved", {"shard": shard, "step": state.step, "tries": tries + 1,
                                       "silent_steps": state.step - (heard or 0), "heard_step": heard,
                                       "silent_cycles": round((state.step - (heard or 0)) / self._period, 2)}),
                       Send(shard, self._hello(state, shard))]

    def _check_block(self, state: LearnerState, actions: list):
        wait = self.must_wait(state)
        if wait == state.blocked:
            return state, actions
        reason = "dp_mean" if self.config.mode in DP_MODES else "in_flight"
        return replace(state, blocked=wait), actions + [
            Block(reason) if wait else Unblock(), Log("blocked", {"on": wait, "reason": reason, "step": state.step})]

    def _to_fetch(self, fragments) -> frozenset:
        if self.config.mode in DP_MODES or "rejoin_without_fetch" in self.config.bugs:
            return frozenset()
        return frozenset(fragments)

    def _hello(self, state: LearnerState, shard: str) -> Hello:
        """fresh while this incarnation 0 has neither stepped nor taken an update: it holds Θ0,
        and says which (the digest over `shard`'s fragments)."""
        fresh = ""
        if (self.math.digest is not None and self.config.incarnation == 0 and state.step == 0
                and not any(state.base_version)):
            fresh = self.math.digest([a for p, owner in enumerate(self.config.owners) if owner == shard
                                      for a in state.base[p]])
        # the copies it holds past version 0: a shard restarted from an older checkpoint
        # asks for the newest instead of rolling it back (docs/PROTOCOL.md "Repair from the learners")
        held = {} if self.math.digest is None else {
            p: (state.base_version[p], self.math.digest(state.base[p]))
            for p, owner in enumerate(self.config.owners) if owner == shard and state.base_version[p] > 0}
        return Hello(self.config.learner, self.config.incarnation, fresh, held_field(held))

    def _started(self, state: LearnerState) -> None:
        if not state.started:
            raise NotStarted(f"{self.config.learner}: event before start")

    def _fragment(self, p: int, sender: str | None = None) -> int:
        if not 0 <= p < len(self.config.owners):
            raise UnknownFragment(f"fragment {p} of {len(self.config.owners)}")
        if sender is not None and sender != self.config.owners[p]:
            raise UnknownPeer(f"fragment {p} comes from {self.config.owners[p]!r}, not {sender!r}")
        return p
