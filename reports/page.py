"""Everything one run page shows, as plain data for the template: formatted check rows,
key figures, facts, tables and the Vega-Lite specs. Formatting only: verdicts are
the check results' `valid` fields, passed through."""
from __future__ import annotations

import json
from pathlib import Path

from diloco_chaos.harness.judging.checks import faults_note, stop_note
from diloco_chaos.reports import charts, fates, series
from diloco_chaos.reports import timeline as tlmod
from diloco_chaos.reports.runs import Run
from diloco_chaos.reports.check_rows import STATUS, check_rows, ci_text, fmt
from diloco_chaos.reports.run_facts import facts, versions


SECTIONS = [("verdict", "Verdict"), ("run", "Run"), ("timeline", "Timeline"), ("loss", "Loss"),
            ("goodput", "Goodput"), ("recovery", "Recovery"), ("staleness", "Staleness"),
            ("ledger", "Token fates"), ("bandwidth", "Bandwidth"), ("buffers", "Link buffers")]
# what a `drop` line's reason means, for the staleness section's counts
DROP_WHY = {
    "stale": "a shard dropped a contribution staler than max_staleness",
    "unanswered": "a learner skipped its turn: its last contribution of that fragment was not answered yet",
    "combined": "two contributions that waited unsent were summed into one",
    "superseded": "a contribution that waited unsent was replaced by a newer one",
    "awaiting_fetch": "a learner's turn came while it waited for the fragment's fetch",
    "old_version": "a learner ignored an update older than the version it had",
}
SYMLOG_AT = 4.0  # a chart's y axis turns symlog when its top is this many times its ordinary values
STARVED_ROWS = 30  # the link buffers section lists the first this many `starved` lines


def _fault_rows(tl) -> list[dict]:
    return [{k: f[k] for k in ("label", "params", "t0", "t1", "kind", "target")} for f in tl.faults]


def _who_runs(run: Run) -> list[tuple[str, Run]]:
    out = [("run", run)]
    if run.reference is not None:
        out.append(("reference", run.reference))
    if run.dp is not None:
        out.append(("dp", run.dp))
    return out


def key_figures(run: Run) -> list[dict]:
    s = run.summary
    dp = run.dp.summary if run.dp is not None else {}
    ref = run.reference.summary if run.reference is not None else {}
    bpt_ratio = (dp.get("bytes_per_token") / s["bytes_per_token"]
                 if dp.get("bytes_per_token") and s.get("bytes_per_token") else None)
    figs = [
        ("goodput", fmt(s.get("goodput"), "pct"), dp and f"dp {fmt(dp.get('goodput'), 'pct')}", "goodput"),
        ("uptime", fmt(s.get("uptime"), "pct"), dp and f"dp {fmt(dp.get('uptime'), 'pct')}", "goodput"),
        ("final loss", fmt(s.get("final_loss"), "loss"),
         f"parity {fmt(s.get('loss_parity'), 'parity')}" if s.get("loss_parity") is not None
         else (ref and f"ref {fmt(ref.get('final_loss'), 'loss')}"), "loss"),
        ("slowest recovery", fmt(s.get("recovery_max_s"), "s"), _plural(len(s.get("recovery") or []), "learner restart"),
         "recovery"),
        ("bytes / token", fmt(s.get("bytes_per_token"), "int"),
         bpt_ratio and f"dp sends {bpt_ratio:,.1f}× more", "bandwidth"),
        ("max staleness", fmt(s.get("staleness_max"), "int"), f"mean {fmt(s.get('staleness_mean'), 'float')}",
         "staleness"),
        *_buffer_figure(run),
        ("faults", str(len(tlmod.faults_of(run.log, 0.0))) if run.log else "–",
         (f"of {s['faults_scheduled']} scheduled; " if (s.get("faults_scheduled") or 0) > (s.get("faults_applied") or 0)
          else "") + _plural(s.get("restarts") or 0, "restart") + ", shards included", "timeline"),
    ]
    return [{"label": a, "value": b, "sub": c or "", "section": d} for a, b, c, d in figs]


