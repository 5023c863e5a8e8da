"""The HTML report's data and page, from a real run with every unit fault kind
(suites/unit/data/report_run: 2 learners × 2 slices, 1 syncer shard, trimmed of the
shard's own send/recv lines): timeline lanes and states, series, check rows, the page and
its sections, the index and the report command. Its faults, in seconds from training start:
kill_slice learner-0 6–10, pause_unit learner-1 6–9, slow_unit learner-0 13–18,
kill_unit learner-1 13 (down 4 s), wan link:learner-0 20–25 at 400 kbps.
Browser checks of the same page: suites/browser/."""
from __future__ import annotations

import argparse
import json
import re
import shutil
from pathlib import Path

import pytest

from diloco_chaos import report_cmd
from diloco_chaos.harness import eventlog
from diloco_chaos.harness.judging import metrics
from diloco_chaos.harness.errors import UserError
from diloco_chaos.reports import check_rows, page, render_index, render_run, run_facts, series, timeline
from diloco_chaos.reports.runs import load

FIXTURE = Path(__file__).parent / "data" / "report_run"
LANES = ["global model", "learner-0", "learner-1", "learner-0 slices", "learner-1 slices", "syncer-0",
         "learner-0~syncer-0", "learner-1~syncer-0"]


def _summary(d: Path) -> dict:
    return json.loads((d / "summary.json").read_text())


def _spans(tl, lane: str, state: str) -> list[tuple[float, float]]:
    return [(g["t0"], g["t1"]) for g in tl.segments if g["lane"] == lane and g["state"] == state]


# --- timeline ----------------------------------------------------------------------------------


def test_paint_later_layers_cover_earlier_ones():
    got = timeline._paint([("up", [(0, 10)], ""), ("down", [(3, 5)], "killed"), ("paused", [(4, 6)], "")])
    assert got == [("up", 0, 3, ""), ("down", 3, 4, "killed"), ("paused", 4, 6, ""), ("up", 6, 10, "")]


def test_timeline_one_lane_per_unit_with_each_fault_as_a_state():
    tl = timeline.build(eventlog.read(FIXTURE), _summary(FIXTURE))
    assert tl.lane_names() == LANES
    approx = pytest.approx
    (a, b), = _spans(tl, "learner-1", "paused")
    assert (a, b) == (approx(6.0, abs=0.2), approx(9.0, abs=0.2))
    (a, b), = _spans(tl, "learner-1", "down")  # killed at 13 s, respawned 4 s later
    assert (a, b) == (approx(13.0, abs=0.2), approx(17.0, abs=0.2))
    (a, b), = _spans(tl, "learner-0", "slow")
    assert (a, b) == (approx(13.0, abs=0.2), approx(18.0, abs=0.2))
    (a, b), = _spans(tl, "learner-0 slices", "slice lost")
    assert (a, b) == (approx(6.0, abs=0.2), approx(10.0, abs=0.2))
    (a, b), = _spans(tl, "learner-0~syncer-0", "throttled")
    assert (a, b) == (approx(20.0, abs=0.2), approx(25.0, abs=0.2))
    assert _spans(tl, "learner-1~syncer-0", "throttled") == []  # the wan fault was on learner-0's link only
    # recovering: from the new incarnation's first step to restart + recovery_s (the metrics' figure)
    rec, = _summary(FIXTURE)["recovery"]
    (a, b), = _spans(tl, "learner-1", "recovering")
    assert b == approx(rec["t_s"] + rec["recovery_s"], abs=1e-3)
    for lane in LANES:  # segments of a lane never overlap
        segs = sorted((g["t0"], g["t1"]) for g in tl.segments if g["lane"] == lane)
        assert segs, lane
        assert all(x[1] <= y[0] + 1e-9 for x, y in zip(segs, segs[1:])), lane
    assert len(tl.faults) == 5 and {f["kind"] for f in tl.faults} == {
        "kill_slice", "pause_unit", "slow_unit", "kill_unit", "wan"}
    assert len(tl.ticks) == _summary(FIXTURE)["commits"]


def test_a_fault_that_never_ended_lasts_to_the_end():
    log = eventlog.read(FIXTURE)
    cut = eventlog.EventLog(log.header, [e for e in log.events if not (e["kind"] == "fault_end" and e["id"] == 4)])
    wan, = [f for f in timeline.faults_of(cut, 123.0) if f["kind"] == "wan"]
    assert wan["open"] and wan["b"] == 123.0


