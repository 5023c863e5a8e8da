"""What every fault kind is: the `Fault` base class and its registry, `FAULT_KINDS`.

A fault kind is one module of faults/kinds/ holding one frozen dataclass that says,
in one place, everything the kind means (docs/ARCHITECTURE.md "Adding a fault kind"):

- its fields, with units in their names, validated on construction with a `FieldError`
  naming the field and what would be valid (faults/fields.py); times are seconds from
  the run's start;
- what it targets (`roles`: learner units, syncer shards, links, or more than one of
  them; `role_of(target)` says which a given target names), how long it lasts
  (`length_field`) and, in words, how it is done (`mechanism`, where a host's own table
  does not say);
- how it is done (`start` / `heal`, through the `Nemesis` the injector hands it: the
  hosts' `Control` and a few shared moves; a link kind made of Toxiproxy toxics only
  declares `toxics()`);
- how the strategies draw it (`draw`, `fits`; whether they draw it unasked,
  `drawn_by_default`, and where among the kinds, `severity`), what it costs the fleet
  (`learner_seconds`; at the paper's scale, `fleet_ddl` / `fleet_dp`), which kinds it may not overlap with on one unit (`conflicts`),
  whether its heal starts a new process (`restarts`: the run keeps warm spares for its
  role), whether its target is down while it lasts (`downs_target`), its colour on the report's timeline (`colour`), and its reference line (the
  class docstring's first sentence).

Defining the class registers it in FAULT_KINDS, which the scenario reader, the schedule
checks, the strategies, the injector, the checks and the report all read.

Targets: `learner-N` (a learner unit), `syncer-N` (a syncer shard), or a link spec:
`link:learner-N` (every link of that learner), `link:learner-N~syncer-M` (one link),
`link:*` (every link). Whether a target exists in a given run is checked by
`faults.schedule`, which knows the run's shape; this module checks only the form.
"""
from __future__ import annotations

import dataclasses
import re
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any, ClassVar, Mapping, Protocol

from diloco_chaos.faults.fields import FieldError, check_number, suggest
from diloco_chaos.faults.overlaps import LinkTarget

if TYPE_CHECKING:
    from diloco_chaos.faults.schedule import RunShape

_N = r"(?:0|[1-9][0-9]*)"
TARGET_FORMS = {  # what a fault's target must look like, by the role it hits
    "learner": (re.compile(f"learner-{_N}"), "learner-N"),
    "syncer": (re.compile(f"syncer-{_N}"), "syncer-N"),
    "link": (re.compile(rf"link:(\*|learner-{_N}(~syncer-{_N})?)"),
             "link:learner-N, link:learner-N~syncer-M, link:*"),
}
ROLES = tuple(TARGET_FORMS)


def role_of(target: str) -> str | None:
    """The role a target names (`learner`, `syncer`, `link`), None if it has no form of one."""
    return next((role for role, (pattern, _) in TARGET_FORMS.items() if pattern.fullmatch(target)), None)


POSITIVE_S = "> 0 seconds"
# `never` / `end` name None in scenario files (metadata read by harness/scenarios/scenario.py).
NEVER = {"none_word": "never"}
STREAMS = ("upstream", "downstream")  # Toxiproxy's streams of a link (upstream = learner → syncer)

FAULT_KINDS: dict[str, type] = {}  # kind -> its class, in the order faults/kinds/__init__.py imports them


class _OneRole:
    """`role`, for readers written when a kind had one: a fault's is the role its target names;
    a kind's is its only one (a kind of several roles has none: read `roles`)."""

    def __get__(self, fault, kind):
        if fault is not None:
            return role_of(fault.target)
        if len(kind.roles) != 1:
            raise AttributeError(f"fault kind {kind.kind!r} targets {', '.join(kind.roles)}: read its `roles`")
        return kind.roles[0]


