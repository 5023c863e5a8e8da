"""The fault model: what goes wrong, where and when, as data (the injector applies it).

One small frozen dataclass per fault kind, in the style of Toxiproxy's toxics: units
in the field names, validated on construction with a `FieldError` (a ValueError)
naming the field and what would be valid (faults/fields.py). Times are seconds from
the run's start.

Targets: `learner-N` (a learner unit), `syncer-N` (a syncer shard), or a link spec:
`link:learner-N` (every link of that learner), `link:learner-N~syncer-M` (one link),
`link:*` (every link). Whether a target exists in a given run is checked by
`faults.schedule`, which knows the run's shape; this module checks only the form.

`conflict(a, b)` (faults/overlaps.py) is the one table of which faults may not overlap
in time on the same target (a dead unit cannot be killed again, paused or slowed), and
`LinkTarget` there parses a link target. `FailureProcess` (faults/failures.py) draws
random interruptions from a rate, seeded, into explicit faults before the run, so a
run with random failures is replayed exactly by its seed.
"""
from __future__ import annotations

import dataclasses
import math
import re
from dataclasses import dataclass, field
from typing import Any, ClassVar, Mapping

from faults.fields import FieldError, check_choice, check_number, suggest
# the overlap table and link targets live in faults/overlaps.py; re-exported here for callers
from faults.overlaps import UNIT_CONFLICTS, LinkTarget, conflict, links_intersect, overlap_in_time  # noqa: F401


_N = r"(?:0|[1-9][0-9]*)"
TARGET_FORMS = {  # what a fault's target must look like, by the role it hits
    "learner": (re.compile(f"learner-{_N}"), "learner-N"),
    "syncer": (re.compile(f"syncer-{_N}"), "syncer-N"),
    "link": (re.compile(rf"link:(\*|learner-{_N}(~syncer-{_N})?)"),
             "link:learner-N, link:learner-N~syncer-M, link:*"),
}
_POSITIVE_S = "> 0 seconds"


FAULT_KINDS: dict[str, type] = {}  # kind -> its class, in the order they are defined (the fault table)


@dataclass(frozen=True)
class _Fault:
    """Common fields: `target` and `at_s` (seconds from the run's start).

    A fault kind is one subclass, and everything the rest of the code needs to know of it
    is declared here (docs/ARCHITECTURE.md "Adding a fault kind"): defining the class
    registers it in FAULT_KINDS, which the scenario reader, the schedule checks, the
    strategies, the injector, the checks and the report's timeline all read."""

    kind: ClassVar[str] = ""
    role: ClassVar[str] = "learner"  # which TARGET_FORMS the target must match
    length_field: ClassVar[str] = "duration_s"  # the field that says how long it lasts
    # how it is done, in words, where a backend's own table does not say (a fault_start's `via`)
    mechanism: ClassVar[str] = ""
    # link faults: whether a learner behind it cannot reach its shard (the reachability
    # the liveness checks allow for), and the link's state on the report's timeline
    cuts_link: ClassVar[bool] = False
    link_state: ClassVar[str] = ""

    def __init_subclass__(cls, **kw):
        super().__init_subclass__(**kw)
        if "kind" in cls.__dict__:
            FAULT_KINDS[cls.kind] = cls

    def toxics(self) -> list[tuple[str, tuple[str, ...], dict]]:
        """A link fault done by Toxiproxy toxics on each of its links, added at its start
        and removed at its end: [(toxic type, streams, attributes)]. The injector applies
        these on every backend, the simulator's links model each toxic type
        (harness/sim/net.py). Empty: the injector has its own `_start_<kind>`."""
        return []

    target: str
    at_s: float

    def __post_init__(self) -> None:
        pattern, forms = TARGET_FORMS[self.role]
        if not isinstance(self.target, str) or not pattern.fullmatch(self.target):
            raise FieldError(type(self).__name__, "target",
                             f"{self.kind} cannot target {self.target!r}", forms)
        check_number(self, "at_s", ">= 0 seconds", lambda v: v >= 0)
        self._check()

    def _check(self) -> None:
        check_number(self, "duration_s", _POSITIVE_S, lambda v: v > 0)

    @property
    def length_s(self) -> float | None:
        """How long the fault lasts; None = to the end of the run (or never healed)."""
        return getattr(self, self.length_field)

    @property
    def end_s(self) -> float | None:
        return None if self.length_s is None else self.at_s + self.length_s

    def to_dict(self) -> dict[str, Any]:
        """JSON-ready, as the event log records it; `fault_from_dict` is the inverse."""
        return {"kind": self.kind, **{f.name: getattr(self, f.name) for f in dataclasses.fields(self)}}


# `never` / `end` name None in scenario files (metadata read by harness/scenarios/scenario.py).
NEVER = {"none_word": "never"}


