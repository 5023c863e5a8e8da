"""The judge's own arithmetic: what a shard *should* have done, written from the documents
(docs/TRAINER_MATH.md "Outer math", docs/PROTOCOL.md "Corrupt contributions" and "Keeping
local progress"), not from trainer/.

A check that computes its expectation with the code under test agrees with that code's
mistakes: `weights_match_staleness` once called the trainer's own `contribution_weight`, so a
wrong exponent there passed it. Every function here is a second, independent statement of
one rule, in float64 numpy, with hand values in suites/unit/test_judge_spec.py; the audits
(harness/judging/audits.py) compare the shards' lines and sampled arrays against it. A test
(suites/unit/test_judge_spec.py) fails when judging imports a function from trainer/.

    weight        w = c_tokens² / c_steps ("tokens") or 1 ("uniform"); × (1 + s)^(−1/2) with the
                  staleness discount; 0 without steps
    staleness     the versions Θ[p] moved between the Δ's base and the commit that merged it
    fleet_share   min(1, n / |live ∪ merged ∪ closed|), n = K (share_by "quorum") or the learners
                  merged ("merged"); 1 without fleet_share or outside decoupled mode
    warm          min(1, lr) / lr for a fragment's first `outer.warmup` steps and for a round
                  holding a closing Δ (decoupled); 1 otherwise
    merge         mean Σwᵢ·Δᵢ/Σw, or RDA (Σwᵢ‖Δᵢ‖/Σw)·unit(Σwᵢ·unit(Δᵢ)), norms over the whole fragment
    outer_step    SGD with (Nesterov) momentum μ: m′ = μ·m + g; Θ′ = Θ − lr·(g + μ·m′) (Nesterov) or
                  Θ − lr·m′; without momentum Θ′ = Θ − lr·g
    guard         drop a Δ whose rms is not finite; whose rms per inner step is over factor × the
                  largest of the shard's last 16 accepted (once 4 are known); or over Θ[p]'s rms

And a learner's inner step (docs/TRAINER_MATH.md "Inner step"), per coordinate:

    inner_lr      linear warm-up 0 → lr over warmup_steps, then cosine to lr/10 at total_steps,
                  held after; at the schedule's count before the step (the first step's is 0)
    clip_factor   min(1, clip_norm / ‖g‖), the norm over every leaf
    adamw         c = count + 1; m = b1·m + (1−b1)·g; v = b2·v + (1−b2)·g²; s = b2·s + (1−b2)·n;
                  hats by 1 − b^c; v_f = max(v̂ − (1 − 1/M)·ŝ, v̂/M) (M = 1: v̂);
                  u = m̂/(√v_f + 1e-8) + wd·θ (matrices only); θ′ = θ − lr·u
"""
from __future__ import annotations

import base64
import hashlib
import math

import numpy as np

GUARD_WINDOW, GUARD_WARMUP = 16, 4   # docs/PROTOCOL.md "Corrupt contributions": 16 remembered, 4 needed
CLOSE_HOLD_S = 8.0                   # docs/PROTOCOL.md round table: a round holding a closed learner's Δ waits 8 s
DIGEST_HEX = 16                      # the digests' length in the log (hex digits of a SHA-256)


# --- weights and scale --------------------------------------------------------------------------
def weight(c_tokens: float, c_steps: int, staleness: int, weighting: str, discount: bool) -> float:
    if c_steps <= 0:
        return 0.0
    w = float(c_tokens) * float(c_tokens) / float(c_steps) if weighting == "tokens" else 1.0
    return w / math.sqrt(1.0 + staleness) if discount else w


def staleness(commit_version: int, base_version: int) -> int:
    """A commit that makes version v merges onto Θ[p] at v − 1: a Δ taken at base b is v − 1 − b old."""
    return commit_version - 1 - base_version


def fleet_share(diloco: dict, merged: int, pool: int) -> float:
    if not diloco.get("fleet_share") or diloco.get("mode") != "decoupled":
        return 1.0
    n = merged if diloco.get("share_by") == "merged" else int(diloco.get("quorum", 1))
    return min(1.0, n / max(pool, 1))


def warm(diloco: dict, outer: dict, version_before: int, closing: bool) -> float:
    lr = float(outer["lr"])
    if diloco.get("mode") != "decoupled" or not (version_before < int(outer.get("warmup", 0)) or closing):
        return 1.0
    return min(1.0, lr) / lr


# --- the merge and the outer step ------------------------------------------------------------------
def _norm(frag: list) -> float:
    return math.sqrt(sum(float(np.sum(np.square(np.asarray(x, np.float64)))) for x in frag))


