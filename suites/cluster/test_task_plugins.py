"""A user's own task, written outside the repository following only docs/TASKS.md: it
trains under a kill and a partition on real processes and in the simulator, and its
report renders; each kind of broken plug-in is one clear line before any process starts."""
from __future__ import annotations

import sys
import textwrap

import pytest

from diloco_chaos.harness.scenarios.scenario import ScenarioError, load_scenario, scenario_from_dict

# What a user writes, following docs/TASKS.md: a small MLP regression in plain JAX.
USER_TASK = '''
import jax
import jax.numpy as jnp
import numpy as np


class Regression:
    def __init__(self, seed, learners, batch_size, seq_len, dim=6, hidden=16, noise=0.1):
        self.seed, self.rows, self.dim, self.hidden, self.noise = seed, batch_size, dim, hidden, noise
        self.w_true = np.random.default_rng([seed, 99]).normal(size=dim)

    def _rows(self, rng, n):
        x = rng.normal(size=(n, self.dim))
        y = np.tanh(x @ self.w_true) + self.noise * rng.normal(size=n)
        return np.concatenate([x, y[:, None]], axis=1).astype(np.float32)

    def init_params(self, key):
        k1, k2 = jax.random.split(key)
        return {"hidden": {"w": 0.3 * jax.random.normal(k1, (self.dim, self.hidden)), "b": jnp.zeros(self.hidden)},
                "out": {"w": 0.3 * jax.random.normal(k2, (self.hidden,)), "b": jnp.zeros(())}}

    def loss(self, params, batch):
        x, y = batch[:, :-1], batch[:, -1]
        h = jnp.tanh(x @ params["hidden"]["w"] + params["hidden"]["b"])
        return jnp.mean((h @ params["out"]["w"] + params["out"]["b"] - y) ** 2)

    def batch(self, learner, step):
        return self._rows(np.random.default_rng([self.seed, 0, learner, step]), self.rows)

    def eval_batches(self, n):
        return [self._rows(np.random.default_rng([self.seed, 1, i]), self.rows) for i in range(n)]

    def loss_floor(self):
        return self.noise ** 2


def make_task(**kwargs):
    return Regression(**kwargs)
'''

SCENARIO = '''
name = "user-task"
seed = 4

[cluster]
learners = 3

[train]
task = "user_tasks:make_task"
steps = {steps}
duration = "{duration}"
seq_len = 1
fragments = 2

[task]
hidden = 12

[[faults]]
kind = "kill_unit"
target = "learner-1"
at = "{kill}"
down_for = "{down}"

[[faults]]
kind = "partition"
target = "link:learner-2"
at = "{cut}"
duration = "{down}"
'''


@pytest.fixture(autouse=True)
def jax_defaults():
    """A user's task runs under JAX's defaults. suites/unit/conftest.py makes implicit rank
    promotion an error for the whole session when the unit suite is collected with this
    one, and `x @ w + b` (Flax's Linear too) relies on it: allowed here, as in a user's
    process."""
    import jax

    with jax.numpy_rank_promotion("allow"):
        yield


@pytest.fixture
def user_dir(tmp_path, monkeypatch):
    """The user's package in a directory outside the repository, on PYTHONPATH (the
    harness's processes inherit it) and on this process's sys.path."""
    d = tmp_path / "user"
    d.mkdir()
    (d / "user_tasks.py").write_text(textwrap.dedent(USER_TASK))
    monkeypatch.setenv("PYTHONPATH", f"{d}:{__import__('os').environ.get('PYTHONPATH', '')}".rstrip(":"))
    monkeypatch.syspath_prepend(str(d))
    yield d
    sys.modules.pop("user_tasks", None)


def _scenario(d, **times):
    path = d / "user-task.toml"
    path.write_text(SCENARIO.format(**times))
    return load_scenario(path)


def test_a_users_task_trains_under_kill_and_partition_in_the_simulator(user_dir, tmp_path):
    from diloco_chaos.harness.sim.run import run_sim
    from diloco_chaos.reports import render_run

    s = _scenario(user_dir, steps=150, duration="20s", kill="3s", cut="5s", down="3s")
    result = run_sim(s, tmp_path / "runs")
    sm = result.summary
    assert sm["faults_applied"] == 2 and sm["restarts"] >= 1, sm
    start, end = _theta0_loss(), _final_global_loss(result.run_dir)
    assert end < 0.5 * start, (start, end)  # the global model learned, through the faults
    page = render_run(result.run_dir, result.run_dir / "report.html")
    assert "user-task" in page.read_text() and "user_tasks:make_task" in page.read_text()


