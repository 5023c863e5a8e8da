"""Everything one run page shows, as plain data for the template: formatted check rows,
key figures, facts, tables and the Vega-Lite specs. Formatting only: verdicts are
the check results' `valid` fields, passed through."""
from __future__ import annotations

import json
import platform
from datetime import datetime, timezone
from importlib import metadata
from pathlib import Path

from harness.checks import faults_note
from reports import charts, series
from reports import timeline as tlmod
from reports.runs import Run

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
    "global_loss_regression": ("the global model's held-out loss never rises far above its best so far, and ends "
                               "near it", "nats", "loss"),
    "staleness_bounded": ("every merge's staleness is within the bound", "int", "staleness"),
    "goodput_min": ("goodput is at least the bound", "pct", "goodput"),
    "uptime_min": ("uptime is at least the bound", "pct", "goodput"),
    "loss_parity_max": ("final loss is within the bound of the fault-free run's", "parity", "loss"),
    "recovery_max_s": ("every restarted unit is merged again within the bound", "s", "recovery"),
    "rejoin_cycles_max": ("every restarted unit's first merged contribution went out within the bound, "
                          "in fragment cycles of H inner steps from its first step", "cycles", "recovery"),
    "no_crash": ("no process crashed by itself", "count", "timeline"),
}
UNKNOWN_WHY = {
    "loss_parity_max": "no fault-free reference run (or no loss) to compare with",
    "recovery_max_s": "no restart in this run, or a restart too close to the end to tell (censored)",
    "rejoin_cycles_max": "no restart in this run, or a restart too close to the end to tell (censored)",
}
SECTIONS = [("verdict", "Verdict"), ("run", "Run"), ("timeline", "Timeline"), ("loss", "Loss"),
            ("goodput", "Goodput"), ("recovery", "Recovery"), ("staleness", "Staleness"),
            ("bandwidth", "Bandwidth")]


def fmt(v, kind: str) -> str:
    if v is None:
        return "–"
    if isinstance(v, bool) or not isinstance(v, (int, float)):
        return str(v)
    return {"pct": f"{v:.1%}", "parity": f"{v:+.2%}", "s": f"{v:.1f} s", "stall": f"{v:.2f} s",
            "int": f"{v:,.0f}", "count": f"{v:,.0f}", "float": f"{v:.4g}", "loss": f"{v:.4f}",
            "bytes": _bytes(v), "cycles": f"{v:.2g} cycles", "nats": f"{v:.3f} nats"}.get(kind, str(v))


def _bytes(v: float) -> str:
    for unit in ("B", "kB", "MB", "GB", "TB"):
        if abs(v) < 1000:
            return f"{v:.3g} {unit}"
        v /= 1000
    return f"{v:.3g} PB"


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
        why, zoom = "", None
        if status == "unknown":
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
    if name == "global_loss_regression":
        if first.get("end"):
            return (f"the final model's loss {first['final']:.3f} is {first['end_excess']:.3f} nats above the best "
                    f"the run reached ({first['best']:.3f}; bound {first['end_max']:.3f}){more}", None)
        at = first.get("at_s")
        return (f"the global model's loss rose to {first['loss']:.3f} at {at:.1f} s, {first['rise']:.3f} nats "
                f"above its best so far ({first['best_so_far']:.3f}){more}", [at - 3, at + 3])
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
        ("faults", str(len(tlmod.faults_of(run.log, 0.0))) if run.log else "–",
         (f"of {s['faults_scheduled']} scheduled; " if (s.get("faults_scheduled") or 0) > (s.get("faults_applied") or 0)
          else "") + _plural(s.get("restarts") or 0, "restart") + ", shards included", "timeline"),
    ]
    return [{"label": a, "value": b, "sub": c or "", "section": d} for a, b, c, d in figs]


def _plural(n: int, word: str) -> str:
    return f"{n} {word}{'' if n == 1 else 's'}"


