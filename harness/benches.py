"""The four benchmarks of issue 3: `diloco-chaos bench overhead|bandwidth|parity|wan`.

Each is `run(out_dir) -> dict` (registered in harness/bench.py) and keeps its run
directories under out_dir/NAME/. Figures, configurations and what they mean:
docs/BENCHMARKS.md. Machinery: harness/bench_runs.py.

Common configuration: the default tiny model and Markov task (batch 16 x 64 tokens),
defaults H = 6, P = 3, K = 1, τ = 1, α = 0, one syncer shard, outer SGD lr 0.7
without momentum (`OUTER`, see BENCHMARKS.md for why).
"""
from __future__ import annotations

import math
import os
import statistics
from dataclasses import asdict, replace
from pathlib import Path

from harness.bench_runs import (ClusterRun, bare_process, bare_steps, best_window_rate, rate_without,
                                run_cluster, window_rate)
from harness.toxiproxy_client import LinkProfile
from trainer.config import DilocoConfig, InnerOptConfig, OuterOptConfig, RunConfig, with_preset
from trainer.tasks import task_for_run

OUTER = OuterOptConfig(lr=0.7, momentum=0.0)


def _cfg(name: str, steps: int, **diloco) -> RunConfig:
    return RunConfig(name=name, seed=0, steps=steps, outer=OUTER, diloco=DilocoConfig(**diloco),
                     inner=InnerOptConfig(total_steps=max(steps, 21)))


def _describe(cfg: RunConfig) -> dict:
    d = cfg.diloco
    return {"steps": cfg.steps, "M": d.learners, "mode": d.mode, "H": d.sync_every, "P": cfg.n_fragments,
            "K": d.quorum, "tau": d.overlap, "compression": d.compression,
            "broadcast_compression": d.broadcast_compression, "downlink": d.downlink,
            "outer": {"lr": cfg.outer.lr, "momentum": cfg.outer.momentum, "nesterov": cfg.outer.nesterov},
            "tokens_per_step": cfg.task.batch_size * cfg.task.seq_len}


# ------------------------------------------------------------------ overhead

OVERHEAD_RUNS = {"batch16": (16, 400), "batch64": (64, 150)}   # name: (batch rows, steps); batch16 = default
OVERHEAD_SKIP = 20   # the first steps (compiles, fetch) are left out


def overhead(out_dir: Path) -> dict:
    """One learner + one syncer shard through Toxiproxy (loopback, no faults) vs the bare
    inner loop of the same model and batches. The learner (and the bare loop) run alone
    on one CPU, the syncer, Toxiproxy and this process on the other: a learner owns its
    hardware, the syncer lives elsewhere. The bare loop runs before and after the system
    run; its rate is their mean. Headline: the default batch (16 x 64 tokens); batch64
    shows how the fixed per-step cost amortises over a 4x longer step."""
    cpus = sorted(os.sched_getaffinity(0))
    learner_cpus, other_cpus = {cpus[-1]}, set(cpus[:-1]) or {cpus[-1]}
    res = {}
    for name, (rows, steps) in OVERHEAD_RUNS.items():
        cfg = _cfg(f"overhead-{name}", steps, learners=1)
        cfg = replace(cfg, task=replace(cfg.task, batch_size=rows))
        res[name] = {**_overhead_once(out_dir / "overhead" / name, cfg, learner_cpus, other_cpus),
                     "config": {**_describe(cfg), "window_steps": [OVERHEAD_SKIP + 1, steps - 1]}}
    head = res["batch16"]
    return {"ratio": head["ratio"], "system_tokens_per_s": head["system_tokens_per_s"],
            "bare_tokens_per_s": head["bare_tokens_per_s"], "goal": 0.95,
            "learner_cpus": sorted(learner_cpus), "other_cpus": sorted(other_cpus), **res}


