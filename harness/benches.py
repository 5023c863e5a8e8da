"""The four benchmarks of issue 3: `diloco-chaos bench overhead|bandwidth|parity|wan`.

Each is `run(out_dir) -> dict` (registered in harness/bench.py) and keeps its run
directories under out_dir/NAME/. Figures, configurations and what they mean:
docs/BENCHMARKS.md. Machinery: harness/bench_runs.py.

Common configuration: the default tiny model and Markov task (batch 16 x 64 tokens),
defaults H = 6, P = 3, K = 1, τ = 1, α = 0, one syncer shard, outer SGD lr 0.7
without momentum (`OUTER`, see BENCHMARKS.md for why).
"""
from __future__ import annotations

import os
import statistics
from dataclasses import replace
from pathlib import Path

from harness.bench_runs import (ClusterRun, bare_process, bare_steps, best_window_rate, rate_without,
                                run_cluster, window_rate)
from harness.toxiproxy_client import LinkProfile
from trainer.config import DilocoConfig, InnerOptConfig, OuterOptConfig, RunConfig, TaskConfig
from trainer.tasks import task_for_run

OUTER = OuterOptConfig(lr=0.7, momentum=0.0)


def _cfg(name: str, steps: int, **diloco) -> RunConfig:
    return RunConfig(name=name, seed=0, steps=steps, outer=OUTER, diloco=DilocoConfig(**diloco),
                     inner=InnerOptConfig(total_steps=max(steps, 21)))


