"""The inner optimizer and step of one learner unit, data-parallel over its S slices.

Optimizer: `optax.chain(clip_by_global_norm(clip_norm), adamw(schedule, b1, b2,
weight_decay, mask))`, schedule = linear warmup from 0 to `lr` over `warmup_steps`,
then cosine decay to `lr / 10` at `total_steps` (held there after). Weight decay
applies to matrices only (ndim >= 2): norm scales and the quadratic's vectors are
not decayed.

Second moment (`second_moment`, DiLoCo modes): "fleet" (the default) corrects Adam's v
for the noise of a batch M times the unit's own (M learner units), so that a learner
normalises its steps as data-parallel does over the fleet's batch; "own" is plain
AdamW. trainer/numerics/fleet_adam.py says why and how; data-parallel modes always use AdamW.

Slices: the unit's S slices are S JAX devices (`jax.devices()[:S]`; on CPU the
process starts with XLA_FLAGS=--xla_force_host_platform_device_count=S). A step on
the live set `live_slices` shards the first B·|live|/S rows of the batch over those
devices ("data" axis of a `Mesh`) and keeps params and optimizer state replicated
on them; XLA's all-reduce makes the gradient the mean over the effective batch. A
lost slice therefore shrinks the effective batch proportionally and the step goes
on. Each live set is compiled once and cached; the step counter lives in the
optimizer state (an array), so nothing retraces from step to step.

Metrics are device arrays except the host-side counts (`tokens`, `rows`): fetch
them one step late to keep the host from waiting on the device.
"""
from __future__ import annotations

from collections import Counter
from typing import Any, Callable, Iterable

import jax
import jax.numpy as jnp
import numpy as np
import optax
from jax.sharding import Mesh, NamedSharding, PartitionSpec

from diloco_chaos.trainer.config import InnerOptConfig, RunConfig
from diloco_chaos.trainer.numerics.fleet_adam import scale_by_fleet_adam, split_grad
from diloco_chaos.trainer.protocol.protocol_base import DILOCO_MODES

GROUPS = 2  # row groups a learner's batch is split into for the noise estimate (trainer/numerics/fleet_adam.py;
            # 4 groups measured no better on the corpus task: 1.9172 / 1.9693 against 1.9070 / 1.9681)

LossFn = Callable[[Any, Any], jax.Array]


def make_schedule(cfg: InnerOptConfig) -> optax.Schedule:
    return optax.warmup_cosine_decay_schedule(
        init_value=0.0, peak_value=cfg.lr, warmup_steps=cfg.warmup_steps,
        decay_steps=cfg.total_steps, end_value=cfg.lr / 10)


def make_optimizer(cfg: InnerOptConfig, fleet: float = 1) -> optax.GradientTransformation:
    """AdamW after clipping; with `fleet` > 1 its second moment is corrected to a batch
    `fleet` times larger (trainer/numerics/fleet_adam.py: `update(..., noise=...)`)."""
    def decay_mask(params):
        return jax.tree.map(lambda x: jnp.ndim(x) >= 2, params)

    if fleet <= 1:
        return optax.chain(
            optax.clip_by_global_norm(cfg.clip_norm),
            optax.adamw(make_schedule(cfg), b1=cfg.b1, b2=cfg.b2,
                        weight_decay=cfg.weight_decay, mask=decay_mask))
    return optax.chain(
        optax.clip_by_global_norm(cfg.clip_norm),
        scale_by_fleet_adam(fleet, cfg.b1, cfg.b2),
        optax.add_decayed_weights(cfg.weight_decay, decay_mask),
        optax.scale_by_learning_rate(make_schedule(cfg)))


def fleet_of(cfg: RunConfig) -> int:
    """The M that a learner unit's second moment is corrected to (1: plain AdamW)."""
    if cfg.inner.second_moment == "fleet" and cfg.diloco.mode in DILOCO_MODES:
        return cfg.diloco.learners
    return 1


