"""Vega-Lite specs of a run page, built with Altair (vega-embed renders them in the page).

Why Vega-Lite: the page stays one self-contained file (vega + vega-lite + vega-embed
inlined are ~0.9 MB; Plotly's bundle alone is ~4.6 MB of the 5 MB budget), a spec is
data (JSON the tests can read), and its signals let one brush zoom every time axis on
the page together. Data goes in by name (`datasets`) after Altair has built the
structure: Altair copies and validates inline rows, which costs seconds for a long run.

Every time chart has x in seconds from t_start, a `xzoom` parameter that the page's
script sets when the timeline's overview is brushed (scale.domainRaw), and the fault
bands shaded.
"""
from __future__ import annotations

import altair as alt

from diloco_chaos.faults.kinds import FAULT_KINDS

WIDTH = 900  # plot area; with the lane labels a chart fits the 1080 px page
ZOOM = "xzoom"
FULL_LOSS = "loss_full"  # the loss chart's checkbox: the whole range instead of the clipped view
T_TITLE = "seconds from training start"

STATE_COLORS = {  # one scale for every lane of the timeline
    "starting": "#9ecae1", "up": "#74c476", "waiting": "#c7e9c0", "recovering": "#fdd0a2",
    "slow": "#fdae6b", "paused": "#9e9ac8", "down": "#de2d26", "finished": "#d9d9d9",
    "all live": "#74c476", "slice lost": "#fd8d3c",
    "disconnected": "#bdbdbd", "throttled": "#f16913", "reset": "#e7298a", "truncated": "#ce1256",
    "partitioned": "#67000d",
    "no commit yet": "#f0f0f0", "advancing": "#31a354", "stalled": "#fc9272", "downtime": "#a50f15",
}
STARVED_COLOR = "#252525"
BOUND_COLOR = "#a50f15"
WHO_COLORS = {"run": "#08519c", "reference": "#737373", "dp": "#e6550d"}
FAULT_COLORS = {kind: cls.colour for kind, cls in FAULT_KINDS.items()}  # each kind's own (faults/kinds/)
BADPUT_COLORS = {"productive": "#31a354", "startup": "#9ecae1", "waiting_on_sync": "#c7e9c0",
                 "rolled_back": "#e6550d", "lost": "#fd8d3c", "stale": "#8c6d31", "recovery": "#fdd0a2",
                 "paused": "#9e9ac8", "dead": "#de2d26", "finished": "#d9d9d9", "other": "#bdbdbd"}


def _spec(chart, datasets: dict[str, list]) -> dict:
    d = chart.to_dict(validate=False)
    d["datasets"] = {**d.get("datasets", {}), **datasets}
    return d


def _x(field: str, domain, title: str | None = T_TITLE, axis: bool = True):
    """A time axis: [lo, hi] of the run unless the page's zoom (`xzoom`) says otherwise."""
    return alt.X(f"{field}:Q", title=title, axis=alt.Axis(grid=False) if axis else None,
                 scale=alt.Scale(domain=list(domain), domainRaw=alt.ExprRef(ZOOM), zero=False, nice=False))


def _zoom_param():
    return alt.param(name=ZOOM, value=None)


def fault_bands(dom):
    """Shaded fault spans (data `faults`), with their labels in a tooltip."""
    return alt.Chart(alt.Data(name="faults")).mark_rect(opacity=0.13, color="#cb181d", clip=True).encode(
        x=_x("t0", dom), x2="t1:Q",
        tooltip=[alt.Tooltip("label:N", title="fault"), alt.Tooltip("params:N"),
                 alt.Tooltip("t0:Q", title="from s", format=".1f"), alt.Tooltip("t1:Q", title="to s", format=".1f")])


