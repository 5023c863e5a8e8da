"""The fault kinds, one module each (faults/kinds/base.py says what a kind holds). The
built-in ones are imported below in the fault table's order (the scenario reference and the
report's legend list them so; the strategies sample by each kind's `severity`); any other
module here is imported after them, in name order, so adding a kind is adding its module."""
import importlib
import pkgutil

from diloco_chaos.faults.kinds.base import FAULT_KINDS, NEVER, POSITIVE_S, STREAMS, TARGET_FORMS, Fault, Nemesis, fault_from_dict
from diloco_chaos.faults.kinds.kill_unit import KillUnit
from diloco_chaos.faults.kinds.kill_slice import KillSlice
from diloco_chaos.faults.kinds.pause_unit import PauseUnit
from diloco_chaos.faults.kinds.slow_unit import SlowUnit
from diloco_chaos.faults.kinds.kill_syncer import KillSyncer
from diloco_chaos.faults.kinds.wan import Wan
from diloco_chaos.faults.kinds.partition import DIRECTIONS, Partition
from diloco_chaos.faults.kinds.reset import Reset
from diloco_chaos.faults.kinds.truncate import Truncate
from diloco_chaos.faults.kinds.latency_spike import LatencySpike
from diloco_chaos.faults.kinds.corrupt import CORRUPT_MODES, SDC_FACTORS, Corrupt

__all__ = ["fault_from_dict", "FAULT_KINDS", "NEVER", "POSITIVE_S", "STREAMS", "TARGET_FORMS", "Fault", "Nemesis",
           "KillUnit", "KillSlice", "PauseUnit", "SlowUnit", "KillSyncer", "Wan", "DIRECTIONS", "Partition",
           "Reset", "Truncate", "LatencySpike", "CORRUPT_MODES", "SDC_FACTORS", "Corrupt"]

for _module in pkgutil.iter_modules(__path__):  # a kind added as a module registers itself
    importlib.import_module(f"{__name__}.{_module.name}")
