"""Recovery: each learner restart, from the harness's respawn to the incarnation's first
merged contribution, split into boot (the process) and rejoin (the protocol), with the
restart's path (a new process or a warm spare) and its length in fragment cycles
(docs/METRICS.md "Recovery"). Read from the event log alone."""
from __future__ import annotations

import statistics
from collections import defaultdict
from dataclasses import dataclass

from diloco_chaos.harness.eventlog import EventLog
from diloco_chaos.harness.judging.history import Incarnation, UnitHistory, first_step_start


@dataclass(frozen=True)
class Recovery:
    """One learner restart. recovery_s = boot_s + rejoin_s: the process's own start
    (boot: Python, JAX, task, checkpoint restore, the fetch of Θ and the first step's
    compile) and the protocol's part (rejoin: its first step → its first merge)."""

    unit: str
    incarnation: int
    t_s: float                   # the restart, seconds from t_start
    recovery_s: float | None     # restart → first merged contribution; None = never
    boot_s: float | None = None  # restart → the start of its first inner step; None = never stepped
    rejoin_s: float | None = None          # its first step's start → first merged contribution
    rejoin_steps: int | None = None        # its inner steps up to the first contribution that was merged
    rejoin_cycles: float | None = None     # rejoin_steps / H: fragment cycles (the design: ≤ 1)
    steps_run: int = 0                     # inner steps the incarnation logged
    sync_every: int | None = None          # H, from the run's config
    start: str = "cold"                    # the restart's path: "cold", "spare" (warm), "spare_booting"
    cycle_s: float | None = None           # a fragment cycle of wall time: H × the unit's median step interval
    recovery_cycles: float | None = None   # recovery_s / cycle_s (the design: ≤ 2 with spares)
    crashed: bool = False                  # the incarnation died of its own error (never censored)



def first_merges(log: EventLog) -> dict[tuple[str, int], float]:
    out: dict[tuple[str, int], float] = {}
    for e in log.of("merge"):
        out.setdefault((e["learner"], e["incarnation"]), e["t"])
    return out


def _rejoin_steps(inc: Incarnation, merged: set) -> int | None:
    """Inner steps this incarnation ran up to (and including) the step that sent its first
    contribution a shard merged: the send line's `at_step` (the learner core's step counter,
    which starts at 0 in every incarnation), else the step lines before the send, plus one
    (the core sends inside a step; that step's line comes after). A dp GradStep goes out
    before its step is counted: at_step + 1."""
    counts = [(int(e["at_step"]) + (e["msg"] == "GradStep")) if e.get("at_step") is not None else before + 1
              for e, before in inc.sends
              if e["kind"] == "send" and e.get("msg") in ("Contribution", "GradStep")
              and (e.get("incarnation", inc.n), e.get("seq"), e.get("fragment")) in merged]
    return min(counts) if counts else None


def recoveries(log: EventLog, hs: dict[str, UnitHistory], lag: int, t0: float, firsts: dict) -> tuple:
    """A `Recovery` for every learner incarnation ≥ 1 (DiLoCo and dp modes alike), and for a
    respawn the harness made whose process never wrote a line (recovery_s None, never
    booted: the harness's word that it restarted, the unit's silence that it did not come
    up); `firsts`: first_merges(log)."""
    H = (log.config.get("diloco") or {}).get("sync_every")
    merged_by: dict[str, set] = defaultdict(set)
    for e in log.of("merge"):
        merged_by[e["learner"]].add((e["incarnation"], e["seq"], e["fragment"]))
    out = []
    for n, h in hs.items():
        merged = merged_by[n]
        gaps = [b["t"] - a["t"] for inc in h.incs for a, b in zip(inc.steps, inc.steps[1:])]
        cycle = H * statistics.median(gaps) if gaps and H else None
        for inc in h.incs:
            if inc.n < 1:
                continue
            first_merge, first_step = firsts.get((n, inc.n)), first_step_start(inc, lag)
            steps = _rejoin_steps(inc, merged) if first_merge is not None else None
            rec = None if first_merge is None else first_merge - inc.restart_t
            out.append(Recovery(
                n, inc.n, inc.restart_t - t0, rec,
                boot_s=None if first_step is None else max(0.0, first_step - inc.restart_t),
                rejoin_s=None if first_merge is None or first_step is None else max(0.0, first_merge - first_step),
                rejoin_steps=steps, rejoin_cycles=None if steps is None or not H else steps / H,
                steps_run=len(inc.steps), sync_every=H, start=inc.start, cycle_s=cycle,
                recovery_cycles=None if rec is None or not cycle else rec / cycle, crashed=inc.crashed))
        if h.unborn is not None:  # respawned, and no process line by the end: it never came up
            t, start = h.unborn
            out.append(Recovery(n, (h.incs[-1].n + 1) if h.incs else 1, t - t0, None,
                                sync_every=H, start=start, cycle_s=cycle))
    return tuple(out)
