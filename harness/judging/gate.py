"""The baseline gate: a run's figures judged against a stored run's (`compare --fail-on`,
`run --baseline RUN --fail-on SPEC`, the `chaos` fixture's `--chaos-baseline`).

Pure functions over summary.json dicts; nothing here imports JAX.

    base = load_summary("runs/nightly/chaos")          # a run directory or a summary.json
    rules = parse_fail_on("goodput:-3pts,parity:+1%,recovery:+5s")
    rows = evaluate(load_summary("runs/latest"), base, rules)
    ok = gate_held(rows)                                # print r["line"] for each
    # or, from a command line's strings: run_gate(summary, "runs/nightly/chaos", SPEC),
    # report_lines(rows, baseline_name=..., spec=SPEC) for the terminal

A SPEC is comma-separated `FIGURE:LIMIT` parts. FIGURE is a short alias (`goodput`,
`parity`, `recovery`, ...: `FIGURE_ALIASES`) or the summary key itself (`loss_parity`,
`recovery_max_s`, `badput.dead`, ...). LIMIT is a sign, a number and a unit:

- the sign says which way fails: `-3pts` fails when the figure *fell* by more than 3
  points, `+2%` when it *rose* by more than 2 %;
- `pts`: percentage points, for figures that are fractions (goodput 0.953 = 95.3 %);
- `%`: relative change (current − baseline) ÷ |baseline| for ordinary figures
  (`final_loss:+2%`); for figures that are themselves fractions or percent gaps
  (goodput, uptime, badput.*, parity) `%` means percentage points, as you would read
  "goodput dropped 3 %" (goodput:-3% is goodput:-3pts);
- `s`: seconds, for figures in seconds (recovery, downtime, ..._s);
- no unit: an absolute change in the figure's own unit (goodput:-0.03 is goodput:-3pts,
  restarts:+1).

A change of exactly the limit passes ("by more than"). A figure missing (or not a finite
number) on either side fails its rule with the reason: a gate that cannot judge is not a
pass.
"""
from __future__ import annotations

import json
import math
import re
from dataclasses import dataclass
from pathlib import Path

from diloco_chaos.harness.errors import UserError
from diloco_chaos.harness.judging.metrics import BADPUT

# short name → summary key
FIGURE_ALIASES = {
    "goodput": "goodput",
    "goodput_paced": "goodput_paced",
    "uptime": "uptime",
    "parity": "loss_parity",
    "loss": "final_loss",
    "final_loss": "final_loss",
    "excess_loss": "excess_loss_ratio",
    "recovery": "recovery_max_s",
    "rejoin": "rejoin_cycles_max",
    "recovery_cycles": "recovery_cycles_median",
    "downtime": "downtime",
    "participation": "participation.mean",
    "staleness": "staleness_max",
    "bandwidth": "bytes_per_token",
    "restarts": "restarts",
}

# summary key → kind: "fraction" (shown in %, deltas in points), "seconds", "loss" (4
# significant digits), "count", "rate" (bytes/s), "number"
FIGURE_KINDS = {
    "goodput": "fraction", "goodput_paced": "fraction", "uptime": "fraction", "loss_parity": "fraction",
    **{f"badput.{b}": "fraction" for b in BADPUT},
    "final_loss": "loss", "reference_loss": "loss", "loss_floor": "loss", "floor_gap": "loss",
    "excess_loss_ratio": "number",
    "recovery_max_s": "seconds", "downtime": "seconds", "duration_s": "seconds", "allocated_s": "seconds",
    "productive_s": "seconds", "uptime_s": "seconds", "commit_gap_bound_s": "seconds", "pace_start_s": "seconds",
    "run_s": "seconds",
    "rejoin_cycles_max": "number", "recovery_cycles_median": "number", "participation.mean": "number",
    "staleness_max": "count", "staleness_mean": "number", "pace": "number",
    "bytes_total": "count", "bytes_per_token": "number", "mean_Bps": "rate", "peak_Bps": "rate",
    "steps": "count", "tokens": "count", "merges": "count", "commits": "count", "restarts": "count",
    "faults_scheduled": "count", "faults_applied": "count", "step_lag": "count", "learners": "count",
    "fragments": "count",
}

