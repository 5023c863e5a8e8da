"""The fault kinds, one module each (faults/kinds/base.py says what a kind holds). The
built-in ones are imported below in the fault table's order (the scenario reference, the
report's legend and the strategies' `ALL_KINDS` list them so); any other module here is
imported after them, in name order, so adding a kind is adding its module."""
import importlib
import pkgutil

from faults.kinds.base import FAULT_KINDS, NEVER, POSITIVE_S, STREAMS, TARGET_FORMS, Fault, Nemesis, fault_from_dict
from faults.kinds.kill_unit import KillUnit
from faults.kinds.kill_slice import KillSlice
from faults.kinds.pause_unit import PauseUnit
from faults.kinds.slow_unit import SlowUnit
from faults.kinds.kill_syncer import KillSyncer
from faults.kinds.wan import Wan
from faults.kinds.partition import DIRECTIONS, Partition
from faults.kinds.reset import Reset
from faults.kinds.truncate import Truncate
from faults.kinds.latency_spike import LatencySpike
from faults.kinds.corrupt import CORRUPT_MODES, SDC_FACTORS, Corrupt

__all__ = ["fault_from_dict", "FAULT_KINDS", "NEVER", "POSITIVE_S", "STREAMS", "TARGET_FORMS", "Fault", "Nemesis",
           "KillUnit", "KillSlice", "PauseUnit", "SlowUnit", "KillSyncer", "Wan", "DIRECTIONS", "Partition",
           "Reset", "Truncate", "LatencySpike", "CORRUPT_MODES", "SDC_FACTORS", "Corrupt"]

for _module in pkgutil.iter_modules(__path__):  # a kind added as a module registers itself
    importlib.import_module(f"{__name__}.{_module.name}")