class Nemesis(Protocol):
    """What a fault kind's `start` / `heal` may use (harness/run/injector.py provides it):
    `control`, the hosts' `Control` (running, kill, spawn, pause, resume, set_speed,
    set_live_slices, set_fault / clear_fault, the links' `client`, the base `wan` profile); the run's
    `shape`; whether a dead learner rolls every learner back (`dp_rollback`); and the
    moves every kind shares, each logged."""

    control: Any
    shape: "RunShape"
    dp_rollback: bool

    def emit(self, kind: str, src: str, **fields) -> None: ...   # a harness event
    def down(self, unit: str, reason: str, act=None) -> None: ...  # act(unit) (a kill); unit_down
    def up(self, unit: str) -> None: ...                        # a new process; unit_up
    def is_down(self, unit: str) -> bool: ...                   # taken down by the nemesis
    def links(self, f: "Fault") -> list[str]: ...               # the link names a link fault hits
    def add_toxics(self, n: int, f: "Fault") -> None: ...       # f.toxics() on each of its links, named f<n>_
    def remove_toxics(self, n: int, f: "Fault") -> None: ...    # fault n's toxics off its links
    def strip(self, link: str, prefix: str) -> None: ...        # every toxic named prefix* off the link
    def shape_link(self, link: str, prefix: str, **profile) -> None: ...  # a WAN profile's toxics
    def base_profile(self, link: str) -> None: ...              # the scenario's [wan] profile back


class FleetLedger(Protocol):
    """What a kind's fleet price may use (harness/fleet/scenario.py provides one per policy):
    the rules' figures, in seconds of the job, and the charges each policy's accounting knows,
    each over [a, b). Decoupled DiLoCo's ledger is charged once per learner unit the fault
    reaches (`charge`, `lost`, `slices_away`); data-parallel's once per fault (`stall`, `slowed`)."""

    job_s: float      # the job's length: spans end there at the latest
    boot_s: float     # a replacement's boot to its first step (a warm spare's, else a cold start's)
    rejoin_s: float   # Decoupled DiLoCo: a restarted unit's first step to its first merged contribution
    detect_s: float   # data-parallel: a death to its notice
    horizon_s: float  # Decoupled DiLoCo: how long a cut unit's kept progress stays within max_staleness

    def charge(self, bucket: str, a: float, b: float) -> None: ...  # the unit `dead`, `recovery` or `paused`
    def lost(self, a: float, b: float, target: str) -> None: ...  # its steps reach no merge (behind `target`)
    def slices_away(self, a: float, b: float, slices: int) -> None: ...  # chip time away, not learner time
    def stall(self, a: float, b: float, restart: bool = False) -> None: ...  # every replica waits (and rolls back)
    def slowed(self, a: float, b: float, speed: float) -> None: ...  # every replica held to one's speed


