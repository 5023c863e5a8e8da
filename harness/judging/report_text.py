"""The end-of-run summary on the terminal (rendering only: values come from summary.json)."""
from __future__ import annotations

from rich.console import Console
from rich.table import Table

from diloco_chaos.harness.judging.checks import faults_note, stop_note

ROWS = [  # (label, key, format)
    ("goodput", "goodput", "{:.1%}"),
    ("uptime", "uptime", "{:.1%}"),
    ("final loss", "final_loss", "{:.4f}"),
    ("loss parity vs fault-free", "loss_parity", "{:+.2%}"),
    ("  its 95 % interval", "loss_parity_ci", "[{0[0]:+.2%}, {0[1]:+.2%}]"),
    ("excess-loss ratio", "excess_loss_ratio", "{:.3f}"),
    ("bytes per token", "bytes_per_token", "{:,.0f}"),
    ("max staleness", "staleness_max", "{}"),
    ("restarts", "restarts", "{}"),
    ("pace (1: the reference machine)", "pace", "{:.2f}"),
    ("  goodput at the reference pace", "goodput_paced", "{:.1%}"),
]


def _fmt(summary: dict, key: str, fmt: str) -> str:
    v = summary.get(key)
    if v is None:
        return "–"
    try:
        return fmt.format(v)
    except (TypeError, ValueError):
        return str(v)


def print_summary(summary: dict, console: Console | None = None) -> None:
    console = console or Console()
    runs = {summary.get("mode", "run"): summary}
    if "dp" in summary:
        runs["dp"] = summary["dp"]
    t = Table(title="summary")
    t.add_column("")
    for name in runs:
        t.add_column(name, justify="right")
    for label, key, fmt in ROWS:
        t.add_row(label, *(_fmt(s, key, fmt) for s in runs.values()))
    t.add_row("learners per round (mean)", *(_fmt(s.get("participation") or {}, "mean", "{:.2f}")
                                             for s in runs.values()))
    # badput: only the causes that cost something in some run (summary.json keeps every row)
    causes = sorted({k for s in runs.values() for k, v in (s.get("badput") or {}).items()
                     if isinstance(v, (int, float)) and round(v, 3) != 0})
    for k in causes:
        t.add_row(f"  badput: {k}", *(_fmt(s.get("badput") or {}, k, "{:.1%}") for s in runs.values()))
    console.print(t)
    for name, s in runs.items():
        for note in (faults_note(s), stop_note(s)):
            if note is not None:
                console.print(f"[yellow]note[/] {name}: {note}")
    colour = {"PASS": "[green]PASS[/]", "FAIL": "[red]FAIL[/]", "UNKNOWN": "[yellow]UNKNOWN[/]"}
    for name, s in runs.items():
        for verdict, text in check_rows(s):
            console.print(f"{colour[verdict]} {name}: {text}")


def figure(v) -> str:
    """A check's value or bound as a person reads it: whole numbers as integers (thousands
    grouped from 10,000), others to 4 significant digits; summary.json keeps full values."""
    if isinstance(v, bool) or not isinstance(v, (int, float)):
        return str(v)
    if float(v).is_integer() and abs(v) < 1e15:
        return f"{int(v):,}" if abs(v) >= 1e4 else str(int(v))
    return f"{v:.4g}"


def check_rows(summary: dict) -> list[tuple[str, str]]:
    """(PASS | FAIL | UNKNOWN, "name = value (bound b)") for each of a run's checks, the
    figures rounded (`figure`)."""
    rows = []
    for c in summary.get("checks", []):
        verdict = {True: "PASS", False: "FAIL"}.get(c.get("valid"), "UNKNOWN")
        bound = f" (bound {figure(c['bound'])})" if c.get("bound") is not None else ""
        value = f" = {figure(c['value'])}" if c.get("value") is not None else ""
        if ci := (c.get("details") or {}).get("ci"):
            value += f", 95 % interval [{ci[0]:.4g}, {ci[1]:.4g}]"
        rows.append((verdict, f"{c['name']}{value}{bound}"))
    return rows


def check_lines(summary: dict) -> list[str]:
    """The check table as plain text (a failing test's message): failures first."""
    rows = sorted(check_rows(summary), key=lambda r: ("FAIL", "UNKNOWN", "PASS").index(r[0]))
    verdict = {True: "PASS", False: "FAIL"}.get(summary.get("valid"), "UNKNOWN")
    return [f"  {v:<7} {text}" for v, text in rows] + [f"  verdict: {verdict}"]

