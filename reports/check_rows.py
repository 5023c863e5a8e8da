"""The checks table of a run's page: each check's name, what it means, its value in
words, and for a failed one the first offending line in a sentence with where it is on the
time axis (reports/page.py puts the rows on the page)."""
from __future__ import annotations

import json

STATUS = {True: "pass", False: "fail", None: "unknown"}
# name -> (what it checks, how the value reads, section that shows why)
CHECKS = {
    "merged_at_most_once": ("every contribution is merged at most once", "count", "timeline"),
    "versions_monotonic": ("fragment versions never go backwards", "count", "timeline"),
    "no_nan": ("no loss is NaN or infinite", "count", "loss"),
    "durable_rounds_kept": ("no round acknowledged durable is lost across a syncer restart", "count", "timeline"),
    "no_global_downtime": ("the global model advances whenever a quorum is reachable", "stall", "timeline"),
    "progress_merged_once": ("no inner step of a learner reaches the global model twice for one fragment",
                             "count", "timeline"),
    "delta_bases_advance": ("every merged Δ of a learner was measured from a newer global fragment than its "
                            "previous one, one the shard had sent it (read from the shards' lines alone)",
                            "count", "timeline"),
    "global_loss_regression": ("the global model's held-out loss never rises far above its best so far, and ends "
                               "near it", "nats", "loss"),
    "staleness_bounded": ("every merge's staleness is within the bound", "int", "staleness"),
    "goodput_min": ("goodput is at least the bound", "pct", "goodput"),
    "uptime_min": ("uptime is at least the bound", "pct", "goodput"),
    "loss_parity_max": ("final loss is within the bound of the fault-free run's", "parity", "loss"),
    "baseline_parity_max": ("final loss is within the bound of the known-good baseline's (a fault-free run of "
                            "trusted code, stored)", "parity", "loss"),
    "recovery_max_s": ("every restarted unit is merged again within the bound", "s", "recovery"),
    "rejoin_cycles_max": ("every restarted unit's first merged contribution went out within the bound, "
                          "in fragment cycles of H inner steps from its first step", "cycles", "recovery"),
    "participation_min": ("committed rounds merged at least this many learners on average", "float", "verdict"),
    "link_buffers_bounded": ("what waits unsent on each link stays within what the kernel and the proxy hold "
                             "plus a whole frame per fragment of the shard, a Hello and the frame being written",
                             "bytes", "buffers"),
    "no_crash": ("no process crashed by itself", "count", "timeline"),
    "tokens_conserved": ("every token a learner trained ends in exactly one fate (merged, superseded, lost, "
                         "dropped, in flight), and none is merged twice", "count", "ledger"),
}
UNKNOWN_WHY = {
    "loss_parity_max": "no fault-free reference run (or no loss) to compare with",
    "recovery_max_s": "no restart in this run, or a restart too close to the end to tell (censored)",
    "rejoin_cycles_max": "no restart in this run, or a restart too close to the end to tell (censored)",
    "link_buffers_bounded": "no link buffer counters in the log (a log from before they were written)",
    "participation_min": "no round was committed",
    "tokens_conserved": "contribute lines without token counts (a log from before the ledger)",
}
def fmt(v, kind: str) -> str:
    if v is None:
        return "–"
    if isinstance(v, bool) or not isinstance(v, (int, float)):
        return str(v)
    return {"pct": f"{v:.1%}", "parity": f"{v:+.2%}", "s": f"{v:.1f} s", "stall": f"{v:.2f} s",
            "int": f"{v:,.0f}", "count": f"{v:,.0f}", "float": f"{v:.4g}", "loss": f"{v:.4f}",
            "bytes": _bytes(v), "cycles": f"{v:.2g} cycles", "nats": f"{v:.3f} nats"}.get(kind, str(v))


def ci_text(ci, kind: str) -> str:
    """' (95 % interval a to b)', or '' without an interval."""
    return f" (95 % interval {fmt(ci[0], kind)} to {fmt(ci[1], kind)})" if ci else ""


def _bytes(v: float) -> str:
    for unit in ("B", "kB", "MB", "GB", "TB"):
        if abs(v) < 1000:
            return f"{v:.3g} {unit}"
        v /= 1000
    return f"{v:.3g} PB"


def pace_text(name: str, d: dict, kind: str) -> str:
    """' (2.0 s at the reference pace; this run's pace 1.6)' for a check whose bound or value
    was scaled by the run's measured pace (harness/judging/pace.py), else ''."""
    p = d.get("pace")
    if not isinstance(p, (int, float)) or p <= 1.0:
        return ""
    if name == "goodput_min" and d.get("goodput_raw") is not None:
        return f" (judged at the reference pace; raw goodput {fmt(d['goodput_raw'], 'pct')}, this run's pace {p:.2g})"
    raw = d.get("bound_at_reference_pace_s", d.get("bound_raw_s"))
    return f" ({fmt(raw, kind)} at the reference pace; this run's pace {p:.2g})" if raw is not None else ""