def backend_text(b: dict | None, tier: str | None = None) -> str:
    """Where the units ran: `docker — containers from IMAGE on ENGINE`, `local — processes
    on HOST`, `sim — ...`."""
    b = b or {}
    name = b.get("name") or ("sim" if tier == "sim" else "local")
    if name == "docker":
        cpus = f", {b['cpus']} CPU each" if b.get("cpus") else ""
        engines = b.get("engines") or [b.get("engine", "?")]
        if len(engines) > 1:
            by = {e: [u for u, at in (b.get("placement") or {}).items() if at == e] for e in engines}
            where = "engines " + "; ".join(f"{e}: {', '.join(us) or 'none'}" for e, us in by.items())
        else:
            where = f"engine {engines[0]}"
        return f"docker — a container per unit, image {b.get('image', '?')}, {where}{cpus}"
    if name == "sim":
        return "sim — no processes: a discrete-event world in virtual time"
    return f"local — a process per unit on {b.get('host', 'this machine')}"


def facts(run: Run) -> list[tuple[str, str]]:
    h, cfg = run.header, (run.log.config if run.log else {})
    sc = h.get("scenario") or {}
    d = cfg.get("diloco") or {}
    topo = h.get("topology") or {}
    s = run.summary
    t0 = s.get("t_start")
    rows = [
        ("scenario", f"{sc.get('name', run.name)}" + (f" — {sc['description']}" if sc.get("description") else "")),
        ("seed", str(h.get("seed", "–"))),
        ("mode", f"{d.get('mode', s.get('mode'))} ({h.get('tier', '?')} tier)"),
        ("backend", backend_text(topo.get("backend"), h.get("tier"))),
        ("shape", f"M={d.get('learners')} learners × S={d.get('slices')} slices, "
                  f"{len(topo.get('shards') or {}) or '?'} syncer shard(s), P={s.get('fragments')} fragments, "
                  f"H={d.get('sync_every')}, τ={d.get('overlap')}, K={d.get('quorum')}, α={d.get('mixing')}, "
                  f"merge {d.get('merge')}, {d.get('compression')}"),
        ("training", f"{cfg.get('steps')} steps per learner, task {(cfg.get('task') or {}).get('kind')}, "
                     f"{s.get('steps', 0):,} steps / {s.get('tokens', 0):,} tokens logged"),
        ("window", (datetime.fromtimestamp(t0, timezone.utc).strftime("%Y-%m-%d %H:%M:%S UTC") if t0 else "–")
         + f", {fmt(s.get('duration_s'), 's')}"),
        ("run directory", str(run.run_dir)),
    ]
    if h.get("interrupted"):
        rows.append(("interrupted", "yes: the run was cut short; what happened until then is shown"))
    if run.recomputed:
        rows.append(("checks", "run by this report (the run wrote no summary.json)"))
    return rows


def versions(run: Run) -> list[tuple[str, str]]:
    out = [(f"run: {k}", str(v)) for k, v in (run.header.get("versions") or {}).items()]

    def v(pkg: str) -> str:
        try:
            return metadata.version(pkg)
        except metadata.PackageNotFoundError:
            return "?"
    import altair as alt

    out += [("report: diloco-chaos", v("diloco-chaos")), ("report: python", platform.python_version()),
            ("report: jax", v("jax")), ("report: vega-lite", alt.SCHEMA_VERSION)]
    return out


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
             "recovery": "never merged" if r["recovery_s"] is None else fmt(r["recovery_s"], "s"),
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

    link_names = tl.lane_names("link")
    rates, bucket = series.link_rates(log, max(lo, 0.0), hi)
    limits = series.link_limits(log, link_names, tlmod.faults_of(log, hi + s.get("t_start", 0.0)), max(lo, 0.0), hi)
    if link_names:
        specs["links"] = charts.links(rates, limits, link_names, faults, tl.x_domain)
    bpt = [{"who": who, "bytes_per_token": r.summary.get("bytes_per_token")} for who, r in _who_runs(run)
           if r.summary.get("bytes_per_token") is not None]
    if bpt:
        specs["bpt"] = charts.bars(bpt, "bytes_per_token", "bytes sent and received per trained token")
    return specs, bucket


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
        "dropped": s.get("dropped") or {},
        "faults_note": faults_note(s),
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
        "reference_loss": fmt(g("reference_loss"), "loss"), "parity": fmt(g("loss_parity"), "parity"),
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