def timeline(tl, lane_order: list[str], fault_rows: list[dict]) -> dict:
    """Overview strip (brush to zoom every time chart), the faults, one lane per unit."""
    states = [s for s in STATE_COLORS if any(seg["state"] == s for seg in tl.segments)]
    brush = alt.selection_interval(name="brush", encodings=["x"])
    lo, hi = dom = tl.x_domain
    whole = alt.Scale(domain=[lo, hi], nice=False, zero=False)
    over = [alt.Chart(alt.Data(name="span")).mark_rule(opacity=0).encode(
        x=alt.X("t:Q", title=None, scale=whole)).add_params(brush)]
    if fault_rows:
        over.append(alt.Chart(alt.Data(name="faults")).mark_rect(color="#cb181d", opacity=0.35).encode(
            x=alt.X("t0:Q", scale=whole), x2="t1:Q"))
    if tl.ticks:
        over.append(alt.Chart(alt.Data(name="ticks")).mark_tick(color="#31a354", opacity=0.5, thickness=1).encode(
            x=alt.X("t:Q", scale=whole)))
    overview = alt.layer(*over).properties(width=WIDTH, height=28, title=alt.Title(
        "drag here to zoom every time chart (click outside the selection to reset); red: faults, green: commits",
        fontSize=11, fontWeight="normal", anchor="start", color="#555"))
    parts = [overview]
    if fault_rows:
        kinds = sorted({f["kind"] for f in fault_rows})
        s_per_px = (hi - lo) / WIDTH  # a label must not run into the next fault of its row
        rows = pack([(f["t0"], max(f["t1"], f["t0"] + (6 + 6.2 * len(f["label"])) * s_per_px)) for f in fault_rows])
        fault_rows = [{**f, "row": r} for f, r in zip(fault_rows, rows)]
        n_rows = 1 + max(rows)
        y = alt.Y("row:O", title=None, axis=None)
        tip = [alt.Tooltip("label:N", title="fault"), alt.Tooltip("params:N"), alt.Tooltip("via:N", title="done by"),
               alt.Tooltip("t0:Q", title="from s", format=".2f"), alt.Tooltip("t1:Q", title="to s", format=".2f")]
        fbars = alt.Chart(alt.Data(name="faults")).mark_bar(clip=True, height={"band": 0.85}, opacity=0.5).encode(
            x=_x("t0", dom, None, axis=False), x2="t1:Q", y=y, tooltip=tip,
            color=alt.Color("kind:N", scale=alt.Scale(domain=kinds, range=[FAULT_COLORS.get(k, "#cb181d") for k in kinds]),
                            legend=None))
        flabels = alt.Chart(alt.Data(name="faults")).mark_text(align="left", dx=3, color="#111", fontSize=10,
                                                               clip=True).encode(x=_x("t0", dom, None, axis=False), y=y, text="label:N",
                                                                                 tooltip=tip)
        parts.append(alt.layer(fbars, flabels).properties(width=WIDTH, height=16 * n_rows, title=alt.Title(
            "faults", fontSize=11, fontWeight="normal", anchor="start", color="#555")))
    y = alt.Y("lane:N", sort=lane_order, title=None, axis=alt.Axis(labelLimit=220))
    layers = []
    if fault_rows:
        layers.append(fault_bands(dom))
    layers.append(alt.Chart(alt.Data(name="segments")).mark_bar(height={"band": 0.72}, clip=True).encode(
        x=_x("t0", dom), x2="t1:Q", y=y,
        color=alt.Color("state:N", scale=alt.Scale(domain=states, range=[STATE_COLORS[s] for s in states]),
                        legend=alt.Legend(orient="bottom", columns=9, title=None)),
        tooltip=[alt.Tooltip("lane:N"), alt.Tooltip("state:N"), alt.Tooltip("detail:N"),
                 alt.Tooltip("t0:Q", title="from s", format=".2f"), alt.Tooltip("t1:Q", title="to s", format=".2f")]))
    if tl.ticks:
        layers.append(alt.Chart(alt.Data(name="ticks")).mark_tick(color="#00441b", thickness=1, opacity=0.55,
                                                                  clip=True).encode(
            x=_x("t", dom), y=y, tooltip=[alt.Tooltip("lane:N", title="commit on"), alt.Tooltip("fragment:O"),
                                     alt.Tooltip("version:Q"), alt.Tooltip("t:Q", format=".2f")]))
    if tl.starved:  # a learner silent from a shard for several fragment cycles: it re-fetched
        layers.append(alt.Chart(alt.Data(name="starved")).mark_point(
            shape="triangle-down", size=110, filled=True, color=STARVED_COLOR, stroke="#fff", strokeWidth=0.8,
            opacity=1, clip=True).encode(
            x=_x("t", dom), y=y,
            tooltip=[alt.Tooltip("lane:N", title="starved learner"), alt.Tooltip("shard:N", title="silent shard"),
                     alt.Tooltip("silent_cycles:Q", title="silent fragment cycles", format=".2f"),
                     alt.Tooltip("silent_steps:Q", title="silent inner steps"),
                     alt.Tooltip("heard_step:Q", title="last heard at step"),
                     alt.Tooltip("tries:Q", title="re-fetch #"), alt.Tooltip("t:Q", title="at s", format=".2f")]))
    layers.append(alt.Chart(alt.Data(name="window")).mark_rule(strokeDash=[4, 3], color="#444", clip=True).encode(
        x=_x("t", dom), tooltip=[alt.Tooltip("what:N")]))
    parts.append(alt.layer(*layers).properties(width=WIDTH, height=max(60, 22 * len(lane_order))))
    chart = alt.vconcat(*parts, spacing=4).add_params(_zoom_param()).resolve_scale(color="independent")
    extra = {"starved": tl.starved} if tl.starved else {}
    return _spec(chart, {
        "segments": tl.segments, "ticks": tl.ticks, "faults": fault_rows, **extra,
        "span": [{"t": lo}, {"t": hi}],
        "window": [{"t": 0.0, "what": "measurement window opens (every learner stepped)"},
                   {"t": tl.t_end, "what": "measurement window closes"}],
    })


