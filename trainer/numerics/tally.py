"""StepTally: what a learner's inner steps did to each fragment, kept beside its core.

A Δ claims the progress of the inner steps from its `from_step` to its `to_step` on
fragment p (the `contribute` line). The core computes it as base[p] − θ[p] (or from θ[p]
as last sent), through every take, re-anchor and keep rule between the two. The tally
takes no part in those rules: around every inner step the loop hands it θ before and
after the step, and it adds up, per fragment, what the step changed (at the commit
audit's coordinates: the whole fragment up to `AUDIT_WHOLE` values, else `AUDIT_SAMPLE`
evenly spread, the same ones the shard's `commit_audit` carries). A take moves θ[p] and
its reference together, so under keep_local (or α = 0) a Δ is exactly minus the sum of
its steps' changes: the `contribute` line carries that sum as `progress`, and the judge
(harness/judging/audits.py `deltas_reexecuted`) compares it with the Δ the shard merged.
A Δ that holds more, less or other progress than its claimed steps shows there.

Steps are the core's own count (`contribute`'s from_step and to_step): from 0 in each
incarnation, whatever step a restart restored, so each incarnation keeps its own tally.
Prefix sums (float64) are kept from the oldest anchor still in use on.

The tally never waits on the device between two steps: θ held as JAX arrays is sampled
where it lives (one jitted gather of every fragment's coordinates, dispatched like the
step itself), and the samples stay there, pending, until a `progress` needs them or more
than `MAX_PENDING` steps wait (then all but the newest come over: their steps are done,
so nothing waits). The host then sums them in step order, in float64, exactly as it would
have at each step. θ held as numpy (a test's) is sampled on the host at once.
"""
from __future__ import annotations

import base64
import functools
from collections import deque

import jax
import jax.numpy as jnp
import numpy as np

# commit_audit's sampling (trainer/numerics/wiring.py `audit`): a fragment with at most AUDIT_WHOLE
# values is carried whole, a larger one at AUDIT_SAMPLE evenly spread coordinates
AUDIT_WHOLE, AUDIT_SAMPLE = 4096, 64
# steps whose samples may wait on the device (two vectors a step, 4 bytes a coordinate,
# at most AUDIT_WHOLE coordinates a fragment)
MAX_PENDING = 32


def audit_index(n: int) -> np.ndarray | None:
    """The coordinates of a flattened fragment of n values that an audit carries (None: all)."""
    return None if n <= AUDIT_WHOLE else np.linspace(0, n - 1, AUDIT_SAMPLE).round().astype(np.int64)


def b64(x) -> dict:
    """One float32 vector as a log line carries it (harness/judging/spec.py `arrays_of` reads it)."""
    x = np.ascontiguousarray(x, np.float32)
    return {"dtype": "float32", "shape": list(x.shape), "b64": base64.b64encode(x.tobytes()).decode()}


def step_tally(cfg, frag) -> "StepTally | None":
    """The tally a learner's driver keeps over its Fragmenter's leaves as held (None:
    data-parallel modes, whose steps are not Δs)."""
    return None if cfg.diloco.mode in ("dp", "elastic_dp") else StepTally(frag.leaves, cfg.n_fragments)


@functools.lru_cache(maxsize=64)
def _gather(picks: tuple):
    """A jitted function: the leaves (every fragment's, in order) -> their picked coordinates,
    as one float32 vector (`picks`: per leaf, a tuple of flat coordinates or None for all)."""
    idx = [None if i is None else np.asarray(i, np.int64) for i in picks]

    @jax.jit
    def gather(leaves):
        return jnp.concatenate([jnp.ravel(x).astype(jnp.float32) if i is None else
                                jnp.ravel(x)[i].astype(jnp.float32) for x, i in zip(leaves, idx)])
    return gather