@dataclass(frozen=True)
class KillUnit(_Fault):
    """A learner unit dies (SIGKILL) and is restarted after `down_for_s`; None = never."""

    kind: ClassVar[str] = "kill_unit"
    length_field: ClassVar[str] = "down_for_s"
    down_for_s: float | None = field(metadata=NEVER)

    def _check(self) -> None:
        check_number(self, "down_for_s", "> 0 seconds, or None (never returns)", lambda v: v > 0,
                     optional=True)


@dataclass(frozen=True)
class KillSlice(_Fault):
    """A unit loses `slices` of its slices for `duration_s`; its batch shrinks meanwhile."""

    kind: ClassVar[str] = "kill_slice"
    duration_s: float
    slices: int = 1

    def _check(self) -> None:
        super()._check()
        check_number(self, "slices", ">= 1 (and fewer than the unit has)", lambda v: v >= 1, integer=True)


@dataclass(frozen=True)
class PauseUnit(_Fault):
    """A unit hangs, alive but silent (SIGSTOP, then SIGCONT after `duration_s`)."""

    kind: ClassVar[str] = "pause_unit"
    duration_s: float


@dataclass(frozen=True)
class SlowUnit(_Fault):
    """A unit runs at `speed` × full speed: in every `period_ms` it is stopped for
    (1 − speed) of the period (duty-cycled SIGSTOP/SIGCONT)."""

    kind: ClassVar[str] = "slow_unit"
    duration_s: float
    speed: float
    period_ms: float = 200.0

    def _check(self) -> None:
        super()._check()
        check_number(self, "speed", "(0, 1): the fraction of full speed", lambda v: 0 < v < 1)
        check_number(self, "period_ms", "[10, 10000] ms", lambda v: 10 <= v <= 10_000)


@dataclass(frozen=True)
class KillSyncer(_Fault):
    """A syncer shard dies (SIGKILL) and restarts from its checkpoint after `down_for_s`."""

    kind: ClassVar[str] = "kill_syncer"
    role: ClassVar[str] = "syncer"
    length_field: ClassVar[str] = "down_for_s"
    down_for_s: float

    def _check(self) -> None:
        check_number(self, "down_for_s", _POSITIVE_S, lambda v: v > 0)


@dataclass(frozen=True)
class Wan(_Fault):
    """The link's profile becomes this for `duration_s` (None = to the end of the run),
    then returns to the scenario's base profile. Toxiproxy `bandwidth` and `latency`
    toxics; latency is one-way, on both streams."""

    kind: ClassVar[str] = "wan"
    role: ClassVar[str] = "link"
    mechanism: ClassVar[str] = "Toxiproxy bandwidth/latency toxics"
    link_state: ClassVar[str] = "slow"  # "throttled" when it limits the bandwidth (reports/timeline.py)
    duration_s: float | None = field(default=None, metadata={"none_word": "end"})
    bandwidth_kbps: float | None = None  # kilobits per second; None = unlimited
    latency_ms: float = 0.0
    jitter_ms: float = 0.0

    def _check(self) -> None:
        check_number(self, "duration_s", "> 0 seconds, or None (to the end)", lambda v: v > 0, optional=True)
        check_number(self, "bandwidth_kbps", ">= 8 kbps (1 KB/s, Toxiproxy's resolution), or None",
                     lambda v: v >= 8, optional=True)
        check_number(self, "latency_ms", ">= 0 ms", lambda v: v >= 0)
        check_number(self, "jitter_ms", f"[0, latency_ms = {self.latency_ms}]",
                     lambda v: 0 <= v <= self.latency_ms)
        if self.bandwidth_kbps is None and self.latency_ms == 0:
            raise FieldError("Wan", "bandwidth_kbps", "a wan fault with no bandwidth limit and no "
                             "latency changes nothing", "set bandwidth_kbps and/or latency_ms")


DIRECTIONS = ("both", "upstream", "downstream")  # upstream = learner → syncer
STREAMS = ("upstream", "downstream")  # Toxiproxy's streams of a link
_STREAMS_OF = {"both": STREAMS, "upstream": ("upstream",), "downstream": ("downstream",)}


@dataclass(frozen=True)
class Partition(_Fault):
    """The link drops all traffic in `direction` for `duration_s` (Toxiproxy `timeout`)."""

    kind: ClassVar[str] = "partition"
    role: ClassVar[str] = "link"
    mechanism: ClassVar[str] = "Toxiproxy timeout toxic (black hole)"
    cuts_link: ClassVar[bool] = True
    link_state: ClassVar[str] = "partitioned"
    duration_s: float
    direction: str = "both"

    def _check(self) -> None:
        super()._check()
        check_choice(self, "direction", DIRECTIONS)

    def toxics(self):
        # a timeout toxic with timeout 0 holds every byte forever: a black hole, as
        # a partition looks to TCP (no reset, no refusal)
        return [("timeout", _STREAMS_OF[self.direction], {"timeout": 0})]