# figures compare() lists first, in this order (then any other numeric top-level key)
COMPARE_ORDER = ("goodput", "goodput_paced", "uptime", *(f"badput.{b}" for b in BADPUT), "final_loss",
                 "reference_loss", "loss_parity", "excess_loss_ratio", "floor_gap", "recovery_max_s",
                 "rejoin_cycles_max", "recovery_cycles_median", "downtime", "restarts", "participation.mean",
                 "staleness_max", "staleness_mean", "bytes_per_token", "bytes_total", "mean_Bps", "peak_Bps",
                 "steps", "tokens", "merges", "commits", "pace", "duration_s", "learners", "fragments")
NOT_FIGURES = {"t_start", "t_end", "valid"}  # timestamps: their delta means nothing

UNITS = {
    "pts": "percentage points of a fraction (goodput, uptime, parity, badput.*)",
    "%": "relative change, but percentage points for fractions and percent gaps (goodput, parity, ...)",
    "s": "seconds, for time figures (recovery, downtime, *_s)",
    "": "an absolute change in the figure's own unit",
}
DEFAULT_FAIL_ON = "goodput:-3pts"

_PART = re.compile(r"^\s*(?P<fig>[A-Za-z_][\w.]*)\s*:\s*(?P<sign>[+-])?\s*(?P<num>\d+(?:\.\d*)?|\.\d+)\s*"
                   r"(?P<unit>pts|pt|%|s)?\s*$")


@dataclass(frozen=True)
class Rule:
    """One part of a --fail-on SPEC: fail when `key` moved by more than `amount` `unit`
    in the direction `sign` (+1 rose, -1 fell) from the baseline."""

    figure: str      # as written (an alias or a key)
    key: str         # the summary key it reads
    sign: int        # +1: fail if it rose by more than amount; -1: if it fell
    amount: float    # ≥ 0
    unit: str        # "pts", "%", "s" or "" (as written; see `measure`)
    text: str        # the part as written

    @property
    def kind(self) -> str:
        return figure_kind(self.key)

    @property
    def measure(self) -> str:
        """How the delta is measured: "pts" (points of a fraction: pts, and % on a
        fraction), "%" (relative change), or "abs" (s, or no unit)."""
        if self.unit == "pts" or (self.unit == "%" and self.kind == "fraction"):
            return "pts"
        return "%" if self.unit == "%" else "abs"

    def limit_text(self) -> str:
        sign = "+" if self.sign > 0 else "-"
        unit = {"pts": " pts", "%": " %"}.get(self.measure, " s" if self.unit == "s" else "")
        return f"{sign}{_num(self.amount)}{unit}"


def figure_kind(key: str) -> str:
    if key in FIGURE_KINDS:
        return FIGURE_KINDS[key]
    return "seconds" if key.endswith("_s") else "number"


def _resolve(figure: str) -> str | None:
    if figure in FIGURE_ALIASES:
        return FIGURE_ALIASES[figure]
    return figure if figure in FIGURE_KINDS else None


def parse_fail_on(spec: str) -> list[Rule]:
    """`goodput:-3pts,parity:+1%,final_loss:+2%,recovery:+5s` → Rules (module docstring
    for the grammar). Raises UserError naming every bad part at once, with the valid
    figures and units."""
    if spec is None or not str(spec).strip():
        raise UserError(_spec_help("an empty --fail-on SPEC"))
    rules, bad = [], []
    for part in str(spec).split(","):
        if not part.strip():
            bad.append("an empty part (two commas, or a trailing one)")
            continue
        m = _PART.match(part)
        if m is None:
            bad.append(f"{part.strip()!r}: not FIGURE:±NUMBER[UNIT] (e.g. goodput:-3pts, final_loss:+2%)")
            continue
        fig, sign, unit = m["fig"], m["sign"], m["unit"] or ""
        unit = "pts" if unit == "pt" else unit
        key = _resolve(fig)
        why = []
        if key is None:
            why.append(f"unknown figure {fig!r}")
        if sign is None:
            why.append("no sign: + fails when the figure rose, - when it fell (e.g. -3pts)")
        if key is not None and unit == "pts" and figure_kind(key) != "fraction":
            why.append(f"pts (percentage points) is for fractions; {fig} is not one: use % (relative) or a bare number")
        if key is not None and unit == "s" and figure_kind(key) != "seconds":
            why.append(f"s (seconds) is for time figures; {fig} is not one")
        if key is not None and not unit and figure_kind(key) == "fraction" and float(m["num"]) >= 1:
            # a bare number is an absolute change: a fraction (0 to 1) never moves by 1 or more
            why.append(f"{fig} is a fraction (0 to 1), so a change of {m['num']} can never happen; "
                       f"did you mean {sign or '-'}{m['num']}pts (percentage points)?")
        if why:
            bad.append(f"{part.strip()!r}: " + "; ".join(why))
            continue
        rules.append(Rule(fig, key, 1 if sign == "+" else -1, float(m["num"]), unit, part.strip()))
    if bad:
        raise UserError(_spec_help(f"--fail-on {spec!r}: " + "; ".join(bad)))
    return rules


