"""The benchmark helpers (harness/bench/runs.py): rates from step lines, checked by hand.
No timing is asserted. (The bare loop itself is left to `bench overhead`: its two
compiles take 5-11 s on the shared 2-core machine, over this suite's 10 s budget.)"""
from __future__ import annotations

import pytest

from diloco_chaos.harness.bench.runs import best_window_rate, rate_without, window_rate


def _steps(times: list[float], tokens: int = 10) -> list[dict]:
    return [{"step": i + 1, "t": t, "tokens": tokens} for i, t in enumerate(times)]


def test_window_rate_counts_the_steps_after_first_up_to_last():
    steps = _steps([0.0, 1.0, 2.0, 4.0, 5.0])
    r = window_rate(steps, 1, 4)          # steps 2, 3, 4: 30 tokens in 4 - 0 = 4 s
    assert (r["tokens"], r["seconds"], r["tokens_per_s"]) == (30, 4.0, 7.5)
    with pytest.raises(ValueError):
        window_rate(steps, 4, 4)


def test_rate_without_drops_the_gaps_holding_a_pause():
    steps = _steps([0.0, 1.0, 2.0, 4.0, 5.0])
    r = rate_without(steps, 1, 5, pauses=[2.5])   # the 2 s gap before step 4 held an eval
    assert r == {"tokens_per_s": 10.0, "gaps_dropped": 1}   # 30 tokens in 1 + 1 + 1 s


def test_best_window_rate_is_the_fastest_stretch():
    steps = _steps([0.0, 1.0, 2.0, 4.0, 5.0, 6.0])
    assert best_window_rate(steps, 1, 6, width=2) == 10.0    # steps 6-5-4: 2 s for 20 tokens
    assert best_window_rate(steps, 1, 6, width=3) == 7.5


def _run(evals: dict, sends: dict | None = None):
    """A ClusterRun of two learners from {learner: [(step, loss, t)]} eval lines; step 1 at
    t = 10 for both; `sends`: {learner: [(t, bytes)]} send lines."""
    from diloco_chaos.harness.bench.runs import ClusterRun, LearnerRun
    from diloco_chaos.trainer.config import RunConfig

    learners = {}
    for name, evs in evals.items():
        events = [{"kind": "step", "step": s, "t": 10.0 + s - 1, "tokens": 100} for s in range(1, 31)]
        events += [{"kind": "eval", "step": s, "loss": loss, "t": t} for s, loss, t in evs]
        events += [{"kind": "send", "t": t, "bytes": b} for t, b in (sends or {}).get(name, [])]
        learners[name] = LearnerRun(name, events)
    return ClusterRun(None, RunConfig(steps=30), 0.0, learners, [])


def test_time_to_target_is_the_first_eval_where_the_learners_mean_reaches_it():
    from diloco_chaos.harness.bench.runs import eval_curve, time_to

    run = _run({"a": [(10, 2.0, 20.0), (20, 1.8, 31.0), (30, 1.7, 41.0)],
                "b": [(10, 2.2, 21.0), (20, 1.7, 30.0), (30, 1.7, 40.0)]})
    # means 2.1, 1.75, 1.7; time from the first step (t = 10) to the later learner's eval line
    assert eval_curve(run) == [[10, 2.1, 11.0], [20, 1.75, 21.0], [30, 1.7, 31.0]]
    assert time_to(run, 1.75) == {"step": 20, "seconds": 21.0, "loss": 1.75}
    assert time_to(run, 1.6) is None


def test_bytes_to_target_counts_the_lines_up_to_that_eval():
    from diloco_chaos.harness.bench.benches import _bytes_to

    run = _run({"a": [(10, 2.0, 20.0), (20, 1.7, 30.0)], "b": [(10, 2.0, 20.0), (20, 1.7, 30.0)]},
               sends={"a": [(15.0, 100), (30.0, 10), (35.0, 1000)], "b": [(29.0, 7)]})
    # reached at step 20, t = 30: 100 + 10 + 7 bytes (35.0 is after); 2 learners x 20 steps x 100 tokens
    assert _bytes_to(run, 1.8) == {"bytes": 117, "step": 20, "loss": 1.7, "tokens": 4000}


