"""The sim tier: a scenario run as a deterministic discrete-event simulation.

    result = run_sim(load_scenario("unit-loss"), Path("runs"))       # like run_scenario
    run = simulate(scenario, bugs={"merge_twice"})                   # in memory, for properties
    run.log()                                                         # an EventLog for metrics/checks

The same LearnerCore / SyncerCore, the same JAX inner steps (trainer/numerics/inner.py) and
outer steps (trainer/numerics/wiring.py), the same fault dataclasses walked by the same
Injector and run loop (harness/run/), on a virtual clock (harness/sim/world.py), over simulated
Toxiproxy links (harness/sim/net.py). It writes the cluster tier's event-log format
(`tier: "sim"`, times in virtual seconds from t_launch = 0) and the same seed gives
the same log, byte for byte. What is modelled and what is not: docs/SIMULATOR.md.
"""
from __future__ import annotations

import dataclasses
import functools
import hashlib
import json
import shlex
from dataclasses import dataclass
from pathlib import Path

import jax

from diloco_chaos.harness import eventlog, listeners
from diloco_chaos.harness.judging.losses import final_eval_event
from diloco_chaos.harness.run.control import make_topology
from diloco_chaos.harness.run.injector import Injector
from diloco_chaos.harness.run.loop import MAX_STEPS_FACTOR, Budget, log_header, run_end_s, token_budget, training_start, walk
from diloco_chaos.harness.run.result import RunResult, summarize, unique_dir
from diloco_chaos.harness.scenarios.scenario import Scenario, scenario_from_dict
from diloco_chaos.harness.scenarios.scenario_toml import scenario_to_toml
from diloco_chaos.harness.sim.progress import SimProgress
from diloco_chaos.harness.sim.world import SimParams, World
from diloco_chaos.trainer.config import RunConfig
from diloco_chaos.trainer.units.events import _plain
from diloco_chaos.harness.run import inner_replay
from diloco_chaos.trainer.numerics.inner import make_inner
from diloco_chaos.trainer.numerics.tasks import task_for_run
from diloco_chaos.trainer.numerics.wiring import fragmenter_for, learner_math, syncer_math
from diloco_chaos.trainer.units.shell import global_init

__all__ = ["SimParams", "SimRun", "launch", "simulate", "finish", "run_sim", "replay_sim", "model_for"]


@dataclass(frozen=True, eq=False)
class Model:
    """Everything numeric a run needs, built once per config (jit caches included).

    `step` / `grad` are InnerLoop's own functions (`step_fn`, `grad_fn`), jitted for one
    device: bit for bit what `InnerLoop.step` / `grad` compute on one slice (tested),
    without re-placing every leaf on a mesh each step, which costs more than the step
    on the small tasks. The simulator cuts the batch to the live slices itself."""

    task: object
    inner: object
    frag: object
    lmath: object
    smath: object
    params0: dict
    eval_batches: list
    final_batches: list
    slices: int
    tokens_per_row: int
    step: object  # (params, opt_state, batch) -> (params, opt_state, loss)
    grad: object  # (params, batch) -> (grads, loss)

    def evaluate(self, params) -> float:
        return self.inner.evaluate(params, self.eval_batches)

    def final_losses(self, params) -> list[float]:
        """The harness's final eval: `task.final_eval_batches` batches, each one's loss."""
        return self.inner.batch_losses(params, self.final_batches)


@functools.lru_cache(maxsize=8)
def _model(cfg: RunConfig) -> Model:
    task = task_for_run(cfg)
    one = dataclasses.replace(cfg, diloco=dataclasses.replace(cfg.diloco, slices=1))
    inner = make_inner(one, task.loss_fn)
    params0 = global_init(task, cfg.seed)  # Θ0, as the processes make it
    frag = fragmenter_for(cfg, params0)

    def step(params, opt_state, batch):
        params, opt_state, metrics = inner.step_fn(params, opt_state, batch)
        return params, opt_state, metrics["loss"]

    def grad(params, batch):
        grads, metrics = inner.grad_fn(params, batch)
        return grads, metrics["loss"]

    return Model(task, inner, frag, learner_math(cfg, frag), syncer_math(cfg, frag), params0,
                 task.eval_batches(), task.eval_batches(cfg.task.final_eval_batches), cfg.diloco.slices, cfg.task.tokens_per_row, jax.jit(step), jax.jit(grad))


def model_for(cfg: RunConfig) -> Model:
    """Cached by the config (its name aside): Hypothesis examples of one shape compile once."""
    return _model(dataclasses.replace(cfg, name="sim"))


