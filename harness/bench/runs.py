"""Machinery shared by the issue-3 benchmarks (harness/bench/benches.py).

- `run_cluster`: one fault-free cluster run (real processes, real Toxiproxy), read
  back from the learners' and the syncer's event logs into a `ClusterRun`.
- `bare_loop`: the learner's inner loop with nothing around it (same model, inner
  optimizer and task batches, loss fetched one step late); `bare_process` runs it
  in a fresh Python process started like a learner, so both get the same XLA setup.
- `window_rate`: tokens/s over a window of inner steps from step events.
- `pin` / `cpu_s` / `CpuSampler`: CPU affinity and CPU time of processes we started.

Everything returns plain data; the benchmarks turn it into their JSON.
"""
from __future__ import annotations

import json
import os
import shutil
import statistics
import subprocess
import sys
import threading
import time
from dataclasses import dataclass, field
from pathlib import Path

from diloco_chaos.harness.backends import procs
from diloco_chaos.harness.backends.cluster import LocalCluster
from diloco_chaos.harness.links import LinkProfile
from diloco_chaos.trainer.config import RunConfig

EVAL_EVERY = 10      # held-out evals along the runs read at a target loss (bench wan, bandwidth)
TARGET_NATS = 0.05   # the target loss: the Markov entropy floor + this


# ------------------------------------------------------------------ processes and CPUs

def pin(pid: int, cpus: set[int]) -> None:
    """Sets the CPU affinity of every thread of `pid` (threads created later inherit it)."""
    for tid in os.listdir(f"/proc/{pid}/task"):
        try:
            os.sched_setaffinity(int(tid), cpus)
        except OSError:  # the thread ended meanwhile
            pass


def cpu_s(pid: int) -> float:
    """User + system CPU seconds of process `pid`, all threads."""
    with open(f"/proc/{pid}/stat") as f:
        fields = f.read().rsplit(")", 1)[1].split()
    return (int(fields[11]) + int(fields[12])) / os.sysconf("SC_CLK_TCK")


class CpuSampler:
    """Samples (wall time, CPU seconds) of some pids every `every_s` in a thread."""

    def __init__(self, every_s: float = 0.1):
        self.every_s, self.samples = every_s, {}
        self._pids: dict[str, int] = {}
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._run, daemon=True)

    def watch(self, name: str, pid: int) -> None:
        self._pids[name] = pid
        self.samples.setdefault(name, [])
        if not self._thread.is_alive():
            self._thread.start()

    def _run(self) -> None:
        while not self._stop.is_set():
            for name, pid in list(self._pids.items()):
                try:
                    self.samples[name].append((time.time(), cpu_s(pid)))
                except (OSError, IndexError):
                    pass  # exited
            self._stop.wait(self.every_s)

    def stop(self) -> None:
        self._stop.set()
        if self._thread.is_alive():
            self._thread.join()

    def between(self, name: str, t0: float, t1: float) -> float | None:
        """CPU seconds `name` used between wall times t0 and t1 (linear between samples)."""
        s = self.samples.get(name, [])
        if len(s) < 2 or not s[0][0] <= t0 < t1 <= s[-1][0]:
            return None
        return _interp(s, t1) - _interp(s, t0)


def _interp(samples: list[tuple[float, float]], t: float) -> float:
    for (ta, ca), (tb, cb) in zip(samples, samples[1:]):
        if ta <= t <= tb:
            return ca if tb == ta else ca + (cb - ca) * (t - ta) / (tb - ta)
    raise ValueError(f"time {t} outside the samples")


# ------------------------------------------------------------------ cluster runs

@dataclass
class LearnerRun:
    name: str
    events: list[dict]

    def of(self, *kinds: str) -> list[dict]:
        return [e for e in self.events if e["kind"] in kinds]

    @property
    def steps(self) -> list[dict]:
        return self.of("step")

    @property
    def tokens(self) -> int:
        return sum(e["tokens"] for e in self.steps)

    @property
    def final_eval(self) -> float:
        return self.of("eval")[-1]["loss"]

    @property
    def link_bytes(self) -> dict[str, int]:
        """Bytes the learner's transport wrote (sent) and read (recv), all links."""
        done = self.of("done")[-1]["links"]
        return {"sent": sum(s["bytes_sent"] for s in done.values()),
                "recv": sum(s["bytes_recv"] for s in done.values())}


@dataclass
class ClusterRun:
    run_dir: Path
    cfg: RunConfig
    wall_s: float
    learners: dict[str, LearnerRun]
    syncer: list[dict]
    cpu: CpuSampler | None = None
    pids: dict[str, int] = field(default_factory=dict)
    global_loss: float | None = None  # the global model's loss on the final held-out batches

    @property
    def tokens(self) -> int:
        return sum(lr.tokens for lr in self.learners.values())

    def mean_final_eval(self) -> float:
        return sum(lr.final_eval for lr in self.learners.values()) / len(self.learners)


