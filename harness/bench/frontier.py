"""`diloco-chaos bench frontier`: quality against bytes, as a frontier.

Each grid point (task, H, codec) is one Decoupled DiLoCo configuration (M = 4, fault-free,
real processes through `run_cluster`, as `bench parity`) run beside a data-parallel
reference of the same seed and tokens. Per point, over the seeds:

- `reduction_steady` / `reduction_total`: the mean over seeds of DP's bytes per token ÷
  the point's (benches `_bytes_per_token`: "steady" without the start-up fetch and the
  closing, "total" the transport counters);
- `parity_gap`: the mean over seeds of (L_ddl − L_dp) / L_dp, L = the learners' mean last
  held-out eval; `parity_gap_ci`: its 95 % Student-t interval ([low, high]; None for one seed);
- `per_seed` (each seed's figures and run dir name) and `config` (seed 0's DDL run).

Contract (other code reads these keys): `points` is a list of dicts, each with `task`,
`H`, `codec`, `reduction_steady`, `reduction_total`, `parity_gap`, `parity_gap_ci`. Beside
it: `long` (a few corpus points at LONG_FACTOR × the steps, seed 0, with the grid's gap at
1× for comparison: does the gap shrink with training?), `best` (per task, the highest
steady reduction with a gap ≤ 3 % and ≤ 2 %), `goals`, `anchors` (published figures), `chart`.

Bound: on loopback every run here is CPU-bound. Bytes are counted at the learners'
transport, never waited on, so a reduction says what a thin link would carry, not how
long it would take (`bench wan` measures that).

The grid: PARITY_TASKS × HS × CODECS × SEEDS, plus LONG_POINTS. BASE_DILOCO is merged into
every DDL run's `diloco` section, SPARSE_KEYS into the sparse runs only. The CLI has no
per-bench flags; two environment variables restrict the defaults for a quicker run:
DILOCO_FRONTIER_SEEDS="0" (comma-separated ints) and DILOCO_FRONTIER_TASKS="markov"
(comma-separated task names). Redraw the chart from a stored result without running:
`python -m diloco_chaos.harness.bench.frontier CHART runs/bench/frontier.json docs/frontier.svg`.
"""
from __future__ import annotations

import argparse
import json
import math
import os
import statistics
from pathlib import Path
from xml.sax.saxutils import escape

from diloco_chaos.harness.bench.benches import PARITY_M, PARITY_TASKS, _bytes_per_token
from diloco_chaos.harness.bench.runs import describe, run_cluster
from diloco_chaos.harness.errors import UserError
from diloco_chaos.trainer.config import RunConfig

HS = (6, 12, 24, 64)   # sync_every
CODECS = {"fp32": {}, "int4": {"compression": "int4", "broadcast_compression": "int4"},
          "sparse": {"compression": "sparse", "broadcast_compression": "sparse"}}
SEEDS = (0, 1, 2)
BASE_DILOCO: dict = {}   # merged into every DDL run's diloco section, e.g. {"downlink": "answer"}
SPARSE_KEYS: dict = {}   # merged into the sparse runs only, e.g. {"sparse_density": 0.05}
LONG_POINTS = (("corpus", 6, "fp32"), ("corpus", 12, "sparse"), ("corpus", 24, "sparse"))
LONG_FACTOR = 4          # the long runs' steps ÷ the grid's; seed 0 only
TIMEOUT_S_PER_STEP = 1.5  # run_cluster's limit (parity: 600 s for 400 steps)
ANCHORS = ({"name": "Streaming DiLoCo 35M", "reduction": 400.0, "parity_gap": 0.037},
           {"name": "Scaling Laws for DiLoCo 35M", "reduction": 30.0, "parity_gap": 0.020})
GOALS = {"reduction_3pct": 400, "reduction_2pct": 100}   # steady reduction at a gap ≤ 3 % / ≤ 2 %
# two-sided 95 % Student-t quantiles by degrees of freedom (scipy is not a dependency);
# past 10 the 10's, a slightly wider interval than the exact one
T95 = {1: 12.706, 2: 4.303, 3: 3.182, 4: 2.776, 5: 2.571, 6: 2.447, 7: 2.365, 8: 2.306, 9: 2.262, 10: 2.228}


# ------------------------------------------------------------------ the runs

