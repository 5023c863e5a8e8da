"""The fault model: what goes wrong, where and when, as data (the injector applies it).

One small frozen dataclass per fault kind, in the style of Toxiproxy's toxics: units
in the field names, validated on construction with a `FieldError` (a ValueError)
naming the field and what would be valid. Times are seconds from the run's start.

Targets: `learner-N` (a learner unit), `syncer-N` (a syncer shard), or a link spec:
`link:learner-N` (every link of that learner), `link:learner-N~syncer-M` (one link),
`link:*` (every link). Whether a target exists in a given run is checked by
`faults.schedule`, which knows the run's shape; this module checks only the form.

`conflict(a, b)` is the one table of which faults may not overlap in time on the same
target (a dead unit cannot be killed again, paused or slowed). `FailureProcess` draws
random interruptions from a rate, seeded, into explicit faults before the run, so a
run with random failures is replayed exactly by its seed.
"""
from __future__ import annotations

import dataclasses
import difflib
import math
import re
from dataclasses import dataclass, field
from typing import Any, ClassVar, Mapping, NamedTuple, Sequence, Union

import numpy as np


class FieldError(ValueError):
    """A bad value in one field: says which, what was wrong and what would be valid."""

    def __init__(self, owner: str, field: str, problem: str, valid: str = ""):
        self.owner, self.field, self.problem, self.valid = owner, field, problem, valid
        super().__init__(f"{owner}.{field}: {problem}" + (f"; valid: {valid}" if valid else ""))


def suggest(word: str, choices: Sequence[str]) -> str:
    """' (did you mean 'x'?)' for the closest choice, or ''."""
    close = difflib.get_close_matches(word, list(choices), n=1, cutoff=0.6)
    return f" (did you mean {close[0]!r}?)" if close else ""


def check_number(obj: Any, name: str, valid: str, ok, *, optional: bool = False,
                 integer: bool = False) -> None:
    """Type- and range-check `obj.name`; floats are stored as float (1 and 1.0 alike)."""
    value = getattr(obj, name)
    if value is None and optional:
        return
    owner = type(obj).__name__
    if isinstance(value, bool) or not isinstance(value, int if integer else (int, float)):
        what = "a whole number" if integer else "a number"
        raise FieldError(owner, name, f"expected {what}, got {value!r}", valid)
    if not (math.isfinite(value) and ok(value)):
        raise FieldError(owner, name, f"{value!r} is out of range", valid)
    if not integer:
        object.__setattr__(obj, name, float(value))


def check_choice(obj: Any, name: str, choices: Sequence[str]) -> None:
    value = getattr(obj, name)
    if value not in choices:
        raise FieldError(type(obj).__name__, name,
                         f"{value!r} is not one of the choices{suggest(str(value), choices)}",
                         ", ".join(choices))


_N = r"(?:0|[1-9][0-9]*)"
TARGET_FORMS = {  # what a fault's target must look like, by the role it hits
    "learner": (re.compile(f"learner-{_N}"), "learner-N"),
    "syncer": (re.compile(f"syncer-{_N}"), "syncer-N"),
    "link": (re.compile(rf"link:(\*|learner-{_N}(~syncer-{_N})?)"),
             "link:learner-N, link:learner-N~syncer-M, link:*"),
}
_POSITIVE_S = "> 0 seconds"


@dataclass(frozen=True)
class _Fault:
    """Common fields: `target` and `at_s` (seconds from the run's start)."""

    kind: ClassVar[str] = ""
    role: ClassVar[str] = "learner"  # which TARGET_FORMS the target must match
    length_field: ClassVar[str] = "duration_s"  # the field that says how long it lasts

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


# `never` / `end` name None in scenario files (metadata read by harness/scenario.py).
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


@dataclass(frozen=True)
class Partition(_Fault):
    """The link drops all traffic in `direction` for `duration_s` (Toxiproxy `timeout`)."""

    kind: ClassVar[str] = "partition"
    role: ClassVar[str] = "link"
    duration_s: float
    direction: str = "both"

    def _check(self) -> None:
        super()._check()
        check_choice(self, "direction", DIRECTIONS)