def _read_events(path: Path) -> list[dict]:
    lines = path.read_text().splitlines() if path.exists() else []
    return [json.loads(line) for line in lines if line.endswith("}")]


def run_cluster(run_dir: Path, cfg: RunConfig, *, wan: LinkProfile | None = None, timeout_s: float = 170.0,
                learner_cpus: set[int] | None = None, other_cpus: set[int] | None = None,
                sample_cpu: bool = False) -> ClusterRun:
    """One fault-free run of `cfg` (one syncer shard, cfg.diloco.learners learner units),
    every link through Toxiproxy (shaped by `wan` if given). With `learner_cpus` /
    `other_cpus` the learners run on the one set and the syncer, Toxiproxy and this
    process on the other. Raises RuntimeError naming the run dir if a learner does not
    finish its steps within `timeout_s`."""
    shutil.rmtree(run_dir, ignore_errors=True)
    run_dir.mkdir(parents=True)
    names = [f"learner-{i}" for i in range(cfg.diloco.learners)]
    cluster = LocalCluster(run_dir, cfg.to_dict(), shards=1, seed=cfg.seed, wan=wan)
    sampler = CpuSampler() if sample_cpu else None
    mine = os.sched_getaffinity(0)
    t0 = time.time()
    try:
        if other_cpus:
            pin(os.getpid(), other_cpus)  # the syncer and Toxiproxy inherit it
        cluster.start(start_learners=False)
        pids = {"syncer-0": cluster.pid("syncer-0"), "toxiproxy": cluster.toxiproxy.pid}
        for n in names:
            cluster.spawn(n)
            pids[n] = cluster.pid(n)
            if learner_cpus:
                pin(pids[n], learner_cpus)  # before the child imports JAX: its XLA pool sees these CPUs
        if sampler:
            for n, pid in pids.items():
                sampler.watch(n, pid)
        finished = cluster.wait_exit(names, timeout_s)
    finally:
        if sampler:
            sampler.stop()
        cluster.close()
        pin(os.getpid(), mine)
    wall = time.time() - t0
    learners = {n: LearnerRun(n, _read_events(run_dir / "logs" / f"{n}.0.jsonl")) for n in names}
    if not finished or any(len(lr.steps) < cfg.steps for lr in learners.values()):
        raise RuntimeError(f"a learner of {run_dir} did not finish {cfg.steps} steps within {timeout_s:.0f} s; "
                           f"its output is in {run_dir / 'stdout'}")
    glob = _global_loss(run_dir, cfg, names)
    shutil.rmtree(run_dir / "ckpt", ignore_errors=True)  # megabytes nobody reads afterwards
    return ClusterRun(run_dir, cfg, wall, learners, _read_events(run_dir / "logs" / "syncer-0.0.jsonl"),
                      sampler, pids, glob)


def _global_loss(run_dir: Path, cfg: RunConfig, names: list[str]) -> float | None:
    """The held-out loss of the model the run produced, on `task.final_eval_batches` batches
    (64; the learners' own evals use the first 4): Θ from the shard's last checkpoint, or in
    dp modes learner-0's (every learner holds the global model). None if it could not be read."""
    from diloco_chaos.harness.run.global_eval import final

    losses, _ = final(run_dir, cfg, {"shards": {"syncer-0": list(range(cfg.n_fragments))}, "learners": names})
    return None if not losses else sum(losses) / len(losses)  # (final gives each held-out batch's loss)


# ------------------------------------------------------------------ rates

def window_rate(steps: list[dict], first: int, last: int) -> dict:
    """Tokens/s over inner steps first+1 .. last, from step events (t = when the step's
    line was stamped; every line is stamped at the same point of its step, so differences
    are step times)."""
    by = {e["step"]: e for e in steps}
    if first not in by or last not in by or last <= first:
        raise ValueError(f"no step events for the window {first}..{last}")
    t0, t1 = by[first]["t"], by[last]["t"]
    tokens = sum(by[s]["tokens"] for s in range(first + 1, last + 1))
    return {"t0": t0, "t1": t1, "seconds": t1 - t0, "tokens": tokens, "tokens_per_s": tokens / (t1 - t0)}


def best_window_rate(steps: list[dict], first: int, last: int, width: int = 50) -> float:
    """The highest tokens/s over any `width` consecutive steps inside first..last: on a
    machine shared with other work, the least disturbed stretch (a 50-step window holds
    one learner checkpoint and at most one eval)."""
    by = {e["step"]: e for e in steps}
    best = 0.0
    for s in range(first, last - width + 1):
        tokens = sum(by[k]["tokens"] for k in range(s + 1, s + width + 1))
        best = max(best, tokens / (by[s + width]["t"] - by[s]["t"]))
    return best