@dataclass(frozen=True)
class Reset(_Fault):
    """Connections on the link are reset (Toxiproxy `reset_peer`) during `duration_s`."""

    kind: ClassVar[str] = "reset"
    role: ClassVar[str] = "link"
    mechanism: ClassVar[str] = "Toxiproxy reset_peer toxic"
    cuts_link: ClassVar[bool] = True
    link_state: ClassVar[str] = "reset"
    duration_s: float

    def toxics(self):
        return [("reset_peer", STREAMS, {"timeout": 0})]


@dataclass(frozen=True)
class Truncate(_Fault):
    """Each connection on the link is closed after `bytes` bytes (Toxiproxy
    `limit_data`) during `duration_s`: a message is cut mid-stream."""

    kind: ClassVar[str] = "truncate"
    role: ClassVar[str] = "link"
    mechanism: ClassVar[str] = "Toxiproxy limit_data toxic"
    cuts_link: ClassVar[bool] = True
    link_state: ClassVar[str] = "truncated"
    duration_s: float
    bytes: int

    def _check(self) -> None:
        super()._check()
        check_number(self, "bytes", ">= 1 byte", lambda v: v >= 1, integer=True)

    def toxics(self):
        return [("limit_data", ("downstream", "upstream"), {"bytes": self.bytes})]


@dataclass(frozen=True)
class LatencySpike(_Fault):
    """For `duration_s` every frame on the link waits `latency_ms` (± `jitter_ms`) more in
    each direction, on top of the scenario's base WAN profile (a route change, a congested
    hop): a Toxiproxy `latency` toxic added beside the base profile's, where a `wan` fault
    replaces the profile. The worked example of docs/ARCHITECTURE.md "Adding a fault kind"."""

    kind: ClassVar[str] = "latency_spike"
    role: ClassVar[str] = "link"
    mechanism: ClassVar[str] = "Toxiproxy latency toxic, added to the base profile"
    link_state: ClassVar[str] = "slow"
    duration_s: float
    latency_ms: float = 250.0
    jitter_ms: float = 0.0

    def _check(self) -> None:
        super()._check()
        check_number(self, "latency_ms", "(0, 60000] ms", lambda v: 0 < v <= 60_000)
        check_number(self, "jitter_ms", f"[0, latency_ms = {self.latency_ms}]", lambda v: 0 <= v <= self.latency_ms)

    def toxics(self):
        return [("latency", STREAMS, {"latency": round(self.latency_ms), "jitter": round(self.jitter_ms)})]


@dataclass(frozen=True)
class Corrupt(_Fault):
    """Silent data corruption: for `duration_s` the unit's outgoing contributions are wrong,
    not absent (trainer/sdc.py): `mode` scale (× `factor`), bitflip (`flips` exponent
    bits) or nonfinite (a NaN / inf per tensor)."""

    kind: ClassVar[str] = "corrupt"
    duration_s: float
    mode: str = "scale"
    factor: float = 1000.0
    flips: int = 8

    def _check(self) -> None:
        super()._check()
        if self.mode not in CORRUPT_MODES:
            raise FieldError(type(self).__name__, "mode", f"unknown corrupt mode {self.mode!r}",
                             ", ".join(CORRUPT_MODES))
        check_number(self, "factor", "a finite number other than 1", lambda v: math.isfinite(v) and v != 1)
        check_number(self, "flips", ">= 1", lambda v: v >= 1, integer=True)


CORRUPT_MODES = ("scale", "bitflip", "nonfinite")  # trainer/sdc.py MODES
Fault = _Fault  # any of FAULT_KINDS


def fault_from_dict(d: Mapping[str, Any]) -> Fault:
    """Inverse of `Fault.to_dict()`: field names with their units, values in those units."""
    if not isinstance(d, Mapping) or "kind" not in d:
        raise ValueError(f"a fault dict needs a 'kind'; got {d!r}")
    cls = FAULT_KINDS.get(d["kind"])
    if cls is None:
        raise FieldError("fault", "kind", f"unknown fault kind {d['kind']!r}{suggest(str(d['kind']), FAULT_KINDS)}",
                         ", ".join(FAULT_KINDS))
    names = [f.name for f in dataclasses.fields(cls)]
    for key in d:
        if key != "kind" and key not in names:
            raise FieldError(cls.__name__, key, f"unknown field{suggest(key, names)}", ", ".join(names))
    return cls(**{k: v for k, v in d.items() if k != "kind"})