@dataclass(frozen=True)
class Reset(_Fault):
    """Connections on the link are reset (Toxiproxy `reset_peer`) during `duration_s`."""

    kind: ClassVar[str] = "reset"
    role: ClassVar[str] = "link"
    duration_s: float


@dataclass(frozen=True)
class Truncate(_Fault):
    """Each connection on the link is closed after `bytes` bytes (Toxiproxy
    `limit_data`) during `duration_s`: a message is cut mid-stream."""

    kind: ClassVar[str] = "truncate"
    role: ClassVar[str] = "link"
    duration_s: float
    bytes: int

    def _check(self) -> None:
        super()._check()
        check_number(self, "bytes", ">= 1 byte", lambda v: v >= 1, integer=True)


Fault = Union[KillUnit, KillSlice, PauseUnit, SlowUnit, KillSyncer, Wan, Partition, Reset, Truncate]
FAULT_KINDS: dict[str, type] = {c.kind: c for c in (KillUnit, KillSlice, PauseUnit, SlowUnit, KillSyncer,
                                                    Wan, Partition, Reset, Truncate)}


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


# --------------------------------------------------------------- overlaps
def _unit_of(f: Fault) -> str:
    """The learner or syncer a fault acts on; for links, the spec after 'link:'."""
    return f.target[5:] if f.role == "link" else f.target


def links_intersect(a: str, b: str) -> bool:
    """Do two link specs ('link:*', 'link:learner-N', 'link:learner-N~syncer-M') share a link?"""
    a, b = a[5:], b[5:]
    if "*" in (a, b) or a == b:
        return True
    return a.split("~")[0] == b.split("~")[0] and ("~" not in a or "~" not in b)


# Pairs of process faults on one unit that cannot be active at once, and why (the
# table schedules are checked against). Pairs not listed may overlap; kill_slice with
# kill_slice may, up to the unit's slice count (checked with the run's shape).
UNIT_CONFLICTS: dict[frozenset, str] = {
    frozenset({"kill_unit"}): "the unit is already down",
    frozenset({"kill_unit", "pause_unit"}): "a unit cannot be paused while it is down "
                                            "(the pause's SIGCONT would hit its restarted process)",
    frozenset({"kill_unit", "slow_unit"}): "a unit cannot be slowed while it is down "
                                           "(the duty cycle signals its process)",
    frozenset({"kill_unit", "kill_slice"}): "a unit that is down has no slices to lose",
    frozenset({"pause_unit"}): "the unit is already paused",
    frozenset({"pause_unit", "slow_unit"}): "pause and slow both drive SIGSTOP/SIGCONT on one process",
    frozenset({"slow_unit"}): "the unit is already slowed",
    frozenset({"kill_syncer"}): "the shard is already down",
}


def overlap_in_time(a: Fault, b: Fault) -> bool:
    """Half-open intervals [at, end): a fault may start exactly when another ends."""
    a_end = math.inf if a.end_s is None else a.end_s
    b_end = math.inf if b.end_s is None else b.end_s
    return a.at_s < b_end and b.at_s < a_end


def conflict(a: Fault, b: Fault) -> str | None:
    """Why `a` and `b` cannot both be active, or None if they can (shape-free part)."""
    if not overlap_in_time(a, b):
        return None
    if a.role == "link" and b.role == "link":
        if a.kind == b.kind and links_intersect(a.target, b.target):
            return f"two {a.kind} faults on one link at once (the second would replace the first's toxic)"
        return None
    if a.role == b.role and _unit_of(a) == _unit_of(b):
        return UNIT_CONFLICTS.get(frozenset({a.kind, b.kind}))
    return None


