"""The timeline's data: one lane per learner unit, slice group, syncer shard and link,
the state of each over time, fault bands and outer-round commits.

Everything comes from the event log (unit histories from harness.judging.metrics, the
harness's fault_start / fault_end lines, the transports' link_up / link_down lines,
round_commit lines); times are seconds from the measurement window's start
(t_start). Painting is by precedence: a later layer covers an earlier one (a dead
unit is `down` whatever else was going on).

Lane states:
  learner / shard  starting, up, waiting (blocked on sync), recovering (restarted,
                   stepping, not merged yet), slow, paused, down, finished
  slice group      all live, slice lost, down
  link             up, disconnected (the transport saw it drop), slow (latency),
                   throttled (bandwidth), reset, truncated, partitioned
  global model     advancing, no commit yet, stalled (a commit gap above the bound),
                   downtime (the no_global_downtime check's violations)

Marks on a learner's lane: its `starved` lines (it heard nothing from a shard for
starve_cycles fragment cycles and re-fetched).
"""
from __future__ import annotations

from dataclasses import dataclass, field

from diloco_chaos.faults.kinds import FAULT_KINDS
from diloco_chaos.harness import intervals
from diloco_chaos.harness.judging import history
from diloco_chaos.harness.eventlog import EventLog

UNIT_STATES = ("starting", "up", "waiting", "recovering", "slow", "paused", "down", "finished")
SLICE_STATES = ("all live", "slice lost")
LINK_STATES = ("disconnected", "slow", "throttled", "reset", "truncated", "partitioned")
GLOBAL_STATES = ("no commit yet", "advancing", "stalled", "downtime")
# a link's state under each link fault kind (faults/kinds/ `link_state`): partitioned, reset, ...
LINK_FAULT_STATE = {k: c.link_state for k, c in FAULT_KINDS.items() if "link" in c.roles}


@dataclass
class Timeline:
    lanes: list[dict] = field(default_factory=list)     # {lane, group, unit}
    segments: list[dict] = field(default_factory=list)  # {lane, state, t0, t1, detail}
    ticks: list[dict] = field(default_factory=list)     # {lane, t, fragment, version}
    faults: list[dict] = field(default_factory=list)    # {id, kind, target, t0, t1, label, params, via}
    starved: list[dict] = field(default_factory=list)   # {lane, t, shard, step, tries, silent_steps, ...}
    x_domain: tuple = (0.0, 1.0)
    t_end: float = 0.0

    def lane_names(self, group: str | None = None) -> list[str]:
        return [l["lane"] for l in self.lanes if group is None or l["group"] == group]


def _paint(layers: list[tuple[str, list, str]]) -> list[tuple[str, float, float, str]]:
    """[(state, intervals, detail)] low → high precedence -> disjoint (state, a, b, detail)."""
    out: list[tuple[str, float, float, str]] = []
    for state, iv, detail in layers:
        iv = intervals.norm(iv)
        if not iv:
            continue
        kept = []
        for s, a, b, d in out:
            kept += [(s, x, y, d) for x, y in intervals.minus([(a, b)], iv)]
        out = kept + [(state, a, b, detail) for a, b in iv]
    return sorted(out, key=lambda r: r[1])


def faults_of(log: EventLog, t_end: float) -> list[dict]:
    """Every fault the harness applied, from its fault_start / fault_end lines (absolute times)."""
    open_: dict = {}
    out: list[dict] = []
    for e in log.of("fault_start", "fault_end", "unit_down"):
        if e["kind"] == "unit_down":  # a backend that had to do a fault another way says so here
            hit = [o for o in open_.values() if o["target"] == e["src"] and o["a"] <= e["t"]]
            if e.get("via") and hit:
                hit[-1]["via"] = e["via"]
            continue
        if e["src"] != "harness":
            continue
        f = e.get("fault") or {}
        key = e.get("id", len(out))
        if e["kind"] == "fault_start":
            open_[key] = {"id": key, "kind": f.get("kind", "?"), "target": f.get("target", "?"),
                          "a": e["t"], "b": t_end, "params": f, "open": True, "via": e.get("via")}
            out.append(open_[key])
        elif key in open_:
            open_.pop(key).update(b=e["t"], open=False)
    return out


def fault_label(f: dict) -> str:
    """`pause_unit learner-2 · docker pause / unpause`: what, on whom, and how it was done
    (the mechanism up to its first ';' or '(' — the whole of it is in the tooltip)."""
    label = f"{f['kind']} {f['target']}"
    via = (f.get("via") or "").split(";")[0].split("(")[0].strip()
    return f"{label} · {via}" if via and via != f["kind"] else label


def link_hit(target: str, learner: str, shard: str) -> bool:
    spec = target.removeprefix("link:")
    if spec == "*":
        return True
    who, _, peer = spec.partition("~")
    return who == learner and (not peer or peer == shard)