def _overhead_once(run_dir: Path, cfg: RunConfig, learner_cpus, other_cpus) -> dict:
    first, last = OVERHEAD_SKIP, cfg.steps - 1   # the last step's line waits for the final eval
    bares = [bare_process(cfg, cfg.steps, learner_cpus)]
    run = run_cluster(run_dir, cfg, learner_cpus=learner_cpus, other_cpus=other_cpus, sample_cpu=True)
    bares.append(bare_process(cfg, cfg.steps, learner_cpus))
    lr = run.learners["learner-0"]
    sys_rate = window_rate(lr.steps, first, last)
    pauses = [e["t"] for e in lr.of("eval", "checkpoint_saved")]
    between = rate_without(lr.steps, first, last, pauses)
    bare_rates = [window_rate(bare_steps(b), first, last) for b in bares]
    bare = statistics.mean(r["tokens_per_s"] for r in bare_rates)
    # CPU seconds per token: insensitive to other load on the machine
    bare_cpu = statistics.mean((b["cpu"][last - 1] - b["cpu"][first - 1]) / r["tokens"]
                               for b, r in zip(bares, bare_rates))
    learner_cpu = run.cpu.between("learner-0", sys_rate["t0"], sys_rate["t1"])
    others_cpu = {n: run.cpu.between(n, sys_rate["t0"], sys_rate["t1"]) for n in ("syncer-0", "toxiproxy")}
    best_bare = max(best_window_rate(bare_steps(b), first, last) for b in bares)
    return {
        "ratio": sys_rate["tokens_per_s"] / bare,
        "ratio_best_50_steps": best_window_rate(lr.steps, first, last) / best_bare,
        "system_tokens_per_s": sys_rate["tokens_per_s"], "bare_tokens_per_s": bare,
        "bare_runs_tokens_per_s": [r["tokens_per_s"] for r in bare_rates],
        "system_step_ms": 1000 * sys_rate["seconds"] / (last - first),
        "bare_step_ms": statistics.mean(1000 * r["seconds"] / (last - first) for r in bare_rates),
        "ratio_between_evals_and_checkpoints": between["tokens_per_s"] / bare,
        "gaps_with_eval_or_checkpoint": between["gaps_dropped"],
        "cpu_ratio": (bare_cpu * sys_rate["tokens"] / learner_cpu) if learner_cpu else None,
        "learner_cpu_s": learner_cpu, "bare_cpu_s": bare_cpu * sys_rate["tokens"],
        "other_cpu_s": others_cpu, "window_s": sys_rate["seconds"], "run_dir": str(run.run_dir),
    }


# ------------------------------------------------------------------ bandwidth

BW_M = 4
BW_STEPS = 300          # runs read to the target loss: long enough for DP and DDL to reach it
BW_RUNS = {  # key: (steps, diloco overrides; "preset": the paper preset)
    "dp": (BW_STEPS, {"mode": "dp"}),
    "fp32": (48, {"compression": "fp32"}),
    "int4": (48, {"compression": "int4"}),
    "int4_H50": (100, {"compression": "int4", "sync_every": 50}),
    "int4_H50_K4": (100, {"compression": "int4", "sync_every": 50, "quorum": BW_M}),
    # compressed broadcasts: Θ comes back as an int4 delta with error feedback
    "int4_bcast": (BW_STEPS, {"compression": "int4", "broadcast_compression": "int4"}),
    "int4_bcast_answer": (48, {"compression": "int4", "broadcast_compression": "int4", "downlink": "answer"}),
    "int4_bcast_H50": (100, {"compression": "int4", "broadcast_compression": "int4", "sync_every": 50}),
    "int4_bcast_H50_K4": (100, {"compression": "int4", "broadcast_compression": "int4", "sync_every": 50,
                                "quorum": BW_M}),
    "preset": (BW_STEPS, {"preset": "paper"}),
}


def _bw_cfg(key: str, steps: int, over: dict) -> RunConfig:
    over = dict(over)
    preset = over.pop("preset", None)
    # the preset brings its own outer optimizer; the other runs use OUTER
    d = with_preset({"diloco": {"learners": BW_M, **over}, **({} if preset else {"outer": asdict(OUTER)})}, preset)
    return RunConfig.from_dict({**d, "name": f"bw-{key}", "seed": 0, "steps": steps,
                                "eval_every": WAN_EVAL_EVERY, "inner": {"total_steps": max(steps, 21)}})