@pytest.mark.cluster
@pytest.mark.slow
def test_a_users_task_trains_under_kill_and_partition_on_real_processes(user_dir, tmp_path):
    from diloco_chaos.harness.backends.runner import run_scenario
    from diloco_chaos.reports import render_run

    # a tiny MLP steps in milliseconds: the budget is the wall clock here, not the tokens. The
    # loss halving below takes no more than the 150 steps of the simulator test above, so pace
    # decides it only on a machine too slow to make 150 steps of it in 14 s (~90 ms a step)
    s = _scenario(user_dir, steps=3000, duration="14s", kill="2s", cut="5s", down="3s")
    result = run_scenario(s, tmp_path / "runs", live=False)
    sm = result.summary
    assert sm["faults_applied"] == 2 and sm["restarts"] >= 1, sm
    start, end = _theta0_loss(), _final_global_loss(result.run_dir)
    assert end < 0.5 * start, (start, end)
    page = render_run(result.run_dir, result.run_dir / "report.html")
    assert "user_tasks:make_task" in page.read_text()


def _theta0_loss() -> float:
    """Θ0's held-out loss, computed here from the user's module as the harness makes Θ0."""
    import jax
    import numpy as np
    import user_tasks

    task = user_tasks.make_task(seed=4, learners=3, batch_size=16, seq_len=1, hidden=12)
    params = task.init_params(jax.random.PRNGKey(4))
    return float(np.mean([task.loss(params, b) for b in task.eval_batches(4)]))


def _final_global_loss(run_dir) -> float:
    from diloco_chaos.harness import eventlog

    evals = [e for e in eventlog.read(run_dir).events if e["kind"] == "eval" and e.get("global")]
    return evals[-1]["loss"]  # the harness's eval of the final global model comes last


# --- broken plug-ins: one line each, before any process ------------------------------------------
BROKEN = {
    "missing module": ("no_such_pkg.tasks:make_task", "", "cannot import 'no_such_pkg.tasks'"),
    "missing attribute": ("user_tasks:no_factory", "", "module 'user_tasks' has no attribute 'no_factory'"),
    "missing method": ("user_tasks:make_task", "del Regression.eval_batches", "without eval_batches"),
    "loss not jit-able": ("user_tasks:make_task",
                          "Regression.loss = lambda self, p, b: float(np.asarray(b).sum())",
                          "loss(params, batch) is not jit-able"),
    "loss of a fixed batch size": ("user_tasks:make_task",
                                   "Regression.loss = lambda self, p, b: jax.numpy.mean(b.reshape(16, 7)[:, 0] * p['out']['b'])",
                                   'cannot be vmapped over groups of a batch\'s rows, which [train] second_moment = '
                                   '"fleet" (the default) needs'),
    "wrong batch rows": ("user_tasks:make_task",
                         "Regression.batch = lambda self, m, s: np.zeros((3, 7), np.float32)",
                         "batch(0, 0) has shape (3, 7); valid: 16 rows first"),
    "batches that change": ("user_tasks:make_task",
                            "Regression.batch = lambda self, m, s: np.random.normal(size=(16, 7)).astype(np.float32)",
                            "differs between two calls"),
    "not a scalar loss": ("user_tasks:make_task",
                          "Regression.loss = lambda self, p, b: b[:, 0] * p['out']['b']",
                          "valid: a float scalar"),
    "params not a dict": ("user_tasks:make_task",
                          "Regression.init_params = lambda self, k: [jax.numpy.zeros(3)]",
                          "valid: a nested dict of arrays"),
    "bad import path": ("user_tasks.make_task", "", "valid: markov, corpus, quadratic, 'package.module:factory'"),
}


@pytest.mark.parametrize("case", sorted(BROKEN))
def test_a_broken_plugin_is_one_line_before_any_process(case, tmp_path, monkeypatch):
    spec, patch, expected = BROKEN[case]
    d = tmp_path / "broken"
    d.mkdir()
    (d / "user_tasks.py").write_text(textwrap.dedent(USER_TASK) + "\n" + patch + "\n")
    monkeypatch.syspath_prepend(str(d))
    sys.modules.pop("user_tasks", None)
    spawned = []
    monkeypatch.setattr("diloco_chaos.harness.backends.procs.spawn", lambda *a, **k: spawned.append(a))
    try:
        with pytest.raises(ScenarioError) as e:
            scenario_from_dict({"name": "broken", "seed": 1, "train": {"task": spec, "steps": 10, "duration": "5s",
                                                                      "seq_len": 1}}, "broken.toml")
    finally:
        sys.modules.pop("user_tasks", None)
    line = str(e.value)
    assert "\n" not in line and line.startswith("broken.toml: train.task: ") and expected in line, line
    assert not spawned


def test_a_task_table_for_a_built_in_task_is_refused_naming_it():
    with pytest.raises(ScenarioError, match=r"^x.toml: task: .*the built-in task 'markov' takes no \[task\] table"):
        scenario_from_dict({"name": "x", "seed": 1, "train": {"steps": 10, "duration": "5s"}, "task": {"a": 1}},
                           "x.toml")


def test_the_flax_example_keeps_the_plugin_contract():
    """examples/flax-unit-loss.toml loads: Flax is installed by make setup, and the Flax
    NNX task passes every check a plug-in gets before a run (its runs: README)."""
    from pathlib import Path

    s = load_scenario(Path(__file__).resolve().parents[2] / "examples" / "flax-unit-loss.toml")
    assert s.run_config().task.kind == "diloco_chaos.examples.flax_mlp:make_task" and s.task_options["hidden"] == 1024
