"""The report's "Run" section: what ran (scenario, seed, mode, shape), where its units ran
(`backend_text`: processes, containers on which engines, the simulator) and with which
versions; reports/page.py puts them on the page."""
from __future__ import annotations

import platform
from datetime import datetime, timezone
from importlib import metadata

from diloco_chaos.reports.check_rows import fmt
from diloco_chaos.reports.runs import Run


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
        shipped = (f"; on {', '.join(b['shipped'])} the code shipped and nothing shared but the network"
                   if b.get("shipped") else "")
        return f"docker — a container per unit, image {b.get('image', '?')}, {where}{cpus}{shipped}"
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