def bandwidth(out_dir: Path) -> dict:
    """Bytes per trained token at the learners' transport (bytes written + read on every
    link, all learners, whole run incl. the start-up fetch) for DP and Decoupled DiLoCo
    (M = 4, defaults), fp32 and int4 pseudo-gradients; two extra int4 runs with H = 50,
    K = 1 and K = M; the same with int4 broadcasts; the paper preset. Each run's final
    held-out loss is kept beside its bytes: fewer bytes at a worse loss would be no gain.
    The 300-step runs (DP, int4 both ways, the preset) are also read at equal loss: the
    bytes every learner's link had carried when the learners' mean held-out loss first
    reached the target (Markov floor + 0.05 nats, as `wan`)."""
    runs = {k: run_cluster(out_dir / "bandwidth" / k, _bw_cfg(k, steps, over), timeout_s=900)
            for k, (steps, over) in BW_RUNS.items()}
    per = {k: _bytes_per_token(r) for k, r in runs.items()}
    dp = per["dp"]["total"]
    ddl = {k: per[k]["total"] for k in ("fp32", "int4", "int4_bcast", "preset")}
    reduction = {k: dp / v for k, v in ddl.items()}
    steady = {k: per["dp"]["steady"] / v["steady"] for k, v in per.items() if k != "dp"}
    k4 = per["int4_H50_K4"]
    # the K = M run had its broadcasts been int4 too (downlink payload / 8; headers < 1 %)
    k4_int4_reduction = per["dp"]["steady"] / (k4["up"] + (k4["steady"] - k4["up"]) / 8)
    target = task_for_run(runs["dp"].cfg).loss_floor() + WAN_TARGET_NATS
    to_target = {k: _bytes_to(runs[k], target) for k, (steps, _) in BW_RUNS.items() if steps == BW_STEPS}
    dp_to = to_target["dp"]
    return {
        "dp_bytes_per_token": dp, "ddl_bytes_per_token": ddl, "reduction": reduction, "goal": 400,
        "reduction_steady": steady, "target_loss": target, "bytes_to_target_loss": to_target,
        "reduction_to_target_loss": {k: dp_to["bytes"] / v["bytes"] if dp_to and v else None
                                     for k, v in to_target.items() if k != "dp"},
        # at a fixed message mix the reduction grows linearly in H: H x 400 / reduction
        "H_for_400x_int4": {"K1": 6 * 400 / steady["int4"], "K1_from_H50": 50 * 400 / steady["int4_H50"],
                            "K4_from_H50": 50 * 400 / steady["int4_H50_K4"],
                            "K4_int4_broadcast_estimate": 50 * 400 / k4_int4_reduction,
                            "int4_bcast_K1": 6 * 400 / steady["int4_bcast"],
                            "int4_bcast_answer_K1": 6 * 400 / steady["int4_bcast_answer"],
                            "int4_bcast_K1_from_H50": 50 * 400 / steady["int4_bcast_H50"],
                            "int4_bcast_K4_from_H50": 50 * 400 / steady["int4_bcast_H50_K4"]},
        "final_eval": {k: r.mean_final_eval() for k, r in runs.items()},
        "global_loss": {k: r.global_loss for k, r in runs.items()},
        "detail": per, "config": {k: _describe(r.cfg) for k, r in runs.items()},
    }


def _bytes_to(run: ClusterRun, target: float) -> dict | None:
    """Bytes on the learners' links (their send + recv lines, start-up fetch included) and
    tokens trained up to the eval at which the learners' mean loss first reached `target`."""
    reached = _time_to(run, target)
    if reached is None:
        return None
    t0 = min(e["t"] for lr in run.learners.values() for e in lr.steps if e["step"] == 1)
    until = t0 + reached["seconds"]
    moved = sum(e["bytes"] for lr in run.learners.values() for e in lr.of("send", "recv") if e["t"] <= until)
    return {"bytes": moved, "step": reached["step"], "loss": reached["loss"],
            "tokens": sum(e["tokens"] for lr in run.learners.values() for e in lr.steps
                          if e["step"] <= reached["step"])}


