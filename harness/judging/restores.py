"""restores_faithful: what a unit holds right after a restore is what it saved.

A unit's lines at two moments. When a save starts, the unit writes the digests of the
tree it hands to its checkpointer: a shard its `checkpoint_started` line (save `number`,
`versions`, `digests` {"theta": {p: d}, "outer": {p: d}}), a learner its `checkpoint_saved`
line (`step`, `digests` {"params": d, "opt": d}). After a restart it writes
`checkpoint_restored`, naming the save it loaded (`step`: a shard's save number, a
learner's step) with the digests of the state the restore produced, computed from that
state. A restore that reads another checkpoint than it names, or mixes two, cannot make
the two agree; nor can one that names an older save than the newest that had landed:

- a shard's landings are its `checkpoint_saved` lines (`number`: the save made durable);
- a learner's are the `durable` field of its `checkpoint_saved` lines (the newest finalized
  save when the next one started);
- a save the harness damaged on disk (its `checkpoint_damaged` line, corrupt_checkpoint)
  is not owed: the newest landing not damaged is.

Both lines are the unit's own account; the check never computes a digest itself, so it
depends on nothing in trainer/ but the field names. A restore line without digests (a log
from before they existed) is unverified: a log whose restores are all unverified is UNKNOWN.
"""
from __future__ import annotations

from diloco_chaos.harness.eventlog import EventLog
from diloco_chaos.harness.judging.check_base import SHOW, Result, _shards
from diloco_chaos.harness.judging.history import learner_names

NAME = "restores_faithful"
SHARD_PARTS = ("theta", "outer")   # per fragment: {p: digest}
LEARNER_PARTS = ("params", "opt")  # one digest each


def restores_faithful(log: EventLog) -> Result:
    """Every checkpoint_restored line of a unit (shard or learner): the save it names is one
    that unit's lines recorded starting, no older than the newest whose landing they logged
    before the restart, and the digests of what it loaded equal those the save recorded
    (a shard's versions too). FAIL with the violations; PASS (value 0) with no restore;
    UNKNOWN when no restore line carries digests."""
    learners = set(learner_names(log))
    shards = [s for s in _shards(log) if s not in learners]
    bad, restores, checked, unverified = [], 0, 0, 0
    for unit in shards + sorted(learners):
        saves: dict[int, dict] = {}  # save number (a learner's: its step) -> what it recorded
        landed = 0                   # the newest save whose landing the unit's lines logged
        landings, damaged = {0}, set()  # (a save the harness damaged, corrupt_checkpoint, is not owed)
        for e in log.events:
            if e["src"] == "harness" and e["kind"] == "checkpoint_damaged" and e.get("unit") == unit:
                if e.get("step") is not None:
                    damaged.add(int(e["step"]))
                    landed = max(landings - damaged)
                continue
            if e["src"] != unit:
                continue
            kind = e["kind"]
            if unit in learners and kind == "checkpoint_saved":
                saves[int(e["step"])] = {"digests": e.get("digests"), "t": e["t"]}
                landings.add(int(e.get("durable") or 0))
                landed = max(landings - damaged)
            elif kind == "checkpoint_started":
                saves[int(e["number"])] = {"digests": e.get("digests"), "versions": e.get("versions"), "t": e["t"]}
            elif kind == "checkpoint_saved" and "number" in e:
                landings.add(int(e["number"]))
                landed = max(landings - damaged)
            elif kind == "checkpoint_restored":
                restores += 1
                if not e.get("digests"):
                    unverified += 1
                    continue
                checked += 1
                why = _judge(e, saves, landed, LEARNER_PARTS if unit in learners else SHARD_PARTS)
                if why:
                    bad.append({"unit": unit, "t": e["t"], "restored": int(e.get("step") or 0),
                                "newest_landed": landed, **why})
    details = {"restores": restores, "checked": checked, "unverified": unverified}
    if not restores:
        return Result(NAME, True, 0, 0, {**details, "why": "no unit restored a checkpoint in this run"})
    if not checked:
        return Result(NAME, None, None, 0, {**details, "why": "no checkpoint_restored line carries digests "
                                                              "(a log from before they existed)"})
    return Result(NAME, not bad, len(bad), 0, {**details, "violations": bad[:SHOW]})


def _judge(restore: dict, saves: dict, landed: int, parts: tuple) -> dict | None:
    """None if the restore loaded the save it names and that save is the newest that landed;
    else what was wrong ({"why": ..., "differs": [...]})."""
    n = int(restore.get("step") or 0)
    if n < landed:
        return {"why": f"loaded save {n}, but save {landed} had landed before the restart"}
    return loaded_differs(restore, saves.get(n), parts)


def loaded_differs(restore: dict, save: dict | None, parts: tuple) -> dict | None:
    """None if the digests (and a shard's versions) of what `restore` loaded equal what
    `save` (its record of the save it names) wrote; else what differs."""
    n, got = int(restore.get("step") or 0), restore.get("digests") or {}
    if save is None or not save["digests"]:
        return {"why": f"names save {n}, which no earlier line of this unit recorded (with digests)"}
    want = save["digests"]
    if parts == SHARD_PARTS:
        differs = sorted(f"{part}[{p}]" for part in parts
                         for p in set(want.get(part) or {}) | set(got.get(part) or {})
                         if (want.get(part) or {}).get(p) != (got.get(part) or {}).get(p))
        if save.get("versions") is not None and restore.get("versions") is not None:
            if _versions(save["versions"]) != _versions(restore["versions"]):
                differs.append("versions")
    else:
        differs = [part for part in parts if want.get(part) != got.get(part)]
    if differs:
        return {"differs": differs, "saved_at": save["t"],
                "why": f"what it loaded is not what save {n} wrote: {', '.join(differs)}"}
    return None


def _versions(v: dict) -> dict:
    return {int(p): int(x) for p, x in v.items()}