# --- series ------------------------------------------------------------------------------------


def test_link_limit_is_the_wan_faults_bandwidth_while_it_lasts():
    log = eventlog.read(FIXTURE)
    t0 = log.header["t_start"]
    faults = timeline.faults_of(log, t0 + 40)
    rows = series.link_limits(log, ["learner-0~syncer-0", "learner-1~syncer-0"], faults, 0.0, 40.0)
    mine = [(r["t"], r["limit_Bps"]) for r in rows if r["link"] == "learner-0~syncer-0"]
    # no base profile: unlimited (no rows) but while the wan fault lasts: 400 kbps = 50,000 bytes/s each way
    (a, la), (b, lb) = mine
    assert la == lb == 50_000.0
    assert (a, b) == (pytest.approx(20.0, abs=0.2), pytest.approx(25.0, abs=0.2))
    assert [r for r in rows if r["link"] == "learner-1~syncer-0"] == []


def test_link_rates_add_up_to_the_bytes_in_the_log():
    log = eventlog.read(FIXTURE)
    rows, w = series.link_rates(log, -5.0, 40.0)
    assert w == 1.0
    for link in ("learner-0~syncer-0", "learner-1~syncer-0"):
        learner = link.split("~")[0]
        for d, kind in (("up", "send"), ("down", "recv")):
            logged = sum(e["bytes"] for e in log.of(kind, src=learner) if e.get("bytes") and e.get("peer"))
            drawn = sum(r["Bps"] * w for r in rows if r["link"] == link and r["dir"] == d)
            assert drawn == pytest.approx(logged)


@pytest.mark.parametrize("duration,bucket", [(30, 1.0), (240, 1.0), (241, 2.0), (1000, 5.0), (86_400, 600.0)])
def test_bucket_keeps_a_long_run_light(duration, bucket):
    assert series.bucket_s(duration) == bucket


# --- page values -------------------------------------------------------------------------------


def test_check_rows_pass_results_through_failures_first():
    rows = check_rows.check_rows([
        {"name": "no_nan", "valid": True, "value": 0, "bound": 0, "details": {"violations": []}},
        {"name": "loss_parity_max", "valid": None, "value": None, "bound": 0.05, "details": {}},
        {"name": "goodput_min", "valid": False, "value": 0.6567, "bound": 0.7, "details": {}},
        {"name": "recovery_max_s", "valid": True, "value": 4.67, "bound": 20.0, "details": {}},
    ])
    assert [r["name"] for r in rows] == ["goodput_min", "loss_parity_max", "no_nan", "recovery_max_s"]
    g, lp, nan, rec = rows
    assert (g["status"], g["value"], g["rel"], g["bound"]) == ("fail", "65.7%", "≥", "70.0%")
    assert (lp["status"], lp["value"], lp["bound"]) == ("unknown", "–", "+5.00%")
    assert "reference" in lp["why"]
    assert (nan["value"], nan["bound"]) == ("0 violations", "0")
    assert (rec["value"], rec["rel"], rec["bound"]) == ("4.7 s", "≤", "20.0 s")


# --- the page ----------------------------------------------------------------------------------


def _specs(html: str) -> dict:
    m = re.search(r'<script type="application/json" id="specs">(.*?)</script>', html, re.S)
    return json.loads(m.group(1))


def test_page_is_self_contained_with_every_section(run):
    out = render_run(run)
    assert out == run / "report.html"
    html = out.read_text()
    assert out.stat().st_size < 5_000_000
    assert "Content-Security-Policy" in html and "connect-src 'none'" in html
    markup = re.sub(r"<script[^>]*>.*?</script>", "<script></script>", html, flags=re.S)
    assert not re.search(r"""<(script|link|img|iframe|object|embed)[^>]+(src|href|data)\s*=""", markup)
    for sid, _ in page.SECTIONS:
        assert f'<section id="{sid}">' in html
    assert '<span class="verdict">FAIL</span>' in html  # the stored summary: no_global_downtime failed
    assert re.search(r'<tr class="fail" data-check="no_global_downtime">', html)
    for c in _summary(run)["checks"]:
        assert f'data-check="{c["name"]}"' in html
    assert eventlog.read(run).header["replay"] in html
    specs = _specs(html)
    assert set(specs) == {"timeline", "loss", "badput", "learner_goodput", "recovery", "staleness", "staleness_time",
                          "links", "bpt"}  # no "buffers": the fixture predates link_buffer lines
    assert {s["lane"] for s in specs["timeline"]["datasets"]["segments"]} == set(LANES)
    for name, spec in specs.items():
        assert all(spec["datasets"].values()), f"{name}: an empty dataset"


