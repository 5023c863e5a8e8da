"""Known-good envelopes: what a faulted scenario kept when the code was known good.

Every run-level check can hold while recovery quietly keeps less: a learner core that
throws away the progress made across a shard's outage still merges each Δ once, weighs it
right and ends near its reference. An envelope remembers, per scenario (its faults
included) and tier, the spread of figures over ≥ 3 known-good runs (seeds, and on
processes idle and busy machines): goodput, the share of trained tokens merged, the share
lost or still in flight at the end, and the final loss. Recorded on purpose only
(`diloco-chaos baseline record NAME`, from code you trust), kept in the repository
(harness/scenarios/envelopes.json for the built-in scenarios, an envelopes.json beside any
other scenario file), keyed by the scenario's config without its seed and
`[expect]` (a changed default or fault makes a new key: nothing is judged against an
envelope that no longer applies).

A run of a scenario that has one is judged against it by default (`--baseline none`
skips it), one check per figure, each with a noise band of the recorded spread (at least
the figure's floor; in the deterministic simulator a recorded seed is judged against its
own run, with the floor as its band): `goodput_vs_baseline` and `tokens_merged_vs_baseline` may not fall
below the lowest known-good value by more than the band, `tokens_lost_vs_baseline` and
`final_loss_vs_baseline` may not rise above the highest by more than it."""
from __future__ import annotations

import dataclasses
import json
import os
import time
from importlib import resources
from pathlib import Path

from diloco_chaos.harness.judging.baseline import keyed, read_store
from diloco_chaos.harness.judging.check_base import Result
from diloco_chaos.trainer.numerics.plugins import SEARCH_ENV

STORE = Path(resources.files("diloco_chaos.harness")) / "scenarios" / "envelopes.json"
MIN_RUNS = 3


def _merged(summary: dict):
    share = (summary.get("ledger") or {}).get("share") or {}
    return share.get("merged")


def _lost(summary: dict):
    share = (summary.get("ledger") or {}).get("share") or {}
    if share.get("lost") is None:
        return None
    return share["lost"] + (share.get("in_flight") or 0.0)


@dataclasses.dataclass(frozen=True)
class Figure:
    check: str
    read: object        # summary dict -> the figure, or None
    higher_is_better: bool
    floor: float        # the band's least width
    relative: bool = False  # the floor is a fraction of the figure (the final loss)


FIGURES = {
    "goodput": Figure("goodput_vs_baseline", lambda s: s.get("goodput"), True, 0.02),
    "tokens_merged": Figure("tokens_merged_vs_baseline", _merged, True, 0.02),
    "tokens_lost": Figure("tokens_lost_vs_baseline", _lost, False, 0.01),
    "final_loss": Figure("final_loss_vs_baseline", lambda s: s.get("final_loss"), False, 0.02, relative=True),
}


def key(s, tier: str) -> str:
    """The scenario's config with its faults, without its seed and [expect], and the tier."""
    return keyed(s.name, tier, dataclasses.replace(s, seed=0, expect=type(s.expect)()))


def _load(store: Path | None) -> dict:
    return read_store(store or STORE)


def stored(s, tier: str, store: Path | None = None) -> dict | None:
    """The envelope of `s` on `tier`: from `store`, else from an envelopes.json beside the
    scenario file being run (the folders its loader names, DILOCO_CHAOS_TASK_PATH), else the
    built-in scenarios' store."""
    if store is not None:
        return _load(store).get(key(s, tier))
    for folder in filter(None, os.environ.get(SEARCH_ENV, "").split(os.pathsep)):
        entry = read_store(Path(folder) / "envelopes.json").get(key(s, tier))
        if entry is not None:
            return entry
    return _load(None).get(key(s, tier))


def store_for(scenario_file: Path) -> Path:
    """Where `baseline record` keeps a scenario's envelope: the built-in scenarios' store for
    a built-in, else envelopes.json beside the scenario file (in the user's repository)."""
    builtin = STORE.parent / "builtin"
    return STORE if scenario_file.resolve().parent == builtin.resolve() else scenario_file.parent / "envelopes.json"


def figures_of(summary: dict) -> dict:
    return {name: f.read(summary) for name, f in FIGURES.items()}


def record(s, tier: str, runs: list[dict], store: Path | None = None, why: str = "") -> dict:
    """Stores the envelope of `runs` (each {"seed", "load", **figures_of(summary)}) for `s` on
    `tier` (on purpose only: from code you trust)."""
    if len(runs) < MIN_RUNS:
        raise ValueError(f"an envelope needs at least {MIN_RUNS} known-good runs, got {len(runs)}")
    figures = {}
    for name in FIGURES:
        values = [r[name] for r in runs if r.get(name) is not None]
        if values:
            figures[name] = {"min": min(values), "max": max(values), "values": values}
    entry = {"scenario": s.name, "tier": tier, "runs": runs, "figures": figures,
             "recorded": time.strftime("%Y-%m-%d"), **({"why": why} if why else {})}
    entries = _load(store)
    entries[key(s, tier)] = entry
    (store or STORE).write_text(json.dumps(dict(sorted(entries.items())), indent=1) + "\n")
    return entry


def band(f: Figure, spread: dict) -> float:
    least = f.floor * abs(spread["max"]) if f.relative else f.floor
    return max(least, spread["max"] - spread["min"])


def checks(summary: dict, entry: dict | None, seed: int | None = None) -> list[Result]:
    """One check per recorded figure (none where no envelope applies: not asked, not judged).
    The simulator is deterministic: a run whose seed the envelope recorded is judged against
    that run's own figures (the band its floor), any other seed against the spread."""
    if entry is None:
        return []
    out = []
    for name, f in FIGURES.items():
        spread = (entry.get("figures") or {}).get(name)
        if spread is None:
            continue
        same = [r[name] for r in entry.get("runs", ()) if r.get("seed") == seed and r.get(name) is not None]
        if entry.get("tier") == "sim" and seed is not None and same:
            spread = {"min": min(same), "max": max(same), "values": same, "seed": seed}
        value, width = f.read(summary), band(f, spread)
        limit = spread["min"] - width if f.higher_is_better else spread["max"] + width
        details = {"known_good": [spread["min"], spread["max"]], "band": width, "limit": limit,
                   "runs": len(spread.get("values", ())), "recorded": entry.get("recorded"),
                   **({"same_seed": seed} if "seed" in spread else {})}
        if value is None:
            out.append(Result(f.check, None, None, limit, {**details, "why": f"this run has no {name}"}))
            continue
        ok = value >= limit if f.higher_is_better else value <= limit
        if not ok:
            details["why"] = (f"{name} {value:.4g} is {'below' if f.higher_is_better else 'above'} what known-good "
                              f"runs kept ({spread['min']:.4g}..{spread['max']:.4g}) by more than the band {width:.3g}")
        out.append(Result(f.check, ok, value, limit, details))
    return out
