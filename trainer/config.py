"""Run configuration: frozen, typed dataclasses, validated on construction.

Every field is checked in `__post_init__`; a bad value raises `ValueError` naming
the field, the value and the valid range. `RunConfig.to_dict()` /
`RunConfig.from_dict()` round-trip exactly through JSON (the event log's first
line and the process config file); unknown keys are rejected with the key and
the valid keys.

Vocabulary (DESIGN.md): M learners, S slices per learner, P fragments, H =
`sync_every` inner steps, overlap τ, mixing α, quorum K, grace factor γ.
"""
from __future__ import annotations

import dataclasses
from dataclasses import dataclass, field
from typing import Any

from diloco_chaos.trainer.protocol.protocol_base import DP_MODES, MODES  # one list of modes for the cores and the config


def _where(cls: type, name: str) -> str:
    return f"{cls.__name__}.{name}"


def _check_int(obj: Any, name: str, lo: int, hi: int | None = None) -> None:
    value = getattr(obj, name)
    if isinstance(value, bool) or not isinstance(value, int):
        raise ValueError(f"{_where(type(obj), name)} must be an int, got {value!r}")
    if value < lo or (hi is not None and value > hi):
        rng = f"[{lo}, {hi}]" if hi is not None else f">= {lo}"
        raise ValueError(f"{_where(type(obj), name)} = {value} is out of range; valid: {rng}")


def _check_float(obj: Any, name: str, lo: float, hi: float, *, lo_open: bool = False,
                 hi_open: bool = False) -> None:
    value = getattr(obj, name)
    if isinstance(value, bool) or not isinstance(value, (int, float)):
        raise ValueError(f"{_where(type(obj), name)} must be a number, got {value!r}")
    too_low = value <= lo if lo_open else value < lo
    too_high = value >= hi if hi_open else value > hi
    if too_low or too_high or value != value:  # value != value: NaN
        rng = f"{'(' if lo_open else '['}{lo}, {hi}{')' if hi_open else ']'}"
        raise ValueError(f"{_where(type(obj), name)} = {value} is out of range; valid: {rng}")
    object.__setattr__(obj, name, float(value))  # 1 and 1.0 round-trip the same way


def _check_choice(obj: Any, name: str, choices: tuple[str, ...]) -> None:
    value = getattr(obj, name)
    if value not in choices:
        raise ValueError(f"{_where(type(obj), name)} = {value!r} is not valid; valid: "
                         + ", ".join(repr(c) for c in choices))


def _check_bool(obj: Any, name: str) -> None:
    value = getattr(obj, name)
    if not isinstance(value, bool):
        raise ValueError(f"{_where(type(obj), name)} must be true or false, got {value!r}")


INF = float("inf")


@dataclass(frozen=True)
class ModelConfig:
    """The tiny decoder-only transformer (trainer/numerics/model.py)."""

    n_layers: int = 2
    d_model: int = 64
    n_heads: int = 4
    d_ff: int = 256
    context: int = 64  # max sequence length (learned positions)
    vocab: int = 256  # byte vocabulary

    def __post_init__(self) -> None:
        _check_int(self, "n_layers", 1, 64)
        _check_int(self, "d_model", 1, 8192)
        _check_int(self, "n_heads", 1, 256)
        _check_int(self, "d_ff", 1, 65536)
        _check_int(self, "context", 1, 65536)
        _check_int(self, "vocab", 2, 1 << 20)
        if self.d_model % self.n_heads:
            raise ValueError(f"ModelConfig.d_model = {self.d_model} must be divisible by "
                             f"ModelConfig.n_heads = {self.n_heads}")


SECOND_MOMENTS = ("fleet", "own")


@dataclass(frozen=True)
class InnerOptConfig:
    """Inner AdamW with linear warmup then cosine decay to lr / 10, global-norm clipping."""

    lr: float = 3e-3  # peak learning rate
    b1: float = 0.9
    b2: float = 0.95
    weight_decay: float = 0.1
    warmup_steps: int = 20
    total_steps: int = 400  # length of the whole schedule, warmup included
    clip_norm: float = 1.0
    # "fleet": in DiLoCo modes, Adam's v corrected to the noise of the M learners' batch
    # (trainer/numerics/fleet_adam.py); "own": plain AdamW on the unit's own batch
    second_moment: str = "fleet"

    def __post_init__(self) -> None:
        _check_float(self, "lr", 0.0, 10.0, lo_open=True)
        _check_choice(self, "second_moment", SECOND_MOMENTS)
        _check_float(self, "b1", 0.0, 1.0, hi_open=True)
        _check_float(self, "b2", 0.0, 1.0, hi_open=True)
        _check_float(self, "weight_decay", 0.0, 10.0)
        _check_int(self, "total_steps", 1)
        _check_int(self, "warmup_steps", 0, self.total_steps - 1)
        _check_float(self, "clip_norm", 0.0, INF, lo_open=True, hi_open=True)


