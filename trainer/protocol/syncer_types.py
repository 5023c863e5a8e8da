"""The syncer core's types: a shard's config, the math it is given, and its state (trainer/protocol/syncer_core.py).

A shard's state is immutable (`SyncerState`): per owned fragment p the global Θ[p], the
outer optimizer's state, version[p] and, while an outer round is open, its `Round` of
`Pending` contributions. The rules that change it are SyncerCore's (its module docstring).
"""
from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any, Callable

from diloco_chaos.trainer.protocol.protocol_base import SYNCER_BUGS, check_common

DOWNLINKS = ("all", "answer")
SHARE_BY = ("quorum", "merged")


@dataclass(frozen=True)
class SyncerConfig:
    shard: str
    fragments: tuple[int, ...]  # owned fragment indices
    learners: tuple[str, ...]   # the M learner units of the run
    mode: str = "decoupled"
    quorum: int = 1             # K, decoupled mode only (the others use K = M)
    tau: float = 2              # overlap τ, inner steps
    grace_gamma: float = 0.5    # γ < 1
    ema_weight: float = 0.25    # weight of a new observation in ξ
    max_staleness: int = 0      # decoupled: contributions staler than this are dropped (0: no bound)
    fleet_share: bool = False   # decoupled: a round's outer step × min(1, K / live learners)
    share_by: str = "quorum"    # fleet_share's numerator: the quorum K, or the learners the round "merged"
    downlink: str = "all"       # decoupled: a commit goes to every live learner ("all") or to its own ("answer")
    align: bool = False         # decoupled: a round's opening goes to the other live learners (RoundOpen)
    guard_factor: float = 0.0   # drop a Δ whose norm per step is over this × the largest of the shard's last 16 (0: off)
    # decoupled: a fragment's first `outer_warmup` outer steps are scaled by `warmup_scale`
    # (min(1, outer lr) / outer lr: the fleet's average step, not past it; docs/PROTOCOL.md "Outer warm-up")
    outer_warmup: int = 0
    warmup_scale: float = 1.0
    bugs: frozenset = frozenset()

    def __post_init__(self):
        check_common("SyncerConfig", self.mode, self.bugs, SYNCER_BUGS)
        object.__setattr__(self, "fragments", tuple(self.fragments))
        object.__setattr__(self, "learners", tuple(self.learners))
        if not self.shard:
            raise ValueError("SyncerConfig.shard must be a non-empty name")
        if len(set(self.fragments)) != len(self.fragments) or any(p < 0 for p in self.fragments):
            raise ValueError(f"SyncerConfig.fragments must be distinct indices ≥ 0, got {self.fragments}")
        if not self.learners or len(set(self.learners)) != len(self.learners):
            raise ValueError(f"SyncerConfig.learners must be distinct names, at least one, got {self.learners}")
        if not 1 <= self.quorum <= len(self.learners):
            raise ValueError(f"SyncerConfig.quorum must be in 1..{len(self.learners)} (M), got {self.quorum}")
        if self.share_by not in SHARE_BY:
            raise ValueError(f"SyncerConfig.share_by must be one of {SHARE_BY}, got {self.share_by!r}")
        if self.downlink not in DOWNLINKS:
            raise ValueError(f"SyncerConfig.downlink must be one of {DOWNLINKS}, got {self.downlink!r}")
        if self.outer_warmup < 0 or not 0 < self.warmup_scale <= 1:
            raise ValueError(f"SyncerConfig needs outer_warmup ≥ 0 and 0 < warmup_scale ≤ 1; got "
                             f"{self.outer_warmup}, {self.warmup_scale}")
        if self.max_staleness < 0:
            raise ValueError(f"SyncerConfig.max_staleness must be ≥ 0 (0: no bound), got {self.max_staleness}")
        if self.tau < 0 or not 0 <= self.grace_gamma < 1 or not 0 < self.ema_weight <= 1:
            raise ValueError("SyncerConfig needs tau ≥ 0, 0 ≤ grace_gamma < 1, 0 < ema_weight ≤ 1; got "
                             f"{self.tau}, {self.grace_gamma}, {self.ema_weight}")

    @property
    def k(self) -> int:
        """The minimum quorum actually used."""
        return self.quorum if self.mode == "decoupled" else len(self.learners)