# --------------------------------------------------------------- failure process
class Cause(NamedTuple):
    """An interruption cause and the fault it becomes. `repair_x` scales the process's
    `repair_s` into the fault's length; `speed` is for slow_unit."""

    kind: str
    repair_x: float = 1.0
    speed: float = 0.5
    note: str = ""


_HW = "a chip or its host fails: its slice is lost until repaired (the whole unit when S = 1)"
CAUSES: dict[str, Cause] = {
    # Llama 3 causes (Dubey et al. 2024, table 5), each mapped to one fault kind.
    "faulty_gpu": Cause("kill_slice", note=_HW),
    "hbm3": Cause("kill_slice", note=_HW),
    "software_bug": Cause("kill_unit", 0.25, note="the process crashes and is restarted"),
    "network": Cause("partition", note="switch or cable: the unit's links drop until repaired"),
    "host_maintenance": Cause("kill_unit", 3.0, note="host drained for maintenance: long down time"),
    "gpu_sram": Cause("kill_slice", note=_HW),
    "gpu_system_processor": Cause("kill_slice", note=_HW),
    "nic": Cause("partition", note="the unit's links drop until the NIC is replaced"),
    "nccl_watchdog": Cause("kill_unit", 0.25, note="a collective hangs, the watchdog kills the job: restart"),
    "silent_data_corruption": Cause("kill_unit", note="detected, the unit restarts from its checkpoint"),
    "thermal": Cause("slow_unit", speed=0.5, note="thermal throttling: half speed"),
    "ssd": Cause("kill_slice", note=_HW),
    "psu": Cause("kill_slice", note=_HW),
    # Plain kinds, for mixes written as kind -> weight.
    "kill_unit": Cause("kill_unit"), "kill_slice": Cause("kill_slice"), "pause_unit": Cause("pause_unit"),
    "slow_unit": Cause("slow_unit"), "partition": Cause("partition"), "reset": Cause("reset"),
}
# Interruption counts over 54 days on 16,384 H100s (419 in all; the 10 in causes
# with 2 each are left out, so the mix is over 409).
LLAMA3_COUNTS: dict[str, int] = {
    "faulty_gpu": 148, "hbm3": 72, "software_bug": 54, "network": 35, "host_maintenance": 32,
    "gpu_sram": 19, "gpu_system_processor": 17, "nic": 7, "nccl_watchdog": 7,
    "silent_data_corruption": 6, "thermal": 6, "ssd": 3, "psu": 3,
}
NAMED_MIXES: dict[str, dict[str, int]] = {"llama3": LLAMA3_COUNTS}


class Interruption(NamedTuple):
    t_s: float
    unit: str
    cause: str


