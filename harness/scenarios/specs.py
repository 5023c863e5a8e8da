"""The scenario's plain tables as frozen dataclasses: `ClusterSpec` ([cluster]: the
learner units, slices, syncer shards, the backend and where units listen), `TrainSpec`
([train]: the training budget and the trainer settings a scenario overrides) and
`Expect` ([expect]: the thresholds the run's checks must meet). Each validates its own
fields and raises `FieldError`; harness/scenarios/scenario.py reads them from TOML (its
errors name the key) and re-exports them. docs/SCENARIOS.md describes every key."""
from __future__ import annotations

import ipaddress
from dataclasses import dataclass

from diloco_chaos.faults.fields import FieldError, check_choice, check_number
from diloco_chaos.trainer.config import (COMPRESSIONS, CORPUS_SPLITS, DOWNLINKS, MERGES, MODES, SECOND_MOMENTS,
                                         SHARE_BY, TASK_KINDS, is_plugin)
from diloco_chaos.trainer.presets import PRESETS

BACKENDS = ("local", "docker")
ENGINE_SCHEMES = ("unix://", "tcp://", "ssh://")


@dataclass(frozen=True)
class ClusterSpec:
    learners: int = 4  # M learner units
    slices: int = 1  # S slices (devices) per unit
    shards: int = 1  # syncer shards
    backend: str = "local"
    # docker: the engines (DOCKER_HOST URLs) to spread learner units over, learner-i on
    # engines[i % n]; syncer shards run on the first. Empty: the one DOCKER_HOST names.
    engines: tuple[str, ...] = ()
    # the address learners reach the link proxies and syncer shards at: loopback unless
    # the units run on other hosts (docs/DOCKER.md, "A run over several hosts")
    listen: str = "127.0.0.1"
    # a public (globally routed or unspecified) `listen` address is refused unless this is
    # set: the shards and proxies would take connections from anyone who can route to them
    listen_public: bool = False
    # warm spares: a pre-started process (a container on docker, one per engine) per role
    # takes a restarted unit's identity. docs/SCENARIOS.md
    spares: bool = True
    # how many warm spares each such role keeps ready: two, so that back-to-back restarts
    # (one taking a spare while its replacement still boots on shared cores) each find one
    spare_pool: int = 2

    def __post_init__(self) -> None:
        for flag in ("spares", "listen_public"):
            if not isinstance(getattr(self, flag), bool):
                raise FieldError("ClusterSpec", flag, f"{getattr(self, flag)!r} is not true or false", "true or false")
        for name in ("learners", "slices", "shards"):
            check_number(self, name, "1..1024", lambda v: 1 <= v <= 1024, integer=True)
        check_number(self, "spare_pool", "1..4", lambda v: 1 <= v <= 4, integer=True)
        check_choice(self, "backend", BACKENDS)
        object.__setattr__(self, "engines", tuple(self.engines))
        if self.engines and self.backend != "docker":
            raise FieldError("ClusterSpec", "engines", f"engines are for backend = \"docker\", not {self.backend!r}",
                             'backend = "docker", or no engines')
        for url in self.engines:
            if not isinstance(url, str) or not url.startswith(ENGINE_SCHEMES):
                raise FieldError("ClusterSpec", "engines", f"{url!r} is not a Docker engine URL",
                                 "unix:///path/docker.sock, tcp://host:2376 or ssh://user@host")
        try:
            addr = ipaddress.ip_address(self.listen)
        except ValueError:
            raise FieldError("ClusterSpec", "listen", f"{self.listen!r} is not an IP address",
                             '"127.0.0.1" (default), or this machine\'s address on the hosts\' network') from None
        if (addr.is_global or addr.is_unspecified) and not self.listen_public:
            raise FieldError("ClusterSpec", "listen",
                             f"{self.listen!r} is {'every address' if addr.is_unspecified else 'a public address'}: "
                             "the link proxies and syncer shards would take connections from anyone who can reach it",
                             "a loopback or private address (127.0.0.1, 10.x, 172.16-31.x, 192.168.x), "
                             "or set listen_public = true to mean it")