def _buffer_figure(run: Run) -> list[tuple]:
    """`most unsent`: the largest backlog any link had (the check's value, else the log's
    counters) and its bound; absent for a log without link buffer counters."""
    chk = _check(run.summary, "link_buffers_bounded")
    most = chk.get("value")
    if most is None and run.log is not None:
        most = max([r["unsent_bytes"] for r in series.link_buffer_rows(run.log)]
                   + [r["unsent_max"] for r in series.link_counters(run.log)], default=None)
    if most is None:
        return []
    starved = len(run.log.of("starved")) if run.log is not None else 0
    sub = "; ".join(x for x in (f"bound {fmt(chk['bound'], 'bytes')}" if chk.get("bound") is not None else "",
                                "starved " + _plural(starved, "time") if starved else "") if x)
    return [("most unsent", fmt(most, "bytes"), sub, "buffers")]


def _check(summary: dict, name: str) -> dict:
    return next((c for c in summary.get("checks") or [] if c.get("name") == name), {})


def _plural(n: int, word: str) -> str:
    return f"{n} {word}{'' if n == 1 else 's'}"


def schedule_rows(run: Run, tl) -> list[dict]:
    applied = {f["id"]: f for f in tl.faults}
    rows = []
    for i, f in enumerate(run.header.get("schedule") or []):
        a = applied.get(i)
        end = f.get("duration_s", f.get("down_for_s"))
        rows.append({"kind": f.get("kind"), "target": f.get("target"), "at": fmt(f.get("at_s"), "s"),
                     "for": "never ends" if end is None else fmt(end, "s"),
                     "params": tlmod._params_text({k: v for k, v in f.items() if k not in ("duration_s", "down_for_s")}),
                     "applied": f"{a['t0']:.1f} – {a['t1']:.1f} s" if a else "not applied",
                     "via": a["via"] if a else "–",
                     "z0": a["t0"] if a else None, "z1": a["t1"] if a else None})
    return rows


def recovery_rows(run: Run) -> list[dict]:
    s = run.summary
    chks = [c for c in s.get("checks") or [] if c["name"] in ("recovery_max_s", "rejoin_cycles_max")]
    marks: dict = {}
    for chk in chks:
        for k in ("late", "never", "censored"):
            for r in (chk.get("details") or {}).get(k) or []:
                marks.setdefault((r["unit"], r["incarnation"]), []).append(
                    k + (" (rejoin)" if chk["name"] == "rejoin_cycles_max" else ""))

    def rejoin(r: dict) -> str:
        if r.get("rejoin_steps") is None:
            return "–"
        cycles = f" ({r['rejoin_cycles']:.2g} cycles)" if r.get("rejoin_cycles") is not None else ""
        return f"{r['rejoin_steps']} steps{cycles}"

    return [{"unit": r["unit"], "incarnation": r["incarnation"], "t": fmt(r["t_s"], "s"),
             "start": {"spare_booting": "spare (still booting)"}.get(r.get("start"), r.get("start") or "cold"),
             "recovery": "never merged" if r["recovery_s"] is None else fmt(r["recovery_s"], "s"),
             "cycles": "–" if r.get("recovery_cycles") is None else f"{r['recovery_cycles']:.2g}",
             "boot": fmt(r.get("boot_s"), "s"), "rejoin_s": fmt(r.get("rejoin_s"), "s"), "rejoin": rejoin(r),
             "mark": ", ".join(marks.get((r["unit"], r["incarnation"]), ["ok"] if chks else [])),
             "z0": r["t_s"] - 2, "z1": r["t_s"] + (r["recovery_s"] or 10) + 2}
            for r in s.get("recovery") or []]


