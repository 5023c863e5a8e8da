"""A user's own task, loaded by import path (docs/TASKS.md).

A scenario names a factory, `[train] task = "my_pkg.tasks:make_task"`, and its keyword
arguments in a `[task]` table. Every process that needs the task (learners, syncer
shards, the harness's global eval, the simulator) imports the module and calls

    make_task(seed=S, learners=M, batch_size=B, seq_len=L, **options)

which returns an object with
    init_params(key) -> a nested dict of arrays   Θ0; fragments are cut from its named leaves
    loss(params, batch) -> a float scalar         jit-able: no clocks, no global RNG, no I/O
    batch(learner, step) -> an array of B rows    a pure function of (seed, learner, step)
    eval_batches(n) -> a list of n arrays         held out; a longer list starts with a shorter one
    loss_floor() -> float | None                  optional: a known lower bound of the eval loss
`PluginTask` adapts it to trainer/numerics/tasks.py's `Task`; `check_task` proves the contract on
the run's own shapes, so a broken plug-in is one line before any process starts.
"""
from __future__ import annotations

import importlib
import os
import re
import sys
from typing import Any, Callable

import jax
import jax.numpy as jnp
import numpy as np

from diloco_chaos.trainer.config import RunConfig, TaskConfig
from diloco_chaos.trainer.numerics.fragments import flatten_with_paths
from diloco_chaos.trainer.numerics.tasks import Task

SPEC = re.compile(r"^[A-Za-z_]\w*(\.[A-Za-z_]\w*)*:[A-Za-z_]\w*$")
REQUIRED = ("init_params", "loss", "batch", "eval_batches")
CONTRACT = "a task provides init_params(key), loss(params, batch), batch(learner, step), eval_batches(n): docs/TASKS.md"


class PluginError(ValueError):
    """What is wrong with a task plug-in, in one line."""


def load_factory(spec: str) -> Callable[..., Any]:
    """The callable an import path `module:attribute` names."""
    if not SPEC.match(spec):
        raise PluginError(f"{spec!r} is not an import path; valid: 'package.module:function'")
    module, attr = spec.split(":")
    try:
        mod = _import(module)
    except Exception as e:  # ModuleNotFoundError, or the module's own error while importing
        raise PluginError(f"cannot import {module!r} ({type(e).__name__}: {_first_line(e)}); "
                          f"valid: a module beside the scenario file, in the directory the run starts "
                          f"from, on PYTHONPATH or installed") from None
    factory = getattr(mod, attr, None)
    if factory is None:
        raise PluginError(f"module {module!r} has no attribute {attr!r}")
    if not callable(factory):
        raise PluginError(f"{spec} is a {type(factory).__name__}, not a callable that makes a task")
    return factory


SEARCH_ENV = "DILOCO_CHAOS_TASK_PATH"  # folders searched first: a scenario file's own (its loader sets it)


def search_first(folder) -> None:
    """Makes `folder` (a scenario file's) the first place a plug-in task is looked for, in
    this process and every process it starts (the environment carries it)."""
    folder = os.path.abspath(folder)
    rest = [f for f in os.environ.get(SEARCH_ENV, "").split(os.pathsep) if f and f != folder]
    os.environ[SEARCH_ENV] = os.pathsep.join([folder, *rest])


def _import(module: str):
    """The module: first from the folders of DILOCO_CHAOS_TASK_PATH (the scenario file's
    folder: "my_task.py beside this file"), then as Python finds it, then from the working
    directory, as uvicorn and pytest find an app or a test module: the harness and every
    process it starts share that directory, whether it was started as `python -m` (cwd on
    sys.path) or as the `diloco-chaos` script (not)."""
    root = module.split(".")[0]
    for folder in filter(None, os.environ.get(SEARCH_ENV, "").split(os.pathsep)):
        if os.path.isfile(os.path.join(folder, root + ".py")) or os.path.isdir(os.path.join(folder, root)):
            if folder not in sys.path:
                sys.path.insert(0, folder)
            return importlib.import_module(module)
    try:
        return importlib.import_module(module)
    except ModuleNotFoundError as e:
        cwd = os.getcwd()
        if e.name != module.split(".")[0] or cwd in sys.path or "" in sys.path:
            raise
        sys.path.insert(0, cwd)
        return importlib.import_module(module)


class PluginTask(Task):
    """A user's task object seen through trainer's `Task` interface."""

    def __init__(self, task_cfg: TaskConfig, user: Any):
        self.kind, self.cfg, self.user = task_cfg.kind, task_cfg, user
        self.tokens_per_batch = task_cfg.batch_size * task_cfg.tokens_per_row
        self.loss_fn = user.loss

    def batch(self, learner: int, step: int) -> np.ndarray:
        return np.asarray(self.user.batch(learner, step))

    def eval_batches(self, n: int | None = None) -> list[np.ndarray]:
        return [np.asarray(b) for b in self.user.eval_batches(self.cfg.eval_batches if n is None else n)]

    def loss_floor(self) -> float | None:
        floor = getattr(self.user, "loss_floor", None)
        value = floor() if callable(floor) else None
        return None if value is None else float(value)

    def init_params(self, key: jax.Array) -> dict:
        return self.user.init_params(key)

    def describe(self) -> dict[str, Any]:
        return {**super().describe(), "options": dict(self.cfg.options)}