@dataclass(frozen=True)
class TrainSpec:
    """The training budget; optional overrides of the trainer's defaults (None = default)."""

    steps: int  # inner steps per learner unit (the token budget)
    duration_s: float  # the run's wall-clock budget (see harness/scenarios/scenario.py's docstring)
    task: str = "markov"
    end_grace_s: float | None = None  # how long past duration_s the run may go on for its tokens; None: 20 s
    mode: str = "decoupled"
    preset: str | None = None  # a named set of the keys below (trainer/config.py PRESETS); set keys win
    fragments: int | None = None
    sync_every: int | None = None
    quorum: int | None = None
    grace_factor: float | None = None  # γ of the adaptive grace window; 0 = none (commit at quorum)
    overlap: int | None = None
    mixing: float | None = None
    compression: str | None = None
    broadcast_compression: str | None = None
    sparse_density: float | None = None  # "sparse": the share of each 256-entry chunk sent
    error_feedback: bool | None = None  # a lossy Δ's left-out part goes out with the next (docs/PROTOCOL.md)
    merge: str | None = None
    max_staleness: int | None = None  # versions; 0 = no bound (docs/PROTOCOL.md "Bounded staleness")
    starve_cycles: int | None = None
    keep_local: bool | None = None  # docs/PROTOCOL.md "Keeping local progress"
    keep_on_fetch: bool | None = None  # a fetch keeps local progress too (within max_staleness)
    fleet_share: bool | None = None
    share_by: str | None = None  # "quorum" | "merged": fleet_share's numerator (docs/PROTOCOL.md)
    downlink: str | None = None  # "all" | "answer" (docs/PROTOCOL.md "Downlink")
    align: bool | None = None  # learners join the rounds others open (docs/PROTOCOL.md "Aligned rounds")
    batch_size: int | None = None
    seq_len: int | None = None
    lr: float | None = None  # inner AdamW peak learning rate
    second_moment: str | None = None  # "fleet" (default) | "own" (trainer/numerics/fleet_adam.py)
    outer_lr: float | None = None  # the outer SGD's learning rate (trainer/config.py OuterOptConfig)
    outer_momentum: float | None = None  # its Nesterov momentum; 0 = none
    outer_warmup: int | None = None  # each fragment's first outer steps at lr ≤ 1 (OuterOptConfig.warmup)
    corpus_split: str | None = None  # corpus: "shuffled" (default) | "contiguous" (non-IID shards)

    def __post_init__(self) -> None:
        check_number(self, "steps", ">= 1", lambda v: v >= 1, integer=True)
        check_number(self, "duration_s", "> 0 seconds", lambda v: v > 0)
        if self.end_grace_s is not None:
            check_number(self, "end_grace_s", ">= 0 seconds", lambda v: v >= 0)
        if not is_plugin(self.task):
            check_choice(self, "task", TASK_KINDS + ("'package.module:factory' (your own task: docs/TASKS.md)",))
        check_choice(self, "mode", MODES)
        check_number(self, "sparse_density", "(0, 1]", lambda v: 0 < v <= 1, optional=True)
        if self.preset is not None:
            check_choice(self, "preset", tuple(PRESETS))
        for name, choices in (("compression", COMPRESSIONS), ("broadcast_compression", COMPRESSIONS),
                              ("merge", MERGES), ("downlink", DOWNLINKS), ("share_by", SHARE_BY),
                              ("corpus_split", CORPUS_SPLITS), ("second_moment", SECOND_MOMENTS)):
            if getattr(self, name) is not None:
                check_choice(self, name, choices)


@dataclass(frozen=True)
class Expect:
    """Thresholds the run's checks must meet; None = not checked."""

    goodput_min: float | None = None
    uptime_min: float | None = None
    loss_parity_max: float | None = None
    recovery_max_s: float | None = None
    rejoin_cycles_max: float | None = None  # fragment cycles (H inner steps) from a restart's first step
    participation_min: float | None = None  # mean learners merged per committed round

    def __post_init__(self) -> None:
        check_number(self, "goodput_min", "[0, 1]", lambda v: 0 <= v <= 1, optional=True)
        check_number(self, "uptime_min", "[0, 1]", lambda v: 0 <= v <= 1, optional=True)
        check_number(self, "loss_parity_max", ">= 0 (a fraction of the reference loss)",
                     lambda v: v >= 0, optional=True)
        check_number(self, "recovery_max_s", "> 0 seconds", lambda v: v > 0, optional=True)
        check_number(self, "participation_min", ">= 1 learner per round", lambda v: v >= 1, optional=True)
        check_number(self, "rejoin_cycles_max", "> 0 fragment cycles (of H inner steps)", lambda v: v > 0,
                     optional=True)