def _spec_help(what: str) -> str:
    units = "; ".join(f"{u or 'no unit'} = {d}" for u, d in UNITS.items())
    aliases = ", ".join(f"{a}" + (f" (= {k})" if a != k else "") for a, k in FIGURE_ALIASES.items())
    keys = ", ".join(k for k in FIGURE_KINDS if k not in FIGURE_ALIASES.values())
    return (f"{what}. A SPEC is FIGURE:±LIMIT[,...], e.g. goodput:-3pts,final_loss:+2%,recovery:+5s; "
            f"the sign is the way that fails. Figures: {aliases}; or a summary key: {keys}. Units: {units}")


# --- reading summaries --------------------------------------------------------------------------


def load_summary(path) -> dict:
    """A run's summary: `path` is a run directory (its summary.json; `runs/latest` too) or
    a summary.json file. UserError naming the path when it is missing or not JSON."""
    p = Path(path)
    f = p / "summary.json" if p.is_dir() else p
    if not f.exists():
        where = f"{p}: no summary.json in this directory" if p.is_dir() else f"{p}: no such run directory or file"
        raise UserError(f"{where} (a run directory is what `diloco-chaos run` printed after 'results:', "
                        "e.g. runs/chaos or runs/latest)")
    try:
        s = json.loads(f.read_text())
    except (OSError, UnicodeDecodeError, json.JSONDecodeError) as e:
        raise UserError(f"{f}: not a readable summary.json ({e})") from None
    if not isinstance(s, dict):
        raise UserError(f"{f}: not a run summary (a JSON object with the run's figures)")
    return s


def _finite(v) -> bool:
    return isinstance(v, (int, float)) and not isinstance(v, bool) and math.isfinite(v)


def figure_value(summary: dict, key: str):
    """The figure `key` of a summary: a top-level number, `badput.<bucket>`,
    `participation.mean`, or `downtime` (the seconds in commit gaps above the bound: the
    sum of the summary's `downtime` gaps). None when absent."""
    if key == "downtime":
        gaps = summary.get("downtime")
        if not isinstance(gaps, list):
            return None
        try:
            return float(sum(b - a for a, b in gaps))
        except (TypeError, ValueError):
            return None
    if "." in key:
        head, _, tail = key.partition(".")
        sub = summary.get(head)
        v = sub.get(tail) if isinstance(sub, dict) else None
    else:
        v = summary.get(key)
    return v if isinstance(v, (int, float)) and not isinstance(v, bool) else None


# --- formatting ---------------------------------------------------------------------------------


def _num(x: float) -> str:
    return f"{x:g}"


def fmt_value(key: str, v) -> str:
    """A figure rounded for reading: fractions in % with 1 decimal, losses 4 significant
    digits, seconds 2 decimals, counts whole."""
    if v is None:
        return "—"
    if not _finite(v):
        return str(v)
    kind = figure_kind(key)
    if kind == "fraction":
        return f"{v * 100:.1f} %"
    if kind == "seconds":
        return f"{v:.2f} s"
    if kind == "rate":
        return f"{v:,.0f} B/s"
    if kind == "count" or (isinstance(v, int) and kind != "loss"):
        return f"{int(v):,}"
    return f"{v:.4g}"


def fmt_delta(key: str, a, b) -> str:
    """b − a, for reading: points for fractions, seconds, else absolute and relative."""
    if not (_finite(a) and _finite(b)):
        return "—"
    d = b - a
    kind = figure_kind(key)
    if kind == "fraction":
        return f"{d * 100:+.1f} pts"
    if kind == "seconds":
        return f"{d:+.2f} s"
    rel = f" ({d / abs(a) * 100:+.1f} %)" if a else ""
    if kind == "rate":
        return f"{d:+,.0f} B/s{rel}"
    if kind == "count" and float(d).is_integer():
        return f"{int(d):+,}{rel}"
    return f"{d:+.4g}{rel}"