def _bytes_per_token(run: ClusterRun) -> dict:
    """total: transport counters / tokens; up/down: the learners' sent/received share;
    steady: from the send/recv lines, without the start-up fetch (FragmentUpdate rejoin
    replies) and without repeats of a seq (dp re-sends its first GradSteps when the
    link-up event is handled after the first step); commits and updates per contribution."""
    sent = sum(lr.link_bytes["sent"] for lr in run.learners.values())
    recv = sum(lr.link_bytes["recv"] for lr in run.learners.values())
    tokens = run.tokens
    steady = 0
    for lr in run.learners.values():
        seen = set()
        for e in lr.of("send", "recv"):
            key = (e["kind"], e["msg"], e.get("fragment"), e.get("seq"))
            if e.get("rejoin") or (e.get("seq") is not None and key in seen):
                continue  # the start-up fetch; a GradStep re-sent on (re)connect, its mean re-sent
            seen.add(key)
            steady += e["bytes"]
    contribs = sum(1 for lr in run.learners.values() for e in lr.of("send") if e["msg"] == "Contribution")
    updates = sum(1 for lr in run.learners.values() for e in lr.of("recv")
                  if e["msg"] in ("FragmentUpdate", "FragmentDelta") and not e.get("rejoin"))
    commits = sum(1 for e in run.syncer if e["kind"] == "round_commit")
    return {"total": (sent + recv) / tokens, "up": sent / tokens, "down": recv / tokens,
            "steady": steady / tokens, "tokens": tokens, "bytes": sent + recv,
            "round_commits": commits, "contributions": contribs,
            "updates_per_contribution": updates / contribs if contribs else None,
            "contributions_per_commit": contribs / commits if contribs and commits else None}


# ------------------------------------------------------------------ parity

PARITY_M = 4
PARITY_TASKS = {"markov": 300, "corpus": 400}   # task: steps per learner


def parity(out_dir: Path) -> dict:
    """Final held-out loss of Decoupled DiLoCo (M = 4) and DP (M = 4, the mean gradient every
    step) after the same tokens, fault-free, at the project defaults (trainer/config.py,
    outer optimizer included), and at the paper preset (`tasks.<task>.preset`), on each
    task. Top-level keys are the Markov task's (as before); `tasks.<task>` holds each.
    Loss = mean of the learners' last evals, and the global model's (DDL: Θ from the
    shard's last checkpoint)."""
    tasks = {task: _parity_task(out_dir, task, steps) for task, steps in PARITY_TASKS.items()}
    mk = tasks["markov"]
    return {**{k: mk[k] for k in ("dp_loss", "ddl_loss", "entropy_floor", "parity_gap", "gap_to_floor",
                                   "excess_loss_ratio", "ddl_learner_losses", "tokens", "wall_s", "config")},
            "goal": 0.01, "goal_corpus": 0.02, "goal_excess_loss_ratio": 1.2, "tasks": tasks}


def _parity_task(out_dir: Path, task: str, steps: int) -> dict:
    runs = {}
    for key, mode, preset in (("dp", "dp", None), ("decoupled", "decoupled", None), ("preset", "decoupled", "paper")):
        d = with_preset({"diloco": {"learners": PARITY_M, "mode": mode}}, preset)
        cfg = RunConfig.from_dict({**d, "name": f"parity-{task}-{key}", "seed": 0, "steps": steps,
                                   "task": {"kind": task}, "inner": {"total_steps": max(steps, 21)}})
        runs[key] = run_cluster(out_dir / "parity" / task / key, cfg, timeout_s=600)
    dp = runs["dp"]
    floor = task_for_run(dp.cfg).loss_floor()
    dp_loss = dp.mean_final_eval()
    out = {"dp_loss": dp_loss, "entropy_floor": floor, **_parity_of(runs["decoupled"], dp_loss, floor),
           "tokens": {"dp": dp.tokens, "ddl": runs["decoupled"].tokens},
           "wall_s": {"dp": dp.wall_s, "ddl": runs["decoupled"].wall_s},
           "config": {"dp": _describe(dp.cfg), "ddl": _describe(runs["decoupled"].cfg)},
           # the paper preset (docs/BENCHMARKS.md), same tokens
           "preset": {**_parity_of(runs["preset"], dp_loss, floor), "config": _describe(runs["preset"].cfg),
                      "wall_s": runs["preset"].wall_s}}
    if floor is not None:  # the corpus has no known entropy floor
        out["gap_to_floor"] = {"dp": dp_loss - floor, "ddl": out["ddl_loss"] - floor}
    else:
        out["gap_to_floor"] = None
    return out