def pack(spans: list[tuple[float, float]]) -> list[int]:
    """A row for each span so that spans in one row do not overlap (greedy, in start order)."""
    ends: list[float] = []
    out = [0] * len(spans)
    for i in sorted(range(len(spans)), key=lambda i: spans[i][0]):
        a, b = spans[i]
        row = next((r for r, end in enumerate(ends) if end <= a), len(ends))
        if row == len(ends):
            ends.append(b)
        ends[row] = b
        out[i] = row
    return out


def badput(rows: list[dict]) -> dict:
    """One stacked bar per run: productive + every badput bucket, as a share of allocated time."""
    order = list(BADPUT_COLORS)
    present = [b for b in order if any(r["bucket"] == b and r["share"] > 0 for r in rows)] or ["productive"]
    chart = alt.Chart(alt.Data(name="badput")).transform_filter(alt.FieldGTPredicate(field="share", gt=0)).transform_calculate(
        order=f"indexof({order!r}, datum.bucket)").mark_bar(height={"band": 0.7}).encode(
        y=alt.Y("who:N", title=None, sort=["run", "reference", "dp"]),
        x=alt.X("share:Q", stack="zero", axis=alt.Axis(format="%"), title="share of allocated learner time",
                scale=alt.Scale(domain=[0, 1])),
        color=alt.Color("bucket:N", scale=alt.Scale(domain=present, range=[BADPUT_COLORS[b] for b in present]),
                        legend=alt.Legend(orient="bottom", columns=5, title=None)),
        order=alt.Order("order:Q"),
        tooltip=["who:N", "bucket:N", alt.Tooltip("share:Q", format=".1%"), alt.Tooltip("seconds:Q", format=".1f")],
    ).properties(width=WIDTH - 200, height=36 * len({r["who"] for r in rows}))
    return _spec(chart, {"badput": rows})


def learner_goodput(rows: list[dict]) -> dict:
    chart = alt.Chart(alt.Data(name="lg")).mark_bar(color=BADPUT_COLORS["productive"]).encode(
        x=alt.X("goodput:Q", axis=alt.Axis(format="%"), scale=alt.Scale(domain=[0, 1]), title="productive share of the window"),
        y=alt.Y("learner:N", title=None), tooltip=["learner:N", alt.Tooltip("goodput:Q", format=".1%")],
    ).properties(width=WIDTH - 200, height=max(40, 18 * len(rows)))
    return _spec(chart, {"lg": rows})


