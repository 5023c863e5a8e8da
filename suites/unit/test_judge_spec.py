"""The judge's own arithmetic (harness/judging/spec.py), by hand values, and the rule that keeps
it the judge's: judging imports from trainer/ only types and constants, never a function that
decides what the system does (a check that calls it agrees with its mistakes)."""
from __future__ import annotations

import ast
import importlib
import math
from pathlib import Path

import numpy as np
import pytest

from diloco_chaos.harness.judging import spec

ROOT = Path(__file__).parents[2]
JUDGING = ROOT / "harness" / "judging"


def test_weight_by_hand():
    assert spec.weight(6144, 6, 0, "tokens", True) == 1024 * 6144          # 6144² / 6
    assert spec.weight(32, 2, 3, "tokens", True) == 512 / 2                 # (1 + 3)^-1/2 = 1/2
    assert spec.weight(32, 2, 3, "tokens", False) == 512
    assert spec.weight(32, 2, 8, "uniform", True) == pytest.approx(1 / 3)   # (1 + 8)^-1/2
    assert spec.weight(32, 0, 0, "tokens", True) == 0.0
    assert spec.staleness(5, 4) == 0 and spec.staleness(5, 2) == 2          # v − 1 − base


def test_fleet_share_and_warm_up_by_hand():
    d = {"mode": "decoupled", "fleet_share": True, "share_by": "quorum", "quorum": 1}
    assert spec.fleet_share(d, merged=3, pool=4) == 0.25
    assert spec.fleet_share({**d, "share_by": "merged"}, merged=2, pool=4) == 0.5
    assert spec.fleet_share({**d, "quorum": 4}, merged=4, pool=3) == 1.0     # never past the average
    assert spec.fleet_share({**d, "fleet_share": False}, 1, 4) == 1.0
    assert spec.fleet_share({**d, "mode": "streaming"}, 1, 4) == 1.0
    outer = {"lr": 1.3, "warmup": 40}
    assert spec.warm(d, outer, 39, False) == pytest.approx(1 / 1.3)
    assert spec.warm(d, outer, 40, False) == 1.0
    assert spec.warm(d, outer, 400, True) == pytest.approx(1 / 1.3)          # a closing round steps by the average
    assert spec.warm(d, {"lr": 0.7, "warmup": 40}, 0, False) == 1.0          # lr ≤ 1: min(1, lr)/lr = 1


def test_merge_by_hand():
    a, b = [np.array([1.0, 0.0])], [np.array([0.0, 1.0])]
    np.testing.assert_allclose(spec.merge([a, b], [1, 1], "rda")[0], [math.sqrt(0.5)] * 2)
    np.testing.assert_allclose(spec.merge([a, b], [1, 1], "mean")[0], [0.5, 0.5])
    rda = spec.merge([[np.array([3.0, 0.0])], [np.array([0.0, 1.0])]], [1, 3], "rda")[0]
    np.testing.assert_allclose(rda, 1.5 * np.array([1.0, 3.0]) / math.sqrt(10))
    np.testing.assert_allclose(spec.merge([a, [-a[0]]], [1, 1], "rda")[0], [0, 0])  # directions cancel
    with pytest.raises(ValueError):
        spec.merge([a], [0], "mean")


def test_outer_step_by_hand():
    """Θ = (1, 2), Δ = (0.1, −0.2), lr 0.7, Nesterov 0.9: (0.867, 2.266), then (0.6773, 2.6454)."""
    outer = {"lr": 0.7, "momentum": 0.9, "nesterov": True}
    theta, trace = [np.array([1.0, 2.0])], [np.zeros(2)]
    g = [np.array([0.1, -0.2])]
    theta, trace = spec.outer_step(theta, trace, g, outer)
    np.testing.assert_allclose(theta[0], [0.867, 2.266])
    theta, trace = spec.outer_step(theta, trace, g, outer)
    np.testing.assert_allclose(theta[0], [0.6773, 2.6454])
    plain, none = spec.outer_step([np.array([1.0])], [], [np.array([0.5])], {"lr": 1.3, "momentum": 0.0})
    np.testing.assert_allclose(plain[0], [1 - 0.65]) and none == []


def test_guard_by_hand():
    seen = (0.01, 0.02, 0.03, 0.04)           # the bound: 30 × 0.04 = 1.2 per inner step
    assert spec.guard_accepts(6.0, 6, seen, 2.0, 30.0)           # 1.0 per step
    assert not spec.guard_accepts(7.8, 6, seen, 2.0, 30.0)       # 1.3 per step
    assert not spec.guard_accepts(6.0, 6, seen, 0.5, 30.0)       # over Θ[p]'s own rms
    assert spec.guard_accepts(60.0, 6, seen[:3], 20.0, 30.0)     # 3 known: only Θ[p]'s bound
    assert not spec.guard_accepts(float("nan"), 6, seen, 2.0, 30.0)
    assert spec.guard_accepts(1e9, 1, seen, 2.0, 0.0)            # factor 0: no guard
    assert spec.guard_remember(seen, 0.0, 6) == seen             # a zero Δ says nothing of the scale
    assert spec.guard_remember(tuple(range(1, 17)), 34.0, 2)[-1] == 17.0
    assert len(spec.guard_remember(tuple(range(1, 17)), 34.0, 2)) == spec.GUARD_WINDOW