@dataclass(frozen=True)
class OuterOptConfig:
    """Outer optimizer: optax.sgd(lr, momentum, nesterov) on the merged pseudo-gradient.

    Defaults differ from DiLoCo's (lr 0.7, Nesterov 0.9, tuned for H = 500): at this
    miniature's H = 6 with quorum 1, each learner's Δ is committed on its own every couple
    of steps and momentum 0.9 overshoots (Markov eval loss 2.4 → 5.8 over 100 steps with
    2 learners; docs/TRAINER_MATH.md). Without momentum, lr 1 is federated averaging; with
    `diloco.fleet_share` (merged Δ × min(1, K / live learners)) it is the fleet's average
    in decoupled mode too. lr 1.3 steps a little past it: on the corpus 0.6 points closer to
    data-parallel (eight seeds, paired), Markov unchanged (docs/BENCHMARKS.md "parity")."""

    lr: float = 1.3
    momentum: float = 0.0
    nesterov: bool = True
    # decoupled: a fragment's first `warmup` outer steps at lr min(1, lr), the fleet's average
    # (~60 inner steps at the defaults; docs/PROTOCOL.md "Outer warm-up"; 0: none)
    warmup: int = 40

    def __post_init__(self) -> None:
        _check_float(self, "lr", 0.0, 10.0, lo_open=True)
        _check_float(self, "momentum", 0.0, 1.0, hi_open=True)
        _check_bool(self, "nesterov")
        _check_int(self, "warmup", 0, 1 << 20)


MERGES = ("rda", "mean")
WEIGHTINGS = ("tokens", "uniform")
COMPRESSIONS = ("fp32", "bf16", "int8", "int4", "sparse")
FRAGMENTATIONS = ("balanced", "strided")
DOWNLINKS = ("all", "answer")
SHARE_BY = ("quorum", "merged")


