"""`diloco-chaos bench grace`: the paper's heterogeneity result (docs/RESULTS.md, "Grace
window"), on real processes. Learner units of unequal speed: a minimum quorum of all M
(K = M) waits for the slowest every round and loses goodput; K = 1 with no grace window
commits each contribution alone and loses quality (a round averages one learner); K = 1
with the adaptive grace window should keep both, gathering the learners that are due.

The scenario is the `heterogeneous` built-in with one slow unit: learner-3 at 0.8×
speed (duty-cycled SIGSTOP/SIGCONT) for the whole run; the other units' step times jitter
by themselves (4 learners on this machine's 2 cores). Each arm runs the same token budget
under each seed; per arm and seed: goodput, wall time, the final global loss with its
bootstrap interval (64 held-out batches), learners per committed round, and the final
loss against the K = M arm of the same seed (paired bootstrap over the same batches).
"""
from __future__ import annotations

import dataclasses
import statistics
from pathlib import Path

from diloco_chaos.faults.kinds import SlowUnit
from diloco_chaos.harness import eventlog
from diloco_chaos.harness.judging.losses import batch_losses, parity_ci

ARMS = {  # name -> [train] overrides
    "K=M": {"quorum": 4},
    "K=1, no grace": {"quorum": 1, "grace_factor": 0.0},
    "K=1, adaptive grace": {"quorum": 1},
}
SEEDS = (4, 5)
STEPS, DURATION_S, SLOW = 400, 120.0, 0.8


def scenario(arm: dict, seed: int):
    from diloco_chaos.harness.scenarios.scenario import load_scenario

    base = load_scenario("heterogeneous")
    train = dataclasses.replace(base.train, steps=STEPS, duration_s=DURATION_S, **arm)
    expect = dataclasses.replace(base.expect, goodput_min=None, loss_parity_max=None)
    return dataclasses.replace(base, name="grace", seed=seed, train=train, expect=expect,
                               faults=(SlowUnit("learner-3", 0.0, duration_s=DURATION_S, speed=SLOW),))


def _dir_name(name: str, seed: int) -> str:
    return f"{name.replace('=', '').replace(', ', '-').replace(' ', '-')}-s{seed}"


def grace(out_dir: Path) -> dict:
    from diloco_chaos.harness.backends.runner import run_scenario

    for seed in SEEDS:
        for name, arm in ARMS.items():
            run_dir = out_dir / "grace" / _dir_name(name, seed)
            if run_dir.exists():  # a run from before: this bench's runs are its own
                import shutil
                shutil.rmtree(run_dir)
            run_dir.mkdir(parents=True)
            run_scenario(scenario(arm, seed), out_dir / "grace", run_dir=run_dir, live=False, expect=False)
    return summarize(out_dir)


def summarize(out_dir: Path) -> dict:
    """The bench's figures from its run directories (out_dir/grace/ARM-sSEED)."""
    import json

    runs: dict[str, list] = {}
    for seed in SEEDS:
        ref_losses = None
        for name in ARMS:
            run_dir = out_dir / "grace" / _dir_name(name, seed)
            summary = json.loads((run_dir / "summary.json").read_text())
            losses = batch_losses(eventlog.read(run_dir / "events.jsonl"))
            if name == "K=M":
                ref_losses = losses
            ci = parity_ci(losses, ref_losses) if name != "K=M" else None
            vs = None if ci is None else {"parity": float(losses.mean() / ref_losses.mean() - 1), "ci": ci}
            part = summary.get("participation") or {}
            runs.setdefault(name, []).append({
                "seed": seed, "run_dir": str(run_dir), "goodput": summary.get("goodput"),
                "wall_s": summary.get("duration_s"), "tokens": summary.get("tokens"),
                "commits": summary.get("commits"), "staleness_mean": summary.get("staleness_mean"),
                "final_loss": summary.get("final_loss"), "final_loss_ci": summary.get("final_loss_ci"),
                "vs_K_M": vs, "learners_per_round": part.get("mean"),
                "share_rounds_2plus": part.get("share_at_least_2"),
                "waiting_on_sync": (summary.get("badput") or {}).get("waiting_on_sync")})
    arms = {name: _summary(rs) for name, rs in runs.items()}
    return {"scenario": {"learners": 4, "slow": {"learner-3": SLOW}, "steps": STEPS, "seeds": list(SEEDS),
                         "task": "markov"},
            "arms": arms, "runs": runs, "direction": _direction(arms)}


def _summary(rs: list[dict]) -> dict:
    def mean(key):
        vals = [r[key] for r in rs if r.get(key) is not None]
        return statistics.fmean(vals) if vals else None

    def span(key):
        vals = [r[key] for r in rs if r.get(key) is not None]
        return [min(vals), max(vals)] if vals else None
    vs = [r["vs_K_M"] for r in rs if r.get("vs_K_M")]
    return {"goodput": mean("goodput"), "goodput_range": span("goodput"), "final_loss": mean("final_loss"),
            "final_loss_range": span("final_loss"), "wall_s": mean("wall_s"), "commits": mean("commits"),
            "staleness_mean": mean("staleness_mean"), "learners_per_round": mean("learners_per_round"),
            "learners_per_round_range": span("learners_per_round"),
            "vs_K_M": {"parity": statistics.fmean(v["parity"] for v in vs),
                       "ci_each_seed": [[v["ci"][0], v["ci"][1]] for v in vs]} if vs else None}


def _direction(arms: dict) -> dict:
    """The paper's claims as measured here: "yes" / "no" when the arms' ranges over the
    seeds do not overlap, "within noise" when they do, None when a figure is missing."""
    km, k1, k1g = arms.get("K=M", {}), arms.get("K=1, no grace", {}), arms.get("K=1, adaptive grace", {})

    def below(a: dict, b: dict, key: str):  # a's key below b's?
        ra, rb = a.get(f"{key}_range") or [a.get(key)] * 2, b.get(f"{key}_range") or [b.get(key)] * 2
        if None in ra + rb:
            return None
        return "yes" if ra[1] < rb[0] else "no" if rb[1] < ra[0] else "within noise"
    return {"K=M loses goodput to K=1 with grace": below(km, k1g, "goodput"),
            "K=1 without grace merges fewer learners per round than with grace":
                below(k1, k1g, "learners_per_round"),
            "K=1 without grace ends at a higher loss than with grace": below(k1g, k1, "final_loss")}