def _parity_of(ddl: ClusterRun, dp_loss: float, floor: float | None) -> dict:
    """One DDL run against DP: its learners' mean last eval, the global Θ's, the gaps."""
    loss, glob = ddl.mean_final_eval(), ddl.global_loss
    return {"ddl_loss": loss, "parity_gap": (loss - dp_loss) / dp_loss,
            "ddl_learner_losses": [lr.final_eval for lr in ddl.learners.values()], "ddl_global_loss": glob,
            "global_parity_gap": None if glob is None else (glob - dp_loss) / dp_loss,
            "excess_loss_ratio": None if floor is None else (loss - floor) / (dp_loss - floor)}


# ------------------------------------------------------------------ wan

WAN_LATENCY_MS = 20                               # one-way, each link
WAN_RATES_KBPS = (32_000, 8_000, 2_000, 1_000)    # the sweep: every learner-syncer link, each direction
WAN_M = 4
WAN_STEPS = 300              # DP's unthrottled reference run and every DDL run (Markov, to the floor)
WAN_EVAL_EVERY = 10          # held-out evals along those runs: the time to the target is read off them
WAN_TARGET_NATS = 0.05       # target = the Markov entropy floor + this
WAN_DP_TIMED = (10, 2)       # a throttled DP run: steps, and the first steps left out of its rate
WAN_SKIP = 4                 # (the defaults' DDL run at 32 Mbit/s: steps left out of its rate)
# "More than 20 times faster" over 2-5 Gbps for a 12B model: the public figures and what we
# assume to turn them into DP's transfer / compute per step (docs/BENCHMARKS.md, "wan")
PAPER = {"params": 12e9, "grad_bytes_per_param": 2, "wan_gbps": (2.0, 5.0),
         "tokens_per_step": 4e6, "accelerators": 2048, "peak_flops": 918e12, "mfu": 0.4,
         "claimed_speedup": 20}


def wan(out_dir: Path) -> dict:
    """Time to a held-out loss target (Markov floor + 0.05 nats) over thin links, DP vs
    Decoupled DiLoCo at the paper preset, swept over the link rate. DP's loss per step does
    not depend on the link: its steps to the target come from one unthrottled run, its step
    time from a short run throttled at each rate (`dp_seconds` = the product). DDL runs
    throttled for real at each rate; its time is from its first step to the eval that
    first reaches the target (evals included). DDL at the project defaults runs at the
    first rate only, timed the old way (tokens/s to DDL's tokens)."""
    ref = run_cluster(out_dir / "wan" / "dp_reference", _wan_cfg("wan-dp-ref", "dp", WAN_STEPS), timeout_s=900)
    floor = task_for_run(ref.cfg).loss_floor()
    target = floor + WAN_TARGET_NATS
    dp_curve = _eval_curve(ref)
    dp_steps = next((step for step, loss, _ in dp_curve if loss <= target), None)
    steps, skip = WAN_DP_TIMED
    timed = lambda kbps: _wan_cfg(f"wan-dp-{kbps}", "dp", steps, eval_every=100)  # noqa: E731 - no evals
    # DP's compute per step: the same short run, unthrottled
    compute_step_s = _job_rate(run_cluster(out_dir / "wan" / "dp_compute", timed(0)), skip)["step_s"]
    sweep = []
    for kbps in WAN_RATES_KBPS:
        link = LinkProfile(bandwidth_kbps=kbps, latency_ms=WAN_LATENCY_MS)
        dp = run_cluster(out_dir / "wan" / f"dp_{kbps}", timed(kbps), wan=link, timeout_s=900)
        dp_step = _job_rate(dp, skip)["step_s"]
        ddl = run_cluster(out_dir / "wan" / f"ddl_{kbps}", _wan_cfg(f"wan-ddl-{kbps}", "decoupled", WAN_STEPS),
                          wan=link, timeout_s=900)
        reached = _time_to(ddl, target)
        dp_s = dp_step * dp_steps if dp_steps else None
        rate_ddl = _job_rate(ddl, WAN_SKIP)
        sweep.append({
            "bandwidth_kbps": kbps, "dp_step_s": dp_step, "dp_seconds": dp_s,
            "ddl_seconds": reached and reached["seconds"], "ddl_steps_to_target": reached and reached["step"],
            "speedup_to_target_loss": dp_s / reached["seconds"] if dp_s and reached else None,
            "ddl_step_s": rate_ddl["step_s"],
            "ddl_link_utilization": max(_link_demand(ddl, rate_ddl).values()) / (kbps * 125) / rate_ddl["seconds"],
            "dp_network_share": 1 - compute_step_s / dp_step,
            "ddl_final_eval": ddl.mean_final_eval(), "ddl_global_loss": ddl.global_loss,
            "ddl_curve": _eval_curve(ddl), "wall_s": {"dp": dp.wall_s, "ddl": ddl.wall_s}})
    head = _headline(sweep, compute_step_s, _n_params(ref.cfg))
    dp_final = ref.mean_final_eval()
    ddl_final = statistics.mean(r["ddl_final_eval"] for r in sweep)
    return {
        "target_loss": target, "entropy_floor": floor, "latency_ms": WAN_LATENCY_MS,
        "speedup_to_target_loss": head["speedup_to_target_loss"], "headline_kbps": head["bandwidth_kbps"],
        "crossing_20x_kbps": _crossing(sweep, 20), "paper_equivalent": head["paper_equivalent"],
        "dp_steps_to_target": dp_steps, "dp_compute_step_s": compute_step_s,
        "dp_seconds_note": "DP's time = its step time measured throttled at each rate x the steps its "
                           "unthrottled run needed to reach the target (its loss per step does not depend on the link)",
        "final_eval": {"dp": dp_final, "ddl_mean_over_sweep": ddl_final},
        "final_parity_gap": (ddl_final - dp_final) / dp_final,
        "dp_curve": dp_curve, "sweep": sweep,
        "config": {"dp": _describe(ref.cfg), "ddl": _describe(_wan_cfg("wan-ddl", "decoupled", WAN_STEPS))},
        "ddl_defaults": _wan_defaults(out_dir, WAN_RATES_KBPS[0], target),
    }