def test_banner_follows_the_check_results(run):
    s = _summary(run)
    for c in s["checks"]:
        c["valid"] = True
    s["valid"] = True
    (run / "summary.json").write_text(json.dumps(s))
    assert '<span class="verdict">PASS</span>' in render_run(run).read_text()
    s["checks"][0]["valid"], s["valid"] = None, None
    (run / "summary.json").write_text(json.dumps(s))
    html = render_run(run).read_text()
    assert '<span class="verdict">UNKNOWN</span>' in html and "1 UNKNOWN (could not be judged; not a pass)" in html

    assert "stop-note" not in render_run(run).read_text()
    s["stop_kills"] = [{"unit": "learner-1", "incarnation": 0, "grace_s": 8.0}]  # SIGKILLed after its grace
    (run / "summary.json").write_text(json.dumps(s))
    assert "learner-1 (incarnation 0) did not leave within 8 s of the run&#39;s SIGTERM" in render_run(run).read_text()


def test_without_summary_the_checks_are_run_for_the_page(run):
    stored = _summary(run)
    (run / "summary.json").unlink()
    r = load(run)
    assert r.recomputed
    now = {c["name"]: c["valid"] for c in r.summary["checks"]}
    expected = {c["name"]: c["valid"] for c in stored["checks"]}
    # judged since with the 2 s downtime floor of real processes (it was 1 s), × the run's
    # measured pace (its units took 3.0 s to start against the reference machine's 2.0 s):
    # the stored run's one stall, 1.70 s while learner-0's link was throttled to 400 kbit/s,
    # is within it
    assert r.summary["pace"] == pytest.approx(r.summary["pace_start_s"] / 2.0) and r.summary["pace"] > 1
    assert expected["no_global_downtime"] is False
    assert r.summary["commit_gap_bound_s"] == pytest.approx(2.0 * r.summary["pace"])
    expected["no_global_downtime"] = True
    assert {c["name"]: now.get(c["name"], "absent") for c in stored["checks"]} == expected
    assert now.get("tokens_conserved", "absent") is None  # a check added since: this log cannot tell
    assert "run by this report" in render_run(run).read_text()


def test_dp_and_reference_runs_are_overlaid(run, tmp_path):
    shutil.copytree(FIXTURE, run / "dp")
    ref = tmp_path / "_reference" / "unit-faults-ref"
    shutil.copytree(FIXTURE, ref)
    s = _summary(run)
    s["dp"] = {**_summary(run / "dp"), "bytes_per_token": 2 * s["bytes_per_token"]}
    (run / "dp" / "summary.json").write_text(json.dumps(s["dp"]))
    s["reference_dir"] = str(ref)
    (run / "summary.json").write_text(json.dumps(s))
    render_run(run / "dp")
    html = render_run(run).read_text()
    specs = _specs(html)
    assert {m["who"] for m in specs["loss"]["datasets"]["means"]} == {"run", "reference", "dp"}
    assert {b["who"] for b in specs["badput"]["datasets"]["badput"]} == {"run", "reference", "dp"}
    assert [b["who"] for b in specs["bpt"]["datasets"]["b"]] == ["run", "reference", "dp"]
    assert "dp sends 2.0× more" in html
    assert 'href="dp/report.html"' in html


def test_index_links_every_run(run, tmp_path):
    other = tmp_path / "other"
    shutil.copytree(FIXTURE, other)
    pages = [render_run(run), render_run(other)]
    out = render_index(pages, tmp_path / "index")
    html = out.read_text()
    hrefs = re.findall(r'<a href="([^"]+)">', html)
    assert len(hrefs) == 2 and all((out.parent / h).resolve() in [p.resolve() for p in pages] for h in hrefs)
    assert html.count('<span class="chip fail">') == 2 and "65.7%" in html