def _params_text(f: dict) -> str:
    skip = {"kind", "target", "at_s"}
    return ", ".join(f"{k}={v}" for k, v in f.items() if k not in skip and v is not None)


def _first_line(h: history.UnitHistory, log: EventLog) -> float | None:
    for e in log.events:
        if e["src"] == h.unit:
            return e["t"]
    return None


def _down_reasons(log: EventLog, unit: str) -> list[tuple[float, str]]:
    return [(e["t"], e.get("reason", "?")) for e in log.of("unit_down") if e["src"] == unit
            and not history.is_process_up(e)]


def _unit_layers(h: history.UnitHistory, log: EventLog, t1: float, hi: float, lag: int,
                 recov: dict, faults: list[dict]) -> list[tuple[str, list, str]]:
    starting, up, waiting, recovering, finished = [], [], [], [], []
    first = _first_line(h, log)
    for i, inc in enumerate(h.incs):
        avail = (first if first is not None else inc.up_t) if i == 0 else inc.restart_t
        step0 = history.first_step_start(inc, lag)
        if inc.steps:  # a learner
            starting.append((avail, step0))
            last = inc.steps[-1]["t"] if inc.done else inc.end_t
            up.append((step0, last))
            if inc.done:
                finished.append((last, hi))
        else:  # a shard (or a learner that never stepped)
            starting.append((avail, inc.up_t))
            up.append((inc.up_t, inc.end_t))
            if inc.done:
                finished.append((inc.end_t, hi))
        waiting += inc.blocked
        r = recov.get((h.unit, inc.n))
        if r is not None and inc.steps:
            end = inc.end_t if r.get("recovery_s") is None else inc.restart_t + r["recovery_s"]
            recovering.append((max(step0, inc.restart_t), end))
    slow = [(f["a"], f["b"]) for f in faults if f["kind"] == "slow_unit" and f["target"] == h.unit]
    slow_detail = "; ".join(_params_text(f["params"]) for f in faults
                            if f["kind"] == "slow_unit" and f["target"] == h.unit)
    reasons = _down_reasons(log, h.unit)
    downs = []
    for a, b in h.dead:
        why = next((r for t, r in reasons if abs(t - a) < 1e-6), "no line from the process")
        downs.append(("down", [(a, b)], f"down ({why})"))
    # from the first line to the window's end, any stretch no other state covers is a
    # (re)start that has not logged yet (e.g. respawned, then killed again before its first line)
    base = [(first, t1)] if first is not None else []
    return [("starting", base + starting, "process start, restore, fetch: until its first step"),
            ("up", up, ""), ("finished", finished, "its token budget is done"),
            ("waiting", waiting, "blocked on sync"),
            ("recovering", recovering, "restarted: stepping, no contribution merged yet"),
            ("slow", slow, slow_detail), ("paused", h.paused, "SIGSTOP")] + downs


def build(log: EventLog, summary: dict) -> Timeline:
    """The timeline of one run (see the module docstring)."""
    t0, t1 = history.window(log)
    ev_ts = [e["t"] for e in log.events if e["src"] != "harness"] or [t0, t1]
    lo, hi = min(min(ev_ts), t0), max(max(ev_ts), t1)
    hs = history.histories(log, t1)
    lag = history.step_lag(hs)
    learners = history.learner_names(log)
    topo = log.header.get("topology") or {}
    shards = sorted(set((topo.get("shards") or {})) | {s for s in hs if s.startswith("syncer")})
    slices = int(((log.header.get("scenario") or {}).get("cluster") or {}).get("slices")
                 or log.config["diloco"].get("slices") or 1)
    faults = faults_of(log, hi)
    recov = {(r["unit"], r["incarnation"]): r for r in summary.get("recovery") or []}
    tl = Timeline(x_domain=(lo - t0, hi - t0), t_end=t1 - t0)

    def add(lane: str, group: str, unit: str, painted) -> None:
        tl.lanes.append({"lane": lane, "group": group, "unit": unit})
        tl.segments += [{"lane": lane, "state": s, "t0": round(a - t0, 4), "t1": round(b - t0, 4), "detail": d}
                        for s, a, b, d in painted if b > a]

    tl.lanes.append({"lane": "global model", "group": "global", "unit": "global"})
    for name in learners:
        h = hs.get(name, history.UnitHistory(name))
        add(name, "learner", name, _paint(_unit_layers(h, log, t1, hi, lag, recov, faults)))
    lost = {n: [f for f in faults if f["kind"] == "kill_slice" and f["target"] == n] for n in learners}
    if slices > 1 or any(lost.values()):
        for name in learners:
            h = hs.get(name, history.UnitHistory(name))
            alive = intervals.minus([(i.up_t, i.end_t) for i in h.incs], h.dead)
            layers = [("all live", alive, f"{slices} of {slices} slices")]
            layers += [("slice lost", [(f["a"], f["b"])], f"{f['params'].get('slices', 1)} of {slices} slices lost")
                       for f in lost[name]]
            layers.append(("down", h.dead, "the unit is down"))
            add(f"{name} slices", "slices", name, _paint(layers))
    for s in shards:
        h = hs.get(s, history.UnitHistory(s))
        add(s, "shard", s, _paint(_unit_layers(h, log, t1, hi, lag, {}, faults)))
    links = topo.get("links") or {n: {s: None for s in shards} for n in learners}
    for learner in learners:
        for shard in sorted(links.get(learner) or {}):
            add(f"{learner}~{shard}", "link", f"{learner}~{shard}",
                _paint(_link_layers(log, learner, shard, faults, lo, hi)))
    _global_lane(tl, log, summary, t0, lo, hi)
    for e in log.of("round_commit"):
        tl.ticks.append({"lane": e["src"], "t": round(e["t"] - t0, 4), "fragment": e.get("fragment"),
                         "version": e.get("version")})
    tl.starved = starved_marks(log, learners, t0)
    tl.faults = [{"id": f["id"], "kind": f["kind"], "target": f["target"], "t0": round(f["a"] - t0, 4),
                  "t1": round(f["b"] - t0, 4), "label": fault_label(f),
                  "params": _params_text(f["params"]), "open": f["open"], "via": f.get("via") or "–"}
                 for f in faults]
    return tl


