"""The messages between learner units, syncer shards and the harness.

Frozen dataclasses. A *fragment* on the wire is a list of leaf arrays (in the order
the fragmenter gives them); a *payload* is such a list, compressed (`Encoded`) or
raw (`np.ndarray`). Every class names the fields that hold tensor lists in
`TENSOR_FIELDS`; all other fields are JSON scalars (str, int, float, bool, None),
which is all the codec (trainer/wire/codec.py) needs to know.

Decoupled / streaming / sync DiLoCo:
  learner → shard   Hello, Contribution, Repair (Θ[p] as it holds it, asked for)
  shard → learner   FragmentUpdate, FragmentDelta (a compressed broadcast),
                    RoundOpen (`align`: a round of a fragment has opened, join it),
                    RepairRequest (a restarted shard asks for a version it lost)
Data-parallel baselines (mode "dp", "elastic_dp"), one message per fragment per step:
  learner → shard   GradStep
  shard → learner   GradMean
Harness → learner   SliceControl
Either end of a link, consumed by the transport (never a core): Received
"""
from __future__ import annotations

from dataclasses import dataclass, fields
from typing import ClassVar

import numpy as np

from diloco_chaos.trainer.protocol.compression import Encoded

Tensor = np.ndarray | Encoded


def _same(a, b) -> bool:
    """Bitwise equality of field values: arrays by dtype, shape and bytes (NaN equals NaN)."""
    if isinstance(a, np.ndarray) or isinstance(b, np.ndarray):
        return (isinstance(a, np.ndarray) and isinstance(b, np.ndarray) and a.dtype == b.dtype
                and a.shape == b.shape and a.tobytes() == b.tobytes())
    if isinstance(a, (list, tuple)) and isinstance(b, (list, tuple)):
        return len(a) == len(b) and all(_same(x, y) for x, y in zip(a, b))
    return type(a) is type(b) and a == b


class _Message:
    TENSOR_FIELDS: ClassVar[tuple[str, ...]] = ()

    def __eq__(self, other) -> bool:
        return type(self) is type(other) and all(
            _same(getattr(self, f.name), getattr(other, f.name)) for f in fields(self))

    __hash__ = None

    def _non_negative(self, *names: str) -> None:
        for name in names:
            if getattr(self, name) < 0:
                raise ValueError(f"{type(self).__name__}.{name} must be ≥ 0, got {getattr(self, name)}")


@dataclass(frozen=True, eq=False)
class Hello(_Message):
    """Learner → every shard on (re)connect: send me every fragment you own (rejoin=True).

    fresh: "" or, while the learner has taken no update and holds the run's initial
    parameters, the digest of its Θ0 over the shard's fragments; if it is the shard's own,
    a fragment the shard still holds at version 0 is answered with no params.
    held: the copies it holds of the shard's fragments past version 0, as
    "p:version:digest" joined by "," (`held_copies` reads it): a shard restarted from an
    older checkpoint asks for a version it lost (RepairRequest) instead of rolling back."""

    learner: str
    incarnation: int
    fresh: str = ""
    held: str = ""


def held_field(copies: dict) -> str:
    """Hello.held from {p: (version, digest)}."""
    return ",".join(f"{p}:{v}:{d}" for p, (v, d) in sorted(copies.items()))


def held_copies(held: str) -> dict:
    """{p: (version, digest)} from Hello.held; a malformed entry raises ValueError."""
    out = {}
    for item in filter(None, held.split(",")):
        p, v, d = item.split(":")
        if not (p.isdigit() and v.isdigit() and d):
            raise ValueError(f"Hello.held entry {item!r} is not p:version:digest")
        out[int(p)] = (int(v), d)
    return out


@dataclass(frozen=True, eq=False)
class Contribution(_Message):
    """Learner → the shard owning `fragment`: a compressed pseudo-gradient Δ = Θ_base − θ_m.

    (learner, incarnation, seq) identifies it; seq increases per learner incarnation over
    all its messages. base_version is the version of the Θ[fragment] the Δ is taken against.
    c_steps / c_tokens count the inner steps and tokens since the learner last sent this
    fragment. step_time_s is its latest inner-step time; last_sync_s its latest measured
    send → update time (None before the first). closing: sent after the learner's last
    inner step (its closing contribution, `LearnerCore.finish`): the shard keeps counting
    it in the fleet once it leaves, since its share of the fleet is in Θ.
    """

    TENSOR_FIELDS: ClassVar[tuple[str, ...]] = ("payload",)
    learner: str
    incarnation: int
    seq: int
    fragment: int
    base_version: int
    c_steps: int
    c_tokens: int
    step_time_s: float
    last_sync_s: float | None
    payload: list[Tensor]
    closing: bool = False

    def __post_init__(self):
        self._non_negative("incarnation", "seq", "fragment", "base_version", "c_steps", "c_tokens")


@dataclass(frozen=True, eq=False)
class FragmentUpdate(_Message):
    """Shard → learner: the current global Θ[fragment] at `version`.

    rejoin=True marks the answer to a Hello (sent to that learner only); False a commit.
    Empty params (only in answer to a fresh Hello, at version 0): the learner's own Θ0[p]
    is current; nothing else needs to cross the link. unmoved=True: no round of p has
    committed since the shard restarted, so the versions past a learner's copy are commits
    from before its crash, which hold none of the progress the learners made while it was
    down: a fetch up to RESTART_GAP versions ahead keeps that progress
    (trainer/protocol/learner_core.py; docs/PROTOCOL.md "Repair from the learners").
    """

    TENSOR_FIELDS: ClassVar[tuple[str, ...]] = ("params",)
    fragment: int
    version: int
    rejoin: bool
    params: list[np.ndarray]
    unmoved: bool = False

    def __post_init__(self):
        self._non_negative("fragment", "version")


