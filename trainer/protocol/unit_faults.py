"""The faults on one unit now, and the hooks where they change what the unit does.

The harness turns a fault on and off per unit, learner or syncer shard alike
(`Control.set_fault` / `clear_fault`, harness/run/control.py): on processes and
containers a control message carries the unit's whole dict of active faults by name
(`{"corrupt": {"mode": "scale", ...}}`), which the unit keeps in its
control/<name>.json and reads between steps (a learner) or loop turns (a shard); in the
simulator the world sets the same dict on the unit. The code both tiers share consults
it at named points, the hooks: a kind whose fault makes the unit behave differently
adds one function here for one point, under its name (`@hook(point, kind)`), and the
point's callers (the loop, the drivers) need no edit.

Points (who calls them; what a hook gets and returns):
- `before_step`: the learner loop, before each inner step: `fn(host, fields, None)`,
  its return value ignored (the host is the loop's, trainer/protocol/learner_loop.py).
- `before_send`: both drivers, before each message the core sends leaves for the link
  (trainer/protocol/learner_driver.py, trainer/protocol/syncer_driver.py): `fn(driver, fields, msg)` returns
  the message to send, or HOLD: the message waits, with every later one, until that
  fault is cleared, then leaves as it was when held, in order.

Protocol behaviour stays in the sans-IO cores; a hook changes only what the unit's own
machinery does around them (what leaves, when).
"""
from __future__ import annotations

from typing import Any, Callable

POINTS = ("before_step", "before_send")
HOLD = object()  # a before_send hook's answer: the message waits until the fault is cleared

# point -> fault kind -> what the unit does there while a fault of that kind is on
HOOKS: dict[str, dict[str, Callable[[Any, dict, Any], Any]]] = {p: {} for p in POINTS}


def hook(point: str, kind: str):
    """Registers `fn(unit, fields, value)` for `kind` at `point` (one of POINTS)."""
    if point not in HOOKS:
        raise ValueError(f"unknown hook point {point!r}; valid: {', '.join(POINTS)}")

    def register(fn):
        HOOKS[point][kind] = fn
        return fn
    return register


class UnitFaults:
    """One unit's active faults by name (their fields as the harness set them) and the
    messages they hold. `active` is the dict itself, not a copy: the simulator hands in
    the unit's own, which the world sets (it outlives a restart, as the control file does);
    a process replaces its contents from the control file (`update`)."""

    def __init__(self, active: dict | None = None):
        self.active: dict[str, dict] = {} if active is None else active
        self.held: list[tuple[str, Callable[[], None]]] = []  # (the fault holding it, its send), in order

    def update(self, active: dict) -> None:
        """The harness's new dict (a process's control message); what a cleared fault held leaves."""
        self.active.clear()
        self.active.update(active)
        self.release()

    def release(self) -> None:
        """Carries out, in order, what faults no longer on had held (up to the first still held:
        later messages never overtake an earlier one)."""
        while self.held and self.held[0][0] not in self.active:
            _, send = self.held.pop(0)
            send()

    def step(self, unit) -> None:
        """`before_step`: every active fault's hook, for what it does before an inner step."""
        for kind, fn in HOOKS["before_step"].items():
            if kind in self.active:
                fn(unit, self.active[kind], None)

    def send(self, unit, msg, out: Callable[[Any], None]) -> None:
        """`before_send`: every active fault's hook, in the order the hooks were registered,
        then `out(msg)`: now, or when the fault that held it (or an earlier message) is
        cleared. A held message leaves as it was when held (the hooks after the holding one
        do not run)."""
        for kind, fn in HOOKS["before_send"].items():
            if kind in self.active:
                after = fn(unit, self.active[kind], msg)
                if after is HOLD:
                    self.held.append((kind, lambda: out(msg)))
                    return
                msg = after
        if self.held:  # an earlier message waits: this one goes after it
            self.held.append((self.held[-1][0], lambda: out(msg)))
            return
        out(msg)


# --- the hooks -------------------------------------------------------------------------------
@hook("before_send", "corrupt")
def _corrupt(driver, fields: dict, msg):
    """corrupt: a learner's outgoing contribution is silently wrong (trainer/protocol/sdc.py), and a
    `corrupt` line names it."""
    driver.sdc.spec = fields
    msg, bad = driver.sdc.apply(msg)
    if bad:
        driver.port.emit("corrupt", **bad)
    return msg


@hook("before_send", "send_stall")
def _send_stall(unit, fields: dict, msg):
    """send_stall: what the core sends waits in the unit until the fault is cleared."""
    return HOLD
