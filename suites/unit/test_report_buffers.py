"""The report's link buffers, starved learners and staleness over time, on the real-run
fixture (suites/unit/data/report_run) with the lines a newer run logs added by
`add_link_lines` (also used by suites/browser/test_report_browser.py)."""
from __future__ import annotations

import json
import re
from pathlib import Path


from diloco_chaos.harness import eventlog
from diloco_chaos.harness.judging import checks, model_checks
from diloco_chaos.reports import check_rows, render_run, series

FIXTURE = Path(__file__).parent / "data" / "report_run"


def _summary(d: Path) -> dict:
    return json.loads((d / "summary.json").read_text())


def _specs(html: str) -> dict:
    m = re.search(r'<script type="application/json" id="specs">(.*?)</script>', html, re.S)
    return json.loads(m.group(1))


# --- link buffers, starved learners, staleness over time ------------------------------------------

BUFFER_LINES = [  # (s from t_start, src, peer, unsent_bytes, frames, superseded)
    (5.0, "learner-0", "syncer-0", 1_000, 0, 0), (6.0, "learner-0", "syncer-0", 250_000, 1, 0),
    (7.0, "learner-0", "syncer-0", 0, 0, 0),  # it emptied
    (8.0, "learner-1", "syncer-0", 0, 0, 0),  # nothing ever waited here: not drawn
    (20.0, "syncer-0", "learner-1", 400_000, 2, 3), (21.0, "syncer-0", "learner-1", 900_000, 3, 5),
    (30.0, "syncer-0", "learner-1", 100_000, 0, 5),  # 9 s of silence after a non-empty line: a break
    (31.0, "syncer-0", "learner-1", 0, 0, 5)]
STARVED = [(22.5, 1, 25, 75, 4.17), (26.0, 2, 46, 75, 7.67)]  # (s, tries, silent_steps, heard_step, silent_cycles)
DONE_LINKS = {"learner-0": {"syncer-0": (250_000, 0)}, "learner-1": {"syncer-0": (1_000, 0)},
              "syncer-0": {"learner-0": (0, 0), "learner-1": (950_000, 5)}}  # (unsent_max, superseded)


def add_link_lines(d: Path, runaway: bool = False) -> dict:
    """The fixture run as a newer one would log it: link_buffer lines, starved lines from
    learner-1, a shard's stale drop, done lines with the buffer counters, max_staleness 16
    in the config, and the link_buffers_bounded check in summary.json. `runaway`: the
    shard's outbox to learner-1 grows to 9 MB (an unbounded backlog). Returns the header."""
    lines = (d / "events.jsonl").read_text().splitlines()
    header, events = json.loads(lines[0]), [json.loads(x) for x in lines[1:]]
    t0 = header["t_start"]
    header["config"]["diloco"]["max_staleness"] = 16
    buf = BUFFER_LINES + ([(22.0, "syncer-0", "learner-1", 4_000_000, 20, 5),
                           (23.0, "syncer-0", "learner-1", 9_000_000, 40, 5)] if runaway else [])
    events += [{"t": t0 + s, "src": src, "kind": "link_buffer", "peer": peer, "unsent_bytes": b, "frames": f,
                "superseded": sup} for s, src, peer, b, f, sup in buf]
    events += [{"t": t0 + s, "src": "learner-1", "kind": "starved", "shard": "syncer-0", "step": heard + steps,
                "tries": tries, "silent_steps": steps, "heard_step": heard, "silent_cycles": cyc}
               for s, tries, steps, heard, cyc in STARVED]
    events.append({"t": t0 + 27.0, "src": "syncer-0", "kind": "drop", "what": "Contribution", "fragment": 1,
                   "learner": "learner-1", "incarnation": 1, "seq": 40, "reason": "stale", "staleness": 30,
                   "max_staleness": 16})
    for e in events:
        if e["kind"] == "done":
            for peer, (most, sup) in DONE_LINKS[e["src"]].items():
                e["links"][peer].update(unsent_max=most, superseded=sup)
    events.sort(key=lambda e: e["t"])
    (d / "events.jsonl").write_text("".join(json.dumps(e) + "\n" for e in [header, *events]))
    s = _summary(d)
    s["checks"] = [c for c in s["checks"] if c["name"] != "link_buffers_bounded"]
    s["checks"].append(checks.link_buffers_bounded(eventlog.read(d)).to_dict())
    (d / "summary.json").write_text(json.dumps(s))
    return header