def chart_specs(run: Run, tl) -> tuple[dict[str, dict], float]:
    """Every chart's Vega-Lite spec (absent: nothing to draw) and the link-rate bucket (s)."""
    s, log = run.summary, run.log
    faults = _fault_rows(tl)
    lo, hi = tl.x_domain
    specs: dict[str, dict] = {"timeline": charts.timeline(tl, tl.lane_names(), faults)}

    pts, glob = series.loss_rows(log, "run")
    means = series.mean_by_step(pts)
    for who, r in _who_runs(run)[1:]:
        if r.log is not None:
            p2, g2 = series.loss_rows(r.log, who)
            means += series.mean_by_step(p2)
            glob += g2
    if pts or glob:
        far = max([r["t"] for r in means + glob] + [hi])  # a slower companion run ends later
        specs["loss"] = charts.loss(pts, means, glob, s.get("loss_floor"), faults, (lo, far + 0.02 * (far - lo)))

    bad = []
    for who, r in _who_runs(run):
        rs = r.summary
        bad.append({"who": who, "bucket": "productive", "share": rs.get("goodput") or 0.0,
                    "seconds": rs.get("productive_s") or 0.0})
        bad += [{"who": who, "bucket": k, "share": v, "seconds": (rs.get("badput_s") or {}).get(k, 0.0)}
                for k, v in (rs.get("badput") or {}).items()]
    specs["badput"] = charts.badput(bad)
    lg = [{"learner": k, "goodput": v} for k, v in (s.get("learner_goodput") or {}).items()]
    if lg:
        specs["learner_goodput"] = charts.learner_goodput(lg)

    rec = [{"recovery_s": r["recovery_s"]} for r in s.get("recovery") or [] if r["recovery_s"] is not None]
    rec_chk = next((c for c in s.get("checks") or [] if c["name"] == "recovery_max_s"), {})
    if rec:
        specs["recovery"] = charts.histogram(rec, "recovery_s", "seconds from restart to first merge",
                                             rec_chk.get("bound"), step=_rec_step(rec, rec_chk.get("bound")),
                                             color="#fd8d3c")
    hist = [{"staleness": int(k), "count": v} for k, v in (s.get("staleness_hist") or {}).items()]
    st_chk = next((c for c in s.get("checks") or [] if c["name"] == "staleness_bounded"), {})
    if hist:
        specs["staleness"] = charts.histogram(hist, "staleness", "staleness (outer rounds since its base version)",
                                              st_chk.get("bound"), discrete=True)

    merges, thinned = series.staleness_rows(log)
    drops = series.stale_drop_rows(log)
    bound = staleness_bound(log)
    if merges or drops:
        ordinary = max([r["staleness"] for r in merges] + [bound or 0, 2])
        top = max([r["staleness"] for r in merges] + [d["staleness"] for d in drops] + [bound or 0])
        specs["staleness_time"] = charts.staleness_time(merges, drops, bound, faults, tl.x_domain,
                                                        top > SYMLOG_AT * (bound or ordinary))

    link_names = tl.lane_names("link")
    rates, bucket = series.link_rates(log, max(lo, 0.0), hi)
    limits = series.link_limits(log, link_names, tlmod.faults_of(log, hi + s.get("t_start", 0.0)), max(lo, 0.0), hi)
    if link_names:
        specs["links"] = charts.links(rates, limits, link_names, faults, tl.x_domain)
    bpt = [{"who": who, "bytes_per_token": r.summary.get("bytes_per_token")} for who, r in _who_runs(run)
           if r.summary.get("bytes_per_token") is not None]
    if bpt:
        specs["bpt"] = charts.bars(bpt, "bytes_per_token", "bytes sent and received per trained token")

    buf = series.link_buffer_rows(log)
    if buf:
        rule = buffer_bound(s)
        specs["buffers"] = charts.link_buffers(buf, rule, faults, tl.x_domain, _buffers_symlog(buf, rule))
    return {**specs, **fates.specs(s)}, bucket


def staleness_bound(log) -> int | None:
    """The run's `diloco.max_staleness` where a shard applies it (decoupled mode; 0: none)."""
    d = log.config.get("diloco") or {}
    return (int(d.get("max_staleness") or 0) or None) if d.get("mode", "decoupled") == "decoupled" else None


