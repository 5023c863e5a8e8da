"""The history of each unit of a run, as its event log tells it: incarnations, their
steps, sends, deaths, pauses and blocks, and the interval arithmetic that metrics
(harness/judging/metrics.py) and checks (harness/judging/checks.py) do on them. Pure functions."""
from __future__ import annotations

from collections import Counter
from dataclasses import dataclass, field

from diloco_chaos.harness.eventlog import EventLog


# --- intervals (harness/intervals.py): the vocabulary of the metrics and checks ------------


# --- the history of each unit, as the log tells it --------------------------------------------


@dataclass
class Incarnation:
    """One process lifetime of a unit: from its own `unit_up` to the next one, the
    harness's `unit_down`, or the end of the run (`done` marks a clean finish)."""

    n: int
    up_t: float          # the process's own unit_up
    restart_t: float     # the harness's respawn (unit_up reason restarted), else up_t
    start_step: int      # learners: the step it starts from (0 or the restored checkpoint)
    end_t: float
    done: bool = False   # its `done` line says it finished its steps
    restored: dict | None = None  # its checkpoint_restored line, if any
    steps: list = field(default_factory=list)    # step lines
    sends: list = field(default_factory=list)    # (Contribution / GradStep send or drop line, step lines before it)
    blocked: list = field(default_factory=list)  # (on, off) spans
    events: list = field(default_factory=list)   # every line the process wrote
    start: str = "cold"  # how the harness started it: "cold", "spare" (warm), "spare_booting"
    crashed: bool = False  # it ended by dying of its own error (the harness's unit_down reason "crashed")


@dataclass
class UnitHistory:
    """A unit's incarnations, and its dead / paused spans from the harness's lines."""

    unit: str
    incs: list[Incarnation] = field(default_factory=list)
    dead: list = field(default_factory=list)
    paused: list = field(default_factory=list)
    # the harness's last respawn, when no process line followed it by the end of the run:
    # (t, start). A restart that never came up is still a restart (recovery: never).
    unborn: tuple | None = None
    _open: dict = field(default_factory=dict, repr=False)  # down / pause / restart / restore / block
    _live: bool = False

    def _end(self, at: float) -> None:
        if self.incs and self._live:
            cur, self._live = self.incs[-1], False
            cur.end_t = at
            if "block" in self._open:
                cur.blocked.append((self._open.pop("block"), at))

    def _close(self, key: str, spans: list, at: float) -> None:
        if key in self._open:
            spans.append((self._open.pop(key), at))

    def feed(self, e: dict, t_end: float) -> None:
        kind, t, o = e["kind"], e["t"], self._open
        if kind in ("unit_down", "unit_up") and not is_process_up(e):  # the harness, about this unit
            reason = e.get("reason")
            if kind == "unit_down":
                if reason == "crashed" and self.incs and self._live:
                    self.incs[-1].crashed = True
                if reason != "paused":
                    self._end(t)
                o.setdefault("pause" if reason == "paused" else "down", t)
            elif reason == "resumed":
                self._close("pause", self.paused, t)
            else:
                self._close("down", self.dead, t)
                o["restart"], o["start"] = t, e.get("start", "cold")
            return
        if kind == "checkpoint_restored":  # written before the process's unit_up
            o["restore"] = e
            return
        if is_process_up(e):
            if self.incs and self._live and "down" not in o:  # it died without a harness line:
                o["down"] = self.incs[-1].events[-1]["t"]   # dead from the last line it wrote
                self._end(o["down"])
            self._end(t)
            self._close("down", self.dead, t)
            restore = o.pop("restore", None) or {}
            self.incs.append(Incarnation(int(e["incarnation"]), t, o.pop("restart", t),
                                         int(e.get("step") or restore.get("step") or 0), t_end,
                                         restored=restore or None, start=o.pop("start", "cold")))
            self._live = True
        if not self.incs:
            return
        cur = self.incs[-1]
        cur.events.append(e)
        if kind == "step":
            cur.steps.append(e)
        elif kind in ("send", "drop") and e.get("msg") in ("Contribution", "GradStep"):
            cur.sends.append((e, len(cur.steps)))
        elif kind == "blocked" and e.get("on"):
            o.setdefault("block", t)
        elif kind == "blocked":
            self._close("block", cur.blocked, t)
        elif kind == "done":
            cur.done = bool(e.get("finished", True))
            self._end(t)

    def finish(self, t_end: float) -> None:
        """Spans still open at the end of the run end there."""
        if self.incs and self._live:
            self._close("block", self.incs[-1].blocked, self.incs[-1].end_t)
        if "restart" in self._open:
            self.unborn = (self._open.pop("restart"), self._open.pop("start", "cold"))
        self._close("down", self.dead, t_end)
        self._close("pause", self.paused, t_end)