@dataclass(frozen=True)
class DilocoConfig:
    """The Decoupled DiLoCo knobs (DESIGN.md, "The algorithm")."""

    learners: int = 4  # M
    slices: int = 1  # S, devices per learner unit
    fragments: int = 3  # P; 0 means n_layers + 1 (see `n_fragments`)
    sync_every: int = 6  # H inner steps between two syncs of one fragment
    overlap: int = 1  # τ inner steps a learner keeps stepping while a fragment is in flight
    mixing: float = 0.0  # α: θ[p] ← α·θ[p] + (1−α)·Θ[p] on arrival
    quorum: int = 1  # K learners a round waits for
    grace_factor: float = 0.5  # γ of the adaptive grace window
    merge: str = "rda"
    weighting: str = "tokens"
    staleness_discount: bool = True  # (1 + staleness)^-0.5 on each contribution, relative within its round
    # a contribution staler than this many versions of its fragment is dropped, not merged,
    # and its learner re-anchors on the current Θ[p] (0: no bound; docs/PROTOCOL.md)
    max_staleness: int = 16
    # fragment cycles of silence from a shard before a learner calls it starved and re-fetches
    starve_cycles: int = 4
    # every DiLoCo mode: a Θ[p] arriving moves the learner's not-yet-contributed progress
    # (the τ steps made while p was in flight, and more in decoupled mode) onto it instead of
    # overwriting it (docs/PROTOCOL.md "Keeping local progress")
    keep_local: bool = True
    # keep_local: a fetch (a reconnect, a restarted shard's answer) keeps the local progress
    # too when it is at most max_staleness versions behind, instead of throwing it away
    keep_on_fetch: bool = True
    # decoupled: each round's outer step is scaled by its share of the live learners, so Θ
    # moves by the fleet's average progress, not its sum (docs/PROTOCOL.md "Keeping local progress")
    fleet_share: bool = True
    # fleet_share's numerator: the quorum K ("quorum": at K = 1 a round counts as one learner's
    # share), or the learners the round merged ("merged": for a grace window that gathers
    # several, e.g. a larger `overlap`; docs/BENCHMARKS.md "The paper preset")
    share_by: str = "quorum"
    # decoupled: a commit's Θ[p] goes to every live learner ("all") or only to the learners
    # whose contributions it merged ("answer": once per learner per fragment cycle, M times
    # fewer bytes down; docs/PROTOCOL.md "Downlink")
    downlink: str = "all"
    # decoupled: a shard tells the other live learners when a round of p opens (RoundOpen),
    # and a learner whose turn for p is at most half a cycle away joins it at once and skips
    # that turn: rounds gather the learners due together though their phases drift apart
    # (docs/PROTOCOL.md "Aligned rounds"; the paper preset sets it, with share_by "merged")
    align: bool = False
    # decoupled: a shard drops a contribution whose Δ is not finite, or whose norm per inner
    # step is over guard_factor × the largest of the shard's last 16 or over |Θ[p]|
    # (`drop reason=corrupt`: silent data corruption; docs/PROTOCOL.md "Corrupt
    # contributions"); 0: the finite check only. 30: the inner lr's warm-up alone grows the
    # size per step up to 20× (10 dropped a legitimate Δ on processes, at 14×)
    guard_factor: float = 30.0
    compression: str = "fp32"  # the pseudo-gradients, learner → shard
    # Θ[p] shard → learner: fp32 sends it whole; bf16/int8/int4 send a compressed delta
    # against the copy the learner holds, with error feedback (trainer/protocol/messages.py, FragmentDelta)
    broadcast_compression: str = "fp32"
    # "sparse" (either way): the share of each 256-entry chunk kept, top-k by size, values in
    # 2 bits; what is not sent stays in the sender's error feedback (docs/PROTOCOL.md
    # "Sparse pseudo-gradients"). 1/16 keeps 16 of 256: 10 bits per kept entry, index included
    sparse_density: float = 1 / 16
    # a lossy Δ (bf16 / int8 / int4 / sparse) is measured as the shard will read it, so what it
    # left out stays in θ and goes out with the next Δ (docs/PROTOCOL.md "Sparse
    # pseudo-gradients"); sparse always (`uplink_feedback`). int4 without it rounds every entry under max|Δ|/128 to zero, for good:
    # corpus, H = 6, int4 both ways, seed 0: 2.317 without, 2.076 with (fp32: 1.924)
    error_feedback: bool = True
    fragmentation: str = "balanced"
    mode: str = "decoupled"

    def __post_init__(self) -> None:
        _check_int(self, "learners", 1, 1024)
        _check_int(self, "slices", 1, 1024)
        _check_int(self, "fragments", 0, 4096)
        _check_int(self, "sync_every", 1)
        _check_int(self, "overlap", 0)
        _check_float(self, "mixing", 0.0, 1.0, hi_open=True)
        _check_int(self, "quorum", 1, self.learners)
        _check_float(self, "grace_factor", 0.0, 1.0, hi_open=True)
        _check_choice(self, "merge", MERGES)
        _check_choice(self, "weighting", WEIGHTINGS)
        _check_bool(self, "staleness_discount")
        _check_int(self, "max_staleness", 0)
        _check_int(self, "starve_cycles", 0)
        _check_bool(self, "keep_local")
        _check_bool(self, "keep_on_fetch")
        _check_bool(self, "fleet_share")
        _check_choice(self, "share_by", SHARE_BY)
        _check_choice(self, "downlink", DOWNLINKS)
        _check_bool(self, "align")
        _check_float(self, "guard_factor", 0.0, 1e9)
        _check_choice(self, "compression", COMPRESSIONS)
        _check_choice(self, "broadcast_compression", COMPRESSIONS)
        _check_float(self, "sparse_density", 0.0, 1.0, lo_open=True)
        _check_bool(self, "error_feedback")
        if self.compression == "sparse" and not self.keep_local and self.mode not in DP_MODES:
            raise ValueError(f"{_where(type(self), 'compression')} = 'sparse' needs keep_local = true: a sparse "
                             "Δ's error feedback is the local progress it did not carry, kept for the next Δ")
        _check_choice(self, "fragmentation", FRAGMENTATIONS)
        _check_choice(self, "mode", MODES)

    @property
    def uplink_feedback(self) -> bool:
        """Whether the learner measures its next Δ from θ as the shard read the last one."""
        return self.compression == "sparse" or (self.compression != "fp32" and self.error_feedback)

    def n_fragments(self, model: ModelConfig) -> int:
        """P, with 0 resolved to n_layers + 1 (one fragment per layer plus embed/final)."""
        return self.fragments or model.n_layers + 1


TASK_KINDS = ("markov", "corpus", "quadratic")


def is_plugin(kind: str) -> bool:
    """Whether a task kind names a user's factory by import path ("module:factory")."""
    return isinstance(kind, str) and ":" in kind


CORPUS_SPLITS = ("shuffled", "contiguous")


