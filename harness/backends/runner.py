"""Runs a scenario on the cluster tier: cluster up, fault schedule walked at its
times, event logs merged, the global model evaluated, metrics and checks written.

    result = run_scenario(load_scenario("chaos"), Path("runs"))

The run directory gets `events.jsonl` (first line: seed, full config, scenario,
drawn schedule, replay command), `scenario.toml`, `summary.json`. Everything the
run started is stopped on every way out (the `with` blocks), Ctrl-C included.
"""
from __future__ import annotations

import json

import os
import shlex
import time
from pathlib import Path

from diloco_chaos.harness import eventlog
from diloco_chaos.harness.backends.cluster import LocalCluster
from diloco_chaos.harness.judging.losses import final_eval_event
from diloco_chaos.harness.progress import Progress
from diloco_chaos.harness.run.injector import Injector
from diloco_chaos.harness.run.loop import MAX_STEPS_FACTOR, Budget, log_header, run_end_s, token_budget, training_start, walk
from diloco_chaos.harness.run.result import RunResult, summarize, unique_dir
from diloco_chaos.harness.scenarios.scenario import Scenario
from diloco_chaos.harness.scenarios.scenario_toml import scenario_to_toml
from diloco_chaos.trainer.config import RunConfig



def run_scenario(s: Scenario, out: Path, *, run_dir: Path | None = None, label: str | None = None,
                 live: bool = True, reference: Path | None = None, expect: bool = True) -> RunResult:
    """`expect=False`: judge only safety, not the scenario's [expect] table (used for
    the data-parallel comparison, which the expectations are not written for)."""
    cfg = s.run_config()
    run_dir = run_dir or unique_dir(out, label or s.name)
    (run_dir / "scenario.toml").write_text(scenario_to_toml(s))
    header = log_header(s, cfg, "cluster", f"diloco-chaos replay {shlex.quote(str(run_dir))}")
    from diloco_chaos.trainer.units.shell import planted_bugs
    if bugs := planted_bugs():  # DILOCO_CHAOS_BUGS: every process runs with these
        header["bugs"] = sorted(bugs)
    harness_events: list[dict] = []

    def emit(kind: str, src: str, **fields) -> None:
        harness_events.append({"t": round(time.time(), 6), "src": src, "kind": kind, **fields})

    shape = s.shape()
    from diloco_chaos.trainer.numerics.tasks import task_for_run

    header["task"] = task_for_run(cfg).describe()  # loss_floor: the entropy floor of the task
    kw = dict(shards=s.cluster.shards, seed=s.seed, wan=s.wan, slices=s.cluster.slices,
              max_steps_factor=MAX_STEPS_FACTOR, listen=s.cluster.listen, spares=s.spare_roles(),
              spare_pool=s.cluster.spare_pool,
              small_disks=tuple(sorted({f.target for f in s.schedule().faults if f.kind == "disk_full"})),
              fuse_disks=tuple(sorted({f.target for f in s.schedule().faults if f.kind in ("disk_slow", "lost_writes")})),
              fuse_journal=any(f.kind == "lost_writes" for f in s.schedule().faults))
    if s.cluster.backend == "docker":
        from diloco_chaos.harness.backends.docker_cluster import DockerCluster

        cluster = DockerCluster(run_dir, cfg.to_dict(), engines=s.cluster.engines, **kw)
    else:
        cluster = LocalCluster(run_dir, cfg.to_dict(), **kw)
    progress = Progress(run_dir, s, enabled=live, total_tokens=token_budget(cfg), end_s=run_end_s(s.train))
    try:
        with cluster:
            header["topology"] = cluster.topology
            header["t_launch"] = time.time()
            header["cpus"] = os.cpu_count()  # the run's pace: how many units start at once per core
            injector = Injector(cluster, shape, emit, dp_rollback=cfg.diloco.mode == "dp")
            injector.setup()
            watch = _Watch(cluster, injector, progress)
            budget = Budget(cfg, cluster, injector, lambda: progress.tokens)
            clock = _WallClock(watch.poll)
            try:
                header["t_start"] = t0 = training_start(
                    clock, lambda: bool(watch.crashes) or len(progress.first_step) >= cfg.diloco.learners)
                progress.started(t0)
                walk(s.schedule(), clock, injector, budget, t0, s.train)
            finally:
                header["t_end"] = time.time()
                injector.teardown()
                progress.stop()
                header["crashes"] = watch.crashes
        header["crashes"] = watch.crashes + cluster.stop_errors  # (the stop runs as the cluster closes)
        header["stop_kills"] = cluster.stop_kills
    except BaseException:
        header.setdefault("t_end", time.time())
        header.setdefault("t_start", header.get("t_launch", header["t_end"]))
        header["interrupted"] = True
        if (run_dir / "logs").exists():
            eventlog.merge(run_dir, header, harness_events)  # what happened so far is kept
        raise
    header.setdefault("t_end", time.time())
    _global_evals(run_dir, cfg, cluster.topology, header, harness_events)
    _inner_replay(run_dir, cfg, cluster.topology, header, harness_events)
    eventlog.merge(run_dir, header, harness_events)
    summary = summarize(run_dir, s, reference, expect=expect)
    return RunResult(run_dir, summary)