def buffer_bound(s: dict) -> dict | None:
    """The link_buffers_bounded check's bound as the buffer chart's rule (None: no such check
    in the summary, or it could not be decided)."""
    c = _check(s, "link_buffers_bounded")
    if c.get("bound") is None:
        return None
    d = c.get("details") or {}
    return {"bytes": c["bound"], "what": "link_buffers_bounded bound", "held_bytes": d.get("held_bytes"),
            "frame_bytes": d.get("frame_bytes")}


def _buffers_symlog(rows: list[dict], rule: dict | None) -> bool:
    """Symlog when the largest backlog dwarfs the bound (or, without one, the median link's peak)."""
    peaks: dict = {}
    for r in rows:
        peaks[r["link"]] = max(peaks.get(r["link"], 0), r["unsent_bytes"])
    ps = sorted(peaks.values())
    ref = rule["bytes"] if rule else ps[len(ps) // 2]
    return max(ps) > SYMLOG_AT * max(ref, 1)


def context(run: Run, test: dict | None = None) -> dict:
    """The template's variables for one run page."""
    s = run.summary
    tl = tlmod.build(run.log, s)
    specs, bucket = chart_specs(run, tl)
    rows = check_rows(s.get("checks") or [], s.get("t_start"))
    dp_rows = check_rows(run.dp.summary.get("checks") or [], None) if run.dp is not None else []
    return {
        "title": f"{run.name} — diloco-chaos report",
        "name": run.name, "status": STATUS.get(s.get("valid")), "checks": rows, "dp_checks": dp_rows,
        "dp_status": STATUS.get(run.dp.summary.get("valid")) if run.dp is not None else None,
        "counts": {k: sum(r["status"] == k for r in rows) for k in ("fail", "unknown", "pass")},
        "figures": key_figures(run), "facts": facts(run), "versions": versions(run),
        "replay": run.header.get("replay") or f"diloco-chaos replay {run.run_dir}",
        "scenario_toml": _scenario_text(run), "schedule": schedule_rows(run, tl),
        "lanes": tl.lanes, "recovery": recovery_rows(run), "specs": specs, "sections": SECTIONS,
        "links": [{"name": f"{l['learner']}~{l['shard']}",
                   "up": fmt(l["up_bytes"], "bytes"), "down": fmt(l["down_bytes"], "bytes"),
                   "mean": fmt(l["mean_Bps"], "bytes") + "/s", "peak": fmt(l["peak_Bps"], "bytes") + "/s"}
                  for l in s.get("links") or []],
        "bucket_s": bucket, "n": numbers(s), "test": test, "run_dir": str(run.run_dir),
        "companions": _companions(run), "crashes": run.header.get("crashes") or [],
        "dropped": s.get("dropped") or {}, "drop_why": DROP_WHY,
        "buffers": buffer_context(run, s), "stal": staleness_context(run, specs),
        "faults_note": faults_note(s), "stop_note": stop_note(s), "fates": fates.context(s),
    }


def staleness_context(run: Run, specs: dict) -> dict:
    """The staleness-over-time chart's legend: the bound it draws, how many stale drops,
    whether a long run's merges were thinned (and to what bucket)."""
    spec = specs.get("staleness_time") or {}
    data = spec.get("datasets") or {}
    bound = (data.get("max_staleness") or [{}])[0].get("staleness")
    thinned = any("n" in r for r in data.get("merges") or [])
    w = series.staleness_rows(run.log)[1] if thinned and run.log is not None else None
    return {"max_staleness": bound, "stale_drops": len(data.get("stale_drops") or []),
            "thinned": fmt(w, "s") if w else None}


def buffer_context(run: Run, s: dict) -> dict:
    """The link buffers section: each link direction's counters from the `done` lines, the
    `starved` lines, and the check's bound and what it is made of."""
    log = run.log
    chk = _check(s, "link_buffers_bounded")
    d = chk.get("details") or {}
    over = {(v.get("src"), v.get("peer")) for v in d.get("violations") or [] if isinstance(v, dict)}
    peaks = d.get("peaks") or {}
    counters = series.link_counters(log) if log is not None else []
    t0 = s.get("t_start") or 0.0
    starved = [{"learner": e["src"], "shard": e.get("shard"), "t": fmt(e["t"] - t0, "s"),
                "cycles": f"{e['silent_cycles']:.2f}" if isinstance(e.get("silent_cycles"), (int, float)) else "–",
                "steps": e.get("silent_steps", "–"), "heard": e.get("heard_step", "–"),
                "step": e.get("step", "–"),
                "tries": e.get("tries", "–"), "z0": e["t"] - t0 - 5, "z1": e["t"] - t0 + 5}
               for e in (log.of("starved") if log is not None else [])]
    return {
        "rows": [{"link": r["link"], "unsent_max": fmt(r["unsent_max"], "bytes"),
                  "peak": fmt(peaks.get(f"{r['src']}~{r['peer']}"), "bytes"),
                  "superseded": f"{r['superseded']:,}", "connects": f"{r['connects']:,}",
                  "frames_sent": f"{r['frames_sent']:,}", "over": (r["src"], r["peer"]) in over}
                 for r in counters],
        "lines": len(log.of("link_buffer")) if log is not None else 0,
        "bound": fmt(chk.get("bound"), "bytes") if chk.get("bound") is not None else None,
        "held": fmt(d.get("held_bytes"), "bytes") if d.get("held_bytes") is not None else None,
        "frame": fmt(d.get("frame_bytes"), "bytes") if d.get("frame_bytes") is not None else None,
        "status": STATUS.get(chk.get("valid")) if chk else None,
        "starved": starved[:STARVED_ROWS], "starved_n": len(starved),
    }


def numbers(s: dict) -> dict:
    """The summary's figures as the prose of the page quotes them ('–' when absent)."""
    g = s.get
    return {
        "goodput": fmt(g("goodput"), "pct"), "uptime": fmt(g("uptime"), "pct"), "allocated": fmt(g("allocated_s"), "s"),
        "learners": fmt(g("learners"), "int"), "duration": fmt(g("duration_s"), "s"),
        "gap_bound": fmt(g("commit_gap_bound_s"), "stall"), "final_loss": fmt(g("final_loss"), "loss"),
        "final_loss_from": {"global": "the global model", "learners": "mean of the learners' own models"}.get(
            g("final_loss_from"), "no eval"),
        "reference_loss": fmt(g("reference_loss"), "loss"),
        "parity": fmt(g("loss_parity"), "parity") + ci_text(g("loss_parity_ci"), "parity"),
        "final_loss_ci": ci_text(g("final_loss_ci"), "loss").strip(),
        "excess_ratio": fmt(g("excess_loss_ratio"), "float"),
        "floor": fmt(g("loss_floor"), "loss"), "floor_gap": fmt(g("floor_gap"), "loss"),
        "staleness_mean": fmt(g("staleness_mean"), "float"), "staleness_max": fmt(g("staleness_max"), "int"),
        "merges": fmt(g("merges"), "int"), "bytes_total": fmt(g("bytes_total"), "bytes"),
        "peak": fmt(g("peak_Bps"), "bytes"), "rate_window": "1 s",
    }


def _rec_step(rec: list[dict], bound) -> float:
    top = max([r["recovery_s"] for r in rec] + [bound or 0])
    for step in (0.5, 1, 2, 5, 10, 20, 30, 60, 120):
        if top / step <= 20:
            return step
    return 300


def _scenario_text(run: Run) -> str:
    p = run.run_dir / "scenario.toml"
    if p.exists():
        return p.read_text()
    return json.dumps(run.header.get("scenario") or {}, indent=1)


def _companions(run: Run) -> list[dict]:
    out = []
    for who, r in _who_runs(run)[1:]:
        page = r.run_dir / "report.html"
        out.append({"who": who, "dir": str(r.run_dir), "page": page if page.exists() else None,
                    "status": STATUS.get(r.summary.get("valid"))})
    return out


def relative_links(ctx: dict, page_dir: Path) -> None:
    """Companion pages as links relative to where this page is written."""
    import os

    for c in ctx["companions"]:
        c["href"] = os.path.relpath(c["page"], page_dir) if c["page"] else None