def test_digest_and_arrays_by_hand():
    x = np.arange(3, dtype=np.float32)
    import base64
    import hashlib
    want = hashlib.sha256(b"float32(3,)" + x.tobytes()).hexdigest()[:16]
    assert spec.digest([x]) == want
    field = [{"dtype": "float32", "shape": [3], "b64": base64.b64encode(x.tobytes()).decode()}]
    np.testing.assert_array_equal(spec.arrays_of(field)[0], x)
    assert spec.rms([np.array([3.0, 4.0])]) == pytest.approx(math.sqrt(12.5))


# --- judging decides in its own arithmetic -------------------------------------------------------------
def trainer_functions_imported(source: str) -> list[str]:
    """Every name judging code imports from diloco_chaos.trainer that is not a type or a
    constant (UPPER_CASE), and every plain `import diloco_chaos.trainer...`."""
    bad = []
    for node in ast.walk(ast.parse(source)):
        if isinstance(node, ast.Import):
            bad += [a.name for a in node.names if a.name.startswith("diloco_chaos.trainer")]
        elif isinstance(node, ast.ImportFrom) and (node.module or "").startswith("diloco_chaos.trainer"):
            module = importlib.import_module(node.module)
            for a in node.names:
                obj = getattr(module, a.name, None)
                if not (a.name.isupper() or isinstance(obj, type)):
                    bad.append(f"{node.module}.{a.name}")
    return bad


def test_judging_imports_no_trainer_function():
    found = {path.name: trainer_functions_imported(path.read_text()) for path in JUDGING.glob("*.py")}
    assert not any(found.values()), {k: v for k, v in found.items() if v}


def test_inner_lr_by_hand():
    """lr 0.01, warm-up 10, total 110: 0 at count 0, 0.005 at 5, then cosine to 0.001 at 110."""
    inner = {"lr": 0.01, "warmup_steps": 10, "total_steps": 110}
    assert spec.inner_lr(inner, 0) == 0.0 and spec.inner_lr(inner, 5) == pytest.approx(0.005)
    assert spec.inner_lr(inner, 10) == pytest.approx(0.01)
    assert spec.inner_lr(inner, 60) == pytest.approx(0.001 + 0.009 * 0.5)   # half-way: cos(π/2) = 0
    assert spec.inner_lr(inner, 110) == pytest.approx(0.001) and spec.inner_lr(inner, 500) == pytest.approx(0.001)


def test_clip_and_adamw_by_hand():
    """Step 1 from zero moments: m̂ = g, v̂ = g², so u = sign(g) (eps aside); with the fleet's
    second moment M = 4 and noise s: v̂ − ¾ŝ. Decay adds wd·θ to u for a matrix only."""
    assert spec.clip_factor(0.5, 1.0) == 1.0 and spec.clip_factor(4.0, 1.0) == 0.25
    inner = {"b1": 0.9, "b2": 0.95, "weight_decay": 0.1}
    z = np.zeros(1)
    th, m, v, s = spec.adamw(np.array([2.0]), np.array([0.5]), z, z, None, None, count=0, lr=0.1, inner=inner,
                             fleet=1, decay=False)
    assert th[0] == pytest.approx(2.0 - 0.1) and m[0] == pytest.approx(0.05) and v[0] == pytest.approx(0.05 * 0.25)
    th, *_ = spec.adamw(np.array([2.0]), np.array([0.5]), z, z, None, None, count=0, lr=0.1, inner=inner,
                        fleet=1, decay=True)
    assert th[0] == pytest.approx(2.0 - 0.1 * (1 + 0.1 * 2.0))
    th, _, _, s = spec.adamw(np.array([0.0]), np.array([0.5]), z, z, z, np.array([0.2]), count=0, lr=1.0,
                             inner=inner, fleet=4, decay=False)  # v̂ − ¾ŝ = 0.25 − 0.15 = 0.1
    assert th[0] == pytest.approx(-0.5 / np.sqrt(0.1)) and s[0] == pytest.approx(0.05 * 0.2)


def test_the_rule_sees_an_imported_formula():
    """The line the old weights_match_staleness had: it would fail the test above."""
    assert trainer_functions_imported("from diloco_chaos.trainer.numerics.outer import contribution_weight\n") == [
        "diloco_chaos.trainer.numerics.outer.contribution_weight"]
    assert trainer_functions_imported("import diloco_chaos.trainer.protocol.guard as g\n") == ["diloco_chaos.trainer.protocol.guard"]
    assert trainer_functions_imported("from diloco_chaos.trainer.protocol.protocol_base import DP_MODES\n") == []