def test_crossing_interpolates_the_rate_on_log_scales():
    from diloco_chaos.harness.bench.wan import _crossing

    sweep = [{"bandwidth_kbps": k, "speedup_to_target_loss": s} for k, s in ((32000, 2), (8000, 8), (2000, 32))]
    # between 8000 (8x) and 2000 (32x) the speedup goes as 1 / rate: 20x at 8000 * 8 / 20
    assert _crossing(sweep, 20) == pytest.approx(3200)
    assert _crossing(sweep, 1) == 32000 and _crossing(sweep, 50) is None


def test_the_grace_bench_arms_differ_only_in_quorum_and_grace():
    from diloco_chaos.harness.bench.grace import ARMS, _direction, _summary, scenario
    cfgs = {name: scenario(arm, 4).run_config().diloco for name, arm in ARMS.items()}
    assert {n: (c.quorum, c.grace_factor) for n, c in cfgs.items()} == {
        "K=M": (4, 0.5), "K=1, no grace": (1, 0.0), "K=1, adaptive grace": (1, 0.5)}
    s = scenario(ARMS["K=M"], 4)
    assert [(f.target, f.speed) for f in s.faults] == [("learner-3", 0.8)] and s.expect.goodput_min is None
    runs = [{"goodput": 0.6, "final_loss": 1.8, "learners_per_round": 4.0, "vs_K_M": None},
            {"goodput": 0.8, "final_loss": 1.7, "learners_per_round": 4.0, "vs_K_M": None}]
    km = _summary(runs)
    assert (km["goodput"], km["goodput_range"], km["final_loss_range"]) == (0.7, [0.6, 0.8], [1.7, 1.8])
    d = _direction({"K=M": km, "K=1, no grace": {"goodput": 0.9, "final_loss": 1.76, "learners_per_round": 1.0},
                    "K=1, adaptive grace": {"goodput": 0.9, "final_loss_range": [1.75, 1.765],
                                            "learners_per_round": 1.5}})
    assert list(d.values()) == ["yes", "yes", "within noise"]  # 1.76 is inside [1.75, 1.765]


def test_parity_over_seeds_means_the_gaps_and_keeps_each_seed():
    from diloco_chaos.harness.bench.benches import seed_means

    def seed(s, dp, ddl, preset):
        return {"seed": s, "dp_loss": dp, "dp_global_loss": dp, "ddl_loss": ddl, "ddl_global_loss": ddl,
                "parity_gap": (ddl - dp) / dp, "global_parity_gap": (ddl - dp) / dp, "excess_loss_ratio": None,
                "ddl_learner_losses": [ddl], "tokens": {"dp": 100 + s}, "entropy_floor": None,
                "preset": {"ddl_loss": preset, "parity_gap": (preset - dp) / dp, "excess_loss_ratio": None,
                           "ddl_learner_losses": [preset], "config": "p"}}

    out = seed_means([seed(0, 2.0, 2.1, 2.4), seed(1, 2.0, 2.0, 2.2)])
    # gaps +5 % and 0 %: mean 2.5 %, sample sd sqrt(2 * 0.025²) = 0.0354; preset +20 % and +10 %
    assert out["parity_gap"] == pytest.approx(0.025) and out["parity_gap_sd"] == pytest.approx(0.0353553, abs=1e-6)
    assert out["ddl_loss"] == pytest.approx(2.05) and out["dp_loss"] == 2.0
    assert out["preset"]["parity_gap"] == pytest.approx(0.15) and out["preset"]["config"] == "p"
    assert out["excess_loss_ratio"] is None and out["tokens"] == {"dp": 100}  # not averaged: seed 0's
    assert [s["seed"] for s in out["seeds"]] == [0, 1] and out["seeds"][1]["parity_gap"] == 0.0
    assert "seed" not in out and "ddl_learner_losses" not in out and "ddl_learner_losses" not in out["preset"]


