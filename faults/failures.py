"""Random failures: a seeded Poisson process of interruptions, drawn into explicit
faults before the run (so a run with random failures replays exactly from its seed),
with causes weighted by published fleet data (the Llama 3 interruption counts)."""
from __future__ import annotations

import dataclasses
import math
from dataclasses import dataclass
from typing import Any, Mapping, NamedTuple, Sequence

import numpy as np

from diloco_chaos.faults.fields import FieldError, check_number, suggest
from diloco_chaos.faults.overlaps import conflict, overlap_in_time
from diloco_chaos.faults.kinds import Corrupt, Fault, KillSlice, KillUnit, POSITIVE_S, Partition, PauseUnit, Reset, SlowUnit


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
    "silent_data_corruption": Cause("corrupt", note="the unit computes wrong values until repaired: its "
                                               "contributions are corrupted (× 1000); the shard's guard must drop them"),
    "thermal": Cause("slow_unit", speed=0.5, note="thermal throttling: half speed"),
    "ssd": Cause("kill_slice", note=_HW),
    "psu": Cause("kill_slice", note=_HW),
    # The fleet model's failure (harness/fleet/model.py, docs/FLEET.md): priced by policy.
    "chip_failure": Cause("fleet", note="a chip fails: a DiLoCo learner pauses for `repair` (detect + drop the "
                                        "slice and reshard); data-parallel (mode dp) restarts every member, "
                                        "the dead one back after `restart`"),
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
NAMED_MIXES: dict[str, dict[str, int]] = {"llama3": LLAMA3_COUNTS, "fleet": {"chip_failure": 1}}


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
    # mode dp: how long a `chip_failure` keeps the job down (the fleet model's detect +
    # restart); DiLoCo modes pause the hit learner for `repair_s` instead
    restart_s: float | None = None

    def __post_init__(self) -> None:
        check_number(self, "mtbi_s", POSITIVE_S, lambda v: v > 0)
        check_number(self, "chips_per_unit", ">= 1", lambda v: v >= 1, integer=True)
        check_number(self, "repair_s", POSITIVE_S, lambda v: v > 0)
        check_number(self, "seed", "[0, 2**63)", lambda v: 0 <= v < 2**63, integer=True)
        check_number(self, "start_s", ">= 0 seconds", lambda v: v >= 0)
        check_number(self, "restart_s", POSITIVE_S, lambda v: v > 0, optional=True)
        valid = f"a named mix ({', '.join(NAMED_MIXES)}) or a table of cause or kind -> weight"
        if isinstance(self.mix, str):
            if self.mix not in NAMED_MIXES:
                raise FieldError("FailureProcess", "mix", f"unknown mix {self.mix!r}{suggest(self.mix, NAMED_MIXES)}",
                                 valid)
            self._check_restart()
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
        self._check_restart()

    def _check_restart(self) -> None:
        fleet = any(CAUSES[n].kind == "fleet" and w > 0 for n, w in self.weights().items())
        if fleet and self.restart_s is None:
            raise FieldError("FailureProcess", "restart_s", "a mix with chip_failure needs the data-parallel "
                             "restart time (the fleet model's detect + restart)", POSITIVE_S)

    def weights(self) -> dict[str, float]:
        """cause -> probability (sums to 1)."""
        raw = NAMED_MIXES[self.mix] if isinstance(self.mix, str) else dict(self.mix)
        total = sum(raw.values())
        return {name: w / total for name, w in raw.items()}

    def to_dict(self) -> dict[str, Any]:
        d = dataclasses.asdict(self)
        d["mix"] = self.mix if isinstance(self.mix, str) else dict(self.mix)
        if d["restart_s"] is None:  # unset: the key is absent from the file too
            del d["restart_s"]
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
             avoid: Sequence[Fault] = (), dp: bool = False) -> list[Fault]:
        """The interruptions as faults. One that would overlap a fault in `avoid` or an
        earlier drawn one impossibly (see `conflict`) is dropped: a unit that is down
        has no running chips to fail. Hardware causes lose one slice when the unit
        has `slices` >= 2, else the whole unit. `dp`: the run is data-parallel (mode
        dp), which prices a `chip_failure` as a restart, not a learner's pause; the
        interruptions themselves (times, units, causes) are the same draw."""
        taken: list[Fault] = list(avoid)
        out: list[Fault] = []
        for t_s, unit, cause_name in self.interruptions(units, run_s):
            fault = self._fault(t_s, unit, CAUSES[cause_name], slices, dp)
            if any(conflict(fault, other) or (fault.kind == other.kind == "kill_slice" and fault.target == other.target
                                              and overlap_in_time(fault, other)) for other in taken):
                continue
            taken.append(fault)
            out.append(fault)
        return out

    def _fault(self, t_s: float, unit: str, cause: Cause, slices: int, dp: bool = False) -> Fault:
        length_s = self.repair_s * cause.repair_x
        if cause.kind == "fleet":  # the injector takes every dp member down with the dead one
            return KillUnit(unit, t_s, down_for_s=self.restart_s) if dp else PauseUnit(unit, t_s, duration_s=length_s)
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
        if cause.kind == "corrupt":
            return Corrupt(unit, t_s, duration_s=length_s)
        return Reset(f"link:{unit}", t_s, duration_s=length_s)
