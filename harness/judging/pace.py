"""The run's pace: how much slower than a reference machine this machine ran the run,
measured from the run's own log, so that a bound in seconds is not decided by the runner.

A CI runner is a new, shared, busy machine every time: its page cache is cold, other jobs
take its cores, and everything that is CPU-bound and not the protocol (a unit's Python +
JAX start, a restore, an eval or a save between steps) takes longer there. A bound set on
an idle machine (a shard's restart is back within 2 s; a restart rejoins within 20 s)
would then FAIL a healthy run. So the checks whose bound is in seconds of such work are
held to that bound × the pace, and say both figures.

What is measured: the units' cold start in this run, from each unit's process start (the
`started` field of its own first `unit_up` line, read from /proc by the unit) to that
`unit_up` (Python, JAX, the task, Θ0, the shard's listening socket), the median over the
run's first incarnations: every unit of every run does this same work before any fault,
on any backend (a container's creation and a remote engine's latency are not in it).
The run's own units start together and share the cores: N units (and the first warm
spare of each role) on C cores take max(1, N / C) times one unit's start, whatever the
machine, so the figure is divided by that (`start_s` is per unit, `start_raw_s` as
measured; C is the harness machine's, `cpus` in the header). A log without `started`
(written before it existed) is measured from the harness's launch (`t_launch`) instead.
Against it: the same figure on an idle 2-core machine of the CI's kind
(REFERENCE_START_S). pace = max(1, measured / reference): a faster machine does not
tighten a bound (the bounds are the design's claims, not this machine's). It takes the
units' word for when they started (a field they write); a unit cannot make its own run's
bounds tighter with it, only looser, and the report shows the pace.

What it does not see: a load that starts after the units are up (it is measured once, at
the start), and a machine slow only at what the cold start does not do (I/O-bound
checkpoints). The virtual clock of the simulator has pace 1 by definition.

Which checks use it (docs/METRICS.md "Pace"): `no_global_downtime` (the floor of its
bound: a replacement unit's boot starving the others), `recovery_max_s` (boot + rejoin, in
seconds), `goodput_min` (the badput that is CPU-bound work off the protocol: startup,
recovery, other). `rejoin_cycles_max` is in inner steps and needs none.
"""
from __future__ import annotations

import statistics

from diloco_chaos.harness.eventlog import EventLog
from diloco_chaos.harness.judging.history import is_process_up

# One unit's cold start (its process start → its first unit_up, divided by the units
# starting together per core), the median of a run's units, on an idle 2-core machine of
# the CI's kind: 0.92-1.11 s over six runs (unit-faults and link-faults on processes and
# on docker, the spare runs of both). Logs without `started`: t_launch → unit_up, per
# backend, undivided (docker creates its containers before t_launch).
REFERENCE_START_S = 1.1
REFERENCE_LAUNCH_S = {"local": 2.0, "docker": 1.4}


def pace(log: EventLog) -> dict:
    """{"pace", "start_s", "start_raw_s", "reference_start_s", "units"}: pace 1.0 (start_s
    None) for the simulator, a log without `t_launch`, or one whose units never came up."""
    header = log.header
    backend = ((header.get("topology") or {}).get("backend") or {}).get("name", "local")
    t_launch = header.get("t_launch")
    ups = [e for e in log.events if is_process_up(e) and int(e["incarnation"]) == 0]
    own = all(isinstance(e.get("started"), (int, float)) for e in ups)
    ref = REFERENCE_START_S if own else REFERENCE_LAUNCH_S.get(backend, REFERENCE_LAUNCH_S["local"])
    out = {"pace": 1.0, "start_s": None, "start_raw_s": None, "reference_start_s": ref, "units": 0}
    if header.get("tier") != "cluster" or not ups or (not own and t_launch is None):
        return out
    firsts: dict[str, float] = {}
    for e in ups:
        firsts.setdefault(e["src"], e["t"] - (e["started"] if own else t_launch))
    raw = statistics.median(firsts.values())
    spares = len(((header.get("topology") or {}).get("backend") or {}).get("spares") or ())
    cpus = header.get("cpus")
    together = max(1.0, (len(firsts) + spares) / cpus) if own and isinstance(cpus, int) and cpus > 0 else 1.0
    start = raw / together
    return {"pace": max(1.0, start / ref), "start_s": start, "start_raw_s": raw, "reference_start_s": ref,
            "units": len(firsts)}