def frontier(out_dir: Path, *, tasks=None, Hs=None, codecs=None, seeds=None, long_points=None) -> dict:
    """The grid (every task, seed: a DP run and one DDL run per H × codec), the long points,
    and their figures (module docstring). Arguments restrict the grid; None = the default,
    itself restricted by DILOCO_FRONTIER_TASKS / DILOCO_FRONTIER_SEEDS."""
    tasks = tuple(tasks) if tasks is not None else _env("DILOCO_FRONTIER_TASKS", str) or tuple(PARITY_TASKS)
    seeds = tuple(seeds) if seeds is not None else _env("DILOCO_FRONTIER_SEEDS", int) or SEEDS
    Hs, codecs = tuple(HS if Hs is None else Hs), tuple(CODECS if codecs is None else codecs)
    if long_points is None:
        long_points = tuple(p for p in LONG_POINTS if p[0] in tasks)
    for name, given, valid in (("task", tasks + tuple(p[0] for p in long_points), PARITY_TASKS),
                               ("codec", codecs + tuple(p[2] for p in long_points), CODECS)):
        if bad := [g for g in given if g not in valid]:
            raise UserError(f"bench frontier: unknown {name} {bad[0]!r}; valid: {', '.join(valid)}")
    root = out_dir / "frontier"
    grid = [_plan(root / task, task, PARITY_TASKS[task], seed, codec, H)
            for task in tasks for seed in seeds for codec, H in [(None, None)] + [(c, h) for c in codecs for h in Hs]]
    long_tasks = sorted({t for t, _, _ in long_points})
    long = [_plan(root / "long" / t, t, PARITY_TASKS[t] * LONG_FACTOR, 0, None, None) for t in long_tasks] + \
           [_plan(root / "long" / t, t, PARITY_TASKS[t] * LONG_FACTOR, 0, c, h) for t, h, c in long_points]
    # every config is built before the first run: a bad key fails now, not after an hour
    points = points_from([_measure(*p) for p in grid])
    long_pts = long_vs_grid(points_from([_measure(*p) for p in long]), points)
    result = {"tasks": {t: PARITY_TASKS[t] for t in tasks}, "Hs": list(Hs), "codecs": list(codecs),
              "seeds": list(seeds), "learners": PARITY_M, "base_diloco": BASE_DILOCO, "sparse_keys": SPARSE_KEYS,
              "points": points, "long": long_pts, "best": best_points(points), "goals": GOALS,
              "anchors": [dict(a) for a in ANCHORS]}
    chart = out_dir / "frontier.svg"
    chart.write_text(chart_svg(result))
    return {**result, "chart": str(chart)}


def _env(var: str, kind: type) -> tuple:
    raw = os.environ.get(var, "").strip()
    try:
        return tuple(kind(x.strip()) for x in raw.split(",") if x.strip())
    except ValueError:
        raise UserError(f"{var}={raw!r}: expected comma-separated {kind.__name__}s, e.g. 0,1") from None


def run_config(task: str, steps: int, seed: int, codec: str | None, H: int | None) -> RunConfig:
    """DP (codec None) or one DDL grid point, at the project defaults otherwise."""
    if codec is None:
        diloco, name = {"mode": "dp"}, "dp"
    else:
        diloco = {**BASE_DILOCO, **CODECS[codec], **(SPARSE_KEYS if codec == "sparse" else {}), "sync_every": H}
        name = f"{codec}-H{H}"
    return RunConfig.from_dict({"diloco": {"learners": PARITY_M, **diloco}, "name": f"frontier-{task}-{name}",
                                "seed": seed, "steps": steps, "task": {"kind": task},
                                "inner": {"total_steps": max(steps, 21)}})


def _plan(folder: Path, task: str, steps: int, seed: int, codec: str | None, H: int | None):
    name = f"dp-seed{seed}" if codec is None else f"{codec}-H{H}-seed{seed}"
    meta = {"task": task, "seed": seed, "codec": codec or "dp", "H": H, "steps": steps, "run_dir": name}
    return meta, folder / name, run_config(task, steps, seed, codec, H)


