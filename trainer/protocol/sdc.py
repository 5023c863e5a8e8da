"""Silent data corruption of a learner's outgoing contributions (the `corrupt` fault).

A unit with faulty hardware computes a wrong Δ and sends it as if it were right: the
message is well-formed, its counters are true, its payload is not. The harness switches
this on for a window (`set_fault`: the unit's `faults`, control/<learner>.json on processes);
the learner's driver passes each Contribution through `corrupt_contribution` before it goes
to the link (the `before_send` hook in trainer/protocol/unit_faults.py, both tiers), and logs a `corrupt` line
naming it, so the checks can tell whether the shard's guard (trainer/protocol/syncer_core.py
`_guard`) kept it out of the model.

Modes (parameters of the fault):
- `scale`: every value × `factor` (default 1000): a wrong-but-finite Δ;
- `bitflip`: in `flips` random non-zero values, the top bit of the fp32 exponent flips
  (x · 2^±128: the flips that matter; a mantissa flip is noise the merge absorbs);
- `nonfinite`: one value of each tensor becomes NaN or ±inf.
The Δ is corrupted decoded (fp32) and encoded again in the run's compression.
"""
from __future__ import annotations

import dataclasses

import numpy as np

from diloco_chaos.trainer.protocol import compression

MODES = ("scale", "bitflip", "nonfinite")


def corrupt_arrays(arrays: list, mode: str, rng: np.random.Generator, *, factor: float = 1000.0,
                   flips: int = 8) -> list[np.ndarray]:
    """The corrupted copies of fp32 `arrays` (the inputs are not touched)."""
    out = [np.array(a, dtype=np.float32, copy=True) for a in arrays]
    if mode == "scale":
        return [a * np.float32(factor) for a in out]
    if mode == "nonfinite":
        for i, a in enumerate(out):
            if a.size:
                a.reshape(-1)[rng.integers(a.size)] = (np.nan, np.inf, -np.inf)[i % 3]
        return out
    if mode == "bitflip":
        flat = [a.reshape(-1) for a in out]
        where = [(i, j) for i, f in enumerate(flat) for j in np.flatnonzero(f)]
        for k in rng.permutation(len(where))[:flips]:
            i, j = where[k]
            bits = flat[i][j:j + 1].view(np.uint32)
            bits ^= np.uint32(1 << 30)
        return out
    raise ValueError(f"corrupt mode {mode!r} is not valid; valid: {', '.join(MODES)}")


def corrupt_contribution(msg, spec: dict, rng: np.random.Generator):
    """(the Contribution with its payload corrupted as `spec` says, the `corrupt` line's fields)."""
    arrays = compression.decode(list(msg.payload))
    bad = corrupt_arrays(arrays, spec.get("mode", "scale"), rng, factor=float(spec.get("factor", 1000.0)),
                         flips=int(spec.get("flips", 8)))
    kind = msg.payload[0].kind if msg.payload else "fp32"
    fields = {"fragment": msg.fragment, "seq": msg.seq, "incarnation": msg.incarnation, "mode": spec.get("mode", "scale"),
              "norm": _norm(arrays), "corrupt_norm": _norm(bad)}
    return dataclasses.replace(msg, payload=compression.encode(bad, kind)), fields


def _norm(arrays: list) -> float | str:
    with np.errstate(over="ignore", invalid="ignore"):
        n = float(np.sqrt(sum(float(np.sum(np.square(np.asarray(a, np.float64)))) for a in arrays)))
    return n if np.isfinite(n) else str(n)  # JSON has no nan / inf


class Corrupter:
    """A learner shell's corruption switch: `spec` (the fault's {mode, factor, flips}, None:
    off) is set from the harness's control; `apply(msg)` -> (msg to send, the `corrupt`
    line's fields or None). Seeded per learner incarnation: a replay corrupts alike."""

    def __init__(self, seed: int, index: int, incarnation: int):
        self.rng = np.random.default_rng([seed, index, incarnation, 0x5DC])
        self.spec: dict | None = None

    def apply(self, msg):
        if self.spec is None or type(msg).__name__ != "Contribution":
            return msg, None
        return corrupt_contribution(msg, self.spec, self.rng)