@dataclass
class SimRun:
    scenario: Scenario
    header: dict
    events: list
    world: World

    def text(self) -> str:
        """events.jsonl, as the cluster tier's merge writes it."""
        lines = [json.dumps({"kind": "config", **self.header}, separators=(",", ":"), default=_plain)]
        lines += [json.dumps(e, separators=(",", ":"), default=_plain) for e in self.events]
        return "\n".join(lines) + "\n"

    def log(self) -> eventlog.EventLog:
        """The log exactly as a reader of events.jsonl sees it."""
        header, *events = (json.loads(line) for line in self.text().splitlines())
        return eventlog.EventLog(header, events)

    def write(self, run_dir: Path) -> Path:
        run_dir.mkdir(parents=True, exist_ok=True)
        (run_dir / "scenario.toml").write_text(scenario_to_toml(self.scenario))
        path = run_dir / "events.jsonl"
        path.write_text(self.text())
        listeners.run_written(run_dir)  # a failing property's example gets its page too
        return path


def _topology(s: Scenario, cfg: RunConfig) -> dict:
    topo = make_topology(s.cluster.learners, s.cluster.shards, cfg.n_fragments)
    key = json.dumps(s.to_dict(), sort_keys=True).encode()
    topo["run_id"] = hashlib.sha256(key).hexdigest()[:12]  # the cluster's is random; here, replayable
    topo["links"] = {u: {sh: f"{u}~{sh}" for sh in topo["shards"]} for u in topo["learners"]}
    topo["backend"] = {"name": "sim"}  # no processes: a discrete-event world in virtual time
    return topo


def launch(s: Scenario, *, params: SimParams = SimParams(), bugs=frozenset(), replay: str | None = None,
           probe=None) -> tuple[World, Injector, dict]:
    """The simulated cluster up at t = 0 with its injector set up, and the log's header:
    what `simulate` walks, and what a test can drive by hand (`injector.start(fault)`,
    `injector.end(fault)`, `world.clock.run_until(t)`). `probe(learner_proc, event, args)`
    sees every learner core event."""
    cfg = s.run_config()
    topology = _topology(s, cfg)
    bugs = frozenset(bugs)
    world = World(cfg, topology, model_for(cfg), params, wan=s.wan, bugs=bugs, seed=s.seed,
                  max_steps=int(MAX_STEPS_FACTOR * cfg.steps), spares=s.spare_roles(),
                  spare_pool=s.cluster.spare_pool)
    world.probe = probe
    header = {**log_header(s, cfg, "sim", replay),
              "sim": {**dataclasses.asdict(params), "bugs": sorted(bugs)},
              "task": world.model.task.describe(), "topology": topology, "t_launch": 0.0}
    injector = Injector(world, s.shape(), world.emit, dp_rollback=cfg.diloco.mode == "dp", clock=lambda: world.now)
    world.start()
    injector.setup()
    return world, injector, header


def simulate(s: Scenario, *, params: SimParams = SimParams(), bugs=frozenset(), replay: str | None = None,
             probe=None, progress: bool = False) -> SimRun:
    """Runs `s` in virtual time through the run loop both tiers share (harness/run/loop.py:
    time zero, the fault timeline, the token budget), then teardown, SIGTERM, the global eval.
    `progress`: a progress line on stderr (harness/sim/progress.py; the log is the same)."""
    world, injector, header = launch(s, params=params, bugs=bugs, replay=replay, probe=probe)
    n = len(world.topology["learners"])
    budget, clock = Budget(world.cfg, world, injector, lambda: world.tokens), _VirtualClock(world.clock)
    header["t_start"] = t0 = training_start(clock, lambda: len(world.first_step) == n)
    along = _snapshot_evals(world, t0, s.train.duration_s)
    shown = SimProgress(world, injector, s.name, run_end_s(s.train), token_budget(world.cfg)) if progress else None
    if shown is not None:
        shown.start(t0)
    try:
        walk(s.schedule(), clock, injector, budget, t0, s.train)
    finally:
        if shown is not None:
            shown.stop()
    along["on"] = False
    return finish(s, world, injector, header)


def _snapshot_evals(world: World, t0: float, duration_s: float) -> dict:
    """The global model along the run, as the process tier gets it (the shards keep a
    checkpoint every KEEP_EVERY_S of clock time and the harness evaluates at most
    MAX_POINTS of them: harness/run/global_eval.py). Here the shards' newest intact
    snapshots (a save the harness damaged is passed over, as a process's is) are evaluated every `duration / (MAX_POINTS - 1)` virtual seconds (at least
    0.5 s: a short run ends long before its duration cap, and still gets its points): a
    harness `eval` line with `global` and `snapshot`, which global_loss_regression reads.
    dp modes: a live learner's model (every learner applies the same mean gradient, so
    each holds the global model; the process tier keeps no such history yet, so there it
    stays UNKNOWN). Returns the switch that ends them (the run's end: not during the
    teardown)."""
    from diloco_chaos.harness.run.global_eval import MAX_POINTS

    state = {"on": True}
    every = max(0.5, duration_s / (MAX_POINTS - 1))

    def tick() -> None:
        if not state["on"]:
            return
        params, any_saved = world.model.params0, False
        if world.dp:
            live = [u.proc for u in world.learners.values() if u.proc is not None and u.proc.driver is not None]
            if live:
                any_saved, params = True, live[0].core.params(live[0].state)
        for shard in ([] if world.dp else world.syncers.values()):
            if shard.intact is not None:
                any_saved = True
                for p, f in shard.intact[0]["fragments"].items():
                    params = world.model.frag.set(params, int(p), f["theta"])
        if any_saved:
            world.emit("eval", "harness", loss=world.model.evaluate(params), step=None,
                       **{"global": True, "snapshot": True})
        world.clock.at(world.now + every, tick)

    world.clock.at(t0 + every, tick)
    return state