def _measure(meta: dict, run_dir: Path, cfg: RunConfig) -> dict:
    """One run's record: `meta` plus its bytes per token, final loss and configuration. Each
    record is appended to records.jsonl beside the run dirs; a record there with the same
    run dir and configuration is taken instead of running again (an interrupted bench
    resumes where it stopped; delete the file to measure afresh)."""
    store = run_dir.parent / "records.jsonl"
    full = json.loads(json.dumps(cfg.to_dict()))
    if store.exists():
        for line in store.read_text().splitlines():
            rec = json.loads(line)
            if rec["run_dir"] == meta["run_dir"] and rec.get("full_config") == full:
                return rec
    run = run_cluster(run_dir, cfg, timeout_s=max(600.0, TIMEOUT_S_PER_STEP * cfg.steps))
    per = _bytes_per_token(run)
    rec = {**meta, "steady": per["steady"], "total": per["total"], "loss": run.mean_final_eval(),
           "wall_s": run.wall_s, "config": describe(cfg), "full_config": full}
    with store.open("a") as f:
        f.write(json.dumps(rec) + "\n")
    return rec


# ------------------------------------------------------------------ the figures (pure)

def points_from(runs: list[dict]) -> list[dict]:
    """The points from run records ({task, seed, codec ("dp" for the reference), H, steady,
    total, loss, run_dir, config?}): each DDL record against the DP record of its task and
    seed, then means over seeds (module docstring). Points in the records' order."""
    dp = {(r["task"], r["seed"]): r for r in runs if r["codec"] == "dp"}
    groups: dict[tuple, list[dict]] = {}
    for r in runs:
        if r["codec"] != "dp":
            groups.setdefault((r["task"], r["H"], r["codec"]), []).append(r)
    points = []
    for (task, H, codec), rs in groups.items():
        per_seed = []
        for r in sorted(rs, key=lambda r: r["seed"]):
            ref = dp.get((task, r["seed"]))
            if ref is None:
                raise ValueError(f"no DP run for task {task!r}, seed {r['seed']} to compare {r['run_dir']} with")
            per_seed.append({"seed": r["seed"], "parity_gap": (r["loss"] - ref["loss"]) / ref["loss"],
                             "reduction_steady": ref["steady"] / r["steady"],
                             "reduction_total": ref["total"] / r["total"], "dp_loss": ref["loss"],
                             "ddl_loss": r["loss"], "ddl_steady": r["steady"], "dp_steady": ref["steady"],
                             "run_dir": r["run_dir"]})
        gaps = [s["parity_gap"] for s in per_seed]
        points.append({"task": task, "H": H, "codec": codec,
                       "reduction_steady": statistics.fmean(s["reduction_steady"] for s in per_seed),
                       "reduction_total": statistics.fmean(s["reduction_total"] for s in per_seed),
                       "parity_gap": statistics.fmean(gaps), "parity_gap_ci": t_interval(gaps),
                       "per_seed": per_seed, "config": min(rs, key=lambda r: r["seed"]).get("config")})
    return points


def t_interval(xs: list[float]) -> list[float] | None:
    """The 95 % Student-t interval of the mean of `xs`; None for fewer than two values."""
    if len(xs) < 2:
        return None
    half = T95[min(len(xs) - 1, max(T95))] * statistics.stdev(xs) / math.sqrt(len(xs))
    mean = statistics.fmean(xs)
    return [mean - half, mean + half]


def best_points(points: list[dict]) -> dict:
    """Per task: the point with the highest steady reduction among those with a parity gap
    ≤ 3 % (`gap_3pct`) and ≤ 2 % (`gap_2pct`), None where no point qualifies; `met`: the
    GOALS against them."""
    out = {}
    for task in dict.fromkeys(p["task"] for p in points):
        best = {}
        for key, bound in (("gap_3pct", 0.03), ("gap_2pct", 0.02)):
            ok = [p for p in points if p["task"] == task and p["parity_gap"] <= bound]
            p = max(ok, key=lambda p: p["reduction_steady"], default=None)
            best[key] = p and {k: p[k] for k in ("H", "codec", "reduction_steady", "reduction_total",
                                                 "parity_gap", "parity_gap_ci")}
        best["met"] = {goal: bool(best[key]) and best[key]["reduction_steady"] >= GOALS[goal]
                       for goal, key in (("reduction_3pct", "gap_3pct"), ("reduction_2pct", "gap_2pct"))}
        out[task] = best
    return out


