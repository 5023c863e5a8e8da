"""The self-contained HTML page of `diloco-chaos fleet`: curves, tables, parameters.

Inline SVG and CSS only: no script, no font, no request to anything. Renders
the result dict of `harness.fleet.model.simulate`; it computes nothing of its own.
"""
from __future__ import annotations

import html
import math

from diloco_chaos.harness.fleet.model import PARAM_DOC, format_duration, short_count

COLORS = {"dp_no_elastic": "#c0392b", "elastic_dp": "#e67e22", "ddl_m1": "#8e6c3a",
          "ddl_m2": "#7fb3d5", "ddl_m4": "#2e86c1", "ddl_m8": "#1a5276", "ddl_m16": "#117a65"}
OTHER = ["#6c3483", "#b7950b", "#5d6d7e", "#1e8449"]
W, H, LEFT, RIGHT, TOP, BOTTOM = 760, 400, 56, 170, 20, 44


def _color(name: str, i: int) -> str:
    return COLORS.get(name, OTHER[i % len(OTHER)])


def _x(chips: list[int], n: int) -> float:
    lo, hi = math.log(min(chips)), math.log(max(chips))
    frac = 0.5 if hi == lo else (math.log(n) - lo) / (hi - lo)
    return LEFT + frac * (W - LEFT - RIGHT)


def _y(value: float) -> float:
    return TOP + (1.0 - value) * (H - TOP - BOTTOM)


def chart(res: dict, key: str | None, title: str) -> str:
    """SVG line chart of res[policy] (key None: goodput) or res[key][policy] vs chips (log axis)."""
    chips = res["chips"]
    e = html.escape
    out = [f'<svg viewBox="0 0 {W} {H}" width="{W}" height="{H}" role="img" aria-label="{e(title)}">']
    for pct in range(0, 101, 20):
        y = _y(pct / 100)
        out.append(f'<line x1="{LEFT}" x2="{W - RIGHT}" y1="{y:.1f}" y2="{y:.1f}" class="grid"/>'
                   f'<text x="{LEFT - 6}" y="{y + 4:.1f}" text-anchor="end">{pct}%</text>')
    for n in chips:
        x = _x(chips, n)
        out.append(f'<line x1="{x:.1f}" x2="{x:.1f}" y1="{TOP}" y2="{H - BOTTOM}" class="grid"/>'
                   f'<text x="{x:.1f}" y="{H - BOTTOM + 16}" text-anchor="middle">{short_count(n)}</text>')
    out.append(f'<text x="{(LEFT + W - RIGHT) / 2:.0f}" y="{H - 8}" text-anchor="middle">chips (log scale)</text>')
    for i, name in enumerate(res["policies"]):
        vals = res[name] if key is None else res[key][name]
        pts = " ".join(f"{_x(chips, n):.1f},{_y(v):.1f}" for n, v in zip(chips, vals))
        dash = ' stroke-dasharray="6 4"' if name == "ddl_m1" else ""  # lies on elastic_dp
        c = _color(name, i)
        out.append(f'<polyline points="{pts}" fill="none" stroke="{c}" stroke-width="2"{dash}/>')
        out += [f'<circle cx="{_x(chips, n):.1f}" cy="{_y(v):.1f}" r="3" fill="{c}">'
                f'<title>{e(name)} at {n:,} chips: {100 * v:.1f}%</title></circle>' for n, v in zip(chips, vals)]
        ly = TOP + 14 + 18 * i
        out.append(f'<line x1="{W - RIGHT + 12}" x2="{W - RIGHT + 34}" y1="{ly - 4}" y2="{ly - 4}" '
                   f'stroke="{c}" stroke-width="2"{dash}/><text x="{W - RIGHT + 40}" y="{ly}">{e(name)}</text>')
    if key is None:
        out += _paper_marks(res)
    out.append("</svg>")
    return "\n".join(out)


