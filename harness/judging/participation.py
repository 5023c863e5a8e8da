"""Participation: how many learners each committed outer round merged (from the log alone).

Decoupled DiLoCo at K = 1 commits a round as soon as one learner's Δ is in, plus whatever
the grace window gathers; streaming / sync_diloco / dp rounds hold every learner. A run
can keep committing while few learners take part, so the summary says how many did:
`participation` in summary.json (docs/METRICS.md). Each `round_commit` line carries `n`,
the distinct learners it merged (a shard keeps one pending contribution per learner).
"""
from __future__ import annotations

from collections import Counter

from diloco_chaos.harness.eventlog import EventLog


def participation(log: EventLog) -> dict | None:
    """{rounds, mean, share_at_least_2, histogram: {n: rounds}, learners: M}, or None when
    no round was committed."""
    ns = [int(e["n"]) for e in log.of("round_commit") if e.get("n") is not None]
    if not ns:
        return None
    hist = Counter(ns)
    return {"rounds": len(ns), "mean": sum(ns) / len(ns),
            "share_at_least_2": sum(c for n, c in hist.items() if n >= 2) / len(ns),
            "histogram": {str(n): hist[n] for n in sorted(hist)},
            "learners": len((log.header.get("topology") or {}).get("learners") or []) or None}
