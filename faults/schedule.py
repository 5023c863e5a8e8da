"""Schedules: a run's faults in time order, checked against the run's shape.

`Schedule` is pure data (Jepsen's generator side): which faults, when. An injector
walks `timeline()`, a list of (t_s, "start" | "end", fault) in time order, and
applies each event; ends come before starts at the same instant, so a fault may
start exactly when another on the same target ends. A fault that has not ended
by the end of the run (or never ends) is healed by the injector's teardown.

`validate(faults, shape)` says what is impossible about a list of faults in a run
of a given shape: targets that do not exist, times outside the run, kills of a unit
that is already down, more slices lost than the unit has, and the rest of the
overlap table in `faults.overlaps.conflict`. Errors are `ScheduleError`s naming the
fault's index in the list as given, the field, and what would be valid.
"""
from __future__ import annotations

import math
from dataclasses import dataclass
from typing import Iterable, Iterator, Sequence

from diloco_chaos.faults.fields import check_number
from diloco_chaos.faults.overlaps import LinkTarget, conflict
from diloco_chaos.faults.kinds import FAULT_KINDS, Fault, fault_from_dict
from diloco_chaos.faults.kinds.base import role_of


@dataclass(frozen=True)
class RunShape:
    """What faults can hit: `learners` units of `slices` slices, `shards` syncer shards,
    one link per (learner, shard); and how long the run is (`run_s`)."""

    learners: int
    run_s: float
    slices: int = 1
    shards: int = 1

    def __post_init__(self) -> None:
        check_number(self, "learners", ">= 1", lambda v: v >= 1, integer=True)
        check_number(self, "run_s", "> 0 seconds", lambda v: v > 0)
        check_number(self, "slices", ">= 1", lambda v: v >= 1, integer=True)
        check_number(self, "shards", ">= 1", lambda v: v >= 1, integer=True)

    @property
    def units(self) -> list[str]:
        return [f"learner-{i}" for i in range(self.learners)]

    @property
    def syncers(self) -> list[str]:
        return [f"syncer-{j}" for j in range(self.shards)]

    def targets(self, roles: Iterable[str]) -> list[str]:
        """The targets of this run a fault of `roles` may name, each once, in the order the
        strategies draw from (faults/strategies.py): the units, the shards, then the link
        specs ('link:*', each learner's links, and each single link where a learner has more
        than one: with one shard, 'link:learner-N~syncer-0' names what 'link:learner-N' does)."""
        out: list[str] = []
        for role in roles:
            if role == "learner":
                out += self.units
            elif role == "syncer":
                out += self.syncers
            else:
                out += ["link:*"] + [f"link:{u}" for u in self.units]
                if self.shards > 1:
                    out += [f"link:{u}~{s}" for u in self.units for s in self.syncers]
        return out

    def has_target(self, target: str) -> bool:
        """Whether `target` (of any role's form) names something in this run."""
        role = role_of(target)
        if role == "link":
            return LinkTarget.parse(target).exists(self.units, self.syncers)
        return role is not None and target in self.targets((role,))

    def valid_targets(self, roles: str | Iterable[str]) -> str:
        """The targets of this run a fault of `roles` may name, as a user reads them."""
        return "; ".join(self._valid_targets(role) for role in ((roles,) if isinstance(roles, str) else roles))

    def _valid_targets(self, role: str) -> str:
        if role == "learner":
            return _span("learner", self.learners)
        if role == "syncer":
            return _span("syncer", self.shards)
        return (f"link:learner-N, link:learner-N~syncer-M, link:* "
                f"(N in 0..{self.learners - 1}, M in 0..{self.shards - 1})")


def _span(prefix: str, n: int) -> str:
    return f"{prefix}-0" if n == 1 else f"{prefix}-0..{prefix}-{n - 1}"


def expand_links(target: str, shape: RunShape) -> list[str]:
    """A link spec as the link names the cluster uses ('learner-N~syncer-M')."""
    return LinkTarget.parse(target).links(shape.units, shape.syncers)


class ScheduleError(ValueError):
    """An impossible fault: `index` in the list as given, `field`, problem, valid."""

    def __init__(self, index: int, fault: Fault, field: str, problem: str, valid: str = ""):
        self.index, self.fault, self.field, self.problem, self.valid = index, fault, field, problem, valid
        super().__init__(f"fault {index} ({fault.kind} of {fault.target}) {field}: {problem}"
                         + (f"; valid: {valid}" if valid else ""))


def _when(f: Fault) -> str:
    end = "the end" if f.end_s is None else f"{f.end_s:g}s"
    return f"{f.at_s:g}s–{end}"


