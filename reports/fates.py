"""The run page's "Token fates" section: the token-fate ledger (harness/judging/ledger.py) as a
stacked bar per learner and a table, and participation (learners merged per committed
round, harness/judging/participation.py) as a histogram. Formatting only."""
from __future__ import annotations

import altair as alt

from diloco_chaos.reports.charts import WIDTH, _spec

FATE_COLORS = {"merged": "#31a354", "superseded": "#fdae6b", "lost": "#de2d26", "dropped": "#756bb1",
               "in_flight": "#9ecae1"}
FATE_WHY = {
    "merged": "in a committed round of the global model (on its own, or summed into a later contribution)",
    "superseded": "trained, then thrown away when a fetch re-anchored the fragment",
    "lost": "with a dead learner (unsent), a dead shard (pending), a link that refused the frame, or a round a "
            "shard crash lost",
    "dropped": "refused by the shard: stale, corrupt, empty, based on a future version, …",
    "in_flight": "at the end: sent and not yet merged, or not yet sent",
}


def specs(s: dict) -> dict[str, dict]:
    """Vega-Lite specs: `ledger` (one stacked bar per learner) and `participation`."""
    out: dict[str, dict] = {}
    book = s.get("ledger") or {}
    rows = [{"learner": name, "fate": f, "tokens": row.get(f) or 0.0,
             "share": (row.get(f) or 0.0) / row["trained"] if row.get("trained") else 0.0}
            for name, row in (book.get("learners") or {}).items() for f in FATE_COLORS]
    if any(r["tokens"] for r in rows):
        fates = list(FATE_COLORS)
        chart = alt.Chart(alt.NamedData("fates")).mark_bar().encode(
            y=alt.Y("learner:N", title=None),
            x=alt.X("tokens:Q", stack="zero", title="tokens trained, by fate (a fragment's share of a token: 1/P)"),
            color=alt.Color("fate:N", scale=alt.Scale(domain=fates, range=[FATE_COLORS[f] for f in fates]),
                            sort=fates, legend=alt.Legend(orient="top", title=None)),
            order=alt.Order("fate_order:Q"),
            tooltip=["learner:N", "fate:N", alt.Tooltip("tokens:Q", format=",.0f"),
                     alt.Tooltip("share:Q", format=".1%")]).properties(width=WIDTH, height=26 * max(len(book["learners"]), 2))
        out["ledger"] = _spec(chart, {"fates": [{**r, "fate_order": fates.index(r["fate"])} for r in rows]})
    part = s.get("participation") or {}
    hist = [{"learners": int(n), "rounds": c} for n, c in (part.get("histogram") or {}).items()]
    if hist:
        chart = alt.Chart(alt.NamedData("participation")).mark_bar(color="#3182bd").encode(
            x=alt.X("learners:O", title="learners merged in the round"),
            y=alt.Y("rounds:Q", title="committed rounds"),
            tooltip=["learners:O", "rounds:Q"]).properties(width=320, height=180)
        out["participation"] = _spec(chart, {"participation": hist})
    return out


def context(s: dict) -> dict:
    """The table: a row per learner and the total (tokens and share per fate, the causes in
    a title), the participation figures, and whether the ledger balanced."""
    book = s.get("ledger") or {}
    check = next((c for c in s.get("checks") or [] if c["name"] == "tokens_conserved"), {})

    def row(name: str, r: dict, why: dict | None) -> dict:
        t = r.get("trained") or 0.0
        cells = []
        for f in FATE_COLORS:
            v = r.get(f) or 0.0
            causes = ", ".join(f"{c} {n:,.0f}" for c, n in ((why or {}).get(f) or {}).items() if n)
            cells.append({"tokens": f"{v:,.0f}", "share": f"{v / t:.1%}" if t else "–", "why": causes})
        return {"name": name, "trained": f"{t:,.0f}", "cells": cells}
    rows = [row(n, r, r.get("why")) for n, r in (book.get("learners") or {}).items()]
    if book.get("total"):
        rows.append(row("all learners", book["total"], None))
    part = s.get("participation") or {}
    return {"rows": rows, "fates": list(FATE_COLORS), "fate_why": FATE_WHY, "fragments": book.get("fragments"),
            "violations": (check.get("details") or {}).get("violations") or [], "valid": check.get("valid"),
            "part": None if not part else {
                "rounds": part["rounds"], "mean": f"{part['mean']:.2f}",
                "at_least_2": f"{part['share_at_least_2']:.1%}", "learners": part.get("learners")}}