def starved_marks(log: EventLog, learners: list[str], t0: float) -> list[dict]:
    """A learner's `starved` lines (silent from `shard` for `silent_cycles` fragment cycles,
    re-fetching for the `tries`-th time), placed on its lane."""
    names = set(learners)
    return [{"lane": e["src"], "t": round(e["t"] - t0, 4), "shard": e.get("shard"), "step": e.get("step"),
             "tries": e.get("tries"), "silent_steps": e.get("silent_steps"), "heard_step": e.get("heard_step"),
             "silent_cycles": e.get("silent_cycles")}
            for e in log.of("starved") if e["src"] in names]


def _link_layers(log: EventLog, learner: str, shard: str, faults: list[dict], lo: float, hi: float):
    downs, opened = [], {}
    first_up = None
    for e in log.of("link_up", "link_down"):
        side = (e["src"], e.get("peer"))
        if side not in ((learner, shard), (shard, learner)):
            continue
        if e["kind"] == "link_up":
            first_up = e["t"] if first_up is None else first_up
            if side in opened:
                downs.append((opened.pop(side), e["t"]))
        else:
            opened.setdefault(side, e["t"])
    downs += [(a, hi) for a in opened.values()]
    layers = [("up", [(first_up if first_up is not None else lo, hi)], ""),
              ("disconnected", downs, "the transport saw the connection drop")]
    for f in faults:
        if f["kind"] not in LINK_FAULT_STATE or not link_hit(f["target"], learner, shard):
            continue
        state = LINK_FAULT_STATE[f["kind"]]
        if f["kind"] == "wan" and f["params"].get("bandwidth_kbps"):
            state = "throttled"
        layers.append((state, [(f["a"], f["b"])], f"{f['kind']}: {_params_text(f['params'])}"))
    # precedence: partitioned over the rest
    layers.sort(key=lambda l: ("up", "disconnected", "slow", "throttled", "reset", "truncated",
                               "partitioned").index(l[0]))
    return layers


def _global_lane(tl: Timeline, log: EventLog, summary: dict, t0: float, lo: float, hi: float) -> None:
    commits = sorted(e["t"] for e in log.of("round_commit"))
    layers = [("no commit yet", [(lo, commits[0] if commits else hi)], "no outer round committed yet")]
    if commits:
        layers.append(("advancing", [(commits[0], commits[-1])], "outer rounds commit"))
        bound = summary.get("commit_gap_bound_s")
        layers += [("stalled", [(t0 + a, t0 + b)], f"no commit for {b - a:.1f} s (bound {bound:.1f} s)"
                    if isinstance(bound, (int, float)) else "no commit")
                   for a, b in summary.get("downtime") or []]
        layers.append(("stalled", [(commits[-1], hi)], "after the last commit"))
    for c in summary.get("checks") or []:
        if c.get("name") == "no_global_downtime":
            for v in (c.get("details") or {}).get("violations") or []:
                layers.append(("downtime", [(t0 + v["from_s"], t0 + v["to_s"])],
                               f"quorum reachable for {v.get('reachable_s', 0):.1f} s without a commit "
                               "(no_global_downtime violation)"))
    tl.segments += [{"lane": "global model", "state": s, "t0": round(a - t0, 4), "t1": round(b - t0, 4),
                     "detail": d} for s, a, b, d in _paint(layers) if b > a]