@dataclass(frozen=True)
class TaskConfig:
    """Data. `batch_size` is per learner unit, split evenly over its S slices."""

    kind: str = "markov"  # a built-in (TASK_KINDS) or a plug-in's "module:factory" (trainer/numerics/plugins.py)
    batch_size: int = 16  # sequences (LM) or samples (quadratic) per learner per step
    seq_len: int = 64  # predicted tokens per sequence; a batch row holds seq_len + 1 tokens
    markov_order: int = 1
    markov_states: int = 16  # alphabet: tokens 0..markov_states-1
    markov_seed: int = 0  # the chain itself; data streams also fold in RunConfig.seed
    markov_concentration: float = 0.2  # Dirichlet α of each transition row: small = peaked
    eval_batches: int = 4
    final_eval_batches: int = 64  # the harness's eval of the final global model (parity interval)
    dim: int = 8  # quadratic: entries per block
    quad_blocks: int = 3  # quadratic: blocks `layer_i/w`, so P fragments have leaves to hold
    quad_noise: float = 0.1  # quadratic: std of per-step target noise
    corpus_mb: float = 2.0  # corpus: bytes of stdlib sources read (MB = 1e6 bytes)
    corpus_eval_fraction: float = 0.05  # corpus: held-out share
    # corpus: how the bytes are dealt to the M learners. "shuffled": cut into chunks of
    # corpus_chunk bytes, dealt by a seeded permutation (every shard a sample of the whole
    # library, as the paper's learners read shards of one shuffled dataset; the held-out
    # chunks too). "contiguous": M consecutive regions of the file-sorted library and the
    # tail held out (each learner its own modules: non-IID data, the layout before)
    corpus_split: str = "shuffled"
    corpus_chunk: int = 4096
    # a plug-in's keyword arguments (the scenario's [task] table); left out of the hash,
    # so a config stays a cache key, and compared like any field
    options: dict = field(default_factory=dict, hash=False)

    def __post_init__(self) -> None:
        if not is_plugin(self.kind):
            _check_choice(self, "kind", TASK_KINDS + ("'package.module:factory' (a plug-in, docs/TASKS.md)",))
        if not isinstance(self.options, dict) or not all(isinstance(k, str) for k in self.options):
            raise ValueError(f"TaskConfig.options = {self.options!r} is not valid; valid: a table of keyword arguments")
        if self.options and not is_plugin(self.kind):
            raise ValueError(f"TaskConfig.options: the built-in task {self.kind!r} takes no [task] table; "
                             f"valid: a plug-in task 'package.module:factory' (docs/TASKS.md)")
        _check_int(self, "batch_size", 1, 1 << 16)
        _check_int(self, "seq_len", 1, 1 << 16)
        _check_int(self, "markov_order", 1, 3)
        _check_int(self, "markov_states", 2, 256)
        if self.markov_states ** self.markov_order > 1024:
            raise ValueError(
                f"TaskConfig.markov_states ** markov_order = "
                f"{self.markov_states}**{self.markov_order} exceeds 1024 contexts; "
                f"lower markov_states or markov_order")
        _check_int(self, "markov_seed", 0)
        _check_float(self, "markov_concentration", 0.0, 100.0, lo_open=True)
        _check_int(self, "eval_batches", 1, 1024)
        _check_int(self, "final_eval_batches", 1, 4096)
        _check_int(self, "dim", 1, 1 << 16)
        _check_int(self, "quad_blocks", 1, 256)
        _check_float(self, "quad_noise", 0.0, 100.0)
        _check_float(self, "corpus_mb", 0.0, 64.0, lo_open=True)
        _check_float(self, "corpus_eval_fraction", 0.0, 0.5, lo_open=True)
        _check_choice(self, "corpus_split", CORPUS_SPLITS)
        _check_int(self, "corpus_chunk", 2, 1 << 24)
        if self.kind == "corpus" and self.corpus_split == "shuffled" and self.corpus_chunk < self.seq_len + 1:
            raise ValueError(f"TaskConfig.corpus_chunk = {self.corpus_chunk} is shorter than a batch row "
                             f"(seq_len + 1 = {self.seq_len + 1}); valid: >= {self.seq_len + 1}")

    @property
    def tokens_per_row(self) -> int:
        """Tokens one batch row contributes (the unit of c_tokens): predicted tokens for
        the language tasks, 1 sample for the quadratic, `seq_len` for a plug-in (set it to
        1 when a row is one sample: docs/TASKS.md)."""
        return 1 if self.kind == "quadratic" else self.seq_len


_SECTIONS = {"model": ModelConfig, "inner": InnerOptConfig, "outer": OuterOptConfig,
             "diloco": DilocoConfig, "task": TaskConfig}