def long_vs_grid(long_points: list[dict], grid: list[dict]) -> list[dict]:
    """Each long point beside the grid's gap for the same (task, H, codec): the mean over
    seeds (`grid_parity_gap`) and seed 0's alone (`grid_parity_gap_seed0`, the like-for-like one)."""
    by = {(p["task"], p["H"], p["codec"]): p for p in grid}
    out = []
    for p in long_points:
        g = by.get((p["task"], p["H"], p["codec"]))
        seed0 = next((s["parity_gap"] for s in g["per_seed"] if s["seed"] == 0), None) if g else None
        out.append({**{k: v for k, v in p.items() if k != "parity_gap_ci"}, "factor": LONG_FACTOR,
                    "grid_parity_gap": g and g["parity_gap"], "grid_parity_gap_seed0": seed0})
    return out


# ------------------------------------------------------------------ the chart

PANEL_W, PANEL_H, LEFT, RIGHT, TOP, BOTTOM = 460, 340, 56, 34, 34, 46
X_TICKS = (1, 3, 10, 30, 100, 300, 1000, 3000)
STYLE = {"fp32": ("circle", "#1f77b4"), "int4": ("square", "#ff7f0e"), "sparse": ("triangle", "#2ca02c")}


def _marker(codec: str, x: float, y: float, cls: str, filled: bool = True) -> str:
    shape, colour = STYLE.get(codec, ("diamond", "#7f7f7f"))
    paint = f'fill="{colour if filled else "white"}" stroke="{colour}" stroke-width="1.5" class="{cls}" ' \
            f'data-codec="{escape(codec)}"'
    if shape == "circle":
        return f'<circle cx="{x:.1f}" cy="{y:.1f}" r="5" {paint}/>'
    if shape == "square":
        return f'<rect x="{x - 4.5:.1f}" y="{y - 4.5:.1f}" width="9" height="9" {paint}/>'
    pts = ((0, -6), (5.5, 4), (-5.5, 4)) if shape == "triangle" else ((0, -6), (5, 0), (0, 6), (-5, 0))
    return f'<polygon points="{" ".join(f"{x + a:.1f},{y + b:.1f}" for a, b in pts)}" {paint}/>'


def _star(x: float, y: float) -> str:
    pts = [(x + (7 if i % 2 == 0 else 3) * math.sin(i * math.pi / 5),
            y - (7 if i % 2 == 0 else 3) * math.cos(i * math.pi / 5)) for i in range(10)]
    return f'<polygon class="anchor" points="{" ".join(f"{a:.1f},{b:.1f}" for a, b in pts)}" ' \
           'fill="#f2c200" stroke="#7a6000"/>'


def _y_range(result: dict) -> tuple[float, float, float]:
    """The shared y axis in %: (low, high, tick step), holding 0–4 %, every point's mean and
    every anchor (an interval wider than that is cut at the panel's edge)."""
    vals = [0.0, 4.0] + [100 * a["parity_gap"] for a in result.get("anchors", ())]
    for p in list(result["points"]) + list(result.get("long") or ()):
        vals += [100 * p["parity_gap"]] if p["parity_gap"] is not None else []
    step = next(s for s in (0.5, 1, 2, 5, 10, 20, 50, 100, 1e9) if (max(vals) - min(vals)) / s <= 8)
    return math.floor(min(vals) / step) * step, math.ceil(max(vals) / step) * step, step