def _wan_cfg(name: str, mode: str, steps: int, eval_every: int = WAN_EVAL_EVERY) -> RunConfig:
    """M = 4 at the paper preset (DP: the same run, every step averaged), evals every 10 steps."""
    d = with_preset({"diloco": {"learners": WAN_M, "mode": mode}}, "paper")
    return RunConfig.from_dict({**d, "name": name, "seed": 0, "steps": steps, "eval_every": eval_every,
                                "inner": {"total_steps": max(WAN_STEPS, 21)}})


def _eval_curve(run: ClusterRun) -> list:
    """[step, the learners' mean held-out loss, seconds since the job's first step (the
    latest learner's eval line)] at every step all learners evaluated."""
    t0 = min(e["t"] for lr in run.learners.values() for e in lr.steps if e["step"] == 1)
    by: dict[int, list] = {}
    for lr in run.learners.values():
        for e in lr.of("eval"):
            by.setdefault(e["step"], []).append(e)
    n = len(run.learners)
    return [[step, statistics.mean(e["loss"] for e in es), max(e["t"] for e in es) - t0]
            for step, es in sorted(by.items()) if len(es) == n]


def _time_to(run: ClusterRun, target: float) -> dict | None:
    for step, loss, t in _eval_curve(run):
        if loss <= target:
            return {"step": step, "seconds": t, "loss": loss}
    return None


def _crossing(sweep: list, x: float) -> float | None:
    """The link rate (kbit/s, log-linear between sweep points) below which the speedup is ≥ x."""
    pts = [(r["bandwidth_kbps"], r["speedup_to_target_loss"]) for r in sweep if r["speedup_to_target_loss"]]
    pts.sort(reverse=True)
    if not pts or pts[0][1] >= x:
        return pts[0][0] if pts else None
    for (k0, s0), (k1, s1) in zip(pts, pts[1:]):
        if s0 < x <= s1:
            f = (math.log(x) - math.log(s0)) / (math.log(s1) - math.log(s0))
            return math.exp(math.log(k0) + f * (math.log(k1) - math.log(k0)))
    return None