def _paper_marks(res: dict) -> list[str]:
    """Hollow squares: the published goodput the defaults were calibrated to."""
    chips, paper, out = res["chips"], res["paper"], []
    lo, hi = min(chips), max(chips)
    for i, name in enumerate(res["policies"]):
        if name not in paper:
            continue
        for n, pct in zip(paper["chips"], paper[name]):
            if lo <= n <= hi:
                x, y = _x(chips, n), _y(pct / 100)
                out.append(f'<rect x="{x - 5:.1f}" y="{y - 5:.1f}" width="10" height="10" fill="none" '
                           f'stroke="{_color(name, i)}" stroke-width="1.5"><title>paper, {name} at {n:,} chips: '
                           f'{pct}%</title></rect>')
    ly = TOP + 14 + 18 * len(res["policies"])
    out.append(f'<rect x="{W - RIGHT + 18}" y="{ly - 9}" width="10" height="10" fill="none" stroke="#333"/>'
               f'<text x="{W - RIGHT + 40}" y="{ly}">paper (calibration)</text>')
    return out


def table(res: dict, key: str | None) -> str:
    chips, e = res["chips"], html.escape
    head = "".join(f"<th>{short_count(n)}</th>" for n in chips)
    rows = []
    for name in res["policies"]:
        vals = res[name] if key is None else res[key][name]
        rows.append(f"<tr><th>{e(name)}</th>" + "".join(f"<td>{100 * v:.1f}%</td>" for v in vals) + "</tr>")
        if key is None and name in res["paper"]:
            ref = dict(zip(res["paper"]["chips"], res["paper"][name]))
            rows.append(f'<tr class="paper"><th>paper {e(name)}</th>'
                        + "".join(f"<td>{ref[n]}%</td>" if n in ref else "<td></td>" for n in chips) + "</tr>")
    return f"<table><tr><th>policy</th>{head}</tr>{''.join(rows)}</table>"


def badput_table(res: dict) -> str:
    """Where the lost chip-time went, at the largest fleet."""
    i, n = len(res["chips"]) - 1, res["chips"][-1]
    rows = "".join(
        f"<tr><th>{html.escape(name)}</th>"
        + "".join(f"<td>{100 * res['badput'][name][k][i]:.1f}%</td>" for k in ("recovery", "rollback", "slice_away"))
        + "</tr>" for name in res["policies"])
    return (f"<table><caption>badput at {n:,} chips (share of allocated chip-time)</caption>"
            f"<tr><th>policy</th><th>paused (detect + restart / reconfigure)</th><th>rolled back</th>"
            f"<th>slice away for repair</th></tr>{rows}</table>")


def params_table(res: dict) -> str:
    rows = "".join(f"<tr><th>{html.escape(k)}</th><td>{_fmt(k, v)}</td><td>{html.escape(PARAM_DOC.get(k, ''))}</td></tr>"
                   for k, v in res["params"].items())
    return f"<table><tr><th>parameter</th><th>value</th><th>meaning</th></tr>{rows}</table>"


def _fmt(key: str, v) -> str:
    if v is None:  # mtbi_s = inf is stored as null
        return "never"
    return format_duration(v) if key.endswith("_s") else f"{v:g}"


CSS = """body{font:14px system-ui,sans-serif;margin:24px auto;max-width:1000px;color:#222}
svg text{font-size:12px;fill:#333} .grid{stroke:#ddd} table{border-collapse:collapse;margin:8px 0 20px}
th,td{border:1px solid #ccc;padding:3px 8px;text-align:right} th{background:#f4f4f4} tr.paper td,tr.paper th{color:#777}
caption{text-align:left;font-weight:600;padding:4px 0} td:last-child{text-align:left}"""


def render(res: dict) -> str:
    p = res["params"]
    lede = (f"MTBI {_fmt('mtbi_s', p['mtbi_s'])} per chip, a {_fmt('job_s', p['job_s'])} job, seed {res['seed']}. "
            "Goodput = productive chip-time / allocated chip-time; uptime = share of wall time in which "
            "the global model advances. Model and calibration: docs/FLEET.md.")
    return f"""<!doctype html>
<html lang="en"><head><meta charset="utf-8"><title>diloco-chaos fleet: goodput vs chips</title>
<style>{CSS}</style></head><body>
<h1>Fleet-scale goodput: Decoupled DiLoCo vs data-parallel</h1>
<p>{html.escape(lede)}</p>
<h2>Goodput</h2>
{chart(res, None, "goodput vs chips")}
{table(res, None)}
<h2>Uptime</h2>
{chart(res, "uptime", "uptime vs chips")}
{table(res, "uptime")}
<h2>Badput</h2>
{badput_table(res)}
<h2>Parameters</h2>
{params_table(res)}
</body></html>
"""
