"""pytest plugin: `pytest --chaos-report DIR` writes a page per run a test made and DIR/index.html.

Every run a test makes is recorded for it without a line in the test: the plugin
listens to harness/listeners.py, which the runner (both tiers, once summary.json is
written) and a failing property's example (`SimRun.write`) call. A run the harness did
not write (made by a subprocess, or copied in) is recorded through the session fixture
`chaos_report`:

    def test_unit_loss(chaos_report, tmp_path):
        run_dir = make_a_run_somehow(tmp_path)
        chaos_report.add(run_dir)

`add` attaches the run to the test running now (once per directory), so it also works inside a Hypothesis
property (a session fixture raises no function-scoped-fixture health check); for a
Hypothesis test only its last run is kept: after a failure that is the run of the
shrunk example, which Hypothesis replays last. A failing test's page shows the
falsifying example, the error and the command that runs the test again; the run's
own replay command and schedule are on every page.

Under pytest-xdist (`pytest -n N --chaos-report DIR`) each worker writes its tests' pages
and records each run in a file of its own under DIR/.chaos-entries/; only the controller
(the process without `workerinput`) writes DIR/index.html, at the session's end, from all
of them (and then removes DIR/.chaos-entries/).

Key figures of each run become JUnit XML properties (`chaos.goodput`, ... or
`chaos.<run>.goodput` for a test with several runs) with or without --chaos-report.
Loaded by diloco_chaos/pytest_plugin.py (the `chaos` fixture), which the package's
`pytest11` entry point registers wherever it is installed.
"""
from __future__ import annotations

import json
import os
import re
import shlex
import shutil
import textwrap
from pathlib import Path

import pytest

FIGURES = ("valid", "goodput", "uptime", "loss_parity", "recovery_max_s", "bytes_per_token", "restarts")
_RUNS = pytest.StashKey[list]()
_REPORTS = pytest.StashKey[dict]()
ENTRIES_DIR = ".chaos-entries"  # under --chaos-report DIR: the runs xdist workers recorded, a file each


def is_worker(config: pytest.Config) -> bool:
    """A pytest-xdist worker (the controller, or a session without xdist, has no workerinput)."""
    return hasattr(config, "workerinput")


class ChaosReport:
    """What the fixture hands out: `add(run_dir)` records a run for the test running now."""

    def __init__(self, config: pytest.Config):
        self.config = config
        self.item: pytest.Item | None = None
        out = config.getoption("chaos_report", None)
        self.out_dir = Path(out).resolve() if out else None
        self.entries: list = []  # reports.IndexEntry, in the order the pages were written

    def add(self, run_dir: Path | str) -> None:
        if self.item is None:
            raise RuntimeError("chaos_report.add() is for use inside a test")
        runs = self.item.stash.setdefault(_RUNS, [])
        run_dir = Path(run_dir).resolve()
        if getattr(getattr(self.item, "obj", None), "is_hypothesis_test", False):
            runs.clear()  # keep the last example's run: the shrunk one after a failure
        if run_dir not in runs:  # the sim writes its events, then its summary: one run
            runs.append(run_dir)

    def heard(self, run_dir: Path) -> None:
        """The harness wrote a run (harness/listeners.py): record it for the test running now."""
        if self.item is not None:  # a run made outside any test (a session fixture) has no page
            self.add(run_dir)


def pytest_addoption(parser: pytest.Parser) -> None:
    parser.getgroup("chaos").addoption(
        "--chaos-report", dest="chaos_report", metavar="DIR", default=None,
        help="write an HTML resilience page for every run a test recorded, and DIR/index.html")


def pytest_configure(config: pytest.Config) -> None:
    from diloco_chaos.harness import listeners

    rec = ChaosReport(config)
    config.stash[_REPORTS] = {"recorder": rec, "unsubscribe": listeners.subscribe(rec.heard)}
    if rec.out_dir is not None and not is_worker(config):  # before any worker starts: this session's entries only
        shutil.rmtree(rec.out_dir / ENTRIES_DIR, ignore_errors=True)


def pytest_unconfigure(config: pytest.Config) -> None:
    config.stash[_REPORTS]["unsubscribe"]()


def _recorder(config: pytest.Config) -> ChaosReport:
    return config.stash[_REPORTS]["recorder"]


@pytest.fixture(scope="session")
def chaos_report(pytestconfig: pytest.Config) -> ChaosReport:
    return _recorder(pytestconfig)


@pytest.hookimpl(wrapper=True)
def pytest_runtest_protocol(item: pytest.Item, nextitem):
    rec = _recorder(item.config)
    rec.item = item
    try:
        return (yield)
    finally:
        rec.item = None


@pytest.hookimpl(wrapper=True)
def pytest_runtest_makereport(item: pytest.Item, call: pytest.CallInfo):
    if call.when == "teardown" and item.stash.get(_RUNS, None):
        _finish(item)  # before the teardown report is made: it carries the JUnit properties
    report = yield
    if report.when in ("setup", "call"):
        item.stash.setdefault(_REPORTS, {})[report.when] = report
    return report


def _summary(run_dir: Path) -> dict:
    try:
        return json.loads((run_dir / "summary.json").read_text())
    except (OSError, json.JSONDecodeError):
        return {}