def check_rows(checks: list[dict], t_start: float | None = None) -> list[dict]:
    """One row per check result, failures first, then unknown, then passes. `zoom`: the
    span (seconds from t_start) of its first offending line, for the timeline."""
    rows = []
    for c in checks:
        what, kind, section = CHECKS.get(c["name"], (c["name"], "float", "verdict"))
        status = STATUS.get(c.get("valid"))
        value, bound = c.get("value"), c.get("bound")
        rel = "≥" if c["name"].endswith("_min") else "≤"
        if kind == "count":
            value_txt, bound_txt = f"{fmt(value, 'count')} violation{'s' if value != 1 else ''}", fmt(bound, "count")
        else:
            value_txt, bound_txt = fmt(value, kind), fmt(bound, kind)
        details = c.get("details") or {}
        bound_txt += pace_text(c["name"], details, kind)
        ci = details.get("ci") if c["name"] == "loss_parity_max" else None
        if ci:
            value_txt += f" [{fmt(ci[0], kind)}, {fmt(ci[1], kind)}]"
        why, zoom = "", None
        if status == "unknown" and ci:
            why = (f"its 95 % interval [{fmt(ci[0], kind)}, {fmt(ci[1], kind)}] holds the bound: "
                   f"the eval cannot tell (raise task.final_eval_batches)")
        elif status == "fail" and ci:
            why = f"the whole 95 % interval [{fmt(ci[0], kind)}, {fmt(ci[1], kind)}] is over the bound"
        elif status == "unknown":
            why = details.get("why") or UNKNOWN_WHY.get(c["name"], "the log cannot tell")
        elif status == "fail":
            why, zoom = _why_failed(c["name"], details, t_start)
        rows.append({"name": c["name"], "what": what, "status": status, "value": value_txt, "bound": bound_txt,
                     "rel": rel, "section": section, "why": why, "zoom": zoom,
                     "details": json.dumps(details, indent=1, default=str)[:6000] if details else ""})
    order = {"fail": 0, "unknown": 1, "pass": 2}
    return sorted(rows, key=lambda r: order[r["status"]])


def _why_failed(name: str, d: dict, t_start: float | None) -> tuple[str, list | None]:
    """The first offending line in words, and where it is on the time axis."""
    v = d.get("violations") or d.get("late") or d.get("never") or d.get("crashes") or []
    if not v or not isinstance(v[0], dict):
        return "", None
    first, more = v[0], f" ({len(v)}{'+' if len(v) >= 10 else ''} in all)" if len(v) > 1 else ""
    if "from_s" in first:  # no_global_downtime
        return (f"no commit from {first['from_s']:.2f} s to {first['to_s']:.2f} s although a quorum was reachable "
                f"for {first.get('reachable_s', 0):.2f} s of it{more}", [first["from_s"] - 2, first["to_s"] + 2])
    if name == "link_buffers_bounded" and "unsent_max" in first:  # the worst link, not the first
        w = max((x for x in v if isinstance(x, dict) and "unsent_max" in x), key=lambda x: x["unsent_max"])
        links = f" ({len(v)}{'+' if len(v) >= 10 else ''} links over)" if len(v) > 1 else ""
        return (f"{w.get('src')} → {w.get('peer')} had up to {_bytes(w['unsent_max'])} waiting unsent "
                f"(bound {_bytes(w.get('bound') or 0)}){links}", None)
    if name == "global_loss_regression":
        if first.get("end"):
            return (f"the final model's loss {first['final']:.3f} is {first['end_excess']:.3f} nats above the best "
                    f"the run reached ({first['best']:.3f}; bound {first['end_max']:.3f}){more}", None)
        at = first.get("at_s")
        return (f"the global model's loss rose to {first['loss']:.3f} at {at:.1f} s, {first['rise']:.3f} nats "
                f"above its best so far ({first['best_so_far']:.3f}){more}", [at - 3, at + 3])
    if name == "no_crash" and "rc" in first:  # the harness's crash entries (harness/backends/runner.py)
        when = "on the run's graceful stop" if first.get("at") == "stop" else "by itself during the run"
        last = (first.get("stdout_tail") or [""])[-1]
        return (f"{first['unit']} (incarnation {first.get('incarnation')}) exited with code {first['rc']} {when}"
                + (f"; its output ends: {last}" if last else "") + more, None)
    if "t_s" in first and name == "rejoin_cycles_max":
        n = first.get("rejoin_steps")
        took = (f"ran {first.get('steps_run')} inner steps and none of its contributions was merged" if n is None
                else f"first had a contribution merged after {n} inner steps "
                     f"({first.get('rejoin_cycles'):.2g} cycles of H = {first.get('sync_every')})")
        rs = first.get("recovery_s")
        return (f"{first['unit']} restarted at {first['t_s']:.1f} s and {took}{more}",
                [first["t_s"] - 2, first["t_s"] + (rs or 10) + 2])
    if "t_s" in first:  # recovery_max_s
        rs = first.get("recovery_s")
        took = "was never merged again" if rs is None else f"took {rs:.1f} s"
        return (f"{first['unit']} restarted at {first['t_s']:.1f} s and {took}{more}",
                [first["t_s"] - 2, first["t_s"] + (rs or 10) + 2])
    text = ", ".join(f"{k}={_short(x)}" for k, x in first.items() if k != "t") + more
    if isinstance(first.get("t"), (int, float)) and t_start is not None:
        t = first["t"] - t_start
        return f"at {t:.2f} s: {text}", [t - 3, t + 3]
    return text, None


def _short(x) -> str:
    """A violation's field for the failure sentence: numbers rounded, lists and text cut short."""
    if isinstance(x, float):
        return f"{x:.4g}"
    text = str(x)
    return text if len(text) <= 40 else text[:37] + "..."