def is_process_up(e: dict) -> bool:
    """The unit's own unit_up carries its incarnation; the harness's carries a reason."""
    return e["kind"] == "unit_up" and "incarnation" in e


def window(log: EventLog) -> tuple[float, float]:
    """[t_start, t_end] from the header, else the first and last event times."""
    ts = [e["t"] for e in log.events] or [0.0]
    return float(log.header.get("t_start", min(ts))), float(log.header.get("t_end", max(ts)))


def histories(log: EventLog, t_end: float) -> dict[str, UnitHistory]:
    """Every unit's history (learners and shards; lines from src "harness" are skipped),
    built once per log and end time and shared by every reader (the metrics, the checks,
    the ledger, the model checks, the report): read-only."""
    key = ("histories", t_end, len(log.events))
    if key not in log.views:
        log.views[key] = _build(log, t_end)
    return log.views[key]


def _build(log: EventLog, t_end: float) -> dict[str, UnitHistory]:
    out: dict[str, UnitHistory] = {}
    for e in log.events:
        if e["src"] != "harness":
            out.setdefault(e["src"], UnitHistory(e["src"])).feed(e, t_end)
    for h in out.values():
        h.finish(t_end)
    return out


def learner_names(log: EventLog) -> list[str]:
    topo = log.header.get("topology") or {}
    if topo.get("learners"):
        return list(topo["learners"])
    return [f"learner-{i}" for i in range(int(log.config["diloco"]["learners"]))]


def fragment_count(log: EventLog) -> int:
    shards = (log.header.get("topology") or {}).get("shards")
    if shards:
        return len({int(p) for ps in shards.values() for p in ps})
    d = log.config["diloco"]
    return int(d.get("fragments") or log.config["model"]["n_layers"] + 1)


def step_lag(hs: dict[str, UnitHistory]) -> int:
    """How many steps late a learner logs its step lines (trainer/units/learner.py: 1, metrics
    reach the host one step late; a log written as it happens: 0). A Contribution for
    fragment p sent in the k-th step of an incarnation has k ≥ Σ c_steps of p's sends
    so far (counters reset at each send, and at fetches, which only lower the sum),
    and it is logged after k − 1 − lag step lines. dp: a GradStep's step field is the
    number of steps the incarnation applied before it; it is logged after step − lag lines."""
    lag = 0
    for h in hs.values():
        for inc in h.incs:
            total: Counter = Counter()
            for e, before in inc.sends:
                if e["msg"] == "GradStep":  # dp: its step field counts the steps applied before it
                    lag = max(lag, int(e.get("step") or 0) - before)
                    continue
                total[e["fragment"]] += int(e.get("c_steps") or 0)
                lag = max(lag, total[e["fragment"]] - before - 1)
    return min(lag, 1)


def first_step_start(inc: Incarnation, lag: int) -> float | None:
    if not inc.steps:
        return None
    s = inc.steps
    return s[0]["t"] - s[0]["dt"] - (lag * s[1]["dt"] if len(s) > 1 else 0.0)