@dataclass(frozen=True, eq=False)
class FragmentDelta(_Message):
    """Shard → learner, a compressed broadcast (`diloco.broadcast_compression`): Θ[fragment]
    at `version` is the learner's copy at `base_version` plus decode(`payload`).

    The shard keeps, per learner, the copy the learner holds (what it reconstructed from
    earlier updates, not the exact Θ), and sends compress(Θ − copy): the quantisation
    error of one delta is carried into the next one (error feedback), so the learner's
    copy stays within one step's quantisation error of Θ. A learner whose copy is not at
    `base_version` (an update lost with a link) drops it and fetches afresh (Hello).
    """

    TENSOR_FIELDS: ClassVar[tuple[str, ...]] = ("payload",)
    fragment: int
    version: int
    base_version: int
    payload: list[Tensor]

    def __post_init__(self):
        self._non_negative("fragment", "version", "base_version")
        if self.base_version >= self.version:
            raise ValueError(f"FragmentDelta.base_version must be < version, got {self.base_version} "
                             f"and {self.version}")


@dataclass(frozen=True, eq=False)
class RoundOpen(_Message):
    """Shard → every other live learner (decoupled mode with `align`): a learner's
    contribution has opened an outer round of `fragment` at `version`. A learner whose own
    turn for it is at most half a fragment cycle away contributes it at once and skips that
    turn, so the grace window gathers the learners that are due together (docs/PROTOCOL.md
    "Aligned rounds"). No tensors: a few dozen bytes."""

    fragment: int
    version: int

    def __post_init__(self):
        self._non_negative("fragment", "version")


@dataclass(frozen=True, eq=False)
class RepairRequest(_Message):
    """Shard → learner: a shard restarted from a checkpoint older than the copy of
    Θ[fragment] at `version` the learner's Hello says it holds, and whose own journal of
    commits names that version's digest: send it (docs/PROTOCOL.md "Repair from the
    learners")."""

    fragment: int
    version: int

    def __post_init__(self):
        self._non_negative("fragment", "version")


@dataclass(frozen=True, eq=False)
class Repair(_Message):
    """Learner → shard, the answer to a RepairRequest: its copy of Θ[fragment] at
    `version`, which the shard takes only if its digest is the one its journal holds."""

    TENSOR_FIELDS: ClassVar[tuple[str, ...]] = ("params",)
    learner: str
    incarnation: int
    fragment: int
    version: int
    params: list[np.ndarray]

    def __post_init__(self):
        self._non_negative("incarnation", "fragment", "version")


@dataclass(frozen=True, eq=False)
class GradStep(_Message):
    """Data-parallel baseline, learner → shard: its gradient of `fragment` at inner `step`.

    The learner then waits for the GradMean answering this seq for every fragment.
    """

    TENSOR_FIELDS: ClassVar[tuple[str, ...]] = ("payload",)
    learner: str
    incarnation: int
    seq: int
    fragment: int
    step: int
    c_tokens: int
    payload: list[Tensor]

    def __post_init__(self):
        self._non_negative("incarnation", "seq", "fragment", "step", "c_tokens")


@dataclass(frozen=True, eq=False)
class GradMean(_Message):
    """Data-parallel baseline, shard → each learner in the round: the token-weighted mean
    gradient of `fragment` over `n_learners` learners; `seq` is the recipient's own GradStep
    it answers, so a late retransmission is never applied to the wrong step."""

    TENSOR_FIELDS: ClassVar[tuple[str, ...]] = ("grads",)
    fragment: int
    round: int
    seq: int
    n_learners: int
    grads: list[np.ndarray]

    def __post_init__(self):
        self._non_negative("fragment", "round", "seq", "n_learners")


@dataclass(frozen=True, eq=False)
class SliceControl(_Message):
    """Harness → learner (kill_slice fault): the unit now has `live_slices` slices."""

    live_slices: int

    def __post_init__(self):
        self._non_negative("live_slices")


@dataclass(frozen=True, eq=False)
class Received(_Message):
    """Either end of a link → the other: `nbytes` of this connection's stream (counted after
    the run-membership exchange) have been read. The transport's delivery window
    (trainer/wire/transport.py): a sender writes a new frame only while what it wrote and the
    peer has not yet read is under WINDOW_BYTES, so a backlog waits in its outbox, where
    a newer Θ[p] can still replace it, not in buffers along the path."""

    nbytes: int

    def __post_init__(self):
        self._non_negative("nbytes")


MESSAGE_TYPES: dict[str, type] = {
    c.__name__: c for c in (Hello, Contribution, FragmentUpdate, FragmentDelta, RoundOpen, RepairRequest, Repair,
                             GradStep, GradMean, SliceControl, Received)
}


def describe(msg) -> dict:
    """The message's scalar fields plus kind and tensor bytes: for the shell's send/recv lines."""
    out = {"msg": type(msg).__name__}
    for f in fields(msg):
        value = getattr(msg, f.name)
        if f.name in msg.TENSOR_FIELDS:
            out["tensor_bytes"] = sum(int(t.nbytes) for t in value)
        else:
            out[f.name] = value
    return out