def merge(deltas: list[list], weights: list[float], kind: str) -> list[np.ndarray]:
    pairs = [(w, [np.asarray(x, np.float64) for x in d]) for w, d in zip(weights, deltas) if w > 0]
    total = sum(w for w, _ in pairs)
    if not pairs or total <= 0:
        raise ValueError("nothing to merge: every weight is zero")
    if kind == "mean":
        return [sum(w / total * d[i] for w, d in pairs) for i in range(len(pairs[0][1]))]
    radius = sum(w / total * _norm(d) for w, d in pairs)
    units = [(w / total, [x / _norm(d) for x in d]) for w, d in pairs if _norm(d) > 1e-12]
    if not units:
        return [np.zeros_like(x) for x in pairs[0][1]]
    direction = [sum(w * d[i] for w, d in units) for i in range(len(units[0][1]))]
    n = _norm(direction)
    return [np.zeros_like(x) for x in direction] if n <= 1e-12 else [x * (radius / n) for x in direction]


def outer_step(theta: list, trace: list, update: list, outer: dict) -> tuple[list, list]:
    """(Θ′, m′) from Θ, the momentum trace m (empty without momentum) and the scaled merged Δ."""
    lr, mu, nesterov = float(outer["lr"]), float(outer.get("momentum") or 0.0), bool(outer.get("nesterov"))
    theta = [np.asarray(x, np.float64) for x in theta]
    g = [np.asarray(x, np.float64) for x in update]
    if not mu:
        return [t - lr * x for t, x in zip(theta, g)], []
    m = [mu * np.asarray(a, np.float64) + x for a, x in zip(trace, g)]
    step = [x + mu * a for x, a in zip(g, m)] if nesterov else m
    return [t - lr * s for t, s in zip(theta, step)], m


# --- the corrupt guard ----------------------------------------------------------------------------------
def guard_accepts(size: float, c_steps: int, seen: tuple, theta_size: float, factor: float) -> bool:
    if not math.isfinite(size):
        return False
    if not factor:
        return True
    per_step = size / max(c_steps, 1)
    if len(seen) >= GUARD_WARMUP and per_step > factor * max(seen):
        return False
    return not 0 < theta_size < per_step


def guard_remember(seen: tuple, size: float, c_steps: int) -> tuple:
    return seen if not size > 0 else (seen + (size / max(c_steps, 1),))[-GUARD_WINDOW:]


# --- evidence: digests, rms, arrays in a log line -----------------------------------------------------
def digest(arrays: list) -> str:
    """The log's content digest of a list of arrays: SHA-256 over each array's dtype and
    shape (as Python prints them) and its C-order bytes, the first 16 hex digits
    (docs/PROTOCOL.md "Digests")."""
    h = hashlib.sha256()
    for a in arrays:
        a = np.ascontiguousarray(np.asarray(a))
        h.update(f"{a.dtype}{a.shape}".encode())
        h.update(a.tobytes())
    return h.hexdigest()[:DIGEST_HEX]


def rms(arrays: list) -> float:
    n = sum(int(np.size(a)) for a in arrays)
    return math.sqrt(sum(float(np.sum(np.square(np.asarray(a, np.float64)))) for a in arrays) / max(n, 1))


def arrays_of(field: list) -> list[np.ndarray]:
    """A list of arrays as a log line carries them: [{"dtype", "shape", "b64"}, ...]."""
    return [np.frombuffer(base64.b64decode(a["b64"]), dtype=np.dtype(a["dtype"])).reshape(a["shape"]) for a in field]


# --- a learner's inner step ---------------------------------------------------------------------
ADAM_EPS = 1e-8   # docs/TRAINER_MATH.md: optax's default, the inner optimizer's


def inner_lr(inner: dict, count: int) -> float:
    lr, warm, total = float(inner["lr"]), int(inner["warmup_steps"]), int(inner["total_steps"])
    if count < warm:
        return lr * count / warm
    span = max(total - warm, 1)
    done = min(count - warm, span) / span
    end = lr / 10
    return end + (lr - end) * 0.5 * (1 + math.cos(math.pi * done))


def clip_factor(norm: float, clip_norm: float) -> float:
    return 1.0 if norm < clip_norm else clip_norm / norm


def adamw(theta, g, m, v, s, noise, *, count: int, lr: float, inner: dict, fleet: int, decay: bool):
    """One coordinate block of the inner step (float64): (θ′, m′, v′, s′) from the clipped
    gradient g (and its noise estimate n, the fleet's second moment; None: plain Adam)."""
    b1, b2 = float(inner["b1"]), float(inner["b2"])
    c = count + 1
    m = b1 * m + (1 - b1) * g
    v = b2 * v + (1 - b2) * g * g
    v_hat = v / (1 - b2 ** c)
    if noise is not None:
        s = b2 * s + (1 - b2) * noise
        v_hat = np.maximum(v_hat - (1 - 1 / fleet) * (s / (1 - b2 ** c)), v_hat / fleet)
    u = (m / (1 - b1 ** c)) / (np.sqrt(v_hat) + ADAM_EPS)
    if decay:
        u = u + float(inner["weight_decay"]) * theta
    return theta - lr * u, m, v, s