def _finish(item: pytest.Item) -> None:
    rec = _recorder(item.config)
    runs = item.stash[_RUNS]
    reports = item.stash.get(_REPORTS, {})
    test = test_info(item.nodeid, reports)
    for i, run_dir in enumerate(runs):
        prefix = "chaos." if len(runs) == 1 else f"chaos.{run_dir.name}."
        s = _summary(run_dir)
        for k in FIGURES:
            if s.get(k) is not None:
                item.user_properties.append((prefix + k, s[k]))
        if rec.out_dir is None:
            continue
        from diloco_chaos.reports import IndexEntry, render_run

        out = rec.out_dir / _slug(item.nodeid) / f"{i}-{run_dir.name}.html"
        try:
            page = render_run(run_dir, out, test=test, shared_js=rec.out_dir)  # one Vega bundle for all
        except Exception as e:  # a page that cannot be drawn must not fail the test that made the run
            item.user_properties.append((prefix + "report_error", repr(e)))
            continue
        item.user_properties.append((prefix + "report", str(page)))
        entry = IndexEntry(page, run_dir, label=item.nodeid, outcome=test["outcome"])
        if is_worker(item.config):
            _write_entry(rec.out_dir, item.config.workerinput.get("workerid", "gw"), entry)
        else:
            rec.entries.append(entry)


def _write_entry(out_dir: Path, worker: str, entry) -> None:
    """A worker's run, for the controller's index: one file per run, renamed into place
    whole (the controller never reads half a file)."""
    d = out_dir / ENTRIES_DIR
    d.mkdir(parents=True, exist_ok=True)
    n = len(list(d.glob(f"{worker}-*.json")))
    data = {"page": str(entry.page), "run_dir": str(entry.run_dir), "label": entry.label, "outcome": entry.outcome}
    tmp = d / f".{worker}-{n}.tmp"
    tmp.write_text(json.dumps(data))
    os.replace(tmp, d / f"{worker}-{n}.json")


def _read_entries(out_dir: Path) -> list:
    """The runs the workers recorded (DIR/.chaos-entries/*.json)."""
    from diloco_chaos.reports import IndexEntry

    entries = []
    def order(f: Path):  # gw0-2 before gw0-10: each worker's runs in the order it made them
        worker, _, n = f.stem.rpartition("-")
        return worker, int(n) if n.isdigit() else 0

    for f in sorted((out_dir / ENTRIES_DIR).glob("*.json"), key=order):
        try:
            d = json.loads(f.read_text())
            entries.append(IndexEntry(Path(d["page"]), Path(d["run_dir"]), label=d.get("label", ""),
                                      outcome=d.get("outcome")))
        except (OSError, ValueError, KeyError, TypeError):
            continue
    return entries


def test_info(nodeid: str, reports: dict) -> dict:
    """{nodeid, outcome, command, error, falsifying, reproduce} from the setup / call reports."""
    failed = next((r for r in reports.values() if r.failed), None)
    call = reports.get("call")
    outcome = "failed" if failed else (call.outcome if call is not None else "skipped")
    text = failed.longreprtext if failed is not None else ""
    return {"nodeid": nodeid, "outcome": outcome, "command": f"pytest {shlex.quote(nodeid)}",
            "error": text[-4000:], "falsifying": falsifying_example(text), "reproduce": reproduce_line(text)}


def _plain(line: str) -> str:
    return re.sub(r"^E {1,3}", "", line)


def falsifying_example(text: str) -> str:
    """Hypothesis's 'Falsifying example: test(...)' block from a failure's text (newer
    Hypothesis writes 'Failing test case: test(...)'), or ''."""
    lines = [_plain(l) for l in text.splitlines()]
    for i, line in enumerate(lines):
        if line.lstrip().startswith(("Falsifying example", "Failing test case")):
            out, depth = [], 0
            for l in lines[i:]:  # up to the line that closes the call's brackets
                out.append(l)
                depth += sum(l.count(c) for c in "([{") - sum(l.count(c) for c in ")]}")
                if depth <= 0:
                    break
            return textwrap.dedent("\n".join(out))
    return ""


def reproduce_line(text: str) -> str:
    m = re.search(r"@reproduce_failure\([^)]*\)", text)
    return m.group(0) if m else ""


def _slug(nodeid: str) -> str:
    return re.sub(r"[^A-Za-z0-9_.-]+", "_", nodeid).strip("_")[:120] or "test"


def pytest_sessionfinish(session: pytest.Session) -> None:
    rec = _recorder(session.config)
    if rec.out_dir is None or is_worker(session.config):  # a worker's runs are in its entry files
        return
    from diloco_chaos.reports import render_index

    rec.entries = sorted(rec.entries + _read_entries(rec.out_dir), key=lambda e: e.label)
    index = render_index(rec.entries, rec.out_dir, title=f"pytest session: {len(rec.entries)} run page(s)")
    shutil.rmtree(rec.out_dir / ENTRIES_DIR, ignore_errors=True)  # in the index now: DIR holds the pages only
    session.config.stash[_REPORTS]["index"] = index


def pytest_terminal_summary(terminalreporter, config: pytest.Config) -> None:
    index = config.stash[_REPORTS].get("index")
    if index is not None:
        terminalreporter.write_line(f"chaos report: {index} ({len(_recorder(config).entries)} run pages)")