def test_parity_over_markov_seeds_means_the_ratio_and_keeps_the_top_level_keys(monkeypatch, tmp_path):
    """Markov over seeds 0-2 (floor 1.70, DP 1.72): learners at 1.73 / 1.724 / 1.724 have
    ratios 1.5 / 1.2 / 1.2, mean 1.3; the top level keeps its keys (the learners' own
    losses seed 0's) and gap_to_floor is of the mean losses (0.02, 0.026)."""
    from diloco_chaos.harness.bench import benches

    def one(out_dir, task, steps, seed):
        ddl = {0: 1.73, 1: 1.724, 2: 1.724}[seed] if task == "markov" else 2.1
        floor = 1.70 if task == "markov" else None
        ratio = None if floor is None else (ddl - floor) / (1.72 - floor)
        return {"seed": seed, "dp_loss": 1.72, "ddl_loss": ddl, "parity_gap": (ddl - 1.72) / 1.72,
                "excess_loss_ratio": ratio, "ddl_learner_losses": [ddl, seed], "entropy_floor": floor,
                "gap_to_floor": None, "tokens": {}, "wall_s": {}, "config": {},
                "preset": {"ddl_loss": ddl, "excess_loss_ratio": ratio, "ddl_learner_losses": [ddl]}}
    monkeypatch.setattr(benches, "_parity_seed", one)
    out = benches.parity(tmp_path)
    assert out["excess_loss_ratio"] == pytest.approx(1.3) and out["tasks"]["markov"]["preset"]["excess_loss_ratio"] \
        == pytest.approx(1.3)
    assert [s["excess_loss_ratio"] for s in out["tasks"]["markov"]["seeds"]] == pytest.approx([1.5, 1.2, 1.2])
    assert out["ddl_learner_losses"] == [1.73, 0] and out["gap_to_floor"] == pytest.approx({"dp": 0.02, "ddl": 0.026})


def test_parity_reports_the_excess_loss_ratio_of_the_learners_and_of_theta():
    """Floor 1.70, DP 1.72 (its learners and its global model): learners at 1.73 have 1.5×
    DP's excess over the floor, Θ at 1.725 1.25×; no floor (the corpus): no ratio."""
    from types import SimpleNamespace

    from diloco_chaos.harness.bench.benches import _parity_of

    run = SimpleNamespace(mean_final_eval=lambda: 1.73, global_loss=1.725,
                          learners={"learner-0": SimpleNamespace(final_eval=1.73)})
    out = _parity_of(run, 1.72, 1.72, 1.70)
    assert out["excess_loss_ratio"] == pytest.approx(1.5) and out["global_excess_loss_ratio"] == pytest.approx(1.25)
    assert out["global_parity_gap"] == pytest.approx(0.005 / 1.72)
    none = _parity_of(run, 1.72, 1.72, None)
    assert none["excess_loss_ratio"] is None and none["global_excess_loss_ratio"] is None


def test_steady_bytes_leave_out_the_fetch_and_the_closing_but_not_the_answers_it_waits_for():
    """One learner, 10 steps of 100 tokens: the start-up fetch (1000 B) and the closing Δ
    (30 B) and its answer (40 B) are left out; the steady Δs (10 + 20 B), their answers
    (5 B, and 7 B for fragment 1, still in flight at `closing`) count: 42 B / 1000 tokens."""
    from diloco_chaos.harness.bench.benches import _bytes_per_token
    from diloco_chaos.harness.bench.runs import ClusterRun, LearnerRun
    from diloco_chaos.trainer.config import RunConfig

    def line(kind, msg, fragment, nbytes, **kw):
        return {"kind": kind, "msg": msg, "fragment": fragment, "bytes": nbytes, **kw}

    events = [{"kind": "step", "step": s, "t": float(s), "tokens": 100} for s in range(1, 11)]
    events += [line("recv", "FragmentUpdate", 0, 1000, rejoin=True),
               line("send", "Contribution", 0, 10, seq=1), line("recv", "FragmentDelta", 0, 5),
               line("send", "Contribution", 1, 20, seq=2),
               {"kind": "closing", "step": 10, "fragments": [0, 1], "waiting": [1]},
               line("send", "Contribution", 0, 30, seq=3, closing=True),
               line("recv", "FragmentDelta", 1, 7),      # the answer to seq 2: steady
               line("recv", "FragmentDelta", 0, 40),     # the closing Δ's answer
               line("send", "Contribution", 1, 30, seq=4, closing=True),
               line("recv", "FragmentDelta", 1, 40),     # its answer
               {"kind": "done", "links": {"s0": {"bytes_sent": 90, "bytes_recv": 1092}}}]
    run = ClusterRun(None, RunConfig(steps=10), 0.0, {"a": LearnerRun("a", events)}, [])
    b = _bytes_per_token(run)
    assert b["steady"] == (10 + 5 + 20 + 7) / 1000 and b["total"] == (90 + 1092) / 1000
