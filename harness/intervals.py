"""Interval arithmetic on lists of (a, b), a ≤ b (seconds of a run): what the judging room's
metrics and checks and the fleet model's pricing of a scenario both do on spans of time.
Pure functions."""
from __future__ import annotations


def norm(iv) -> list[tuple[float, float]]:
    """Sorted, merged, empty pieces dropped."""
    out: list[list[float]] = []
    for a, b in sorted((a, b) for a, b in iv if b > a):
        if out and a <= out[-1][1]:
            out[-1][1] = max(out[-1][1], b)
        else:
            out.append([a, b])
    return [(a, b) for a, b in out]


def measure(iv) -> float:
    return sum(b - a for a, b in norm(iv))


def clip(iv, lo: float, hi: float) -> list[tuple[float, float]]:
    return norm((max(a, lo), min(b, hi)) for a, b in iv)


def minus(iv, cut) -> list[tuple[float, float]]:
    out, cut = [], norm(cut)
    for a, b in norm(iv):
        for c, d in cut:
            if d <= a or c >= b:
                continue
            if c > a:
                out.append((a, c))
            a = max(a, d)
        if b > a:
            out.append((a, b))
    return out


def intersect(iv, other) -> list[tuple[float, float]]:
    return minus(iv, minus(iv, other))