# --- the gate -----------------------------------------------------------------------------------

_EPS = 1e-9  # float noise: 0.95 → 0.92 is a fall of 3 points, not of 3.0000000000000027


def evaluate(summary: dict, baseline: dict, rules: list[Rule]) -> list[dict]:
    """One row per rule: {figure, key, rule, baseline, current, delta, unit, limit,
    held, line, why}. `delta` is in the rule's measure (points, % relative, or the
    figure's own unit), `limit` the signed limit in it; `held` False when the figure
    moved past the limit the failing way, or is missing (or not finite) on either
    side (`why` says which)."""
    rows = []
    for r in rules:
        base, cur = figure_value(baseline, r.key), figure_value(summary, r.key)
        name = r.figure
        limit = r.sign * r.amount
        unit = {"pts": "pts", "%": "%"}.get(r.measure, "s" if r.unit == "s" else "")
        row = {"figure": r.figure, "key": r.key, "rule": r.text, "baseline": base, "current": cur,
               "delta": None, "unit": unit, "limit": limit, "held": False, "why": None}
        missing = [side for side, v in (("this run", cur), ("the baseline", base)) if v is None]
        if missing:
            row["why"] = f"{r.key} missing in {' and '.join(missing)}: the gate cannot judge it (not a pass)"
            row["line"] = f"{name}: {row['why']}: FAIL"
            rows.append(row)
            continue
        if not (_finite(cur) and _finite(base)):
            row["why"] = f"{r.key} is not a finite number ({cur} vs baseline {base})"
            row["line"] = f"{name}: {row['why']}: FAIL"
            rows.append(row)
            continue
        d = cur - base
        if r.measure == "pts":
            delta = d * 100
        elif r.measure == "%":
            delta = (d / abs(base) * 100) if base else (0.0 if d == 0 else math.copysign(math.inf, d))
            if not base and d:
                row["why"] = "baseline is 0: any change is an infinite relative change"
        else:
            delta = d
        held = not (r.sign * delta > r.amount + _EPS)
        row.update(delta=delta, held=held)
        dtxt = (f"{delta:+.1f} pts" if unit == "pts" else f"{delta:+.2f} %" if unit == "%"
                else f"{delta:+.2f} s" if unit == "s" else f"{delta:+.4g}")
        row["line"] = (f"{name} {fmt_value(r.key, cur)} vs baseline {fmt_value(r.key, base)}: {dtxt}, "
                       f"limit {r.limit_text()}: {'PASS' if held else 'FAIL'}")
        rows.append(row)
    return rows


def gate_held(rows: list[dict]) -> bool:
    """Every rule held (a missing figure did not)."""
    return all(r["held"] for r in rows)


def run_gate(summary: dict, baseline, spec: str = DEFAULT_FAIL_ON) -> list[dict]:
    """`evaluate` from what a command line holds: `baseline` a run directory, a
    summary.json path or an already loaded summary dict; `spec` a --fail-on SPEC.
    UserError on a bad SPEC (checked first) or an unreadable baseline."""
    rules = parse_fail_on(spec)
    base = baseline if isinstance(baseline, dict) else load_summary(baseline)
    return evaluate(summary, base, rules)


def report_lines(rows: list[dict], *, baseline_name: str = "the baseline", spec: str | None = None) -> list[str]:
    """The gate for a terminal: a header, one line per rule, a verdict line."""
    failed = sum(not r["held"] for r in rows)
    head = f"gate: against {baseline_name}" + (f", --fail-on {spec}" if spec else "")
    return [head, *(f"  {r['line']}" for r in rows),
            f"gate: {'FAIL' if failed else 'PASS'} ({failed} of {len(rows)} rule(s) failed)"]


# --- compare ------------------------------------------------------------------------------------


def _state(check: dict | None) -> str:
    if check is None:
        return "absent"
    return {True: "PASS", False: "FAIL"}.get(check.get("valid"), "UNKNOWN")


def _verdict(s: dict) -> str:
    checks = s.get("checks", [])
    if s.get("valid") is False or any(c.get("valid") is False for c in checks):
        return "FAIL"
    if s.get("valid") is None or any(c.get("valid") is None for c in checks):
        return "UNKNOWN"
    return "PASS"


