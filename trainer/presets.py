"""Named presets: sets of trainer settings a RunConfig dict is laid over.

`with_preset(data, name)` returns `data` (a `RunConfig.to_dict()`-shaped dict) over the
sections of `PRESETS[name]`; keys `data` sets win. Used by `Scenario.run_config`
(`[train] preset = ...`) and the benches; `trainer.config` re-exports both names.
"""
from __future__ import annotations

from typing import Any

# Named sets of trainer settings: `[train] preset = "paper"` in a scenario, `bench` runs.
# Keys set explicitly beside a preset win over it. "paper": the Decoupled DiLoCo paper's
# regime scaled to this model (docs/BENCHMARKS.md, "The paper preset"): every fragment
# synced once per H = 64 inner steps, P = 8 fragments (one sent every 8 steps; the paper's
# P = H = 24 needs more leaves than this model's 16), τ = 2, int4 both ways, each commit
# sent back only to the learners it merged, learners joining the rounds others open (`align`)
# and each round moving Θ by the share of the learners it merged; the outer step 30 % past
# that share (lr 1.3, momentum 0: the paper's Nesterov family tuned for this H), after each
# fragment's first outer step at lr 1 (`warmup` counts versions of a fragment, and at
# H = 64 a fragment has 6–7 in a 400-step run, so the default 40 would be the whole run).
# Its figures were measured before the uplink's error feedback existed: it keeps it off
# until the preset is measured with it (docs/BENCHMARKS.md "frontier").
PRESETS = {
    "paper": {"diloco": {"sync_every": 64, "fragments": 8, "overlap": 2, "compression": "int4",
                         "broadcast_compression": "int4", "downlink": "answer", "align": True,
                         "share_by": "merged", "error_feedback": False},
              "outer": {"lr": 1.3, "momentum": 0.0, "nesterov": True, "warmup": 1}},
    # "sparse": the project defaults (H = 6, P = 3, K = 1) with sparse pseudo-gradients both
    # ways, 16 of every 256 entries, error feedback on both ends: the recommended point on
    # the bytes/quality frontier (docs/BENCHMARKS.md "frontier")
    "sparse": {"diloco": {"compression": "sparse", "broadcast_compression": "sparse", "sparse_density": 1 / 16}},
}


def with_preset(data: dict[str, Any], name: str | None) -> dict[str, Any]:
    """`data` (a RunConfig dict) over preset `name`'s sections: what `data` sets wins."""
    if name is None:
        return data
    if name not in PRESETS:
        raise ValueError(f"RunConfig preset {name!r} is not valid; valid: " + ", ".join(map(repr, PRESETS)))
    out = dict(data)
    for section, values in PRESETS[name].items():
        out[section] = {**values, **data.get(section, {})}
    return out
