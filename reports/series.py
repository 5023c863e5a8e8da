"""Time series a page plots, cut from event logs (times in seconds from each run's t_start):
held-out loss over time, bytes per link over time and each link's bandwidth limit, what
waits unsent on each link direction (`link_buffer` lines, the `done` lines' counters) and
each merge's staleness (with the shards' stale drops). Only counting and bucketing here;
every judgement is in harness.judging.checks."""
from __future__ import annotations

import math
from collections import defaultdict

from diloco_chaos.harness.judging import history
from diloco_chaos.harness.eventlog import EventLog
from diloco_chaos.reports.timeline import link_hit

MAX_BUCKETS = 240  # per link and direction: keeps a long run's page light


def loss_rows(log: EventLog, who: str) -> tuple[list[dict], list[dict]]:
    """(per-learner held-out eval points, the global model's evals) of one run.
    A learner's eval line is its own model on held-out data; the harness's eval with
    `global: true` is the assembled global model: the runner evaluates it after the run,
    along it (from the syncer shards' kept checkpoints, at the times they were taken) and
    at the end (harness/run/global_eval.py)."""
    t0, t1 = history.window(log)
    learners = set(history.learner_names(log))
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
    t0, _ = history.window(log)
    learners = set(history.learner_names(log))
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
    t0, _ = history.window(log)
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


# --- what waits on the links, staleness over time ------------------------------------------------

BUFFER_GAP_S = 3.0   # link_buffer lines come about once a second while bytes wait; a longer silence
                     # after a non-empty line is a break (the process stopped, was paused or killed)
MAX_MERGE_POINTS = 3000  # staleness over time: beyond this, one point per learner and time bucket
MAX_BUFFER_POINTS = 3000  # link buffers: beyond this, each link's highest and lowest line per time bucket


def link_name(src: str, peer: str) -> str:
    """A link direction as the page names it: the writing end first (`learner-1 → syncer-0`:
    what waits in learner-1's outbox for syncer-0)."""
    return f"{src} → {peer}"


def link_buffer_rows(log: EventLog) -> list[dict]:
    """What waits unsent on each link direction over time, from the `link_buffer` lines (one
    about every second while something waits, one more when it empties): {link, t,
    unsent_bytes, frames, superseded, seg, i}. Only links that ever had something waiting.
    `seg` numbers the stretches of one link: a new one starts after a silence of more than
    BUFFER_GAP_S following a non-empty line (no line said it emptied); `i` keeps the order.
    A long run (more than MAX_BUFFER_POINTS lines) keeps, per link, stretch and time bucket
    (`bucket_s`), the line with the most waiting and the one with the least, in time order:
    peaks and emptyings both stay."""
    t0, _ = history.window(log)
    by: dict = defaultdict(list)
    for e in log.of("link_buffer"):
        if e.get("peer"):
            by[(e["src"], e["peer"])].append(e)
    rows = []
    for (src, peer), es in sorted(by.items()):
        if not any(int(e.get("unsent_bytes") or 0) > 0 for e in es):
            continue
        seg, prev = 0, None
        for e in es:
            b = int(e.get("unsent_bytes") or 0)
            if prev is not None and e["t"] - prev["t"] > BUFFER_GAP_S and int(prev.get("unsent_bytes") or 0) > 0:
                seg += 1
            rows.append({"link": link_name(src, peer), "t": round(e["t"] - t0, 3),
                         "unsent_bytes": b, "frames": int(e.get("frames") or 0),
                         "superseded": int(e.get("superseded") or 0), "seg": seg, "i": len(rows)})
            prev = e
    if len(rows) > MAX_BUFFER_POINTS:
        lo = min(r["t"] for r in rows)
        w = bucket_s(max(r["t"] for r in rows) - lo or 1.0)
        keep: dict = {}
        for r in rows:
            k = (r["link"], r["seg"], int((r["t"] - lo) // w))
            hi_, lo_ = keep.get(k, (r, r))
            keep[k] = (r if r["unsent_bytes"] > hi_["unsent_bytes"] else hi_,
                       r if r["unsent_bytes"] < lo_["unsent_bytes"] else lo_)
        kept = sorted({id(x): x for pair in keep.values() for x in pair}.values(), key=lambda r: r["i"])
        rows = [{**r, "i": i} for i, r in enumerate(kept)]
    return rows


def link_counters(log: EventLog) -> list[dict]:
    """Each link direction's counters from its writer's `done` lines (`links.<peer>`): the
    most that waited unsent (`unsent_max`), whole frames replaced by a newer one before they
    went out (`superseded`), connects and traffic; several incarnations: the max of
    unsent_max, the sum of the rest. Only links whose counters include unsent_max or
    superseded (an older log's `done` lines have neither: no rows)."""
    acc: dict = {}
    for e in log.of("done"):
        for peer, st in (e.get("links") or {}).items():
            if not isinstance(st, dict) or not ({"unsent_max", "superseded"} & set(st)):
                continue
            r = acc.setdefault((e["src"], peer), {"link": link_name(e["src"], peer), "src": e["src"], "peer": peer,
                                                  "unsent_max": 0, "superseded": 0, "connects": 0,
                                                  "bytes_sent": 0, "frames_sent": 0, "done_lines": 0})
            r["unsent_max"] = max(r["unsent_max"], int(st.get("unsent_max") or 0))
            for k in ("superseded", "connects", "bytes_sent", "frames_sent"):
                r[k] += int(st.get(k) or 0)
            r["done_lines"] += 1
    return [acc[k] for k in sorted(acc)]


def staleness_rows(log: EventLog) -> tuple[list[dict], float | None]:
    """Every merge's staleness over time: {t, learner, staleness, fragment, seq, shard (when
    there are several)}, and the bucket (s) when a long run was thinned to one point per
    learner and bucket (the stalest merge in it, with n: the merges in the bucket), else None."""
    t0, _ = history.window(log)
    rows = [{"t": round(e["t"] - t0, 3), "learner": e.get("learner"), "staleness": int(e["staleness"]),
             "fragment": e.get("fragment"), "shard": e["src"], "seq": e.get("seq")}
            for e in log.of("merge") if isinstance(e.get("staleness"), (int, float))]
    if len({r["shard"] for r in rows}) == 1:  # one shard: no need to say which on every point
        for r in rows:
            del r["shard"]
    if len(rows) <= MAX_MERGE_POINTS:
        return rows, None
    lo = min(r["t"] for r in rows)
    w = bucket_s(max(r["t"] for r in rows) - lo or 1.0)
    best: dict = {}
    for r in rows:
        k = (r["learner"], int((r["t"] - lo) // w))
        if k not in best:
            best[k] = {**r, "n": 1}
        else:
            n = best[k]["n"] + 1
            if r["staleness"] > best[k]["staleness"]:
                best[k] = {**r, "n": n}
            best[k]["n"] = n
    return sorted(best.values(), key=lambda r: r["t"]), w


def stale_drop_rows(log: EventLog) -> list[dict]:
    """Contributions a shard dropped as too stale (`drop` reason stale): {t, learner,
    staleness, max_staleness, fragment, seq, shard}."""
    t0, _ = history.window(log)
    return [{"t": round(e["t"] - t0, 3), "learner": e.get("learner"), "staleness": e.get("staleness"),
             "max_staleness": e.get("max_staleness"), "fragment": e.get("fragment"), "seq": e.get("seq"),
             "shard": e["src"]}
            for e in log.of("drop") if e.get("reason") == "stale" and isinstance(e.get("staleness"), (int, float))]