def _figure_keys(a: dict, b: dict) -> list[str]:
    keys = [k for k in COMPARE_ORDER if figure_value(a, k) is not None or figure_value(b, k) is not None]
    extra = sorted({k for s in (a, b) for k, v in s.items()
                    if k not in NOT_FIGURES and k not in keys and isinstance(v, (int, float))
                    and not isinstance(v, bool)})
    return keys + extra


def _parity_ci(s: dict):
    for c in s.get("checks", []):
        if c.get("name") == "loss_parity_max":
            ci = (c.get("details") or {}).get("ci")
            if isinstance(ci, list) and len(ci) == 2 and all(_finite(x) for x in ci):
                return ci
    ci = s.get("loss_parity_ci")
    return ci if isinstance(ci, list) and len(ci) == 2 and all(_finite(x) for x in ci) else None


def noise_band(a: dict, b: dict) -> dict | None:
    """The eval's noise on a final-loss change, as a relative half-width: half the width
    of the paired 95 % loss-parity interval (the loss_parity_max check's `ci`, else the
    summary's `loss_parity_ci`), the wider of the two runs'. Both runs' final evals read
    the same held-out batches (same task and seed), so a change of (B − A) / A inside
    ±half-width is within noise. None when neither summary carries the interval (a run
    without a fault-free reference): the unpaired final_loss_ci holds the batches' own
    spread and would call real changes noise, so it is not used."""
    halves = [(ci[1] - ci[0]) / 2 for s in (a, b) if (ci := _parity_ci(s)) is not None]
    if not halves:
        return None
    half = max(halves)
    source = "the paired 95 % loss-parity interval"
    fa, fb = a.get("final_loss"), b.get("final_loss")
    rel = (fb - fa) / abs(fa) if _finite(fa) and _finite(fb) and fa else None
    within = None if rel is None else abs(rel) <= half
    if rel is None:
        note = f"eval noise ±{half * 100:.2f} % of the final loss ({source}); no final-loss change to judge"
    else:
        note = (f"final_loss {rel * 100:+.2f} % is {'within noise' if within else 'outside the noise band'} "
                f"(±{half * 100:.2f} %, half {source})")
    return {"half_width": half, "source": "loss_parity_ci", "final_loss_change": rel, "within_noise": within,
            "note": note}


def compare(a: dict, b: dict) -> dict:
    """Two summaries side by side (b against a): every numeric figure with its delta
    (points for fractions), the checks whose state differs (PASS / FAIL / UNKNOWN /
    absent), the verdicts and the final-loss noise band (`noise_band`).

    {"a": {run_dir, verdict}, "b": {...}, "figures": [{key, kind, a, b, delta, delta_unit,
    relative, a_text, b_text, delta_text, zero}], "checks": [{name, a, b, flipped}],
    "flipped": [{name, a, b}], "noise": {...} | None}"""
    figures = []
    for k in _figure_keys(a, b):
        va, vb = figure_value(a, k), figure_value(b, k)
        kind = figure_kind(k)
        delta = rel = None
        unit = "pts" if kind == "fraction" else ("s" if kind == "seconds" else "")
        if _finite(va) and _finite(vb):
            delta = (vb - va) * 100 if kind == "fraction" else vb - va
            rel = (vb - va) / abs(va) * 100 if kind != "fraction" and va else None
        figures.append({"key": k, "kind": kind, "a": va, "b": vb, "delta": delta, "delta_unit": unit,
                        "relative": rel, "a_text": fmt_value(k, va), "b_text": fmt_value(k, vb),
                        "delta_text": fmt_delta(k, va, vb), "zero": not va and not vb})
    ca = {c.get("name"): c for c in a.get("checks", [])}
    cb = {c.get("name"): c for c in b.get("checks", [])}
    names = list(ca) + [n for n in cb if n not in ca]
    checks = [{"name": n, "a": _state(ca.get(n)), "b": _state(cb.get(n))} for n in names]
    for c in checks:
        c["flipped"] = c["a"] != c["b"]
    return {
        "a": {"run_dir": a.get("run_dir"), "verdict": _verdict(a)},
        "b": {"run_dir": b.get("run_dir"), "verdict": _verdict(b)},
        "figures": figures,
        "checks": checks,
        "flipped": [{"name": c["name"], "a": c["a"], "b": c["b"]} for c in checks if c["flipped"]],
        "noise": noise_band(a, b),
    }