def chart_svg(result: dict) -> str:
    """The frontier as an SVG string: one panel per task, x = steady reduction (log), y =
    parity gap in % with its CI, one marker per point (shape and colour by codec, labelled
    H=…), long points hollow, the anchors as stars, dashed lines at 2 % and 3 %."""
    tasks = list(result.get("tasks") or dict.fromkeys(p["task"] for p in result["points"]))
    lo, hi, step = _y_range(result)
    w, h = PANEL_W * len(tasks) + 20, PANEL_H + 52
    out = [f'<svg xmlns="http://www.w3.org/2000/svg" width="{w}" height="{h}" viewBox="0 0 {w} {h}" '
           'font-family="sans-serif" font-size="11">', f'<rect width="{w}" height="{h}" fill="white"/>']
    for i, task in enumerate(tasks):
        x0, x1, y0, y1 = i * PANEL_W + LEFT, (i + 1) * PANEL_W - RIGHT, TOP, PANEL_H - BOTTOM
        fx = lambda r: x0 + (x1 - x0) * math.log10(min(max(r, 1.0), 3000.0)) / math.log10(3000)  # noqa: E731
        fy = lambda pct: y1 - (y1 - y0) * (pct - lo) / (hi - lo)  # noqa: E731
        steps = (result.get("tasks") or {}).get(task)
        out.append(f'<text x="{(x0 + x1) / 2:.0f}" y="18" text-anchor="middle" font-size="13" font-weight="bold">'
                   f'{escape(task)}{f" ({steps} steps)" if steps else ""}</text>')
        for r in X_TICKS:
            out.append(f'<line x1="{fx(r):.1f}" y1="{y0}" x2="{fx(r):.1f}" y2="{y1}" stroke="#eee"/>'
                       f'<text x="{fx(r):.1f}" y="{y1 + 14}" text-anchor="middle">{r}</text>')
        for k in range(round((hi - lo) / step) + 1):
            v = lo + k * step
            out.append(f'<line x1="{x0}" y1="{fy(v):.1f}" x2="{x1}" y2="{fy(v):.1f}" stroke="#eee"/>'
                       f'<text x="{x0 - 5}" y="{fy(v) + 4:.1f}" text-anchor="end">{v:g}</text>')
        for pct in (2, 3):
            out.append(f'<line class="bound" x1="{x0}" y1="{fy(pct):.1f}" x2="{x1}" y2="{fy(pct):.1f}" '
                       f'stroke="#c00" stroke-dasharray="5 4"/><text x="{x1 + 3}" y="{fy(pct) + 4:.1f}" '
                       f'fill="#c00">{pct} %</text>')
        out.append(f'<rect x="{x0}" y="{y0}" width="{x1 - x0}" height="{y1 - y0}" fill="none" stroke="#333"/>'
                   f'<text x="{(x0 + x1) / 2:.0f}" y="{y1 + 32}" text-anchor="middle">'
                   'bytes per token, DP ÷ DDL (steady, ×, log)</text>'
                   f'<text transform="translate({x0 - 38},{(y0 + y1) / 2:.0f}) rotate(-90)" '
                   'text-anchor="middle">parity gap to DP (%)</text>')
        for a in result.get("anchors", ()):
            ax, ay = fx(a["reduction"]), fy(100 * a["parity_gap"])
            out.append(_star(ax, ay) + f'<text x="{ax:.1f}" y="{ay - 21:.1f}" text-anchor="middle" font-size="9" '
                       f'fill="#7a6000">{escape(a["name"])}<tspan x="{ax:.1f}" dy="10">{a["reduction"]:g}×, '
                       f'+{100 * a["parity_gap"]:.1f} %</tspan></text>')
        for cls, pts in (("point", result["points"]), ("long-point", result.get("long") or ())):
            for p in (p for p in pts if p["task"] == task and p.get("reduction_steady")):
                px, py = fx(p["reduction_steady"]), fy(100 * p["parity_gap"])
                if p.get("parity_gap_ci"):
                    ya, yb = (min(max(fy(100 * v), y0), y1) for v in p["parity_gap_ci"])
                    out.append(f'<path class="ci" d="M{px:.1f},{ya:.1f}V{yb:.1f}M{px - 3:.1f},{ya:.1f}h6'
                               f'M{px - 3:.1f},{yb:.1f}h6" stroke="#888" fill="none"/>')
                label = f'H={p["H"]}' + (f', {p.get("factor", LONG_FACTOR)}× steps' if cls == "long-point" else "")
                out.append(_marker(p["codec"], px, py, cls, filled=cls == "point") +
                           f'<text x="{px + 7:.1f}" y="{py - 6:.1f}" font-size="9">{escape(label)}</text>')
    lx = LEFT
    for codec in dict.fromkeys(p["codec"] for p in result["points"]):
        out.append(_marker(codec, lx, h - 32, "legend") + f'<text x="{lx + 9}" y="{h - 28}">{escape(codec)}</text>')
        lx += 80
    out.append(f'<text x="{LEFT - 5}" y="{h - 10}" font-size="10">hollow: {LONG_FACTOR}× the steps, seed 0; '
               'bars: 95 % t-interval over seeds; stars: published figures</text></svg>')
    return "\n".join(out) + "\n"


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(prog="python -m diloco_chaos.harness.bench.frontier",
                                description="Redraw the frontier chart from a stored bench result.")
    p.add_argument("command", type=str.lower, choices=["chart"], help="CHART: draw RESULT_JSON into OUT_SVG")
    p.add_argument("result_json", type=Path)
    p.add_argument("out_svg", type=Path)
    args = p.parse_args(argv)
    args.out_svg.write_text(chart_svg(json.loads(args.result_json.read_text())))
    print(f"wrote {args.out_svg}")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
