"""A task built on Flax NNX, written as docs/TASKS.md asks: a byte-level MLP language model
(the previous 8 bytes -> the next byte) on the Python standard library's own sources,
which ship with every Python.

    [train]
    task = "diloco_chaos.examples.flax_mlp:make_task"
    seq_len = 1                 # one predicted byte per row

    [task]
    context = 8                 # bytes of context
    hidden = 128

`make setup` (or `pip install -e .[flax]`) installs Flax; examples/flax-unit-loss.toml is
the built-in `unit-loss` on this model. The harness sees only a nested dict of arrays
(`nnx.split`'s state as a pure dict) and a loss over it; the module is rebuilt from its
graph definition inside the loss, so the learner's AdamW, the fragments and the outer
step work on plain pytrees.
"""
from __future__ import annotations

import sysconfig
from pathlib import Path

import jax
import numpy as np
import optax
try:
    from flax import nnx
except ImportError as e:  # an extra: the rest of diloco-chaos needs no Flax
    raise ImportError(f"the Flax example task needs flax ({e}); "
                      "install it with: pip install 'diloco-chaos[flax]'") from None

VOCAB = 256


class ByteMLP(nnx.Module):
    def __init__(self, context: int, embed: int, hidden: int, *, rngs: nnx.Rngs):
        self.embed = nnx.Embed(VOCAB, embed, rngs=rngs)  # a top-level `embed`: merged by plain mean
        self.hidden = nnx.Linear(context * embed, hidden, rngs=rngs)
        self.out = nnx.Linear(hidden, VOCAB, rngs=rngs)

    def __call__(self, x_BxC: jax.Array) -> jax.Array:
        h = self.embed(x_BxC).reshape(x_BxC.shape[0], -1)
        return self.out(nnx.gelu(self.hidden(h)))


def stdlib_bytes(nbytes: int) -> bytes:
    """The first `nbytes` of the stdlib's .py files in sorted path order (the same on every
    process of a run: it depends only on the Python version)."""
    root = Path(sysconfig.get_paths()["stdlib"])
    files = sorted((p for p in root.rglob("*.py") if not {"site-packages", "dist-packages"} & set(p.parts)),
                   key=lambda p: p.relative_to(root).as_posix())
    out, total = [], 0
    for path in files:
        if total >= nbytes:
            break
        data = path.read_bytes()
        out.append(data)
        total += len(data)
    return b"".join(out)[:nbytes]


class FlaxByteTask:
    def __init__(self, seed: int, learners: int, batch_size: int, seq_len: int, *,
                 context: int = 8, embed: int = 16, hidden: int = 128, megabytes: float = 1.0):
        self.seed, self.learners, self.rows, self.context = seed, learners, batch_size, context
        self.dims = (context, embed, hidden)
        data = np.frombuffer(stdlib_bytes(int(megabytes * 1e6)), np.uint8).astype(np.int32)
        held = len(data) // 20  # the last 5 % held out; the rest dealt in M contiguous shards
        train, self.eval_region = data[:-held], data[-held:]
        bounds = [len(train) * m // learners for m in range(learners + 1)]
        self.shards = [train[a:b] for a, b in zip(bounds[:-1], bounds[1:])]
        # the module's structure (no arrays kept): the loss rebuilds it around the params
        self.graphdef, _ = nnx.split(nnx.eval_shape(lambda: ByteMLP(*self.dims, rngs=nnx.Rngs(0))))

    def init_params(self, key: jax.Array) -> dict:
        _, state = nnx.split(ByteMLP(*self.dims, rngs=nnx.Rngs(params=key)))
        return nnx.to_pure_dict(state)

    def loss(self, params: dict, batch_BxR: jax.Array) -> jax.Array:
        model = nnx.merge(self.graphdef, params)
        logits = model(batch_BxR[:, :-1])
        return optax.softmax_cross_entropy_with_integer_labels(logits, batch_BxR[:, -1]).mean()

    def _windows(self, region: np.ndarray, rng: np.random.Generator) -> np.ndarray:
        starts = rng.integers(0, len(region) - self.context, size=self.rows)
        return region[starts[:, None] + np.arange(self.context + 1)[None, :]]

    def batch(self, learner: int, step: int) -> np.ndarray:
        return self._windows(self.shards[learner], np.random.default_rng([self.seed, 0, learner, step]))

    def eval_batches(self, n: int) -> list[np.ndarray]:
        rng = np.random.default_rng([self.seed, 1])
        return [self._windows(self.eval_region, rng) for _ in range(n)]


def make_task(**kwargs) -> FlaxByteTask:
    return FlaxByteTask(**kwargs)
