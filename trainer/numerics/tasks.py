"""Training data and the loss each task trains: one `Task` interface, three kinds.

- `markov`: a seeded order-k Markov source over `markov_states` symbols. Its entropy
  rate is computed exactly and is a true lower bound on the expected next-token
  loss (the loss floor).
- `corpus`: byte-level text, the Python standard library's own `.py` sources.
- `quadratic`: ½·mean((A·w − y)²) with a learner-specific target; a cheap task with
  a known optimum for protocol-level tests.

Determinism: learner m's batch at inner step s is a pure function of
(run seed, m, s) — numpy `default_rng([seed, stream, m, s])` — so learners draw
disjoint deterministic streams and a restarted learner replays its own data. Eval
batches come from a separate stream (stream id 1) or a held-out region.

Batches are numpy arrays: LM tasks give int32 `tokens_BxL1` (L = seq_len, a row
holds L+1 tokens: L inputs, L targets); the quadratic gives float32 `y_BxN`.
"""
from __future__ import annotations

import functools
import hashlib
import sysconfig
from pathlib import Path
from typing import Any, Callable

import jax
import jax.numpy as jnp
import numpy as np

from diloco_chaos.trainer.config import ModelConfig, RunConfig, TaskConfig, is_plugin
from diloco_chaos.trainer.numerics import model

TRAIN_STREAM, EVAL_STREAM, SPLIT_STREAM = 0, 1, 2
MARKOV_FLOOR_MIX = 1e-4  # uniform mass mixed into each transition row: ergodic, no log(0)


class Task:
    """What a learner needs from its data: batches, eval batches, params and a loss."""

    kind: str
    tokens_per_batch: int  # tokens (LM: predicted tokens; quadratic: samples) in a full batch
    loss_fn: Callable[[Any, Any], jax.Array]  # (params, batch) -> scalar, jit-able

    def batch(self, learner: int, step: int) -> np.ndarray:
        raise NotImplementedError

    def eval_batches(self, n: int | None = None) -> list[np.ndarray]:
        """The held-out batches: `task.eval_batches` of them, or `n` (the first of a
        longer list are the same batches, so a larger final eval extends the learners')."""
        raise NotImplementedError

    def loss_floor(self) -> float | None:
        """A true lower bound on the expected eval loss, when one is known exactly."""
        return None

    def init_params(self, key: jax.Array) -> dict:
        raise NotImplementedError

    def describe(self) -> dict[str, Any]:
        """JSON-ready facts for the event log (floor, corpus hash, ...)."""
        return {"kind": self.kind, "tokens_per_batch": self.tokens_per_batch,
                "loss_floor": self.loss_floor()}


def make_task(task_cfg: TaskConfig, model_cfg: ModelConfig, seed: int, *,
              learners: int = 1) -> Task:
    """The task for a run. `learners` (M) matters for the corpus (M disjoint shards)
    and the quadratic (M targets define the global objective); the Markov source
    serves any learner index. A "module:factory" kind is a user's task (trainer/numerics/plugins.py)."""
    if is_plugin(task_cfg.kind):
        from diloco_chaos.trainer.numerics.plugins import make_plugin_task

        return make_plugin_task(task_cfg, seed, learners)
    if task_cfg.kind == "markov":
        return MarkovTask(task_cfg, model_cfg, seed)
    if task_cfg.kind == "corpus":
        return CorpusTask(task_cfg, model_cfg, seed, learners)
    return QuadraticTask(task_cfg, seed, learners)


def task_for_run(cfg: RunConfig) -> Task:
    return make_task(cfg.task, cfg.model, cfg.seed, learners=cfg.diloco.learners)


def _check_learner(learner: int, learners: int | None) -> None:
    if learner < 0 or (learners is not None and learner >= learners):
        valid = f"[0, {learners - 1}]" if learners is not None else ">= 0"
        raise ValueError(f"learner index {learner} out of range; valid: {valid} "
                         f"(make_task(..., learners=M) sets M)")


class _LMTask(Task):
    def __init__(self, task_cfg: TaskConfig, model_cfg: ModelConfig, seed: int):
        self.cfg, self.model_cfg, self.seed = task_cfg, model_cfg, seed
        self.tokens_per_batch = task_cfg.batch_size * task_cfg.seq_len
        self.loss_fn = model.loss

    def init_params(self, key: jax.Array) -> dict:
        return model.init_params(self.model_cfg, key)


# ---------------------------------------------------------------- Markov source