class _WallClock:
    """The run loop's clock (harness/run/loop.py) on wall time: waiting is polling the cluster."""

    def __init__(self, poll):
        self.poll = poll

    def now(self) -> float:
        return time.time()

    def run_until(self, t: float, until) -> None:
        wait_until(t, self.poll, until=until)


class _Watch:
    """What the harness looks at while it waits: the live progress, and units that died by
    themselves (we reap what we kill): crashes, not faults."""

    def __init__(self, cluster: LocalCluster, injector: Injector, progress: Progress):
        self.cluster, self.injector, self.progress = cluster, injector, progress
        self.crashes: list[dict] = []

    def poll(self) -> None:
        self.progress.update(self.injector)
        for name, m in self.cluster.members.items():
            if m.proc is not None and m.proc.poll() not in (None, 0):
                self.crashes.append({"unit": name, "incarnation": m.incarnation, "rc": m.proc.returncode,
                                     "stdout_tail": self.cluster.stdout_tail(name, m.incarnation)})
                self.injector.emit("unit_down", name, reason="crashed", rc=m.proc.returncode)
                m.proc = None


def _global_evals(run_dir: Path, cfg: RunConfig, topology: dict, header: dict, events: list) -> None:
    """The global model's held-out loss along the run (from the syncer shards' kept
    checkpoints, at the times they were taken) and at the end: harness `eval` lines with
    `global: true`; the last one is the run's final loss (harness/run/global_eval.py)."""
    from diloco_chaos.harness.run import global_eval
    along, why = global_eval.over_time(run_dir, cfg, topology, header.get("t_start", 0.0), header["t_end"])
    events += [{"t": round(p["t"], 6), "src": "harness", "kind": "eval", "loss": p["loss"], "step": None,
                "global": True, "snapshot": True} for p in along]
    final, why_final = global_eval.final(run_dir, cfg, topology)
    if final is not None:
        events.append(final_eval_event(time.time(), cfg.steps, final))
    errors = [w for w in (why, why_final) if w]
    if errors:  # in the log's header too, where a report or a failed test can show it
        header["global_eval_errors"] = errors
        (run_dir / "global_eval_error.txt").write_text("\n".join(errors) + "\n")


def _inner_replay(run_dir: Path, cfg: RunConfig, topology: dict, header: dict, events: list) -> None:
    """The harness's gradient of every learner's sampled inner step (its `inner_audit` lines
    in the processes' logs): harness `inner_gradient` lines (harness/run/inner_replay.py),
    which inner_steps_reexecuted reads. A failure is kept in the header, never raised."""
    from diloco_chaos.harness.run import inner_replay
    audits = []
    for path in sorted((run_dir / "logs").glob("*.jsonl")):
        with open(path) as f:
            audits += [json.loads(line) for line in f if '"inner_audit"' in line and line.endswith("\n")]
    try:
        events += inner_replay.gradient_lines(cfg, list(topology["learners"]), audits)
    except Exception as e:  # noqa: BLE001 - the run's log must still be written
        header["inner_replay_error"] = f"{type(e).__name__}: {e}"


def wait_until(t_wall: float, poll, interval_s: float = 0.1, until=lambda: False) -> None:
    """Sleeps until wall time `t_wall` (or `until()`), calling `poll()` every interval."""
    while (left := t_wall - time.time()) > 0 and not until():
        poll()
        time.sleep(min(interval_s, left))
