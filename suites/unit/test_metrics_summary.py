"""harness/judging/metrics.py's run summary (uptime, bandwidth, staleness and drops, losses,
the window) on small hand-made event logs and a real fault-free sample; every expected number
is worked out by hand in the comments; the logs come from `LogBuilder` (log_builder.py)."""
from __future__ import annotations

import json
import math
from pathlib import Path

from diloco_chaos.harness import eventlog

from diloco_chaos.harness.judging import checks
from diloco_chaos.harness.judging.metrics import compute
from log_builder import LogBuilder
from metrics_helpers import approx, total

SAMPLE = Path(__file__).parent / "data" / "fault_free_2learners.jsonl"


def test_uptime_and_downtime():
    # commits at 1, 2, 3, 4, 8, 9 in a 10 s run: gaps 1, 1, 1, 4, 1, median 1, bound
    # max(1, 3 × 1) = 3 s; the 4 s gap is down. Up: [1, 4] ∪ [8, 9] = 4 s -> 0.4.
    b = LogBuilder(learners=1)
    for v, t in enumerate((1, 2, 3, 4, 8, 9), 1):
        b.commit(t, v)
    m = compute(b.log())
    assert m.commit_gap_bound_s == approx(3.0)
    assert m.uptime_s == approx(4.0) and m.uptime == approx(0.4)
    assert m.downtime == ((4.0, 8.0),)


def test_bandwidth_and_bytes_per_token():
    # 4 s run. learner-0: sends 1000 B at 0.5 and 3000 B at 1.2, receives 500 B at 1.5;
    # learner-1: sends 2000 B at 2.1. Both log 2 steps of 100 tokens -> 400 tokens.
    # link 0: up 4000, down 500, mean 4500/4 = 1125 B/s, peak window [1, 2) = 3500 B/s.
    # link 1: up 2000, mean 500 B/s, peak 2000 B/s. All: 6500 B, 1625 B/s, peak 3500 B/s,
    # 6500 / 400 = 16.25 B per token. The shard's own send line is not a learner's.
    b = LogBuilder(learners=2, t_end=4.0)
    b.send(0.5, "learner-0", 1, 1, nbytes=1000).send(1.2, "learner-0", 2, 1, nbytes=3000)
    b.add(1.5, "learner-0", "recv", peer="syncer-0", bytes=500, msg="FragmentUpdate", fragment=0, version=1)
    b.add(1.5, "syncer-0", "send", peer="learner-0", bytes=500, msg="FragmentUpdate", fragment=0, version=1)
    b.send(2.1, "learner-1", 1, 1, nbytes=2000)
    for u in ("learner-0", "learner-1"):
        b.step(3, u, 1).step(4, u, 2)
    m = compute(b.log())
    l0, l1 = m.links
    assert (l0.learner, l0.shard, l0.up_bytes, l0.down_bytes) == ("learner-0", "syncer-0", 4000, 500)
    assert l0.mean_Bps == approx(1125.0) and l0.peak_Bps == approx(3500.0)
    assert (l1.up_bytes, l1.down_bytes, l1.mean_Bps, l1.peak_Bps) == (2000, 0, approx(500.0), approx(2000.0))
    assert m.bytes_total == 6500 and m.mean_Bps == approx(1625.0) and m.peak_Bps == approx(3500.0)
    assert m.tokens == 400 and m.bytes_per_token == approx(16.25)


def test_staleness_and_drop_counts():
    b = LogBuilder(learners=1)
    for seq, s in enumerate((0, 0, 1, 3), 1):
        b.merge(seq, "learner-0", seq, 1, staleness=s)
    b.add(5, "syncer-0", "drop", what="contribution", fragment=0, learner="learner-0", incarnation=0, seq=9,
          reason="superseded", by_seq=10)
    b.add(5, "learner-0", "drop", what="Contribution", fragment=0, reason="awaiting_fetch")
    b.add(5, "learner-0", "drop", peer="syncer-0", bytes=0, msg="Contribution", learner="learner-0", seq=11)
    b.add(5, "learner-0", "drop", what="FragmentUpdate", fragment=0, version=0, reason="old_version")
    m = compute(b.log())
    assert m.staleness_hist == {0: 2, 1: 1, 3: 1}
    assert m.staleness_max == 3 and m.staleness_mean == approx(1.0)  # (0 + 0 + 1 + 3) / 4
    assert m.dropped == {"superseded": 1, "awaiting_fetch": 1, "not_sent": 1}
    assert m.to_dict()["staleness_hist"] == {"0": 2, "1": 1, "3": 1}


