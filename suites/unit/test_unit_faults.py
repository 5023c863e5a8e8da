"""The faults on a unit and their hooks (trainer/protocol/unit_faults.py), by hand: a hook runs only
while its fault is on; a held message leaves at the fault's clear, as it was when held,
and no later message overtakes it; the `corrupt` hook corrupts a contribution and logs it."""
from __future__ import annotations

from types import SimpleNamespace

import numpy as np

from diloco_chaos.trainer.protocol import compression
from diloco_chaos.trainer.protocol.messages import Contribution
from diloco_chaos.trainer.protocol.sdc import Corrupter
from diloco_chaos.trainer.protocol.unit_faults import HOLD, HOOKS, UnitFaults


def test_a_hook_runs_only_while_its_fault_is_on(monkeypatch):
    monkeypatch.setitem(HOOKS["before_send"], "double", lambda unit, fields, msg: msg * fields["by"])
    faults, out = UnitFaults(), []
    faults.send(None, 3, out.append)
    faults.update({"double": {"by": 2}})
    faults.send(None, 3, out.append)
    faults.update({})
    faults.send(None, 3, out.append)
    assert out == [3, 6, 3]


def test_held_messages_leave_at_the_clear_in_order_and_none_overtakes(monkeypatch):
    monkeypatch.setitem(HOOKS["before_send"], "stall", lambda unit, fields, msg: HOLD)
    active: dict = {}
    faults, out = UnitFaults(active), []
    faults.send(None, "a", out.append)
    active["stall"] = {}  # the simulator sets the unit's own dict
    faults.send(None, "b", out.append)
    faults.send(None, "c", out.append)
    assert out == ["a"] and [k for k, _ in faults.held] == ["stall", "stall"]
    faults.release()  # still on: nothing leaves
    assert out == ["a"]
    del active["stall"]
    faults.release()
    faults.send(None, "d", out.append)
    assert out == ["a", "b", "c", "d"] and not faults.held


def test_a_message_after_a_held_one_waits_even_once_its_own_hooks_are_off(monkeypatch):
    monkeypatch.setitem(HOOKS["before_send"], "stall", lambda unit, fields, msg: HOLD)
    faults, out = UnitFaults({"stall": {}}), []
    faults.send(None, 1, out.append)
    faults.update({"stall": {}, "other": {}})
    faults.send(None, 2, out.append)
    assert out == []
    faults.update({"other": {}})
    assert out == [1, 2]


def test_the_corrupt_hook_scales_a_contribution_and_logs_it():
    lines = []
    driver = SimpleNamespace(sdc=Corrupter(0, 0, 0), port=SimpleNamespace(emit=lambda kind, **f: lines.append((kind, f))))
    c = Contribution("A", 0, 3, 1, 0, 6, 60, 1.0, None, compression.encode([np.ones(4, np.float32)], "fp32"))
    faults, out = UnitFaults({"corrupt": {"mode": "scale", "factor": 1000.0, "flips": 8}}), []
    faults.send(driver, c, out.append)
    assert compression.decode(out[0].payload)[0].tolist() == [1000.0] * 4
    assert lines == [("corrupt", {"fragment": 1, "seq": 3, "incarnation": 0, "mode": "scale", "norm": 2.0,
                                  "corrupt_norm": 2000.0})]
    faults.update({})
    faults.send(driver, c, out.append)
    assert out[1] is c and len(lines) == 1


def test_a_message_queued_behind_a_held_one_still_passes_the_hooks_before_the_hold(monkeypatch):
    """corrupt and send_stall at once: every contribution held is corrupted (corrupt's hook
    comes first), the ones queued behind the first too."""
    lines = []
    driver = SimpleNamespace(sdc=Corrupter(0, 0, 0), port=SimpleNamespace(emit=lambda kind, **f: lines.append(kind)))
    c = Contribution("A", 0, 3, 1, 0, 6, 60, 1.0, None, compression.encode([np.ones(4, np.float32)], "fp32"))
    faults, out = UnitFaults({"corrupt": {"mode": "scale", "factor": 10.0}, "send_stall": {}}), []
    for _ in range(3):
        faults.send(driver, c, out.append)
    assert out == [] and lines == ["corrupt"] * 3
    faults.update({})
    assert [compression.decode(m.payload)[0].tolist() for m in out] == [[10.0] * 4] * 3