@dataclass(frozen=True)
class RunConfig:
    name: str = "run"
    seed: int = 0
    model: ModelConfig = field(default_factory=ModelConfig)
    inner: InnerOptConfig = field(default_factory=InnerOptConfig)
    outer: OuterOptConfig = field(default_factory=OuterOptConfig)
    diloco: DilocoConfig = field(default_factory=DilocoConfig)
    task: TaskConfig = field(default_factory=TaskConfig)
    steps: int = 400  # inner steps per learner
    eval_every: int = 100  # inner steps between held-out evaluations of a learner's θ (and the last step)

    def __post_init__(self) -> None:
        if not isinstance(self.name, str) or not self.name:
            raise ValueError(f"RunConfig.name must be a non-empty string, got {self.name!r}")
        _check_int(self, "seed", 0, (1 << 32) - 1)
        _check_int(self, "steps", 1)
        _check_int(self, "eval_every", 1)
        for key, cls in _SECTIONS.items():
            if not isinstance(getattr(self, key), cls):
                raise ValueError(f"RunConfig.{key} must be a {cls.__name__}, "
                                 f"got {type(getattr(self, key)).__name__}")
        d, t, m = self.diloco, self.task, self.model
        if d.mode not in DP_MODES and d.sync_every < self.n_fragments:
            raise ValueError(f"DilocoConfig.sync_every = {d.sync_every} is less than the {self.n_fragments} "
                             f"fragments (DilocoConfig.fragments): one fragment goes out every H / P steps; "
                             f"valid: sync_every >= {self.n_fragments}, or fewer fragments")
        if d.mode in ("streaming", "sync_diloco") and d.sync_every <= d.overlap:
            # a round needs every unit: p would come due again while its last Δ is still in
            # flight, and go out measured from the same base (its progress sent twice)
            raise ValueError(f"DilocoConfig.sync_every = {d.sync_every} is not more than DilocoConfig.overlap "
                             f"= {d.overlap}: in {d.mode} a fragment must be answered before its next turn; "
                             f"valid: sync_every > overlap (e.g. overlap = {d.sync_every - 1})")
        if d.mode == "sync_diloco" and self.n_fragments != 1:
            raise ValueError(f"DilocoConfig.fragments = {d.fragments}: sync_diloco syncs the whole model at "
                             f"once; valid: fragments = 1")
        if t.batch_size % d.slices:
            raise ValueError(f"TaskConfig.batch_size = {t.batch_size} must be divisible by "
                             f"DilocoConfig.slices = {d.slices} (the batch is split over slices)")
        if t.kind in ("markov", "corpus"):
            if t.seq_len > m.context:
                raise ValueError(f"TaskConfig.seq_len = {t.seq_len} exceeds "
                                 f"ModelConfig.context = {m.context}; valid: [1, {m.context}]")
            if t.kind == "markov" and t.markov_states > m.vocab:
                raise ValueError(f"TaskConfig.markov_states = {t.markov_states} exceeds "
                                 f"ModelConfig.vocab = {m.vocab}")
            if t.kind == "corpus" and m.vocab < 256:
                raise ValueError(f"ModelConfig.vocab = {m.vocab}: the corpus task is "
                                 f"byte-level and needs vocab >= 256")

    @property
    def n_fragments(self) -> int:
        return self.diloco.n_fragments(self.model)

    def to_dict(self) -> dict[str, Any]:
        """A JSON-ready dict (only str, int, float, bool and nested dicts)."""
        return dataclasses.asdict(self)

    @classmethod
    def from_dict(cls, data: dict[str, Any]) -> "RunConfig":
        """Inverse of `to_dict`. Missing keys take their defaults; unknown keys raise."""
        _reject_unknown(cls, data, "RunConfig")
        kwargs = dict(data)
        for key, sub in _SECTIONS.items():
            if key in kwargs:
                value = kwargs[key]
                if not isinstance(value, dict):
                    raise ValueError(f"RunConfig.{key} must be a table/dict, got {value!r}")
                _reject_unknown(sub, value, f"RunConfig.{key}")
                kwargs[key] = sub(**value)
        return cls(**kwargs)


def _reject_unknown(cls: type, data: dict[str, Any], where: str) -> None:
    if not isinstance(data, dict):
        raise ValueError(f"{where} must be a dict, got {type(data).__name__}")
    valid = [f.name for f in dataclasses.fields(cls)]
    for key in data:
        if key not in valid:
            raise ValueError(f"unknown key {where}.{key!s}; valid keys: {', '.join(valid)}")
