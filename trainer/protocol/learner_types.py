"""The learner core's types: its config, the math it is given, and its state (trainer/protocol/learner_core.py).

A learner unit's protocol state is immutable (`LearnerState`); per fragment p it holds
base[p], base_version[p], the counters since p was last sent and the in-flight record.
The rules that change it are LearnerCore's (its module docstring).
"""
from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any, Callable

from diloco_chaos.trainer.protocol.protocol_base import LEARNER_BUGS, check_common


@dataclass(frozen=True)
class LearnerConfig:
    learner: str
    incarnation: int            # increases on every restart of the unit
    owners: tuple[str, ...]     # owners[p]: the shard owning fragment p; P = len(owners)
    mode: str = "decoupled"
    tau: int = 2                # overlap τ: inner steps a fragment may be in flight (streaming)
    alpha: float = 0.0          # mixing α: θ[p] ← α·θ[p] + (1−α)·Θ[p]
    starve_cycles: int = 4      # fragment cycles of silence from a shard before it is `starved` (0: never)
    keep_local: bool = False    # DiLoCo modes: an update keeps the local progress not yet contributed
    keep_on_fetch: bool = False  # keep_local: so does a fetch, when its version is ≤ keep_gap ahead
    keep_gap: int = 0           # versions (0: any)
    # keep_local: progress whose oldest step was made on a copy more than this many versions
    # behind the Θ[p] taken is thrown away, not kept (the shard would drop it as stale; 0: no bound)
    max_staleness: int = 0
    align: bool = False         # decoupled: join a round a RoundOpen announces (docs/PROTOCOL.md "Aligned rounds")
    bugs: frozenset = frozenset()

    def __post_init__(self):
        check_common("LearnerConfig", self.mode, self.bugs, LEARNER_BUGS)
        object.__setattr__(self, "owners", tuple(self.owners))
        if not self.learner or self.incarnation < 0:
            raise ValueError(f"LearnerConfig needs a name and incarnation ≥ 0, got "
                             f"{self.learner!r}, {self.incarnation}")
        if not self.owners or not all(self.owners):
            raise ValueError(f"LearnerConfig.owners must name a shard per fragment, got {self.owners}")
        if self.mode == "sync_diloco" and len(self.owners) != 1:
            raise ValueError(f"LearnerConfig: sync_diloco syncs the whole model, P must be 1, got {len(self.owners)}")
        if self.max_staleness < 0:
            raise ValueError(f"LearnerConfig.max_staleness must be ≥ 0, got {self.max_staleness}")
        if self.starve_cycles < 0:
            raise ValueError(f"LearnerConfig.starve_cycles must be ≥ 0, got {self.starve_cycles}")
        if self.tau < 0 or not 0 <= self.alpha < 1:  # α = 1 would never take Θ
            raise ValueError(f"LearnerConfig needs tau ≥ 0 and 0 ≤ alpha < 1, got {self.tau}, {self.alpha}")

    @property
    def shards(self) -> tuple[str, ...]:
        return tuple(sorted(set(self.owners)))


@dataclass(frozen=True)
class LearnerMath:
    """get_fragment(params, p) -> arrays; set_fragment(params, p, arrays) -> params;
    pseudo_grad_payload(base, local) -> payload (Δ = base − local, compressed);
    mix(local, global, alpha) -> arrays; due_fragment(step) -> p | None;
    grad_payload(arrays) -> payload (dp modes only); apply_delta(base, payload) -> arrays
    (compressed broadcasts: base + decode(payload), as the shard computes it)."""

    get_fragment: Callable[[Any, int], list]
    set_fragment: Callable[[Any, int, list], Any]
    pseudo_grad_payload: Callable[[list, list], list]
    mix: Callable[[list, list, float], list]
    due_fragment: Callable[[int], int | None]
    grad_payload: Callable[[list], list] | None = None
    apply_delta: Callable[[list, list], list] | None = None
    # rebase(params, p, new, ref) -> params with fragment p = new + (θ[p] − ref); None: via
    # get_fragment / set_fragment (the trainer's leaves stay on the device: no host wait)
    rebase: Callable[[Any, int, list, list], Any] | None = None
    # digest(arrays) -> str of Θ0 over a shard's fragments, for a fresh Hello (None: never fresh)
    digest: Callable[[list], str] | None = None
    # shard_view(base, payload) -> θ[p] as the shard reads a Δ: base − decode(payload). With
    # keep_local it is what the next Δ is measured from, so the part of the progress a lossy
    # Δ left out goes out with the next one (error feedback). None: θ[p] as sent
    shard_view: Callable[[list, list], list] | None = None


@dataclass(frozen=True)
class InFlight:
    seq: int
    sent_at: float
    sent_step: int
    msg: Any = None  # the Contribution, sent again after a reconnect in streaming / sync_diloco


@dataclass(frozen=True)
class LearnerState:
    params: Any
    base: tuple                  # per p: the last Θ[p] received (at first: own initial params)
    base_version: tuple          # per p
    c_steps: tuple               # per p, since p was last sent
    c_tokens: tuple
    step: int = 0                # inner steps done
    seq: int = 0                 # last seq used by this incarnation
    started: bool = False
    awaiting: frozenset = frozenset()               # fragments not contributed until fetched
    in_flight: dict = field(default_factory=dict)   # p -> InFlight
    blocked: bool = False
    step_time_s: float | None = None
    last_sync_s: float | None = None
    live_slices: int | None = None
    dp_grads: Any = None                            # dp: the gradient pytree being averaged
    dp_wait: dict = field(default_factory=dict)     # dp: p -> GradStep awaiting its GradMean
    phase: int = 0                                  # fragment p is due at due_fragment(step + phase)
    joined: frozenset = frozenset()                 # align: fragments sent early into a round, their turn skipped
    deferred: frozenset = frozenset()               # streaming: due while awaiting a fetch, sent after it
    phased: bool = False                            # a restarted streaming unit's phase is set
    anchor_step: tuple = ()                         # per p: the step at which base[p] was taken
    anchor_version: tuple = ()                      # per p: the copy's version at anchor_step (what the
                                                    # oldest step not yet contributed was made on)
    skipped: frozenset = frozenset()                # decoupled: p's turn came while p was unanswered
    cut: frozenset = frozenset()                    # decoupled: p's link broke; its fetch keeps nothing
    heard: dict = field(default_factory=dict)       # shard -> step of the last message from it
    sent_from: tuple = ()                           # keep_local, per p: θ[p] as last contributed (None: base[p])
    asked: dict = field(default_factory=dict)       # shard -> (step of the last Hello, Hellos unheard)
    closing: frozenset | None = None                # after `finish`: fragments whose closing Δ is still to go
