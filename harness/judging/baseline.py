"""Known-good baselines: an absolute check of learning that does not trust the code under
test to make its own reference.

Loss parity compares a faulted run with a fault-free run of the *same* code, so a bug
that is always on (in the merge, the outer step, the learner's handling of updates) is
in both, and parity calls it healthy. A baseline is the final global loss of the
fault-free scenario made once by code known to be good, kept in the repository
(harness/scenarios/baselines.json) and refreshed only on purpose (`diloco-chaos run NAME
--record-baseline`: it records the fault-free reference the run made). Keyed by the
fault-free scenario's whole config (a changed default makes a new key: the stored value
no longer applies, and nothing is judged against it) and the tier; the simulator is
deterministic, so there a known-good run lands on it to float rounding.

`baseline_parity_max`: (final loss − baseline) / baseline within ±bound (the scenario's
`loss_parity_max`, else BOUND, widened to the entry's `tolerance` where it has one):
above is learning lost to faults or to a bug; far below is suspect, as for parity.

On real processes a fault-free run is not a function of its seed alone: how many steps a
Δ is stale depends on the pace of the steps against the links, so the final loss moves
with the machine's load. A process-tier entry carries the `tolerance` its known-good runs
measured, idle and busy (`tolerance_why` says which runs); the simulator's entries need
none (it is deterministic)."""
from __future__ import annotations

import dataclasses
import hashlib
import json
import time
from importlib import resources
from pathlib import Path

from diloco_chaos.harness.judging.check_base import Result

STORE = Path(resources.files("diloco_chaos.harness")) / "scenarios" / "baselines.json"
BOUND = 0.05


def key(s, tier: str) -> str:
    """The fault-free scenario's config (seed included) and the tier."""
    return keyed(s.name, tier, dataclasses.replace(s, faults=(), failure_process=None, expect=type(s.expect)()))


def keyed(name: str, tier: str, clean) -> str:
    """A store's key: the scenario's name, the tier, and a digest of the config that counts."""
    digest = hashlib.sha256(json.dumps(clean.to_dict(), sort_keys=True, default=str).encode()).hexdigest()[:12]
    return f"{name}@{tier}:{digest}"


def read_store(store: Path) -> dict:
    return json.loads(store.read_text()) if store.is_file() else {}


def _load(store: Path | None) -> dict:
    return read_store(store or STORE)


def stored(s, tier: str, store: Path | None = None) -> dict | None:
    """The known-good baseline of `s` on `tier`, or None (none recorded for this config)."""
    return _load(store).get(key(s, tier))


def record(s, tier: str, final_loss: float, store: Path | None = None) -> dict:
    """Stores the fault-free final loss of `s` as its known-good baseline (on purpose only)."""
    entries = _load(store)
    entry = {"scenario": s.name, "tier": tier, "seed": s.seed, "final_loss": float(final_loss),
             "recorded": time.strftime("%Y-%m-%d")}
    kept = {k: v for k, v in entries.get(key(s, tier), {}).items() if k.startswith("tolerance")}
    entries[key(s, tier)] = {**entry, **kept}  # a measured tolerance stays until measured again
    (store or STORE).write_text(json.dumps(dict(sorted(entries.items())), indent=1) + "\n")
    return entry


def check(final_loss: float | None, baseline: dict | None, bound: float = BOUND) -> Result | None:
    """`baseline_parity_max`, or None where no baseline applies (not asked: not judged)."""
    if baseline is None:
        return None
    base = float(baseline["final_loss"])
    bound = max(bound, float(baseline.get("tolerance", 0.0)))
    if final_loss is None:
        return Result("baseline_parity_max", None, None, bound, {"why": "no final loss", "baseline": base})
    gap = (final_loss - base) / base
    details = {"final_loss": final_loss, "baseline": base, "recorded": baseline.get("recorded")}
    if gap < -bound:
        details["why"] = f"suspect: {-gap:.1%} below the known-good baseline, more than the bound {bound:.1%}"
    return Result("baseline_parity_max", -bound <= gap <= bound, gap, bound, details)