def markov_transitions(states: int, order: int, concentration: float,
                       seed: int) -> np.ndarray:
    """T[c, y] = P(next = y | context c), c = Σ_i x_i·V^(k−1−i) over the last k tokens.
    Rows are Dirichlet(concentration) draws (small = peaked), mixed with a 1e-4
    uniform floor so the chain is ergodic and no probability is exactly 0."""
    rng = np.random.default_rng([seed, 7])
    T_CxV = rng.dirichlet(np.full(states, concentration), size=states ** order)
    return (1 - MARKOV_FLOOR_MIX) * T_CxV + MARKOV_FLOOR_MIX / states


def markov_stationary(T_CxV: np.ndarray, order: int) -> np.ndarray:
    """Stationary distribution over contexts: the left eigenvector of the context
    chain (c → (c·V + y) mod V^k with probability T[c, y]) for eigenvalue 1."""
    C, V = T_CxV.shape
    Q_CxC = np.zeros((C, C))
    nxt_CxV = (np.arange(C)[:, None] * V + np.arange(V)[None, :]) % C
    np.add.at(Q_CxC, (np.repeat(np.arange(C), V), nxt_CxV.ravel()), T_CxV.ravel())
    eigvals, eigvecs = np.linalg.eig(Q_CxC.T)
    pi_C = np.real(eigvecs[:, np.argmin(np.abs(eigvals - 1.0))])
    return pi_C / pi_C.sum()


def markov_entropy_rate(T_CxV: np.ndarray, order: int) -> float:
    """H = −Σ_c π_c Σ_y T[c,y]·log T[c,y] in nats: the exact entropy rate."""
    pi_C = markov_stationary(T_CxV, order)
    logT = np.log(np.where(T_CxV > 0, T_CxV, 1.0))
    return float(-np.sum(pi_C[:, None] * T_CxV * logT))