def _describe(cfg: RunConfig) -> dict:
    d = cfg.diloco
    return {"steps": cfg.steps, "M": d.learners, "mode": d.mode, "H": d.sync_every, "P": cfg.n_fragments,
            "K": d.quorum, "tau": d.overlap, "compression": d.compression,
            "broadcast_compression": d.broadcast_compression,
            "outer": {"lr": cfg.outer.lr, "momentum": cfg.outer.momentum},
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
BW_RUNS = {  # key: (steps, diloco overrides)
    "dp": (12, {"mode": "dp"}),
    "fp32": (48, {"compression": "fp32"}),
    "int4": (48, {"compression": "int4"}),
    "int4_H50": (100, {"compression": "int4", "sync_every": 50}),
    "int4_H50_K4": (100, {"compression": "int4", "sync_every": 50, "quorum": BW_M}),
    # compressed broadcasts: Θ comes back as an int4 delta with error feedback
    "int4_bcast": (48, {"compression": "int4", "broadcast_compression": "int4"}),
    "int4_bcast_H50": (100, {"compression": "int4", "broadcast_compression": "int4", "sync_every": 50}),
    "int4_bcast_H50_K4": (100, {"compression": "int4", "broadcast_compression": "int4", "sync_every": 50,
                                "quorum": BW_M}),
}


def bandwidth(out_dir: Path) -> dict:
    """Bytes per trained token at the learners' transport (bytes written + read on every
    link, all learners, whole run incl. the start-up fetch) for DP and Decoupled DiLoCo
    (M = 4, defaults), fp32 and int4 pseudo-gradients; two extra int4 runs with H = 50,
    K = 1 and K = M, for the H that would reach the goal; the same with int4 broadcasts.
    Each run's final held-out loss is kept beside its bytes: fewer bytes at a worse loss
    would be no gain."""
    runs = {k: run_cluster(out_dir / "bandwidth" / k, _cfg(f"bw-{k}", steps, learners=BW_M, **over))
            for k, (steps, over) in BW_RUNS.items()}
    per = {k: _bytes_per_token(r) for k, r in runs.items()}
    dp = per["dp"]["total"]
    ddl = {k: per[k]["total"] for k in ("fp32", "int4", "int4_bcast")}
    reduction = {k: dp / v for k, v in ddl.items()}
    steady = {k: per["dp"]["steady"] / v["steady"] for k, v in per.items() if k != "dp"}
    k4 = per["int4_H50_K4"]
    # the K = M run had its broadcasts been int4 too (downlink payload / 8; headers < 1 %)
    k4_int4_reduction = per["dp"]["steady"] / (k4["up"] + (k4["steady"] - k4["up"]) / 8)
    return {
        "dp_bytes_per_token": dp, "ddl_bytes_per_token": ddl, "reduction": reduction, "goal": 400,
        "reduction_steady": steady,
        # at a fixed message mix the reduction grows linearly in H: H x 400 / reduction
        "H_for_400x_int4": {"K1": 6 * 400 / steady["int4"], "K1_from_H50": 50 * 400 / steady["int4_H50"],
                            "K4_from_H50": 50 * 400 / steady["int4_H50_K4"],
                            "K4_int4_broadcast_estimate": 50 * 400 / k4_int4_reduction,
                            "int4_bcast_K1": 6 * 400 / steady["int4_bcast"],
                            "int4_bcast_K1_from_H50": 50 * 400 / steady["int4_bcast_H50"],
                            "int4_bcast_K4_from_H50": 50 * 400 / steady["int4_bcast_H50_K4"]},
        "final_eval": {k: r.mean_final_eval() for k, r in runs.items()},
        "detail": per, "config": {k: _describe(r.cfg) for k, r in runs.items()},
    }


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
    outer optimizer included), on each task. Top-level keys are the Markov task's (as
    before); `tasks.<task>` holds each. Loss = mean of the learners' last evals, and the
    global model's (DDL: Θ from the shard's last checkpoint)."""
    tasks = {task: _parity_task(out_dir, task, steps) for task, steps in PARITY_TASKS.items()}
    mk = tasks["markov"]
    return {**{k: mk[k] for k in ("dp_loss", "ddl_loss", "entropy_floor", "parity_gap", "gap_to_floor",
                                   "excess_loss_ratio", "ddl_learner_losses", "tokens", "wall_s", "config")},
            "goal": 0.01, "goal_corpus": 0.02, "goal_excess_loss_ratio": 1.2, "tasks": tasks}


def _parity_task(out_dir: Path, task: str, steps: int) -> dict:
    runs = {}
    for mode in ("dp", "decoupled"):
        cfg = RunConfig(name=f"parity-{task}-{mode}", seed=0, steps=steps,
                        diloco=DilocoConfig(learners=PARITY_M, mode=mode), task=TaskConfig(kind=task),
                        inner=InnerOptConfig(total_steps=max(steps, 21)))
        runs[mode] = run_cluster(out_dir / "parity" / task / mode, cfg)
    dp, ddl = runs["dp"], runs["decoupled"]
    floor = task_for_run(ddl.cfg).loss_floor()
    dp_loss, ddl_loss = dp.mean_final_eval(), ddl.mean_final_eval()
    out = {"dp_loss": dp_loss, "ddl_loss": ddl_loss, "entropy_floor": floor,
           "parity_gap": (ddl_loss - dp_loss) / dp_loss,
           "ddl_learner_losses": [lr.final_eval for lr in ddl.learners.values()],
           "ddl_global_loss": ddl.global_loss, "tokens": {"dp": dp.tokens, "ddl": ddl.tokens},
           "wall_s": {"dp": dp.wall_s, "ddl": ddl.wall_s},
           "config": {"dp": _describe(dp.cfg), "ddl": _describe(ddl.cfg)}}
    if floor is not None:  # the corpus has no known entropy floor
        out["gap_to_floor"] = {"dp": dp_loss - floor, "ddl": ddl_loss - floor}
        out["excess_loss_ratio"] = (ddl_loss - floor) / (dp_loss - floor)
    else:
        out["gap_to_floor"] = out["excess_loss_ratio"] = None
    if out["ddl_global_loss"] is not None:
        out["global_parity_gap"] = (out["ddl_global_loss"] - dp_loss) / dp_loss
    return out


# ------------------------------------------------------------------ wan

WAN = LinkProfile(bandwidth_kbps=32_000, latency_ms=20)   # each link, each direction; latency one-way
WAN_M = 4
WAN_DP_STEPS, WAN_DDL_STEPS, WAN_SKIP = 16, 120, 4


def wan(out_dir: Path) -> dict:
    """Every learner-syncer link throttled to WAN; seconds to DDL's token count for DP and
    Decoupled DiLoCo (M = 4, defaults). DP runs only WAN_DP_STEPS steps, so both are
    timed by their steady job rate (steps after WAN_SKIP) times DDL's token count.
    DDL never waits for its link, so its time is also bounded below by what its busiest
    link direction had to carry at the link rate (`ddl_link_bound_s`): if the learners
    outran the link, updates queued (staleness), and that bound is what counts."""
    dp = run_cluster(out_dir / "wan" / "dp", _cfg("wan-dp", WAN_DP_STEPS, learners=WAN_M, mode="dp"), wan=WAN)
    ddl = run_cluster(out_dir / "wan" / "ddl", _cfg("wan-ddl", WAN_DDL_STEPS, learners=WAN_M), wan=WAN)
    rate_dp, rate_ddl = _job_rate(dp), _job_rate(ddl)
    link_Bps = WAN.bandwidth_kbps * 1000 / 8
    busiest = max(_link_demand(ddl, rate_ddl).values())
    bound_s = busiest / link_Bps
    target = ddl.tokens
    dp_s = target / rate_dp["tokens_per_s"]
    ddl_measured_s = target / rate_ddl["tokens_per_s"]
    ddl_s = max(rate_ddl["seconds"], bound_s) * target / rate_ddl["tokens"]
    staleness = [e["staleness"] for e in ddl.syncer if e["kind"] == "merge"]
    return {
        "bandwidth_kbps": WAN.bandwidth_kbps, "latency_ms": WAN.latency_ms,
        "dp_seconds": dp_s, "ddl_seconds": ddl_s, "speedup": dp_s / ddl_s,
        "speedup_measured": dp_s / ddl_measured_s, "ddl_seconds_measured": ddl_measured_s,
        "tokens": target, "dp_timed_tokens": rate_dp["tokens"], "ddl_timed_tokens": rate_ddl["tokens"],
        "dp_step_s": rate_dp["step_s"], "ddl_step_s": rate_ddl["step_s"],
        # least time DP's bytes need on one link per step (gradient up, mean down) / its step time
        "dp_network_share": 2 * 4 * _n_params(dp.cfg) / link_Bps / rate_dp["step_s"],
        "ddl_link_utilization": bound_s / rate_ddl["seconds"],
        "ddl_link_bound_s": bound_s * target / rate_ddl["tokens"],
        "ddl_staleness_mean": statistics.mean(staleness) if staleness else None,
        "final_eval": {"dp": dp.mean_final_eval(), "ddl": ddl.mean_final_eval()},
        "wall_s": {"dp": dp.wall_s, "ddl": ddl.wall_s},
        "config": {"dp": _describe(dp.cfg), "ddl": _describe(ddl.cfg)},
        # the same link with int4 both ways (pseudo-gradients up, broadcast deltas down)
        "ddl_int4": _wan_ddl_variant(out_dir, "ddl_int4", dp_s, compression="int4",
                                     broadcast_compression="int4"),
    }


def _wan_ddl_variant(out_dir: Path, key: str, dp_s: float, **diloco) -> dict:
    """One more DDL run on the WAN links, timed as `wan` times the default one."""
    run = run_cluster(out_dir / "wan" / key, _cfg(f"wan-{key}", WAN_DDL_STEPS, learners=WAN_M, **diloco), wan=WAN)
    rate = _job_rate(run)
    bound_s = max(_link_demand(run, rate).values()) / (WAN.bandwidth_kbps * 1000 / 8)
    seconds = max(rate["seconds"], bound_s) * run.tokens / rate["tokens"]
    staleness = [e["staleness"] for e in run.syncer if e["kind"] == "merge"]
    return {"seconds": seconds, "speedup": dp_s / seconds, "step_s": rate["step_s"],
            "link_utilization": bound_s / rate["seconds"],
            "staleness_mean": statistics.mean(staleness) if staleness else None,
            "final_eval": run.mean_final_eval(), "wall_s": run.wall_s, "config": _describe(run.cfg)}


def _job_rate(run: ClusterRun) -> dict:
    """Job tokens/s over steps WAN_SKIP+1 .. steps-1: from the earliest learner's line for
    step WAN_SKIP to the latest learner's line for the second-to-last step."""
    first, last = WAN_SKIP, run.cfg.steps - 1
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