def loss(points: list[dict], means: list[dict], glob: list[dict], floor: float | None,
         fault_rows: list[dict], dom: tuple) -> dict:
    """Held-out loss over time: each learner (thin), learners' mean per run (thick:
    run, fault-free reference, dp), the global model's evals (diamonds on a dashed line:
    along the run and at the end), the floor."""
    whos = [w for w in WHO_COLORS if any(r["who"] == w for r in means + glob)]
    color = alt.Color("who:N", scale=alt.Scale(domain=whos, range=[WHO_COLORS[w] for w in whos]),
                      legend=alt.Legend(orient="top", title=None))
    clip = loss_view(points + means + glob, floor, dom)
    y = alt.Y("loss:Q", title="held-out loss (nats/token)", scale=alt.Scale(
        zero=False, **({"domainRaw": alt.ExprRef(f"{FULL_LOSS} ? null : {list(clip)}")} if clip else {})))
    layers, data = [], {}
    if fault_rows:
        layers.append(fault_bands(dom))
        data["faults"] = fault_rows
    if points:
        layers.append(alt.Chart(alt.Data(name="points")).mark_line(strokeWidth=0.8, opacity=0.35, clip=True,
                                                                   color=WHO_COLORS["run"]).encode(
            x=_x("t", dom), y=y, detail="learner:N", tooltip=["learner:N", "step:Q", alt.Tooltip("loss:Q", format=".4f")]))
        data["points"] = points
    if means:
        layers.append(alt.Chart(alt.Data(name="means")).mark_line(strokeWidth=2.2, point=True, clip=True).encode(
            x=_x("t", dom), y=y, color=color,
            tooltip=["who:N", "step:Q", alt.Tooltip("loss:Q", format=".4f"), alt.Tooltip("n:Q", title="learners")]))
        data["means"] = means
    if glob:  # along the run (the syncer shards' kept checkpoints), then the final Θ
        layers.append(alt.Chart(alt.Data(name="global")).mark_line(strokeWidth=1.6, strokeDash=[5, 3],
                                                                   clip=True).encode(
            x=_x("t", dom), y=y, color=color, detail="who:N"))
        layers.append(alt.Chart(alt.Data(name="global")).mark_point(shape="diamond", size=140, filled=True,
                                                                    clip=True).encode(
            x=_x("t", dom), y=y, color=color,
            tooltip=["who:N", alt.Tooltip("loss:Q", format=".4f", title="global model loss"), "step:Q"]))
        data["global"] = glob
    if floor is not None:
        layers.append(alt.Chart(alt.Data(name="floor")).mark_rule(strokeDash=[6, 4], color="#000").encode(
            y="loss:Q", tooltip=[alt.Tooltip("loss:Q", title="entropy floor", format=".4f")]))
        data["floor"] = [{"loss": floor}]
    chart = alt.layer(*layers).properties(width=WIDTH, height=260).add_params(_zoom_param())
    if clip:  # the start-up losses (~5.5 nats) would squash the range the run spends its time in
        chart = chart.add_params(alt.param(name=FULL_LOSS, value=False,
                                           bind=alt.binding_checkbox(name="show the whole loss range ")))
    return _spec(chart, data)


def loss_view(rows: list[dict], floor: float | None, dom: tuple) -> tuple[float, float] | None:
    """The loss axis's default [lo, hi]: from the lowest loss (or the floor) to the highest
    after the first quarter of the run, 5 % padded; None when that would hide nothing
    (the checkbox `FULL_LOSS` shows the whole range)."""
    vals = [r for r in rows if r.get("loss") is not None]
    late = [r["loss"] for r in vals if r.get("t") is not None and r["t"] >= dom[0] + 0.25 * (dom[1] - dom[0])]
    lo = min([r["loss"] for r in vals] + ([floor] if floor is not None else []), default=None)
    if not late or max(late) <= lo:
        return None
    hi, pad = max(late), 0.05 * (max(late) - lo)
    return None if max(r["loss"] for r in vals) <= hi + pad else (round(lo - pad, 4), round(hi + pad, 4))


