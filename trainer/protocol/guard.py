"""The syncer's corrupt guard, pure (docs/PROTOCOL.md "Corrupt contributions").

Silent data corruption makes a contribution wrong, not absent. `judge` says whether a Δ
of `size` (the rms of its values; nan / inf when not finite) over `c_steps` inner steps
is corrupt, against `seen` (the last accepted sizes per step of the shard, any fragment)
and the size of the Θ[p] it would move: not finite; over `factor` × the largest of
`seen` once GUARD_WARMUP are known; over Θ[p]'s size (no inner step moves a fragment by
its own size: the bound that holds with no history). The largest, not the median: the
inner lr's warm-up grows the size per step step after step, and a run's first sizes
(lr ≈ 0) made a median that a legitimate Δ at step 20 was 33× over (found by the
cluster-model property); a ×1000 corruption is still ~300× the largest. A Δ of size 0
(a fragment synced before the warm-up's first lr > 0, as at H = P) says nothing about the
scale and is not remembered: four of them made a bound of 0 that dropped every later Δ.
"""
from __future__ import annotations

import math

GUARD_WINDOW, GUARD_WARMUP = 16, 4  # accepted sizes remembered, and how many the bound needs


def judge(size: float, c_steps: int, seen: tuple, theta_size: float, factor: float) -> dict | None:
    """None: accept; else the `drop reason=corrupt` line's figures."""
    if not math.isfinite(size):
        return {"rms": str(size)}
    if not factor:
        return None
    per_step = size / max(c_steps, 1)
    if len(seen) >= GUARD_WARMUP:
        largest = max(seen)
        if per_step > factor * largest:
            return {"rms_per_step": per_step, "recent_max": largest, "guard_factor": factor}
    if 0 < theta_size < per_step:
        return {"rms_per_step": per_step, "theta_rms": theta_size}
    return None


def remember(seen: tuple, size: float, c_steps: int) -> tuple:
    """`seen` with an accepted Δ's size per step, the last GUARD_WINDOW kept (size 0: unchanged)."""
    if not size > 0:
        return seen
    return (seen + (size / max(c_steps, 1),))[-GUARD_WINDOW:]
