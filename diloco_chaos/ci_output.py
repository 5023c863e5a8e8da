"""A run's verdict where a CI system reads it. Under GitHub Actions (`GITHUB_ACTIONS=true`):
an `::error` workflow command per failed (or UNKNOWN) check and failed gate rule, which
the job's page shows as an annotation; and, where `GITHUB_STEP_SUMMARY` names a file, a
Markdown table of the verdict appended to it (the job's summary page). Elsewhere: nothing.
The figures are the summary's, rounded for a person as `compare` rounds them (gate.fmt_value)."""
from __future__ import annotations

import os
from pathlib import Path

from diloco_chaos.harness.judging.gate import fmt_value
from diloco_chaos.harness.judging.report_text import check_rows

VERDICT = {0: "PASS", 1: "FAIL"}
ROWS = [("goodput", "goodput"), ("final loss", "final_loss"), ("loss parity vs fault-free", "loss_parity"),
        ("restarts", "restarts")]


def publish(summary: dict, run_dir: Path, *, scenario: str, tier: str, code: int, env=None) -> None:
    env = os.environ if env is None else env
    if env.get("GITHUB_ACTIONS") == "true":
        for line in error_lines(summary, scenario):
            print(line)
    path = env.get("GITHUB_STEP_SUMMARY")
    if path:
        with open(path, "a", encoding="utf-8") as f:
            f.write(step_summary(summary, run_dir, scenario=scenario, tier=tier, code=code))


def _escape(text: str, prop: bool = False) -> str:
    """A workflow command's escaping (%, CR, LF; and : , in a property)."""
    text = text.replace("%", "%25").replace("\r", "%0D").replace("\n", "%0A")
    return text.replace(":", "%3A").replace(",", "%2C") if prop else text


def error_lines(summary: dict, scenario: str) -> list[str]:
    lines = []
    for verdict, text in check_rows(summary):
        if verdict != "PASS":
            lines.append(f"::error title={_escape(f'{scenario}: {verdict}', prop=True)}::{_escape(text)}")
    for row in summary.get("gate") or []:
        if not row.get("held"):
            lines.append(f"::error title={_escape(f'{scenario}: gate', prop=True)}::{_escape(row['line'])}")
    return lines


def step_summary(summary: dict, run_dir: Path, *, scenario: str, tier: str, code: int) -> str:
    verdict = VERDICT.get(code, f"exit {code}")
    mark = "✅" if code == 0 else "❌"
    out = [f"### {mark} diloco-chaos `{scenario}` ({tier}): {verdict}", "",
           "| figure | value |", "|---|---|"]
    out += [f"| {label} | {fmt_value(key, summary[key])} |" for label, key in ROWS if summary.get(key) is not None]
    out += ["", "| check | verdict | value |", "|---|---|---|"]
    for verdict_, text in check_rows(summary):
        name, _, rest = text.partition(" = ")
        out.append(f"| `{name.split(' ')[0]}` | {verdict_} | {rest or '–'} |")
    for row in summary.get("gate") or []:
        out.append(f"| gate `{row['figure']}` | {'PASS' if row['held'] else 'FAIL'} | {row['line']} |")
    out += ["", f"Run directory: `{run_dir}` (report.html, summary.json, events.jsonl)", "", ""]
    return "\n".join(out)