def test_losses_parity_and_floor():
    run = LogBuilder(learners=2, loss_floor=1.5)
    run.add(9, "learner-0", "eval", step=10, loss=3.0).add(10, "learner-0", "eval", step=20, loss=2.4)
    run.add(10, "learner-1", "eval", step=20, loss=2.0)
    m = compute(run.log())
    assert (m.final_loss, m.final_loss_from) == (approx(2.2), "learners")  # mean(2.4, 2.0)
    assert m.loss_parity is None
    run.add(10, "harness", "eval", loss=2.2, step=20, **{"global": True})
    ref = LogBuilder(learners=2).add(10, "harness", "eval", loss=2.0, step=20, **{"global": True})
    m = compute(run.log(), reference=ref.log())
    assert m.final_loss_from == "global" and m.reference_loss == approx(2.0)
    assert m.loss_parity == approx(0.1)                # (2.2 − 2.0) / 2.0
    assert m.loss_floor == approx(1.5) and m.floor_gap == approx(0.7)


def test_window_falls_back_to_event_times():
    b = LogBuilder(learners=1)
    del b.header["t_start"], b.header["t_end"]
    b.step(2, "learner-0", 1).step(5, "learner-0", 2)
    m = compute(b.log())
    assert (m.t_start, m.t_end, m.duration_s) == (2.0, 5.0, 3.0)


def test_only_time_inside_the_window_counts():
    # the runner opens the window once every learner has stepped (t_start = 2 here):
    # steps 1..6 (step k spans [k-1, k]) all merged; steps 1, 2 lie before it.
    b = LogBuilder(learners=1, t_start=2.0, t_end=6.0).up(0, "learner-0")
    b.train("learner-0", 6, merged={1, 2, 3})
    m = compute(b.log())
    assert m.productive_s == approx(4.0) and m.goodput == approx(1.0)
    assert total(m) == approx(1.0)


def test_real_fault_free_sample():
    """A real 2-learner decoupled run (150 steps each, P = 3, one shard; the send/recv lines'
    tensor_bytes / step_time_s / last_sync_s fields removed to keep the file small)."""
    log = eventlog.read(SAMPLE)
    m = compute(log)
    assert 0.5 < m.goodput < 1.0
    assert total(m) == approx(1.0)
    assert m.badput_s["dead"] == 0 and m.badput_s["paused"] == 0 and m.badput_s["rolled_back"] == 0
    assert m.restarts == 0 and m.recovery == ()
    assert m.steps == 300 and m.tokens == 300 * 1024   # 150 steps × 1024 tokens, each learner
    assert m.merges == m.commits == 148
    assert m.step_lag == 1                             # trainer/units/learner.py logs a step one step late
    # bytes per link = the transport's own counters in each learner's done line
    done = {e["src"]: e["links"]["syncer-0"] for e in log.of("done") if e["src"].startswith("learner")}
    for link in m.links:
        assert (link.up_bytes, link.down_bytes) == (done[link.learner]["bytes_sent"],
                                                    done[link.learner]["bytes_recv"])
    assert 0 <= m.staleness_max <= 10 and m.final_loss_from == "learners" and math.isfinite(m.final_loss)
    json.dumps(m.to_dict())                            # JSON-ready
    results = checks.safety_checks(log, m)
    assert {r.name: r.valid for r in results} == {
        **dict.fromkeys(["merged_at_most_once", "versions_monotonic", "no_nan", "durable_rounds_kept",
                         "no_global_downtime"], True),
        # recorded before contribute lines and snapshot global evals: the log cannot tell
        "progress_merged_once": None, "global_loss_regression": None,
        "link_buffers_bounded": None,  # and before the links counted what waits unsent
        "tokens_conserved": None,      # and before they carried token counts
        # and before the answer gate: the shard merged Δs of learner-1 from Θ0 twice (seq 1
        # and 4 of fragment 1), each carrying its drift since Θ0; the shard's lines show it
        "delta_bases_advance": False,
        # and before the audits' evidence (digests, commit_audit, copy lines): UNKNOWN, not judged
        "commits_audited": None, "copies_consistent": None, "deltas_reexecuted": None,
        "inner_steps_reexecuted": None,  # (and before the inner_audit lines)
        "weights_match_staleness": True, "quorum_respected": True,
        "grace_respected": None,  # (no live sets nor commit times on its round_commit lines)
        "guard_decisions": True,  # (no guard in that version: its config has no guard_factor)
        "restores_faithful": True, "committed_rounds_kept": True,  # (no shard restarted)
        "membership_follows_links": None,  # (no live sets on its round_commit lines)
        "starved_learners_reanchor": True,
        "progress_staleness_bounded": True,  # (no max_staleness in that version's config: no bound)
        "checkpoint_integrity": True, "restore_latest_intact": True}  # (no checkpoint damaged, no shard killed)
    assert m.badput_s["stale"] == 0