class MarkovTask(_LMTask):
    kind = "markov"

    def __init__(self, task_cfg: TaskConfig, model_cfg: ModelConfig, seed: int):
        super().__init__(task_cfg, model_cfg, seed)
        c = task_cfg
        self.order, self.states = c.markov_order, c.markov_states
        self.T_CxV = markov_transitions(c.markov_states, c.markov_order,
                                        c.markov_concentration, c.markov_seed)
        self.pi_C = markov_stationary(self.T_CxV, self.order)
        self._cum_CxV = np.cumsum(self.T_CxV, axis=1)
        self._entropy = markov_entropy_rate(self.T_CxV, self.order)

    def entropy_rate(self) -> float:
        return self._entropy

    def loss_floor(self) -> float:
        """The entropy rate. For order 1 the Bayes predictor attains it at every
        position; for order k > 1 the first k−1 positions see less context and
        cost more, so the floor stays a strict lower bound."""
        return self._entropy

    def sample(self, rng: np.random.Generator, rows: int) -> np.ndarray:
        """`rows` sequences of seq_len + 1 tokens, the first context drawn from π."""
        V, k, n = self.states, self.order, self.cfg.seq_len + 1
        ctx_B = np.searchsorted(np.cumsum(self.pi_C), rng.random(rows), side="right")
        ctx_B = np.minimum(ctx_B, len(self.pi_C) - 1)
        out_BxN = np.empty((rows, max(n, k)), np.int32)
        for i in range(k):  # unpack the initial context into its k tokens
            out_BxN[:, i] = (ctx_B // V ** (k - 1 - i)) % V
        for t in range(k, n):
            u_B = rng.random(rows)
            y_B = np.minimum((u_B[:, None] >= self._cum_CxV[ctx_B]).sum(axis=1), V - 1)
            out_BxN[:, t] = y_B
            ctx_B = (ctx_B * V + y_B) % V ** k
        return out_BxN[:, :n]

    def batch(self, learner: int, step: int) -> np.ndarray:
        _check_learner(learner, None)
        rng = np.random.default_rng([self.seed, TRAIN_STREAM, learner, step])
        return self.sample(rng, self.cfg.batch_size)

    def eval_batches(self, n: int | None = None) -> list[np.ndarray]:
        return [self.sample(np.random.default_rng([self.seed, EVAL_STREAM, i]),
                            self.cfg.batch_size) for i in range(n or self.cfg.eval_batches)]

    def nll_under_chain(self, tokens_BxL1: np.ndarray) -> float:
        """Mean −log T[context, next] over the predicted tokens that have a full
        context: what the true chain scores (its expectation is the entropy rate)."""
        V, k = self.states, self.order
        x = tokens_BxL1.astype(np.int64)
        ctx = np.zeros(x.shape[0], np.int64)
        nll = []
        for t in range(x.shape[1]):
            if t >= k:
                nll.append(-np.log(self.T_CxV[ctx, x[:, t]]))
            ctx = (ctx * V + x[:, t]) % V ** k
        return float(np.mean(nll))

    def describe(self) -> dict[str, Any]:
        return {**super().describe(), "entropy_rate": self._entropy,
                "uniform_entropy": float(np.log(self.states))}


# ---------------------------------------------------------------- stdlib corpus

@functools.lru_cache(maxsize=4)
def stdlib_corpus(nbytes: int) -> tuple[bytes, int]:
    """The first `nbytes` of the stdlib's .py files, concatenated in sorted order of
    their path relative to the stdlib dir (site-/dist-packages excluded). Returns
    (bytes, number of files read). Machine-dependent only through the Python
    version: `CorpusTask.describe()` records a hash."""
    root = Path(sysconfig.get_paths()["stdlib"])
    files = sorted((p for p in root.rglob("*.py")
                    if not {"site-packages", "dist-packages"} & set(p.parts)),
                   key=lambda p: p.relative_to(root).as_posix())
    chunks, total, used = [], 0, 0
    for path in files:
        if total >= nbytes:
            break
        try:
            data = path.read_bytes()
        except OSError:
            continue
        chunks.append(data)
        total += len(data)
        used += 1
    return b"".join(chunks)[:nbytes], used


class CorpusTask(_LMTask):
    """Byte tokens, dealt to M learner shards and a held-out set (`TaskConfig.corpus_split`).

    shuffled (default): the bytes cut into chunks of `corpus_chunk`; a permutation seeded
    by the run seed holds out `corpus_eval_fraction` of them and deals the rest round
    robin, so every shard (and the held-out set) samples the whole library, as the paper's
    learners read disjoint shards of one shuffled dataset. A window never crosses a chunk.
    contiguous: [shard 0 | shard 1 | ... | shard M−1 | eval tail] of the file-sorted
    library: each learner its own modules (non-IID data), the layout before; measured in
    docs/BENCHMARKS.md "parity"."""

    kind = "corpus"

    def __init__(self, task_cfg: TaskConfig, model_cfg: ModelConfig, seed: int,
                 learners: int):
        super().__init__(task_cfg, model_cfg, seed)
        self.learners = learners
        raw, self.n_files = stdlib_corpus(int(task_cfg.corpus_mb * 1e6))
        self.sha256 = hashlib.sha256(raw).hexdigest()
        data = np.frombuffer(raw, np.uint8).astype(np.int32)
        n, row = len(data), task_cfg.seq_len + 1
        if task_cfg.corpus_split == "contiguous":
            n_eval = max(int(n * task_cfg.corpus_eval_fraction), row)
            train = data[: n - n_eval]
            bounds = [len(train) * m // learners for m in range(learners + 1)]
            # one chunk per region: a region is a [1, length] array of chunks
            self.eval_region = data[n - n_eval:][None, :]
            self.shards = [train[a:b][None, :] for a, b in zip(bounds[:-1], bounds[1:])]
        else:
            size = task_cfg.corpus_chunk
            chunks = data[: n // size * size].reshape(-1, size)
            order = np.random.default_rng([seed, SPLIT_STREAM]).permutation(len(chunks))
            n_eval = max(int(len(chunks) * task_cfg.corpus_eval_fraction), 1)
            self.eval_region = chunks[np.sort(order[:n_eval])]
            dealt = order[n_eval:]
            self.shards = [chunks[np.sort(dealt[m::learners])] for m in range(learners)]
            if len(dealt) < learners:
                raise ValueError(f"TaskConfig.corpus_mb = {task_cfg.corpus_mb} gives {len(chunks)} chunks of "
                                 f"corpus_chunk = {size} bytes, fewer than {learners} learners + the held-out "
                                 f"share need; raise corpus_mb or lower corpus_chunk")
        if min(s.shape[1] for s in self.shards) < row:
            raise ValueError(f"TaskConfig.corpus_mb = {task_cfg.corpus_mb} gives shards "
                             f"shorter than seq_len + 1 = {row} bytes for {learners} "
                             f"learners; raise corpus_mb")

    @staticmethod
    def _windows(region: np.ndarray, rng: np.random.Generator, rows: int,
                 row: int) -> np.ndarray:
        """`rows` windows of `row` bytes from a [chunks, length] region, each inside one chunk."""
        # one chunk (contiguous): no chunk drawn, the same windows as before chunks existed
        chunk_B = rng.integers(0, region.shape[0], size=rows) if region.shape[0] > 1 else np.zeros(rows, int)
        starts_B = rng.integers(0, region.shape[1] - row + 1, size=rows)
        return region[chunk_B[:, None], starts_B[:, None] + np.arange(row)[None, :]]

    def batch(self, learner: int, step: int) -> np.ndarray:
        _check_learner(learner, self.learners)
        rng = np.random.default_rng([self.seed, TRAIN_STREAM, learner, step])
        return self._windows(self.shards[learner], rng, self.cfg.batch_size,
                             self.cfg.seq_len + 1)

    def eval_batches(self, n: int | None = None) -> list[np.ndarray]:
        rng = np.random.default_rng([self.seed, EVAL_STREAM])
        return [self._windows(self.eval_region, rng, self.cfg.batch_size,
                              self.cfg.seq_len + 1) for _ in range(n or self.cfg.eval_batches)]

    def describe(self) -> dict[str, Any]:
        return {**super().describe(), "corpus_sha256": self.sha256,
                "corpus_files": self.n_files, "corpus_split": self.cfg.corpus_split,
                "corpus_bytes": int(sum(s.size for s in self.shards) + self.eval_region.size)}


# ---------------------------------------------------------------- quadratic

class QuadraticTask(Task):
    """Learner m minimises f_m(w) = ½·mean((A·w − b_m)²) from noisy targets
    y = b_m + quad_noise·ε; w (N = quad_blocks·dim entries) is stored as blocks
    `layer_i/w` so fragmentation has leaves to split. A = Q·diag(0.5..1.5)·Qᵀ is
    well conditioned. The global objective (1/M)Σ_m f_m has its optimum at
    w* = A⁻¹·b̄ (b̄ the mean target) with value (1/M)Σ_m ½·mean((b̄ − b_m)²): the
    loss floor. Eval batches are the M noise-free targets, one batch each."""

    kind = "quadratic"

    def __init__(self, task_cfg: TaskConfig, seed: int, learners: int):
        self.cfg, self.seed, self.learners = task_cfg, seed, learners
        self.n = task_cfg.quad_blocks * task_cfg.dim
        rng = np.random.default_rng([seed, 11])
        Q_NxN, _ = np.linalg.qr(rng.standard_normal((self.n, self.n)))
        self.A_NxN = (Q_NxN * np.linspace(0.5, 1.5, self.n)[None, :]) @ Q_NxN.T
        b0_N = rng.standard_normal(self.n)
        self.b_MxN = np.stack([b0_N + 0.5 * np.random.default_rng([seed, 12, m])
                               .standard_normal(self.n) for m in range(learners)])
        self.tokens_per_batch = task_cfg.batch_size
        A = jnp.asarray(self.A_NxN, jnp.float32)

        def loss_fn(params: dict, y_BxN: jax.Array) -> jax.Array:
            w_N = self.flatten(params)
            r_BxN = (A @ w_N)[None, :] - y_BxN
            return 0.5 * jnp.mean(jnp.square(r_BxN))

        self.loss_fn = loss_fn

    def flatten(self, params: dict) -> jax.Array:
        return jnp.concatenate([params[f"layer_{i}"]["w"]
                                for i in range(self.cfg.quad_blocks)])

    def unflatten(self, w_N: np.ndarray) -> dict:
        d = self.cfg.dim
        return {f"layer_{i}": {"w": jnp.asarray(w_N[i * d:(i + 1) * d], jnp.float32)}
                for i in range(self.cfg.quad_blocks)}

    def init_params(self, key: jax.Array) -> dict:
        return self.unflatten(jax.random.normal(key, (self.n,)))  # traceable: jit-able init

    def optimum(self) -> dict:
        return self.unflatten(np.linalg.solve(self.A_NxN, self.b_MxN.mean(axis=0)))

    def loss_floor(self) -> float:
        return float(np.mean(0.5 * np.mean((self.b_MxN.mean(0) - self.b_MxN) ** 2, 1)))

    def batch(self, learner: int, step: int) -> np.ndarray:
        _check_learner(learner, self.learners)
        rng = np.random.default_rng([self.seed, TRAIN_STREAM, learner, step])
        noise_BxN = rng.standard_normal((self.cfg.batch_size, self.n))
        return (self.b_MxN[learner][None, :] + self.cfg.quad_noise * noise_BxN
                ).astype(np.float32)

    def eval_batches(self, n: int | None = None) -> list[np.ndarray]:
        return [b_N[None, :].astype(np.float32) for b_N in self.b_MxN]  # exact: n changes nothing
