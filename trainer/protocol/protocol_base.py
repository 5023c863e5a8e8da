"""The vocabulary shared by the sans-IO cores: modes, planted bugs, actions, errors.

A core event returns `(new_state, actions)`. Actions are requests to the shell (the
process around the core, or the simulator); the core never does them itself:

  Send(to, msg)            put `msg` on the link to peer `to` (a learner or a shard name)
  SetTimer(key, at)        call `core.timer(state, now, key)` once `now >= at`
  Log(kind, fields)        write an event-log line (kinds of trainer/units/events.py)
  Block(reason) / Unblock()  the learner must stop / may resume inner steps
  SaveCheckpoint(versions) persist `core.snapshot(state)`; report back with `durable(...)`
  Journal(fragment, version, digest)  append a commit's digest to the shard's journal, apart
                           from its checkpoints; a restart hands it back (`SyncerCore.remember`)
  ApplyGrads(step, grads)  data-parallel: apply the averaged gradient pytree now
  SetSlices(live_slices)   the learner's batch is now spread over this many slices
"""
from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any

# decoupled: quorum K from the config, adaptive grace window; learners never block.
# streaming: K = M, no grace; a learner blocks once a fragment is τ steps in flight.
# sync_diloco: streaming with P = 1.   dp / elastic_dp: the gradient-averaging baselines
# (dp waits for all M configured learners, elastic_dp for the live ones).
MODES = ("decoupled", "streaming", "sync_diloco", "dp", "elastic_dp")
DILOCO_MODES = ("decoupled", "streaming", "sync_diloco")
DP_MODES = ("dp", "elastic_dp")

# Planted bugs, each a one-line deviation guarded by its name, so that the property
# suites can prove they fail when the protocol is wrong.
# The last three restore the behaviour before bounded staleness (docs/PROTOCOL.md,
# "Bounded staleness"): cumulative_delta (a learner contributes every turn against the
# last Θ[p] it received, answered or not: the same progress is merged again and again);
# relative_discount (no staleness bound: a stale Δ is only discounted relative to its
# round, at full weight in a round of one); unbounded_outbox (no newest-supersedes on
# the links: every queued frame goes out, however stale).
SYNCER_BUGS = frozenset({"merge_twice", "stale_as_fresh", "ignore_quorum", "relative_discount",
                         "unbounded_outbox", "trust_payloads", "damped_outer", "restore_oldest",
                         "shared_version", "steep_discount", "drop_last_delta", "guard_ignores_steps", "held_as_exact",
                         "restore_mixed", "sticky_membership", "restore_stale_outer", "durable_on_failure",
                         "restore_unverified", "no_repair", "journal_unsynced", "commit_by_count",
                         "guard_remembers_whole", "combine_newer_base"})
LEARNER_BUGS = frozenset({"rejoin_without_fetch", "rejoin_out_of_phase", "cumulative_delta", "unbounded_outbox",
                          "count_discarded", "resend_drift", "rejoin_reads_in_flight", "roundopen_heard",
                          "keep_sent_progress", "fetch_discards", "batch_of_incarnation",
                          "batch_off_by_one", "starve_backoff_doubling", "keep_stale_progress"})
BUGS = SYNCER_BUGS | LEARNER_BUGS


def check_common(owner: str, mode: str, bugs: frozenset, valid_bugs: frozenset) -> None:
    if mode not in MODES:
        raise ValueError(f"{owner}.mode must be one of {MODES}, got {mode!r}")
    if not isinstance(bugs, frozenset) or not bugs <= valid_bugs:
        raise ValueError(f"{owner}.bugs must be a frozenset of {sorted(valid_bugs)}, got {bugs!r}")


# --- actions ------------------------------------------------------------------------------

@dataclass(frozen=True, eq=False)
class Send:
    to: str
    msg: Any
    # what takes msg's place if it must supersede an unsent message of its key on the link
    # (a FragmentDelta: Θ[p] whole, the very copy the delta builds; trainer/protocol/outbox.py)
    whole: Any = None


@dataclass(frozen=True)
class SetTimer:
    key: str
    at: float


@dataclass(frozen=True)
class Log:
    kind: str
    fields: dict = field(default_factory=dict)


@dataclass(frozen=True)
class Block:
    reason: str


@dataclass(frozen=True)
class Unblock:
    pass


@dataclass(frozen=True)
class SaveCheckpoint:
    versions: dict


@dataclass(frozen=True)
class Journal:
    fragment: int
    version: int
    digest: str


@dataclass(frozen=True, eq=False)
class ApplyGrads:
    step: int
    grads: Any


@dataclass(frozen=True)
class SetSlices:
    live_slices: int


# --- errors -------------------------------------------------------------------------------

class IllegalTransition(Exception):
    """An event the core's state machine does not allow. The state passed in stays valid
    (states are immutable); the shell logs it and, for a remote peer, cuts the link."""


class NotStarted(IllegalTransition):
    """An event before `start` (learner)."""


class UnknownFragment(IllegalTransition):
    """A fragment this core does not own (syncer) or know (learner)."""


class UnknownPeer(IllegalTransition):
    """A learner not in the syncer's config, a message signed by another sender, or an
    update from a shard that does not own the fragment."""


class UnexpectedMessage(IllegalTransition):
    """A message type this core, in its mode, never receives."""


def ema(old: float | None, x: float, weight: float) -> float:
    """Exponential moving average; the first observation initialises it."""
    return x if old is None else (1 - weight) * old + weight * x