def test_index_counts_a_test_once_and_its_reference_run_apart(run, tmp_path):
    """One test made a run and its fault-free reference (CI's --chaos-report index): "tests: 1
    passed", not 2; the reference is a REFERENCE row, not an UNKNOWN run (its loss parity has
    nothing to be judged against), and the banner counts the run under test only."""
    from diloco_chaos.reports import IndexEntry

    ref = tmp_path / "_reference" / "unit-faults-abc"
    shutil.copytree(FIXTURE, ref)
    s = _summary(ref)
    for c in s["checks"]:
        c["valid"] = None if c["name"] == "loss_parity_max" else True
    s["valid"] = None
    (ref / "summary.json").write_text(json.dumps(s))
    test = "suites/test_mine.py::test_unit_loss"
    entries = [IndexEntry(render_run(run), run, label=test, outcome="passed"),
               IndexEntry(render_run(ref), ref, label=test, outcome="passed")]
    html = " ".join(render_index(entries, tmp_path / "index").read_text().split())
    assert "tests: 1 passed, 0 failed" in html, html
    assert '<span class="verdict">1 run</span>' in html and "0 PASS, 1 FAIL, 0 UNKNOWN · 1 fault-free reference run" in html
    assert html.count('<span class="chip reference">REFERENCE</span>') == 1 and '<span class="chip unknown">' not in html


def test_report_command_renders_a_stored_run(run, tmp_path, capsys):
    parser = argparse.ArgumentParser()
    report_cmd.register(parser.add_subparsers(), "re-render")
    args = parser.parse_args(["report", str(run), "--out", str(tmp_path / "x.html")])
    assert args.func(args) == 0
    assert (tmp_path / "x.html").exists() and f"report: {tmp_path / 'x.html'}" in capsys.readouterr().out
    args = parser.parse_args(["report", str(tmp_path / "nowhere")])
    with pytest.raises(UserError, match="no events.jsonl"):
        args.func(args)


def test_a_run_cut_short_before_any_round_still_renders(tmp_path):
    """An interrupted run: one learner stepped twice, nothing merged, no summary.json."""
    header = {"kind": "config", "seed": 3, "interrupted": True, "t_start": 100.0, "t_end": 103.0,
              "config": {"diloco": {"mode": "decoupled", "learners": 1, "fragments": 1}, "model": {"n_layers": 1}},
              "topology": {"learners": ["learner-0"], "shards": {"syncer-0": [0]}}}
    events = [{"t": 99.0, "src": "learner-0", "kind": "unit_up", "incarnation": 0, "step": 0},
              {"t": 100.5, "src": "learner-0", "kind": "step", "step": 1, "tokens": 64, "loss": 5.5, "dt": 0.5},
              {"t": 101.0, "src": "learner-0", "kind": "step", "step": 2, "tokens": 64, "loss": 5.4, "dt": 0.5}]
    d = tmp_path / "cut"
    d.mkdir()
    (d / "events.jsonl").write_text("".join(json.dumps(e) + "\n" for e in [header, *events]))
    html = render_run(d).read_text()
    for sid, _ in page.SECTIONS:
        assert f'<section id="{sid}">' in html
    assert "the run was cut short" in html and "no learner restarted" in html
    assert "no merge in this run" in html  # staleness: nothing to show, and it says so


def test_fault_label_says_how_the_fault_was_done():
    f = {"kind": "pause_unit", "target": "learner-2", "via": "docker pause / unpause (cgroup freezer)"}
    assert timeline.fault_label(f) == "pause_unit learner-2 · docker pause / unpause"
    f = {"kind": "kill_unit", "target": "learner-1", "via": "docker kill; a new container after down_for"}
    assert timeline.fault_label(f) == "kill_unit learner-1 · docker kill"
    # a log from before fault_start said how (like this fixture): kind and target only
    assert timeline.fault_label({"kind": "wan", "target": "link:*", "via": None}) == "wan link:*"


def test_a_fault_done_another_way_says_so_on_the_timeline():
    """docker pause falls back to the engine's SIGSTOP when the freezer keeps refusing; the
    unit_down line says so, and the timeline shows that, not the planned mechanism."""
    from log_builder import LogBuilder

    b = LogBuilder(learners=3)
    fault = {"kind": "pause_unit", "target": "learner-2"}
    b.add(1.0, "harness", "fault_start", id=0, fault=fault, via="docker pause / unpause (cgroup freezer)")
    b.add(1.2, "learner-1", "unit_down", reason="killed", via="not this one")
    b.add(1.3, "learner-2", "unit_down", reason="paused", via="docker kill --signal SIGSTOP / SIGCONT (...)")
    b.add(4.0, "harness", "fault_end", id=0, fault=fault)
    f, = timeline.faults_of(b.log(), 10.0)
    assert (f["a"], f["b"], f["open"]) == (1.0, 4.0, False)
    assert timeline.fault_label(f) == "pause_unit learner-2 · docker kill --signal SIGSTOP / SIGCONT"