def _headline(sweep: list, compute_step_s: float, n_params: int) -> dict:
    """The paper-equivalent rate: where our DP's transfer per step over its compute per step
    is the 12B run's at 2-5 Gbps (PAPER's assumptions); the headline is the sweep's
    thinnest rate at or above it (all rates are above it: the thinnest)."""
    p = PAPER
    flops_s = p["accelerators"] * p["peak_flops"] * p["mfu"]
    compute_s = 6 * p["params"] * p["tokens_per_step"] / flops_s
    # a ring all-reduce moves ~2x the gradient through each site's link, per direction
    transfer_s = [2 * p["params"] * p["grad_bytes_per_param"] * 8 / (g * 1e9) for g in p["wan_gbps"]]
    ratios = [t / compute_s for t in transfer_s]
    # ours: each learner's gradient up then the mean down, fp32, through one link
    ours_bits = 2 * 4 * n_params * 8
    rates = [ours_bits / (r * compute_step_s) / 1000 for r in ratios]   # kbit/s
    claim_kbps = ours_bits / ((p["claimed_speedup"] - 1) * compute_step_s) / 1000
    equivalent = {"assumptions": p, "paper_compute_step_s": compute_s, "paper_transfer_step_s": transfer_s,
                  "paper_transfer_over_compute": ratios, "kbps_range": sorted(rates),
                  "kbps_if_transfer_is_19x_compute": claim_kbps,
                  "note": "at rates at or below kbps_range's top our DP spends as large a share of a step "
                          "on the link as DP would on the paper's 2-5 Gbps WAN, under these assumptions"}
    top = max(rates)
    at = [r for r in sweep if r["bandwidth_kbps"] >= top] or sweep[:1]
    row = min(at, key=lambda r: r["bandwidth_kbps"])
    return {"speedup_to_target_loss": row["speedup_to_target_loss"], "bandwidth_kbps": row["bandwidth_kbps"],
            "paper_equivalent": equivalent}


def _wan_defaults(out_dir: Path, kbps: int, target: float) -> dict:
    """DDL at the project defaults on the first sweep rate: to the same target, and the old
    figure (tokens/s to equal tokens, against DP's throttled step rate)."""
    link = LinkProfile(bandwidth_kbps=kbps, latency_ms=WAN_LATENCY_MS)
    cfg = RunConfig(name="wan-ddl-defaults", seed=0, steps=WAN_STEPS, eval_every=WAN_EVAL_EVERY,
                    diloco=DilocoConfig(learners=WAN_M), inner=InnerOptConfig(total_steps=WAN_STEPS))
    run = run_cluster(out_dir / "wan" / "ddl_defaults", cfg, wan=link, timeout_s=900)
    rate = _job_rate(run, WAN_SKIP)
    reached = _time_to(run, target)
    return {"bandwidth_kbps": kbps, "ddl_seconds": reached and reached["seconds"],
            "ddl_steps_to_target": reached and reached["step"], "ddl_step_s": rate["step_s"],
            "ddl_link_utilization": max(_link_demand(run, rate).values()) / (kbps * 125) / rate["seconds"],
            "final_eval": run.mean_final_eval(), "global_loss": run.global_loss, "config": _describe(cfg)}


def _job_rate(run: ClusterRun, skip: int) -> dict:
    """Job tokens/s over steps skip+1 .. steps-1: from the earliest learner's line for
    step `skip` to the latest learner's line for the second-to-last step."""
    first, last = skip, run.cfg.steps - 1
    t0 = min(e["t"] for lr in run.learners.values() for e in lr.steps if e["step"] == first)
    t1 = max(e["t"] for lr in run.learners.values() for e in lr.steps if e["step"] == last)
    tokens = sum(e["tokens"] for lr in run.learners.values() for e in lr.steps if first < e["step"] <= last)
    return {"t0": t0, "t1": t1, "seconds": t1 - t0, "tokens": tokens, "tokens_per_s": tokens / (t1 - t0),
            "step_s": (t1 - t0) / (last - first)}


def _link_demand(run: ClusterRun, window: dict) -> dict:
    """Bytes each link direction was handed inside the window: what the syncer queued for
    each learner (its send lines) and what each learner queued for the syncer."""
    out: dict[str, int] = {}
    inside = lambda e: window["t0"] <= e["t"] <= window["t1"]  # noqa: E731
    for e in run.syncer:
        if e["kind"] == "send" and inside(e):
            out[f"down:{e['peer']}"] = out.get(f"down:{e['peer']}", 0) + e["bytes"]
    for name, lr in run.learners.items():
        out[f"up:{name}"] = sum(e["bytes"] for e in lr.of("send") if inside(e))
    return out


def _n_params(cfg: RunConfig) -> int:
    import jax

    params = jax.eval_shape(task_for_run(cfg).init_params, jax.random.PRNGKey(0))
    return sum(x.size for x in jax.tree.leaves(params))
