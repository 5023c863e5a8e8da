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
"""
from __future__ import annotations

import base64

import numpy as np

# commit_audit's sampling (trainer/wiring.py `audit`): a fragment with at most AUDIT_WHOLE
# values is carried whole, a larger one at AUDIT_SAMPLE evenly spread coordinates
AUDIT_WHOLE, AUDIT_SAMPLE = 4096, 64


def audit_index(n: int) -> np.ndarray | None:
    """The coordinates of a flattened fragment of n values that an audit carries (None: all)."""
    return None if n <= AUDIT_WHOLE else np.linspace(0, n - 1, AUDIT_SAMPLE).round().astype(np.int64)


def b64(x) -> dict:
    """One float32 vector as a log line carries it (harness/judging/spec.py `arrays_of` reads it)."""
    x = np.ascontiguousarray(x, np.float32)
    return {"dtype": "float32", "shape": list(x.shape), "b64": base64.b64encode(x.tobytes()).decode()}


def step_tally(cfg, lmath) -> "StepTally | None":
    """The tally a learner's driver keeps (None: data-parallel modes, whose steps are not Δs)."""
    return None if cfg.diloco.mode in ("dp", "elastic_dp") else StepTally(lmath.get_fragment, cfg.n_fragments)


class StepTally:
    def __init__(self, get_fragment, n_fragments: int):
        self.get, self.n = get_fragment, n_fragments
        self.picks: list | None = None   # per fragment: [(leaf, local coordinates or None)]
        self.prefix: dict[int, list] = {}  # step -> per fragment, the sum of the steps' changes up to it
        self._kept = None  # (the last θ after a step, its samples)

    def _plan(self, params) -> None:
        self.picks = []
        for p in range(self.n):
            sizes = [int(np.size(a)) for a in self.get(params, p)]
            idx = audit_index(sum(sizes))
            plan, at = [], 0
            for leaf, size in enumerate(sizes):
                local = None if idx is None else idx[(idx >= at) & (idx < at + size)] - at
                plan.append((leaf, local))
                at += size
            self.picks.append(plan)

    def _sample(self, params, p: int) -> np.ndarray:
        arrays = self.get(params, p)
        parts = [np.ravel(np.asarray(arrays[leaf], np.float32)) if local is None else
                 np.ravel(np.asarray(arrays[leaf], np.float32))[local] for leaf, local in self.picks[p]]
        return np.concatenate(parts) if parts else np.zeros(0, np.float32)

    def record(self, step: int, before, after) -> None:
        """Inner step `step` (1-based) took θ from `before` to `after`."""
        if self.picks is None:
            self._plan(before)
        last = self.prefix.get(step - 1)
        if last is None:  # the first step: the record starts before it
            last = [np.zeros(len(self._sample(before, p)), np.float64) for p in range(self.n)]
            self.prefix[step - 1] = last
        # θ before a step is the last step's θ after, unless a take came between: its samples are kept
        was = self._kept[1] if self._kept is not None and self._kept[0] is before else \
            [self._sample(before, p).astype(np.float64) for p in range(self.n)]
        now = [self._sample(after, p).astype(np.float64) for p in range(self.n)]
        self._kept = (after, now)
        self.prefix[step] = [last[p] + (now[p] - was[p]) for p in range(self.n)]

    def forget_before(self, step: int) -> None:
        """No Δ will start before `step` (the oldest anchor in use): drop older sums."""
        self.prefix = {s: v for s, v in self.prefix.items() if s >= step}

    def progress(self, p: int, from_step: int, to_step: int):
        """−(the sum of fragment p's changes over steps from_step+1 .. to_step), the Δ those
        steps make (float64), or None where the record does not reach."""
        a, b = self.prefix.get(from_step), self.prefix.get(to_step)
        if a is None or b is None:
            return None
        return -(b[p] - a[p])