def test_link_buffer_rows_one_series_per_direction_that_ever_waited(run):
    add_link_lines(run)
    rows = series.link_buffer_rows(eventlog.read(run))
    got = {}
    for r in rows:
        got.setdefault(r["link"], []).append((round(r["t"], 3), r["unsent_bytes"], r["frames"], r["superseded"],
                                              r["seg"]))
    assert got == {  # learner-1 → syncer-0 only ever said 0: no series
        "learner-0 → syncer-0": [(5.0, 1_000, 0, 0, 0), (6.0, 250_000, 1, 0, 0), (7.0, 0, 0, 0, 0)],
        "syncer-0 → learner-1": [(20.0, 400_000, 2, 3, 0), (21.0, 900_000, 3, 5, 0), (30.0, 100_000, 0, 5, 1),
                                 (31.0, 0, 0, 5, 1)]}
    assert [r["i"] for r in rows] == list(range(len(rows)))


def test_link_counters_come_from_the_done_lines(run):
    add_link_lines(run)
    got = {r["link"]: (r["unsent_max"], r["superseded"], r["connects"]) for r in series.link_counters(eventlog.read(run))}
    assert got == {"learner-0 → syncer-0": (250_000, 0, 2), "learner-1 → syncer-0": (1_000, 0, 1),
                   "syncer-0 → learner-0": (0, 0, 1), "syncer-0 → learner-1": (950_000, 5, 2)}
    # the fixture's own done lines have no buffer counters: no rows (the page leaves the table out)
    assert series.link_counters(eventlog.read(FIXTURE)) == []


def test_page_draws_what_waits_on_each_link_and_who_starved(run):
    add_link_lines(run)
    html = render_run(run).read_text()
    specs = _specs(html)
    assert {"buffers", "staleness_time"} <= set(specs)
    for name, spec in specs.items():
        assert all(spec["datasets"].values()), f"{name}: an empty dataset"
    # what waits on each link: the link_buffer lines as drawn, the check's bound as the rule
    drawn = specs["buffers"]["datasets"]["buffers"]
    assert [(r["link"], r["t"], r["unsent_bytes"]) for r in drawn] == [
        ("learner-0 → syncer-0", 5.0, 1_000), ("learner-0 → syncer-0", 6.0, 250_000), ("learner-0 → syncer-0", 7.0, 0),
        ("syncer-0 → learner-1", 20.0, 400_000), ("syncer-0 → learner-1", 21.0, 900_000),
        ("syncer-0 → learner-1", 30.0, 100_000), ("syncer-0 → learner-1", 31.0, 0)]
    chk = next(c for c in _summary(run)["checks"] if c["name"] == "link_buffers_bounded")
    frame = max(e["bytes"] for e in eventlog.read(run).of("send"))
    assert chk["valid"] is True and chk["bound"] == model_checks.HELD_BYTES + (3 + 2) * frame
    rule, = specs["buffers"]["datasets"]["bound"]
    assert (rule["bytes"], rule["held_bytes"], rule["frame_bytes"]) == (chk["bound"], model_checks.HELD_BYTES, frame)
    assert _y_scale(specs["buffers"]).get("type") is None  # 950 kB under a 1.27 MB bound: a linear axis
    # the done lines' counters, a table
    row = re.search(r"<tr><td>syncer-0 → learner-1</td>(.*?)</tr>", html).group(1)
    assert re.findall(r'<td class="num">([^<]*)</td>', row)[:3] == ["950 kB", "950 kB", "5"]
    # starved lines: marks on learner-1's lane, and a table
    marks = specs["timeline"]["datasets"]["starved"]
    assert [(m["lane"], m["t"], m["shard"], m["silent_cycles"], m["tries"]) for m in marks] == [
        ("learner-1", 22.5, "syncer-0", 4.17, 1), ("learner-1", 26.0, "syncer-0", 7.67, 2)]
    assert "Black ▼ on a learner's lane" in html and html.count('<td class="num">4.17</td>') == 1
    # staleness over time: every merge, max_staleness from the config, the stale drop
    st = specs["staleness_time"]["datasets"]
    merges = eventlog.read(run).of("merge")
    assert len(st["merges"]) == len(merges)
    assert sorted(r["staleness"] for r in st["merges"]) == sorted(e["staleness"] for e in merges)
    assert st["max_staleness"] == [{"staleness": 16}]
    drop, = st["stale_drops"]
    assert (drop["learner"], drop["t"], drop["staleness"], drop["max_staleness"]) == ("learner-1", 27.0, 30, 16)
    assert "red crosses: the 1 contribution it dropped as stale" in html
    # the key figure
    assert re.search(r'<div class="label">most unsent</div><div class="value">950 kB</div>'
                     r'<div class="sub">bound 1.27 MB; starved 2 times</div>', html)