@dataclass(frozen=True)
class FailureProcess:
    """Random interruptions: a Poisson process at `1 / mtbi_s` per chip, each hitting a
    uniformly chosen unit and mapped to a fault through `mix` (cause or kind -> weight,
    or a named mix such as "llama3"). Drawn once, before the run, from `seed`."""

    mtbi_s: float  # mean time between interruptions of one chip
    chips_per_unit: int
    repair_s: float  # a fault's length before the cause's repair_x
    mix: str | tuple[tuple[str, float], ...] = "llama3"
    seed: int = 0
    start_s: float = 0.0  # no interruptions before this (startup is not what we test)

    def __post_init__(self) -> None:
        check_number(self, "mtbi_s", _POSITIVE_S, lambda v: v > 0)
        check_number(self, "chips_per_unit", ">= 1", lambda v: v >= 1, integer=True)
        check_number(self, "repair_s", _POSITIVE_S, lambda v: v > 0)
        check_number(self, "seed", "[0, 2**63)", lambda v: 0 <= v < 2**63, integer=True)
        check_number(self, "start_s", ">= 0 seconds", lambda v: v >= 0)
        valid = f"a named mix ({', '.join(NAMED_MIXES)}) or a table of cause or kind -> weight"
        if isinstance(self.mix, str):
            if self.mix not in NAMED_MIXES:
                raise FieldError("FailureProcess", "mix", f"unknown mix {self.mix!r}{suggest(self.mix, NAMED_MIXES)}",
                                 valid)
            return
        items = list(self.mix.items() if isinstance(self.mix, Mapping) else self.mix)
        for name, weight in items:
            if name not in CAUSES:
                raise FieldError("FailureProcess", "mix", f"unknown cause or kind {name!r}{suggest(name, CAUSES)}",
                                 ", ".join(CAUSES))
            if isinstance(weight, bool) or not isinstance(weight, (int, float)) or not 0 <= weight < math.inf:
                raise FieldError("FailureProcess", "mix", f"weight of {name!r} is {weight!r}", "a number >= 0")
        if not items or sum(w for _, w in items) <= 0:
            raise FieldError("FailureProcess", "mix", "the weights sum to 0", valid)
        object.__setattr__(self, "mix", tuple(sorted((n, float(w)) for n, w in items)))

    def weights(self) -> dict[str, float]:
        """cause -> probability (sums to 1)."""
        raw = NAMED_MIXES[self.mix] if isinstance(self.mix, str) else dict(self.mix)
        total = sum(raw.values())
        return {name: w / total for name, w in raw.items()}

    def to_dict(self) -> dict[str, Any]:
        d = dataclasses.asdict(self)
        d["mix"] = self.mix if isinstance(self.mix, str) else dict(self.mix)
        return d

    def interruptions(self, units: Sequence[str], run_s: float) -> list[Interruption]:
        """Every interruption in [start_s, run_s), before conflicts are resolved.
        Drawn one at a time, so a longer run extends a shorter one's list."""
        rng = np.random.default_rng(self.seed)
        names, p = zip(*self.weights().items())
        cum_p = np.cumsum(p)
        rate_per_s = len(units) * self.chips_per_unit / self.mtbi_s
        out, t = [], self.start_s
        while units:
            t += rng.exponential(1.0 / rate_per_s)
            unit = units[int(rng.integers(len(units)))]
            cause = names[min(int(np.searchsorted(cum_p, rng.random(), side="right")), len(names) - 1)]
            t_s = round(float(t), 3)  # whole ms: finer than an injector can act
            if t_s >= run_s:
                return out
            out.append(Interruption(t_s, unit, cause))
        return out

    def draw(self, units: Sequence[str], run_s: float, *, slices: int = 1,
             avoid: Sequence[Fault] = ()) -> list[Fault]:
        """The interruptions as faults. One that would overlap a fault in `avoid` or an
        earlier drawn one impossibly (see `conflict`) is dropped: a unit that is down
        has no running chips to fail. Hardware causes lose one slice when the unit
        has `slices` >= 2, else the whole unit."""
        taken: list[Fault] = list(avoid)
        out: list[Fault] = []
        for t_s, unit, cause_name in self.interruptions(units, run_s):
            fault = self._fault(t_s, unit, CAUSES[cause_name], slices)
            if any(conflict(fault, other) or (fault.kind == other.kind == "kill_slice" and fault.target == other.target
                                              and overlap_in_time(fault, other)) for other in taken):
                continue
            taken.append(fault)
            out.append(fault)
        return out

    def _fault(self, t_s: float, unit: str, cause: Cause, slices: int) -> Fault:
        length_s = self.repair_s * cause.repair_x
        if cause.kind == "kill_slice" and slices >= 2:
            return KillSlice(unit, t_s, duration_s=length_s)
        if cause.kind in ("kill_slice", "kill_unit"):
            return KillUnit(unit, t_s, down_for_s=length_s)
        if cause.kind == "pause_unit":
            return PauseUnit(unit, t_s, duration_s=length_s)
        if cause.kind == "slow_unit":
            return SlowUnit(unit, t_s, duration_s=length_s, speed=cause.speed)
        if cause.kind == "partition":
            return Partition(f"link:{unit}", t_s, duration_s=length_s)
        return Reset(f"link:{unit}", t_s, duration_s=length_s)