def test_backend_fact_names_where_the_units_ran(run):
    assert run_facts.backend_text({"name": "docker", "image": "diloco-chaos-host:ab12", "engine": "http+docker://x",
                              "cpus": 0.5}) == ("docker — a container per unit, image diloco-chaos-host:ab12, "
                                                "engine http+docker://x, 0.5 CPU each")
    two = {"name": "docker", "image": "i", "engines": ["unix:///a", "ssh://b"],
           "placement": {"learner-0": "unix:///a", "learner-1": "ssh://b", "syncer-0": "unix:///a"}}
    assert run_facts.backend_text(two) == ("docker — a container per unit, image i, engines unix:///a: learner-0, "
                                      "syncer-0; ssh://b: learner-1")
    assert run_facts.backend_text({"name": "local", "host": "ci-1"}) == "local — a process per unit on ci-1"
    assert run_facts.backend_text(None, "sim").startswith("sim — ")
    rows = dict(page.facts(load(run)))
    assert rows["backend"].startswith("local — ")  # the fixture's log predates the field


def test_recovery_splits_into_boot_and_rejoin_on_the_real_run():
    # learner-1's restart in the fixture: its new incarnation's Contribution seq 1
    # (fragment 1) went out with its 2nd inner step (`at_step` 2 on the send line) and was
    # merged; H = 6, so a third of a fragment cycle. boot + rejoin = recovery.
    rec, = metrics.compute(eventlog.read(FIXTURE)).recovery
    assert (rec.unit, rec.incarnation, rec.rejoin_steps, rec.sync_every) == ("learner-1", 1, 2, 6)
    assert rec.rejoin_cycles == pytest.approx(1 / 3)
    assert rec.boot_s + rec.rejoin_s == pytest.approx(rec.recovery_s)
    assert 0 < rec.rejoin_s < rec.boot_s  # the process's start dominates

    summary = {"recovery": [vars(rec)], "checks": [
        {"name": "rejoin_cycles_max", "valid": False, "value": 1 / 3, "bound": 0.25,
         "details": {"late": [vars(rec)], "never": [], "censored": []}}]}
    row, = page.recovery_rows(argparse.Namespace(summary=summary))
    assert (row["rejoin"], row["mark"]) == ("2 steps (0.33 cycles)", "late (rejoin)")
    chk, = check_rows.check_rows(summary["checks"])
    assert (chk["status"], chk["value"], chk["bound"]) == ("fail", "0.33 cycles", "0.25 cycles")
    assert "first had a contribution merged after 2 inner steps (0.33 cycles of H = 6)" in chk["why"]


def test_a_failed_check_without_a_time_is_told_field_by_field():
    # progress_merged_once's violations carry no time: the sentence lists their fields
    # (this path raised NameError before, so such a run got no report at all)
    d = {"violations": [{"learner": "learner-2", "fragment": 0, "seqs": [99, 102], "overlap_steps": 5,
                         "weight": 0.123456789}]}
    text, span = check_rows._why_failed("progress_merged_once", d, None)
    assert text == "learner=learner-2, fragment=0, seqs=[99, 102], overlap_steps=5, weight=0.1235" and span is None


def test_a_crash_is_told_in_words_with_when_and_its_last_output():
    # the runner's crash entries: during the run, or on the graceful stop (LocalCluster.record_stop)
    stop = {"unit": "learner-0", "incarnation": 0, "rc": 1, "at": "stop",
            "stdout_tail": ["Traceback (most recent call last):", "ValueError: checkpoint step 700 <= last saved step 700"]}
    row, = check_rows.check_rows([{"name": "no_crash", "valid": False, "value": 2, "bound": 0,
                                   "details": {"crashes": [stop, {"unit": "syncer-1", "incarnation": 1, "rc": 2,
                                                                   "stdout_tail": []}]}}])
    assert row["why"] == ("learner-0 (incarnation 0) exited with code 1 on the run's graceful stop; its output ends: "
                          "ValueError: checkpoint step 700 <= last saved step 700 (2 in all)")
    text, _ = check_rows._why_failed("no_crash", {"crashes": [{"unit": "syncer-1", "incarnation": 1, "rc": 2}]}, None)
    assert text == "syncer-1 (incarnation 1) exited with code 2 by itself during the run"