def rate_without(steps: list[dict], first: int, last: int, pauses: list[float]) -> dict:
    """`window_rate` with every step gap that contains one of the wall times `pauses`
    (eval / checkpoint lines) removed: what the loop runs at between them."""
    by = {e["step"]: e for e in steps}
    keep_s, keep_tok, dropped = 0.0, 0, 0
    for s in range(first + 1, last + 1):
        a, b = by[s - 1]["t"], by[s]["t"]
        if any(a < p <= b for p in pauses):
            dropped += 1
            continue
        keep_s += b - a
        keep_tok += by[s]["tokens"]
    return {"tokens_per_s": keep_tok / keep_s, "gaps_dropped": dropped}


# ------------------------------------------------------------------ the bare loop

def bare_loop(cfg: RunConfig, steps: int, learner: int = 0) -> dict:
    """The learner's inner loop alone: `make_inner` steps on `task.batch(learner, s)`,
    the loss fetched one step late as the learner does. Returns one wall time
    (time.time()) and process CPU time per step, stamped at a fixed point of the step
    (after step s+1 is dispatched and step s's loss fetched), plus tokens per step."""
    import jax

    from diloco_chaos.trainer.numerics.inner import make_inner
    from diloco_chaos.trainer.numerics.tasks import task_for_run
    from diloco_chaos.trainer.units.shell import global_init

    task = task_for_run(cfg)
    inner = make_inner(cfg, task.loss_fn)
    params = global_init(task, cfg.seed)          # the learner's Θ0
    opt_state = jax.jit(inner.init)(params)       # the same zeros as inner.init, one compile
    t, cpu, tokens, pending = [], [], [], None
    for s in range(steps):
        params, opt_state, metrics = inner.step(params, opt_state, task.batch(learner, s))
        if pending is not None:
            float(pending)
            t.append(time.time())
            cpu.append(time.process_time())
        pending = metrics["loss"]
        tokens.append(int(metrics["tokens"]))
    float(pending)
    t.append(time.time())
    cpu.append(time.process_time())
    # t[i] / cpu[i]: step i+1 finished (1-based, as in step events)
    return {"t": t, "cpu": cpu, "tokens": tokens}


def bare_steps(bare: dict) -> list[dict]:
    """`bare_loop`'s result as step events, for `window_rate`."""
    return [{"step": i + 1, "t": t, "tokens": n} for i, (t, n) in enumerate(zip(bare["t"], bare["tokens"]))]


def bare_process(cfg: RunConfig, steps: int, cpus: set[int] | None = None, timeout_s: float = 120.0) -> dict:
    """`bare_loop` in a fresh process with a learner's environment (1 XLA host device,
    CPU platform, the cluster's compilation cache), pinned to `cpus` before it imports
    JAX, exactly as `run_cluster` pins a learner."""
    from diloco_chaos.harness.backends.cluster import JAX_CACHE

    env = {**os.environ, "PYTHONUNBUFFERED": "1", "XLA_FLAGS": "--xla_force_host_platform_device_count=1"}
    env.setdefault("JAX_PLATFORMS", "cpu")
    env.setdefault("JAX_COMPILATION_CACHE_DIR", str(JAX_CACHE))
    code = ("import json, sys; from harness.bench.runs import bare_loop; from trainer.config import RunConfig; "
            "a = json.loads(sys.argv[1]); "
            "print(json.dumps(bare_loop(RunConfig.from_dict(a['cfg']), a['steps'])))")
    arg = json.dumps({"cfg": cfg.to_dict(), "steps": steps})
    proc = procs.spawn([sys.executable, "-c", code, arg], stdout=subprocess.PIPE, stderr=subprocess.PIPE, env=env)
    if cpus:
        pin(proc.pid, cpus)
    try:
        out, err = proc.communicate(timeout=timeout_s)
    finally:
        procs.stop(proc, grace_s=1.0)
    if proc.returncode != 0:
        raise RuntimeError(f"the bare loop failed (rc {proc.returncode}): {err.decode(errors='replace')[-2000:]}")
    return json.loads(out.decode().strip().splitlines()[-1])


# ------------------------------------------------------------------ loss along a run

def eval_curve(run: ClusterRun) -> list:
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


def time_to(run: ClusterRun, target: float) -> dict | None:
    """The first eval at which the learners' mean loss reached `target`: {step, seconds, loss}."""
    for step, loss, t in eval_curve(run):
        if loss <= target:
            return {"step": step, "seconds": t, "loss": loss}
    return None


def describe(cfg: RunConfig) -> dict:
    """A run's configuration as the bench JSONs show it."""
    d = cfg.diloco
    return {"steps": cfg.steps, "M": d.learners, "mode": d.mode, "H": d.sync_every, "P": cfg.n_fragments,
            "K": d.quorum, "tau": d.overlap, "compression": d.compression,
            "broadcast_compression": d.broadcast_compression, "downlink": d.downlink,
            **({"sparse_density": d.sparse_density} if "sparse" in (d.compression, d.broadcast_compression) else {}),
            "error_feedback": d.uplink_feedback,
            "outer": {"lr": cfg.outer.lr, "momentum": cfg.outer.momentum, "nesterov": cfg.outer.nesterov},
            "tokens_per_step": cfg.task.batch_size * cfg.task.seq_len}