def _y_scale(spec: dict) -> dict:
    layer = next(x for x in spec["layer"] if x.get("data", {}).get("name") == "buffers")
    return layer["encoding"]["y"].get("scale") or {}


def test_a_runaway_backlog_fails_the_check_and_reads_on_a_symlog_axis(run):
    add_link_lines(run, runaway=True)
    html = render_run(run).read_text()
    specs = _specs(html)
    assert _y_scale(specs["buffers"])["type"] == "symlog"
    assert max(r["unsent_bytes"] for r in specs["buffers"]["datasets"]["buffers"]) == 9_000_000
    assert re.search(r'<tr class="fail" data-check="link_buffers_bounded">', html)
    assert "syncer-0 → learner-1 had up to 9 MB waiting unsent (bound 1.27 MB)" in html
    assert re.search(r'<tr class="fail"><td>syncer-0 → learner-1 <span class="chip fail">over</span>', html)


def test_an_old_log_says_it_has_no_link_buffer_lines(run):
    html = render_run(run).read_text()  # the fixture: no link_buffer, starved or stale lines
    specs = _specs(html)
    assert "buffers" not in specs and "starved" not in specs["timeline"]["datasets"]
    assert '<section id="buffers">' in html and "no link buffer lines in this log" in html
    assert "no learner was starved" in html and "Black ▼" not in html
    assert "most unsent" not in html
    # staleness over time still drawn from the merge lines; the config has no max_staleness: no rule
    assert set(specs["staleness_time"]["datasets"]) == {"faults", "merges"}


def test_a_long_run_keeps_the_stalest_merge_of_each_bucket(monkeypatch):
    log = eventlog.read(FIXTURE)
    merges = log.of("merge")
    monkeypatch.setattr(series, "MAX_MERGE_POINTS", 50)
    rows, w = series.staleness_rows(log)
    assert w == 1.0 and len(rows) < len(merges)
    assert sum(r["n"] for r in rows) == len(merges)
    for learner in {e["learner"] for e in merges}:
        assert max(r["staleness"] for r in rows if r["learner"] == learner) == max(
            e["staleness"] for e in merges if e["learner"] == learner)


def test_link_buffer_check_failure_names_the_worst_link():
    d = {"violations": [{"src": "learner-1", "peer": "syncer-0", "unsent_max": 26_468_068, "bound": 1_267_478},
                        {"src": "syncer-0", "peer": "learner-1", "unsent_max": 74_608_968, "bound": 1_267_478}],
         "held_bytes": 360_448, "frame_bytes": 181_406, "peaks": {}}
    row, = check_rows.check_rows([{"name": "link_buffers_bounded", "valid": False, "value": 74_608_968,
                             "bound": 1_267_478, "details": d}])
    assert (row["value"], row["bound"], row["section"]) == ("74.6 MB", "1.27 MB", "buffers")
    assert row["why"] == "syncer-0 → learner-1 had up to 74.6 MB waiting unsent (bound 1.27 MB) (2 links over)"


def test_a_long_run_keeps_each_links_peaks_and_emptyings(run, monkeypatch):
    add_link_lines(run, runaway=True)
    log = eventlog.read(run)
    every = series.link_buffer_rows(log)
    monkeypatch.setattr(series, "MAX_BUFFER_POINTS", 5)
    monkeypatch.setattr(series, "bucket_s", lambda duration_s: 5.0)  # a bucket of 5 s
    kept = series.link_buffer_rows(log)
    assert len(kept) < len(every) and [r["i"] for r in kept] == list(range(len(kept)))
    for link in {r["link"] for r in every}:
        mine, all_ = [r for r in kept if r["link"] == link], [r for r in every if r["link"] == link]
        assert max(r["unsent_bytes"] for r in mine) == max(r["unsent_bytes"] for r in all_)
        assert mine[-1]["unsent_bytes"] == 0  # the last emptying stays
        assert [r["t"] for r in mine] == sorted(r["t"] for r in mine)