@dataclass(frozen=True)
class SyncerMath:
    """merge_and_step(Θ[p], outer_p, deltas, weights, scale, mean) -> (Θ[p], outer_p): merge
    (the run's merge, or the plain weighted mean where `mean`), times `scale`, then the outer step;
    weight(c_tokens, c_steps, staleness) -> float; decode(payload) -> fp32 arrays;
    outer_init(Θ[p]) -> outer_p; average(grads, weights) -> arrays (dp modes only);
    broadcast_delta(Θ[p], learner's copy) -> (payload, learner's new copy): compressed
    broadcasts (FragmentDelta); None sends every commit whole (FragmentUpdate, fp32);
    combine(payload, payload) -> payload: the sum of two Δs (None: the newer replaces)."""

    merge_and_step: Callable[[list, Any, list, list, float, bool], tuple[list, Any]]
    weight: Callable[[int, int, int], float]
    decode: Callable[[list], list]
    outer_init: Callable[[list], Any]
    average: Callable[[list, list], list] | None = None
    broadcast_delta: Callable[[list, list], tuple[list, list]] | None = None
    combine: Callable[[list, list], list] | None = None
    # digest(arrays) -> str: what a fresh Hello's Θ0 is compared with (None: never fresh)
    digest: Callable[[list], str] | None = None
    # rms(arrays) -> float, the root mean square of every value (nan / inf for a non-finite
    # Δ): the corrupt guard's size of a Δ or a Θ[p], comparable across fragments (None: no guard)
    rms: Callable[[list], float] | None = None
    # audit(Θ[p], outer_p, deltas, weights, Θ[p] after, outer_p after, closing) -> dict | None: a
    # commit's arrays for the `commit_audit` line (None: this commit not sampled; trainer/numerics/wiring.py)
    audit: Callable[..., dict | None] | None = None


@dataclass(frozen=True)
class Pending:
    """A contribution (or dp gradient, base_version = its step) waiting in a round."""

    incarnation: int
    seq: int
    base_version: int
    c_steps: int
    c_tokens: int
    payload: list
    received_at: float
    combined: tuple = ()     # seqs summed into this one


@dataclass(frozen=True)
class Round:
    opened_at: float
    pending: dict            # learner -> Pending; one per learner
    quorum_at: float | None = None
    deadline: float | None = None


@dataclass(frozen=True)
class Repairing:
    """A fragment a restarted shard is repairing: the version it asked `learner` for, by
    when, and the learners whose Hello it answers once the repair is in or given up
    (learner -> the (version, digest) its Hello said it holds)."""
    version: int
    learner: str
    deadline: float
    waiting: dict


@dataclass(frozen=True)
class SyncerState:
    theta: dict              # p -> list of arrays
    outer: dict              # p -> outer optimizer state (opaque)
    version: dict            # p -> int
    durable: dict            # p -> highest version the shell reported saved
    live: frozenset = frozenset()
    closed: frozenset = frozenset()  # learners whose closing contribution came: done, still in the fleet's count
    rounds: dict = field(default_factory=dict)       # p -> Round, open rounds only
    last_merged: dict = field(default_factory=dict)  # (learner, p) -> (incarnation, seq)
    dp_sent: dict = field(default_factory=dict)      # (learner, p) -> last GradMean sent
    held: dict = field(default_factory=dict)         # (learner, p) -> (version, the copy it holds)
    xi_step: float | None = None
    xi_quorum: float | None = None
    xi_sync: float | None = None
    theta0: str = ""         # digest of the owned fragments' Θ0 ("" after a restore: unknown)
    norms: tuple = ()        # the last accepted Δs' rms per inner step, every fragment (the corrupt guard)
    # repair from the learners (a restart): p -> {version: digest} the journal holds past
    # the restored version, until p's first commit; p -> Repairing while a learner is asked
    journal: dict = field(default_factory=dict)
    repairing: dict = field(default_factory=dict)
    rejoining: frozenset = frozenset()  # fragments not committed since a restart (their first round holds)