def validate(faults: Sequence[Fault], shape: RunShape, name=lambda i: f"fault {i}") -> None:
    """Raises ScheduleError for the first impossible fault (in the order given).
    `name(i)` is how messages refer to another fault (a scenario says 'faults[3]')."""
    for i, f in enumerate(faults):
        if not shape.has_target(f.target):
            raise ScheduleError(i, f, "target", f"unknown target {f.target!r} in a run with "
                                f"{shape.learners} learners and {shape.shards} syncer shard(s)",
                                shape.valid_targets(f.roles))
        if f.at_s >= shape.run_s:
            raise ScheduleError(i, f, "at_s", f"{f.at_s:g}s is at or past the end of the run "
                                f"({shape.run_s:g}s)", f"[0, {shape.run_s:g}) seconds")
        if f.kind == "kill_slice" and shape.slices < 2:
            raise ScheduleError(i, f, "target", f"{f.target} has 1 slice: it cannot lose one and go on",
                                "kill_unit to lose the whole unit, or cluster.slices >= 2")
        if f.kind == "kill_slice" and f.slices >= shape.slices:
            raise ScheduleError(i, f, "slices", f"{f.slices} of {shape.slices} slices: the unit would "
                                "have none left", f"1..{shape.slices - 1} (kill_unit to lose them all)")
    # The later of two clashing faults is the one reported: it is the one to move.
    order = sorted(range(len(faults)), key=lambda i: (faults[i].at_s, i))
    for pos, i in enumerate(order):
        for j in order[:pos]:
            why = conflict(faults[i], faults[j])
            if why:
                g = faults[j]
                fix = (f"give {name(j)} an end at or before {faults[i].at_s:g}s" if g.end_s is None
                       else f"start it at or after {g.end_s:g}s, when {name(j)} ends")
                raise ScheduleError(i, faults[i], "at_s", f"overlaps {name(j)} ({g.kind} of {g.target}, "
                                    f"{_when(g)}): {why}", fix)
        _check_slices_left(i, faults[i], faults, order[:pos], shape)


def _check_slices_left(i: int, f: Fault, faults: Sequence[Fault], earlier: Iterable[int],
                       shape: RunShape) -> None:
    if f.kind != "kill_slice":
        return
    # Slices down peak at some fault's start, so checking at each start is enough.
    lost = f.slices + sum(g.slices for g in (faults[j] for j in earlier) if g.kind == "kill_slice"
                          and g.target == f.target and g.at_s <= f.at_s < g.end_s)
    if lost >= shape.slices:
        raise ScheduleError(i, f, "at_s", f"with the kill_slice faults already running at {f.at_s:g}s, "
                            f"{f.target} would lose {lost} of its {shape.slices} slices",
                            f"at most {shape.slices - 1} slices down at once (kill_unit to lose them all)")


def _sort_key(f: Fault) -> tuple:
    return (f.at_s, f.kind, f.target, math.inf if f.end_s is None else f.end_s)


@dataclass(frozen=True)
class Schedule:
    """A run's faults, sorted by start time (ties: kind, target, end)."""

    faults: tuple[Fault, ...] = ()

    def __post_init__(self) -> None:
        for f in self.faults:
            if type(f) not in FAULT_KINDS.values():
                raise ValueError(f"Schedule.faults: {f!r} is not a fault; valid: "
                                 + ", ".join(c.__name__ for c in FAULT_KINDS.values()))
        object.__setattr__(self, "faults", tuple(sorted(self.faults, key=_sort_key)))

    def __iter__(self) -> Iterator[Fault]:
        return iter(self.faults)

    def __len__(self) -> int:
        return len(self.faults)

    def validate(self, shape: RunShape) -> "Schedule":
        validate(self.faults, shape)
        return self

    def timeline(self) -> list[tuple[float, str, Fault]]:
        """(t_s, "start" | "end", fault) in time order; at one instant ends come first.
        Faults that never end (down_for None, a wan fault to the end) have no end."""
        events = []
        for n, f in enumerate(self.faults):
            events.append((f.at_s, 1, n, "start", f))
            if f.end_s is not None:
                events.append((f.end_s, 0, n, "end", f))
        return [(t, what, f) for t, _, _, what, f in sorted(events, key=lambda e: e[:3])]

    def to_dicts(self) -> list[dict]:
        return [f.to_dict() for f in self.faults]

    @classmethod
    def from_dicts(cls, dicts: Iterable[dict]) -> "Schedule":
        return cls(tuple(fault_from_dict(d) for d in dicts))