class InnerLoop:
    """`init`, `step`, `grad`, `apply_grads`, `evaluate` for one learner unit."""

    def __init__(self, cfg: RunConfig, loss_fn: LossFn):
        self.cfg, self.loss_fn = cfg, loss_fn
        self.S = cfg.diloco.slices
        devices = jax.devices()
        if len(devices) < self.S:
            raise ValueError(
                f"DilocoConfig.slices = {self.S} needs {self.S} JAX devices, found "
                f"{len(devices)}; on CPU start the process with XLA_FLAGS="
                f"--xla_force_host_platform_device_count={self.S}")
        self.devices = devices[: self.S]
        self.fleet = fleet_of(cfg)
        self.tx = make_optimizer(cfg.inner, self.fleet)
        self.schedule = make_schedule(cfg.inner)
        self.tokens_per_row = cfg.task.tokens_per_row
        self.trace_counts: Counter = Counter()  # (fn name, live set) -> times traced
        self._fns: dict[tuple[int, ...], dict[str, Any]] = {}
        self._in_flight: Any = None  # outputs of the last sharded call, see _dispatch
        self._apply = jax.jit(self._apply_impl)
        self._eval = jax.jit(self._eval_impl)

    # ------------------------------------------------------------ pure functions

    def grad_fn(self, params, batch):  # unjitted, as step_fn
        loss, grads = jax.value_and_grad(self.loss_fn)(params, batch)
        return grads, {"loss": loss, "grad_norm": optax.tree.norm(grads)}

    def step_fn(self, params, opt_state, batch):
        """One inner AdamW step, unjitted: what `step` compiles over a mesh of the live
        slices and the simulator compiles for one device (harness/sim/run.py)."""
        if self.fleet <= 1:
            grads, metrics = self.grad_fn(params, batch)
            updates, opt_state = self.tx.update(grads, opt_state, params)
            return optax.apply_updates(params, updates), opt_state, metrics
        loss, grads, noise = split_grad(self.loss_fn, params, batch, self.cfg.inner.clip_norm, GROUPS)
        updates, opt_state = self.tx.update(grads, opt_state, params, noise=noise)
        return (optax.apply_updates(params, updates), opt_state,
                {"loss": loss, "grad_norm": optax.tree.norm(grads)})

    def _apply_impl(self, params, opt_state, grads):
        self.trace_counts[("apply_grads", None)] += 1
        updates, opt_state = self.tx.update(grads, opt_state, params)
        return optax.apply_updates(params, updates), opt_state

    def _eval_impl(self, params, batch):
        self.trace_counts[("evaluate", None)] += 1
        return self.loss_fn(params, batch)

    # ------------------------------------------------------------ per live set

    def live_key(self, live_slices: Iterable[int] | None) -> tuple[int, ...]:
        live = tuple(range(self.S)) if live_slices is None else tuple(sorted(set(live_slices)))
        if not live or any(not 0 <= s < self.S for s in live):
            raise ValueError(f"live_slices {live_slices!r} must be a non-empty subset of "
                             f"slices 0..{self.S - 1}")
        return live

    def _compiled(self, live: tuple[int, ...]) -> dict[str, Any]:
        if live in self._fns:
            return self._fns[live]
        mesh = Mesh(np.array([self.devices[s] for s in live]), ("data",))
        repl = NamedSharding(mesh, PartitionSpec())
        data = NamedSharding(mesh, PartitionSpec("data"))

        def step_impl(params, opt_state, batch):
            self.trace_counts[("step", live)] += 1
            return self.step_fn(params, opt_state, batch)

        def grad_impl(params, batch):
            self.trace_counts[("grad", live)] += 1
            return self.grad_fn(params, batch)

        fns = {
            "repl": repl, "data": data,
            "step": jax.jit(step_impl, in_shardings=(repl, repl, data),
                            out_shardings=(repl, repl, repl)),
            "grad": jax.jit(grad_impl, in_shardings=(repl, data),
                            out_shardings=(repl, repl)),
        }
        self._fns[live] = fns
        return fns

    def _dispatch(self, fn: Callable, *args: Any) -> Any:
        """Call a sharded function with at most one such call in flight. XLA:CPU runs
        the S per-device parts on a shared thread pool and all-reduces between them;
        with two multi-device steps queued, each can hold a thread waiting for a
        participant the other step is blocking, and XLA aborts the process after
        40 s (seen here with S=2 on 2 cores). Waiting for the previous call keeps
        one step of host/device overlap and removes the deadlock."""
        if self._in_flight is not None:
            jax.block_until_ready(self._in_flight)
        out = fn(*args)
        self._in_flight = out
        return out

    def _effective(self, batch: Any, live: tuple[int, ...]) -> tuple[Any, int]:
        rows = batch.shape[0]
        if rows % self.S:
            raise ValueError(f"batch of {rows} rows does not split over {self.S} slices")
        eff = rows * len(live) // self.S
        return batch[:eff], eff

    # ------------------------------------------------------------ public API

    def init(self, params: dict) -> Any:
        return self.tx.init(params)

    def step(self, params: dict, opt_state: Any, batch: Any,
             live_slices: Iterable[int] | None = None) -> tuple[dict, Any, dict]:
        """One inner AdamW step on the live slices' share of the batch. Metrics:
        loss (before the update), grad_norm (before clipping), tokens, rows."""
        live = self.live_key(live_slices)
        fns = self._compiled(live)
        batch, eff = self._effective(batch, live)
        params, opt_state = jax.device_put((params, opt_state), fns["repl"])
        params, opt_state, metrics = self._dispatch(
            fns["step"], params, opt_state, jax.device_put(batch, fns["data"]))
        return params, opt_state, {**metrics, "tokens": eff * self.tokens_per_row,
                                   "rows": eff}

    def grad(self, params: dict, batch: Any,
             live_slices: Iterable[int] | None = None) -> tuple[dict, dict]:
        """Mean gradient over the effective batch (for the data-parallel baseline,
        which averages it across learners before `apply_grads`)."""
        live = self.live_key(live_slices)
        fns = self._compiled(live)
        batch, eff = self._effective(batch, live)
        grads, metrics = self._dispatch(fns["grad"], jax.device_put(params, fns["repl"]),
                                        jax.device_put(batch, fns["data"]))
        return grads, {**metrics, "tokens": eff * self.tokens_per_row, "rows": eff}

    def apply_grads(self, params: dict, opt_state: Any, grads: Any) -> tuple[dict, Any]:
        """The optimizer half of `step`: clip, AdamW, apply. `grads` may be numpy."""
        dev = self.devices[0]
        params, opt_state, grads = jax.device_put((params, opt_state, grads), dev)
        return self._apply(params, opt_state, grads)

    def evaluate(self, params: dict, eval_batches: list[Any]) -> float:
        """Mean of the per-batch mean losses (eval batches have equal sizes)."""
        return float(np.mean(self.batch_losses(params, eval_batches)))

    def batch_losses(self, params: dict, eval_batches: list[Any]) -> list[float]:
        """Each eval batch's mean loss, in order (the harness pairs them with a reference
        run's on the same batches for the parity interval)."""
        params = jax.device_put(params, self.devices[0])
        losses = [self._eval(params, jax.device_put(b, self.devices[0]))
                  for b in eval_batches]
        return [float(x) for x in losses]

    def opt_state_from_tree(self, params: dict, leaves: list[Any]) -> Any:
        """Inverse of `opt_state_to_tree` (e.g. after a checkpoint restore): optax's
        NamedTuple structure is rebuilt from `params`' structure."""
        abstract = jax.eval_shape(self.tx.init, params)
        want = jax.tree.leaves(abstract)
        if len(leaves) != len(want) or any(
                tuple(np.shape(x)) != a.shape for x, a in zip(leaves, want)):
            raise ValueError(f"inner optimizer state does not match the params: expected "
                             f"{len(want)} leaves {[a.shape for a in want]}, got "
                             f"{len(leaves)} {[tuple(np.shape(x)) for x in leaves]}")
        return jax.tree.unflatten(jax.tree.structure(abstract),
                                  [jnp.asarray(x, a.dtype) for x, a in zip(leaves, want)])

    def lr_at(self, count: int) -> float:
        return float(self.schedule(count))


def opt_state_to_tree(opt_state: Any) -> list[np.ndarray]:
    """The optimizer state as a flat list of numpy arrays (checkpointable as is)."""
    return [np.asarray(x) for x in jax.tree.leaves(opt_state)]


def state_digests(params: Any, opt_state: Any) -> dict:
    """{"params": digest, "opt": digest} of a learner's parameters and inner optimizer state,
    leaves in tree order (trainer/numerics/wiring.py `digest`): its `checkpoint_saved` line's of what a
    save writes and its `checkpoint_restored` line's of what a restore loaded (restores_faithful)."""
    from diloco_chaos.trainer.numerics.wiring import digest

    return {"params": digest([np.asarray(x) for x in jax.tree.leaves(params)]),
            "opt": digest(opt_state_to_tree(opt_state))}


def make_inner(cfg: RunConfig, loss_fn: LossFn) -> InnerLoop:
    return InnerLoop(cfg, loss_fn)
