"""Time series a page plots, cut from event logs (times in seconds from each run's t_start):
held-out loss over time, bytes per link over time and each link's bandwidth limit.
Only counting and bucketing here; every judgement is in harness.checks."""
from __future__ import annotations

import math
from collections import defaultdict

from harness import metrics
from harness.eventlog import EventLog
from reports.timeline import link_hit

MAX_BUCKETS = 240  # per link and direction: keeps a long run's page light


def loss_rows(log: EventLog, who: str) -> tuple[list[dict], list[dict]]:
    """(per-learner held-out eval points, the global model's evals) of one run.
    A learner's eval line is its own model on held-out data; the harness's eval with
    `global: true` is the assembled global model: the runner evaluates it after the run,
    along it (from the syncer shards' kept checkpoints, at the times they were taken) and
    at the end (harness/global_eval.py)."""
    t0, t1 = metrics.window(log)
    learners = set(metrics.learner_names(log))
    points = [{"who": who, "learner": e["src"], "t": round(e["t"] - t0, 3), "step": e.get("step"),
               "loss": e["loss"]} for e in log.of("eval") if e["src"] in learners and _finite(e.get("loss"))]
    # the runner evaluates the final Θ after the run: shown where the run ended
    glob = [{"who": who, "t": round(min(e["t"], t1) - t0, 3), "step": e.get("step"), "loss": e["loss"]}
            for e in log.of("eval", src="harness") if e.get("global") and _finite(e.get("loss"))]
    return points, glob


def mean_by_step(points: list[dict]) -> list[dict]:
    """The learners' mean eval loss at each eval step, placed at their mean time."""
    by: dict = defaultdict(list)
    for p in points:
        by[(p["who"], p["step"])].append(p)
    out = []
    for (who, step), ps in sorted(by.items(), key=lambda kv: (kv[0][0], kv[0][1] or 0)):
        out.append({"who": who, "step": step, "t": round(sum(p["t"] for p in ps) / len(ps), 3),
                    "loss": sum(p["loss"] for p in ps) / len(ps), "n": len(ps)})
    return out


def _finite(v) -> bool:
    return isinstance(v, (int, float)) and math.isfinite(v)


def bucket_s(duration_s: float) -> float:
    """1 s, or the smallest of 2, 5, 10, 20, 30, 60 ... that keeps ≤ MAX_BUCKETS buckets."""
    for b in (1, 2, 5, 10, 20, 30, 60, 120, 300, 600):
        if duration_s / b <= MAX_BUCKETS:
            return float(b)
    return math.ceil(duration_s / MAX_BUCKETS)


def link_rates(log: EventLog, lo: float, hi: float) -> tuple[list[dict], float]:
    """Bytes per second on every (learner, shard) link and direction, in buckets over
    [lo, hi] (seconds from t_start), from the learners' own send / recv lines: `up` is
    learner → shard, `down` shard → learner. Empty buckets are zeros (a gap is real)."""
    t0, _ = metrics.window(log)
    learners = set(metrics.learner_names(log))
    w = bucket_s(max(hi - lo, 1e-9))
    n = int(math.ceil((hi - lo) / w)) or 1
    acc: dict = defaultdict(lambda: [0] * n)
    for e in log.of("send", "recv"):
        if e["src"] not in learners or not e.get("bytes") or not e.get("peer"):
            continue
        i = min(n - 1, max(0, int((e["t"] - t0 - lo) // w)))
        acc[(f"{e['src']}~{e['peer']}", "up" if e["kind"] == "send" else "down")][i] += int(e["bytes"])
    rows = []
    for (link, d), bs in sorted(acc.items()):
        rows += [{"link": link, "dir": d, "t": round(lo + i * w, 3), "Bps": b / w} for i, b in enumerate(bs)]
    return rows, w


def _kbps_Bps(kbps) -> float | None:
    return None if kbps is None else float(kbps) * 1000.0 / 8.0


def link_limits(log: EventLog, links: list[str], faults: list[dict], lo: float, hi: float) -> list[dict]:
    """Each link's configured limit (bytes/s, one direction) as flat pieces {link, seg, t, limit_Bps},
    two rows per piece: the scenario's base `wan.bandwidth_kbps`, a `wan` fault's bandwidth
    while it lasts (the latest started wins), 0 while partitioned. Unlimited stretches have
    no rows. `faults` from timeline.faults_of (absolute times)."""
    t0, _ = metrics.window(log)
    base = _kbps_Bps(((log.header.get("scenario") or {}).get("wan") or {}).get("bandwidth_kbps"))
    rows = []
    for link in links:
        learner, _, shard = link.partition("~")
        mine = [f for f in faults if f["kind"] in ("wan", "partition") and link_hit(f["target"], learner, shard)]
        cuts = sorted({lo, hi} | {min(max(f[k] - t0, lo), hi) for f in mine for k in ("a", "b")})
        for i, (a, b) in enumerate(zip(cuts, cuts[1:])):
            limit = base
            for f in mine:
                if f["a"] - t0 <= a < f["b"] - t0:
                    bw = f["params"].get("bandwidth_kbps")
                    limit = 0.0 if f["kind"] == "partition" else (limit if bw is None else _kbps_Bps(bw))
            if limit is not None and b > a:
                rows += [{"link": link, "seg": i, "t": round(x, 3), "limit_Bps": limit} for x in (a, b)]
    return rows