class _VirtualClock:
    """The run loop's clock (harness/run/loop.py) on the world's virtual seconds: waiting runs the events."""

    def __init__(self, clock):
        self.clock = clock

    def now(self) -> float:
        return self.clock.now

    def run_until(self, t: float, until) -> bool:
        return self.clock.run_until(t, until=until)


def finish(s: Scenario, world: World, injector: Injector, header: dict) -> SimRun:
    """The end of a run: teardown, SIGTERM to every process, the global eval."""
    header["t_end"] = world.now
    injector.teardown()
    world.close()
    header.setdefault("t_start", 0.0)
    header["crashes"], header["stop_kills"] = world.crashes, world.stop_kills
    final = _global_eval(world)
    if final is not None:
        e = final_eval_event(world.now, world.cfg.steps, final)
        world.emit("eval", "harness", loss=e["loss"], step=e["step"], batch_losses=e["batch_losses"],
                   **{"global": True})
    return SimRun(s, header, _with_inner_replay(world), world)


def _with_inner_replay(world: World) -> list:
    """The events with the harness's gradient of each sampled inner step right after its
    `inner_audit` line (harness/run/inner_replay.py), as the process runner adds them."""
    lines = inner_replay.gradient_lines(world.cfg, list(world.topology["learners"]), world.events)
    if not lines:
        return world.events
    after = {(g["learner"], g["audit_t"]): g for g in lines}
    out = []
    for e in world.events:
        out.append(e)
        if e["kind"] == "inner_audit" and (g := after.get((e["src"], e["t"]))) is not None:
            out.append(g)
    return out


def _global_eval(world: World) -> list[float] | None:
    """Each final held-out batch's loss under the global model: Θ as the shards leave it
    (dp: learner-0's last checkpoint), as the process runner assembles it from the checkpoints."""
    m = world.model
    if world.dp:
        ckpt = world.learners[world.topology["learners"][0]].ckpt
        return None if ckpt is None else m.final_losses(ckpt[0])
    params = m.params0
    for shard in world.syncers.values():
        for p, theta in (shard.theta() or {}).items():
            params = m.frag.set(params, p, theta)
    return m.final_losses(params)


def run_sim(s: Scenario, out: Path, run_dir: Path | None = None, *, label: str | None = None, live: bool = False,
            reference=None, expect: bool = True, params: SimParams = SimParams(),
            bugs=frozenset()) -> RunResult:
    """The sim tier's `run_scenario` (same keywords, same files: run_dir/events.jsonl,
    scenario.toml, summary.json; the CLI renders report.html). `live`: a progress line on stderr; planted bugs
    come from `bugs`, else from DILOCO_CHAOS_BUGS as on processes. `reference`: the fault-free
    run's folder, or a callable giving it once this run is simulated (one made beside it)."""
    from diloco_chaos.trainer.units.shell import planted_bugs

    run_dir = run_dir or unique_dir(Path(out), label or s.name)
    run = simulate(s, params=params, bugs=frozenset(bugs) or planted_bugs(),
                   replay=f"diloco-chaos replay {shlex.quote(str(run_dir))}", progress=live)
    run.write(run_dir)
    summary = summarize(run_dir, s, reference() if callable(reference) else reference, expect=expect)
    return RunResult(run_dir, summary)


def replay_sim(run_dir: Path, out_dir: Path, label: str | None = None) -> RunResult:
    """Runs a sim run's recorded scenario, schedule, sim parameters and planted bugs again."""
    header = eventlog.read(run_dir).header
    d = {**header["scenario"], "faults": header["schedule"]}
    d.pop("failure_process", None)
    s = scenario_from_dict(d, source=str(Path(run_dir) / "events.jsonl"))
    sim = dict(header.get("sim") or {})
    bugs = frozenset(sim.pop("bugs", ()))
    return run_sim(s, out_dir, params=SimParams(**sim), bugs=bugs, label=label or f"{s.name}-replay")