@dataclass(frozen=True)
class Fault:
    """Common fields: `target` and `at_s` (seconds from the run's start)."""

    kind: ClassVar[str] = ""
    roles: ClassVar[tuple[str, ...]] = ("learner",)  # the TARGET_FORMS its target may match
    role = _OneRole()
    length_field: ClassVar[str] = "duration_s"  # the field that says how long it lasts
    # how it is done, in words, where a host's own table does not say (a fault_start's `via`)
    mechanism: ClassVar[str] = ""
    # link faults: whether a learner behind it cannot reach its shard (the reachability
    # the liveness checks allow for), and the link's state on the report's timeline
    cuts_link: ClassVar[bool] = False
    link_state: ClassVar[str] = ""
    colour: ClassVar[str] = "#cb181d"  # its marks on the report's timeline
    restarts: ClassVar[bool] = False  # its heal starts a new process (warm spares are kept for its role)
    # while it is active its target neither steps nor answers (killed, paused, preempted):
    # what the property suites' fault model reads to find a job-wide outage
    downs_target: ClassVar[bool] = False
    # how the strategies sample it (faults/strategies.py): unasked, or only where a property
    # names it; and its place among the kinds, mildest first (Hypothesis shrinks a sampled
    # kind toward the front; None: after the ranked ones, in the registry's order)
    drawn_by_default: ClassVar[bool] = True
    severity: ClassVar[int | None] = None
    # unit faults: the kinds it may not be active with on the same unit, and why (looked
    # up both ways: a pair is declared by either kind; faults/overlaps.py `conflict`)
    conflicts: ClassVar[dict[str, str]] = {}

    target: str
    at_s: float

    def __init_subclass__(cls, **kw):
        super().__init_subclass__(**kw)
        if isinstance(cls.__dict__.get("role"), str):  # a kind that declares one role, as kinds once did
            cls.roles = (cls.__dict__["role"],)
            del cls.role
        unknown = [r for r in cls.roles if r not in TARGET_FORMS]
        if unknown or not cls.roles:
            raise ValueError(f"{cls.__name__}.roles = {cls.roles!r}; valid: one or more of {', '.join(ROLES)}")
        if "kind" in cls.__dict__:
            FAULT_KINDS[cls.kind] = cls

    def __post_init__(self) -> None:
        if not isinstance(self.target, str) or role_of(self.target) not in self.roles:
            raise FieldError(type(self).__name__, "target", f"{self.kind} cannot target {self.target!r}",
                             self.target_forms())
        check_number(self, "at_s", ">= 0 seconds", lambda v: v >= 0)
        self._check()

    def _check(self) -> None:
        check_number(self, "duration_s", POSITIVE_S, lambda v: v > 0)

    @classmethod
    def target_forms(cls) -> str:
        """The forms its target may take, as a user reads them (`learner-N`, ...)."""
        return ", ".join(TARGET_FORMS[role][1] for role in cls.roles)

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

    # --- how it is done -------------------------------------------------------------------
    def toxics(self) -> list[tuple[str, tuple[str, ...], dict]]:
        """A link fault done by Toxiproxy toxics on each of its links, added at its start
        and removed at its end: [(toxic type, streams, attributes)]. Every host applies
        these the same way; the simulator's links model each toxic type (harness/sim/net.py)."""
        return []

    def start(self, nemesis: Nemesis, n: int) -> None:
        """Fault number `n` begins (default: its toxics on each of its links)."""
        if not self.toxics():
            raise ValueError(f"fault kind {self.kind!r} has no toxics and no start of its own")
        nemesis.add_toxics(n, self)

    def heal(self, nemesis: Nemesis, n: int, final: bool) -> None:
        """Fault number `n` ends; `final`: at the run's teardown (nothing is restarted then)."""
        nemesis.remove_toxics(n, self)

    # --- how strategies draw it ---------------------------------------------------------------
    @classmethod
    def fits(cls, shape: "RunShape") -> bool:
        """Whether a run of this shape can have it at all."""
        return True

    @classmethod
    def draw(cls, draw, shape: "RunShape", target: str, at: float, length: float, *, never: bool = False) -> "Fault":
        """One fault of this kind at `target`, `at`, lasting `length` (Hypothesis `draw` for
        its own fields; each shrinks toward its mildest value). Default: the fields' defaults."""
        return cls(target, at, **{cls.length_field: length})

    # --- what it costs ---------------------------------------------------------------------
    def learner_seconds(self, span: float, shape: "RunShape") -> float:
        """The learner time it takes away over `span` seconds of it (faults/strategies.py
        `unit_seconds`): a unit fault its unit's, a syncer fault every learner's, a link
        fault every learner it cuts off."""
        role = role_of(self.target)
        if role == "syncer":
            return span * shape.learners
        if role == "link":
            return span * (shape.learners if LinkTarget.parse(self.target).every else 1)
        return span


    # --- what the fleet model prices it at (harness/fleet/scenario.py) ------------------------
    def fleet_ddl(self, fleet: FleetLedger, at: float, end: float) -> None:
        """Its charges to one learner unit it reaches under Decoupled DiLoCo, active over [at,
        end) of the job. Default: a cut link (`cuts_link`) longer than the staleness horizon
        loses the unit's progress behind it (a shorter one's kept progress is merged when the
        link returns); else nothing: no learner waits for a shard, and a thin link's progress
        waits in the outbox."""
        if self.cuts_link and end - at > fleet.horizon_s:
            fleet.lost(at, end, self.target)

    def fleet_dp(self, fleet: FleetLedger, at: float, end: float) -> None:
        """Its charges to data-parallel without elasticity, where it reaches a learner: one
        replica's stop stops all. Default: a cut link stalls every replica while it lasts (the
        all-reduce cannot complete); else nothing."""
        if self.cuts_link:
            fleet.stall(at, end)


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