def make_plugin_task(task_cfg: TaskConfig, seed: int, learners: int) -> PluginTask:
    spec = task_cfg.kind
    factory = load_factory(spec)
    try:
        user = factory(seed=seed, learners=learners, batch_size=task_cfg.batch_size,
                       seq_len=task_cfg.seq_len, **task_cfg.options)
    except Exception as e:
        raise PluginError(f"{spec}(seed=, learners=, batch_size=, seq_len=, **[task]) failed: "
                          f"{type(e).__name__}: {_first_line(e)}") from None
    missing = [name for name in REQUIRED if not callable(getattr(user, name, None))]
    if missing:
        raise PluginError(f"{spec} returned a {type(user).__name__} without {', '.join(missing)} ({CONTRACT})")
    return PluginTask(task_cfg, user)


def check_task(cfg: RunConfig) -> None:
    """Loads the run's plug-in and proves its contract on the run's shapes: PluginError
    (one line) when it cannot be imported, lacks a method, gives batches of the wrong
    shape or that change between calls, params that are not a dict of at least P leaves,
    or a loss that is not a jit-able float scalar. Builds nothing on a device."""
    spec, t = cfg.task.kind, cfg.task
    task = make_plugin_task(t, cfg.seed, cfg.diloco.learners)
    last = cfg.diloco.learners - 1
    try:
        b0, b1, again = task.batch(0, 0), task.batch(last, 1), task.batch(0, 0)
        evals = task.eval_batches(1)
    except Exception as e:
        raise PluginError(f"{spec}: drawing a batch failed: {type(e).__name__}: {_first_line(e)}") from None
    for what, b in (("batch(0, 0)", b0), (f"batch({last}, 1)", b1)):
        if b.ndim == 0 or b.shape[0] != t.batch_size:
            raise PluginError(f"{spec}: {what} has shape {b.shape}; valid: {t.batch_size} rows first "
                              f"([train] batch_size)")
    if (b1.shape, b1.dtype) != (b0.shape, b0.dtype):
        raise PluginError(f"{spec}: batch({last}, 1) is {b1.shape} {b1.dtype}, batch(0, 0) {b0.shape} {b0.dtype}; "
                          f"every batch must have one shape and dtype")
    if not np.array_equal(again, b0):
        raise PluginError(f"{spec}: batch(0, 0) differs between two calls; a batch must be a pure function "
                          f"of (seed, learner, step) so that a restarted learner replays its data")
    if len(evals) != 1 or evals[0].shape[1:] != b0.shape[1:]:
        shapes = [e.shape for e in evals]
        raise PluginError(f"{spec}: eval_batches(1) gave {shapes}; valid: a list of one array shaped like a "
                          f"batch's rows {b0.shape[1:]}")
    try:
        params = jax.eval_shape(task.init_params, jax.random.PRNGKey(0))
    except Exception as e:
        raise PluginError(f"{spec}: init_params(key) cannot be traced by jax.jit: {type(e).__name__}: "
                          f"{_first_line(e)}") from None
    leaves = flatten_with_paths(params) if isinstance(params, dict) else []
    if not leaves or not all(hasattr(v, "shape") for _, v in leaves):
        raise PluginError(f"{spec}: init_params(key) returned {type(params).__name__}; valid: a nested dict "
                          f"of arrays (fragments are cut from its named leaves)")
    if len(leaves) < cfg.n_fragments:
        raise PluginError(f"{spec}: the params have {len(leaves)} leaves, fewer than the {cfg.n_fragments} "
                          f"fragments ([train] fragments); set fragments <= {len(leaves)}")
    try:
        out = jax.eval_shape(task.loss_fn, params, jax.ShapeDtypeStruct(b0.shape, b0.dtype))
    except Exception as e:
        raise PluginError(f"{spec}: loss(params, batch) is not jit-able: {type(e).__name__}: "
                          f"{_first_line(e)}") from None
    if not (hasattr(out, "shape") and out.shape == () and jnp.issubdtype(out.dtype, jnp.floating)):
        raise PluginError(f"{spec}: loss(params, batch) returned {getattr(out, 'shape', out)} "
                          f"{getattr(out, 'dtype', '')}; valid: a float scalar")
    from diloco_chaos.trainer.numerics.inner import GROUPS, fleet_of
    if fleet_of(cfg) > 1:  # the learner differentiates the loss on groups of rows (trainer/numerics/fleet_adam.py)
        from diloco_chaos.trainer.numerics.fleet_adam import split_grad
        try:
            jax.eval_shape(lambda p, b: split_grad(task.loss_fn, p, b, cfg.inner.clip_norm, GROUPS),
                           params, jax.ShapeDtypeStruct(b0.shape, b0.dtype))
        except Exception as e:
            raise PluginError(f"{spec}: loss(params, batch) cannot be vmapped over groups of a batch's rows, "
                              f"which [train] second_moment = \"fleet\" (the default) needs: "
                              f"{type(e).__name__}: {_first_line(e)}; set second_moment = \"own\"") from None


def _first_line(e: BaseException) -> str:
    text = str(e).strip()
    return text.splitlines()[0][:200] if text else type(e).__name__
