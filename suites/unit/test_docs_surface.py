"""The README and docs as a newcomer reads them: the README is a page (<= 80 lines), every
figure it states is on docs/RESULTS.md (beside the command that reproduces it), and no
page cites the project's issue numbers or a path outside the repository."""
from __future__ import annotations

import re
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]
FIGURE = re.compile(r"[−+]?\d[\d,.]*(?:\s?[–-]\s?\d[\d,.]*)?\s?(?:%|×|s\b|min\b|ms\b)")


def figures(text: str) -> set[str]:
    """Measured figures: numbers with a unit (12 %, 482–484×, 78–80 s, 5 min), outside
    `code` (an option's example value is not a measurement)."""
    text = re.sub(r"`[^`\n]*`", "", text)
    return {re.sub(r"\s+", " ", m.group(0)).replace("−", "-") for m in FIGURE.finditer(text)}


def test_the_readme_is_a_page():
    assert len((ROOT / "README.md").read_text().splitlines()) <= 80


def test_every_readme_figure_is_on_the_results_page():
    results = (ROOT / "docs" / "RESULTS.md").read_text().replace("−", "-")
    results = re.sub(r"\*\*", "", results)
    missing = sorted(f for f in figures((ROOT / "README.md").read_text()) if f not in results)
    assert not missing, f"README figures not on docs/RESULTS.md: {missing}"


def test_the_checker_sees_a_planted_figure():
    assert figures("goodput 85.0–86.0 %, 482–484× and 78–80 s; `--fail-on parity:+1%`") == {
        "85.0–86.0 %", "482–484×", "78–80 s"}


def test_no_page_cites_an_issue_number_or_a_path_outside_the_repository():
    pages = [ROOT / "README.md", *sorted((ROOT / "docs").glob("**/*.md"))]
    bad = [f"{p.relative_to(ROOT)}:{i}: {line.strip()}" for p in pages
           for i, line in enumerate(p.read_text().splitlines(), 1)
           if re.search(r"issue [0-9]|shared/", line)]
    assert not bad, "\n".join(bad)