class StepTally:
    def __init__(self, leaves_of, n_fragments: int):
        """`leaves_of(params, p)`: fragment p's leaves as θ holds them (no copy; numpy or JAX)."""
        self.get, self.n = leaves_of, n_fragments
        self.picks: tuple | None = None   # per leaf of every fragment in order: local coordinates or None
        self._idx: list = []              # the same as numpy index arrays (numpy θ)
        self.sizes: list[int] = []        # per fragment, how many coordinates it samples
        self.prefix: dict[int, list] = {}  # step -> per fragment, the sum of the steps' changes up to it
        self.pending: deque = deque()     # steps not yet summed, in order: (step, was, now, floor to forget after)
        self._kept = None  # (the last θ after a step, its samples)

    def _plan(self, params) -> None:
        picks = []
        for p in range(self.n):
            sizes = [int(np.size(a)) for a in self.get(params, p)]
            idx = audit_index(sum(sizes))
            at = 0
            for size in sizes:
                picks.append(None if idx is None else tuple(int(i) for i in idx[(idx >= at) & (idx < at + size)] - at))
                at += size
            self.sizes.append(sum(sizes) if idx is None else len(idx))
        self.picks = tuple(picks)
        self._idx = [None if i is None else np.asarray(i, np.int64) for i in picks]

    def _sample(self, params):
        """Every fragment's coordinates of θ, one float32 vector: on the device θ lives on
        (not waited for), or numpy for numpy θ."""
        leaves = [a for p in range(self.n) for a in self.get(params, p)]
        if any(isinstance(a, jax.Array) for a in leaves):
            return _gather(self.picks)(leaves)
        parts = [np.ravel(np.asarray(a, np.float32)) if i is None else np.ravel(np.asarray(a, np.float32))[i]
                 for a, i in zip(leaves, self._idx)]
        return np.concatenate(parts) if parts else np.zeros(0, np.float32)

    def record(self, step: int, before, after) -> None:
        """Inner step `step` (1-based) took θ from `before` to `after`."""
        if self.picks is None:
            self._plan(before)
        # θ before a step is the last step's θ after, unless a take came between: its samples are kept
        was = self._kept[1] if self._kept is not None and self._kept[0] is before else self._sample(before)
        now = self._sample(after)
        self._kept = (after, now)
        self.pending.append((step, was, now, None))
        if len(self.pending) > MAX_PENDING:  # all but the newest step's: done on the device already
            self._sum(len(self.pending) - 1)

    def forget_before(self, step: int) -> None:
        """No Δ will start before `step` (the oldest anchor in use): drop older sums."""
        if not self.pending:
            self.prefix = {s: v for s, v in self.prefix.items() if s >= step}
            return
        s, was, now, floor = self.pending[-1]  # after that step is summed (the higher of two floors drops both's)
        self.pending[-1] = (s, was, now, step if floor is None else max(floor, step))

    def _sum(self, k: int) -> None:
        """Adds the oldest k pending entries into the prefix sums, as each step would have."""
        entries = [self.pending.popleft() for _ in range(k)]
        vectors = iter(jax.device_get([v for e in entries for v in e[1:3]]))
        ends = np.cumsum(self.sizes)[:-1]
        for step, _, _, floor in entries:
            was, now = next(vectors), next(vectors)
            was = np.split(np.asarray(was, np.float32).astype(np.float64), ends)
            now = np.split(np.asarray(now, np.float32).astype(np.float64), ends)
            last = self.prefix.get(step - 1)
            if last is None:  # the first step: the record starts before it
                last = [np.zeros(len(now[p]), np.float64) for p in range(self.n)]
                self.prefix[step - 1] = last
            self.prefix[step] = [last[p] + (now[p] - was[p]) for p in range(self.n)]
            if floor is not None:
                self.prefix = {s: v for s, v in self.prefix.items() if s >= floor}

    def progress(self, p: int, from_step: int, to_step: int):
        """−(the sum of fragment p's changes over steps from_step+1 .. to_step), the Δ those
        steps make (float64), or None where the record does not reach."""
        self._sum(len(self.pending))
        a, b = self.prefix.get(from_step), self.prefix.get(to_step)
        if a is None or b is None:
            return None
        return -(b[p] - a[p])