def histogram(rows: list[dict], field: str, title: str, bound: float | None, *, step: float | None = None,
              discrete: bool = False, color: str = "#3182bd") -> dict:
    """Counts per value of `field` (discrete) or per bin of width `step` from 0 to past the
    bound, with a dashed rule at the bound."""
    data = {"h": rows}
    if discrete:
        bars = alt.Chart(alt.Data(name="h")).mark_bar(color=color).encode(
            x=alt.X(f"{field}:O", title=title), y=alt.Y("count:Q", title="count"),
            tooltip=[alt.Tooltip(f"{field}:O", title=title), "count:Q"])
        return _spec(bars.properties(width=WIDTH // 2 - 40, height=180), data)
    top = max([r[field] for r in rows] + [bound or 0.0])
    step = step or max(top / 20, 1e-9)
    extent = [0, step * (int(top / step) + 1)]
    b = alt.Bin(step=step, extent=extent)
    x_scale = alt.Scale(domain=extent)
    layers = [alt.Chart(alt.Data(name="h")).mark_bar(color=color).encode(
        x=alt.X(f"{field}:Q", bin=b, title=title, scale=x_scale),
        y=alt.Y("count():Q", title="count", axis=alt.Axis(tickMinStep=1)),
        tooltip=[alt.Tooltip(f"{field}:Q", bin=b, title=title), alt.Tooltip("count():Q", title="count")])]
    if bound is not None:
        layers.append(alt.Chart(alt.Data(name="bound")).mark_rule(color="#a50f15", strokeDash=[6, 3], size=2)
                      .encode(x=alt.X("bound:Q", scale=x_scale), tooltip=[alt.Tooltip("bound:Q", title="bound")]))
        data["bound"] = [{"bound": bound}]
    return _spec(alt.layer(*layers).properties(width=WIDTH // 2 - 40, height=180), data)


def links(rates: list[dict], limits: list[dict], names: list[str], fault_rows: list[dict], dom: tuple) -> dict:
    """One small chart per link: bytes/s up and down, the link's limit as a dashed step line."""
    has_limit = bool(limits)
    dir_dom = ["up", "down"] + (["limit"] if has_limit else [])
    dirs = alt.Color("dir:N", scale=alt.Scale(domain=dir_dom, range=["#08519c", "#6baed6", "#a50f15"][:len(dir_dom)]),
                     legend=alt.Legend(orient="top", title=None))
    # symlog: a throttled limit (kB/s) and the traffic (MB/s) both stay readable, and 0 too
    top = max([r["Bps"] for r in rates] + [r["limit_Bps"] for r in limits] + [1.0])
    ticks = [0] + [10 ** k for k in range(3, 12) if 10 ** k <= top * 1.5]
    ylog = alt.Scale(type="symlog", constant=1000, domain=[0, top])
    rows = []
    for i, name in enumerate(names):
        x = _x("t", dom, T_TITLE if i == len(names) - 1 else None)
        sel = alt.FieldEqualPredicate(field="link", equal=name)
        y = alt.Y("Bps:Q", title="bytes/s", scale=ylog,
                  axis=alt.Axis(values=ticks, labelExpr="datum.value == 0 ? '0' : format(datum.value, '.0s')"))
        layer = [fault_bands(dom)] if fault_rows else []
        layer.append(alt.Chart(alt.Data(name="rates")).transform_filter(sel).mark_line(
            interpolate="step-after", strokeWidth=1.2, clip=True).encode(
            x=x, y=y, color=dirs, tooltip=["link:N", "dir:N", alt.Tooltip("t:Q", format=".0f"),
                                           alt.Tooltip("Bps:Q", format=",.0f", title="bytes/s")]))
        if any(r["link"] == name for r in limits):
            layer.append(alt.Chart(alt.Data(name="limits")).transform_filter(sel).transform_calculate(dir="'limit'")
                         .mark_line(strokeDash=[5, 3], strokeWidth=1.8, clip=True)
                         .encode(x=x, y=alt.Y("limit_Bps:Q", scale=ylog), color=dirs, detail="seg:N",
                                 tooltip=["link:N", alt.Tooltip("limit_Bps:Q", format=",.0f",
                                                                title="limit bytes/s (each way)")]))
        rows.append(alt.layer(*layer).properties(width=WIDTH, height=90, title=alt.Title(
            name, fontSize=11, anchor="start")))
    chart = alt.vconcat(*rows, spacing=8).add_params(_zoom_param())
    data = {"rates": rates, "faults": fault_rows}
    if has_limit:
        data["limits"] = limits
    return _spec(chart, data)


def bars(rows: list[dict], field: str, title: str, fmt: str = ",.0f") -> dict:
    """One bar per run (run / reference / dp) of `field`, labelled with its value."""
    whos = [w for w in WHO_COLORS if any(r["who"] == w for r in rows)]
    base = alt.Chart(alt.Data(name="b")).encode(
        y=alt.Y("who:N", title=None, sort=whos), x=alt.X(f"{field}:Q", title=title))
    chart = alt.layer(
        base.mark_bar(height={"band": 0.7}).encode(
            color=alt.Color("who:N", scale=alt.Scale(domain=whos, range=[WHO_COLORS[w] for w in whos]), legend=None),
            tooltip=["who:N", alt.Tooltip(f"{field}:Q", format=fmt)]),
        base.mark_text(align="left", dx=4).encode(text=alt.Text(f"{field}:Q", format=fmt)),
    ).properties(width=WIDTH - 300, height=34 * max(1, len(whos)))
    return _spec(chart, {"b": rows})


def _symlog_axis(top: float, constant: float, fmt: str) -> tuple:
    """A symlog y scale from 0 to top (a runaway value and the ordinary ones both read) and
    its axis: 0 and the powers of ten up to top."""
    ticks = [0] + [10 ** k for k in range(0, 16) if constant <= 10 ** k <= top * 1.5]
    scale = alt.Scale(type="symlog", constant=constant, domain=[0, top * 1.4], nice=False)
    axis = alt.Axis(values=ticks, labelExpr=f"datum.value == 0 ? '0' : format(datum.value, '{fmt}')")
    return scale, axis


def link_buffers(rows: list[dict], bound: dict | None, fault_rows: list[dict], dom: tuple, symlog: bool) -> dict:
    """What waits unsent on each link direction over time (one step line per src → peer, a
    break where the lines stopped), the link_buffers_bounded bound as a dashed rule."""
    names = sorted({r["link"] for r in rows})
    top = max([r["unsent_bytes"] for r in rows] + [bound["bytes"] if bound else 0] + [1])
    if symlog:
        scale, axis = _symlog_axis(top, 1000, ".0s")
        title = "unsent bytes (symlog)"
    else:
        scale, axis = alt.Scale(domain=[0, top * 1.05], nice=False), alt.Axis(labelExpr="format(datum.value, '~s')")
        title = "unsent bytes"
    y = alt.Y("unsent_bytes:Q", title=title, scale=scale, axis=axis)
    layers, data = [], {"buffers": rows}
    if fault_rows:
        layers.append(fault_bands(dom))
        data["faults"] = fault_rows
    layers.append(alt.Chart(alt.Data(name="buffers")).mark_line(
        interpolate="step-after", strokeWidth=1.5, clip=True, point=alt.OverlayMarkDef(size=10, opacity=0.6)).encode(
        x=_x("t", dom), y=y, detail="seg:N", order="i:Q",
        color=alt.Color("link:N", sort=names, legend=alt.Legend(orient="top", title=None, columns=4, labelLimit=260)),
        tooltip=[alt.Tooltip("link:N"), alt.Tooltip("t:Q", title="at s", format=".1f"),
                 alt.Tooltip("unsent_bytes:Q", title="unsent bytes", format=",d"),
                 alt.Tooltip("frames:Q", title="whole frames waiting"),
                 alt.Tooltip("superseded:Q", title="frames superseded so far")]))
    if bound:
        layers.append(alt.Chart(alt.Data(name="bound")).mark_rule(color=BOUND_COLOR, strokeDash=[6, 3], size=2)
                      .encode(y=alt.Y("bytes:Q", scale=scale),
                              tooltip=[alt.Tooltip("what:N", title="rule"),
                                       alt.Tooltip("bytes:Q", title="bytes", format=",d"),
                                       alt.Tooltip("held_bytes:Q", title="kernel + proxy hold", format=",d"),
                                       alt.Tooltip("frame_bytes:Q", title="largest frame", format=",d")]))
        data["bound"] = [bound]
    chart = alt.layer(*layers).properties(width=WIDTH, height=220).add_params(_zoom_param())
    return _spec(chart, data)


def staleness_time(rows: list[dict], drops: list[dict], bound: int | None, fault_rows: list[dict], dom: tuple,
                   symlog: bool) -> dict:
    """Each merge's staleness over time (a point per merge, coloured by learner), the run's
    max_staleness as a dashed rule, the shards' stale drops as crosses at their staleness."""
    learners = sorted({r["learner"] for r in rows} | {d["learner"] for d in drops}, key=str)
    top = max([r["staleness"] for r in rows] + [d["staleness"] for d in drops] + [bound or 0, 1])
    if symlog:
        scale, axis = _symlog_axis(top, 1, "d")
        title = "staleness (outer rounds; symlog)"
    else:
        scale, axis = alt.Scale(domain=[0, top + 0.5], nice=False), alt.Axis(tickMinStep=1, format="d")
        title = "staleness (outer rounds)"
    y = alt.Y("staleness:Q", title=title, scale=scale, axis=axis)
    color = alt.Color("learner:N", sort=learners, legend=alt.Legend(orient="top", title=None))
    layers, data = [], {}
    if fault_rows:
        layers.append(fault_bands(dom))
        data["faults"] = fault_rows
    if rows:
        layers.append(alt.Chart(alt.Data(name="merges")).mark_circle(size=16, opacity=0.55, clip=True).encode(
            x=_x("t", dom), y=y, color=color,
            tooltip=[alt.Tooltip("learner:N"), alt.Tooltip("staleness:Q"), alt.Tooltip("fragment:O")]
            + ([alt.Tooltip("shard:N")] if "shard" in rows[0] else [])
            + [alt.Tooltip("seq:Q"), alt.Tooltip("t:Q", title="at s", format=".2f")]
            + ([alt.Tooltip("n:Q", title="merges in this point (the stalest shown)")] if "n" in rows[0] else [])))
        data["merges"] = rows
    if drops:
        layers.append(alt.Chart(alt.Data(name="stale_drops")).mark_point(
            shape="cross", size=120, filled=True, color=BOUND_COLOR, opacity=0.9, clip=True).encode(
            x=_x("t", dom), y=y,
            tooltip=[alt.Tooltip("learner:N", title="dropped as stale: learner"), alt.Tooltip("staleness:Q"),
                     alt.Tooltip("max_staleness:Q", title="bound"), alt.Tooltip("fragment:O"), alt.Tooltip("seq:Q"),
                     alt.Tooltip("shard:N"), alt.Tooltip("t:Q", title="at s", format=".2f")]))
        data["stale_drops"] = drops
    if bound:
        layers.append(alt.Chart(alt.Data(name="max_staleness")).mark_rule(color=BOUND_COLOR, strokeDash=[6, 3], size=2)
                      .encode(y=alt.Y("staleness:Q", scale=scale),
                              tooltip=[alt.Tooltip("staleness:Q", title="max_staleness (config)")]))
        data["max_staleness"] = [{"staleness": bound}]
    chart = alt.layer(*layers).properties(width=WIDTH, height=200).add_params(_zoom_param())
    return _spec(chart, data)
