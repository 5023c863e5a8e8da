"""The storage oracles: what a restarted shard loaded, against what the harness saw on its
disk and did to it.

Evidence, in order of trust:
- the harness's own lines, written right after it killed the shard and before the restart:
  `checkpoints_listed` (kill_syncer), `checkpoint_damaged` (corrupt_checkpoint: also the
  step it damaged and how) and `writes_lost` (lost_writes: listed after the crash dropped
  the un-fsynced writes) carry the shard's checkpoint folder as the harness listed it:
  the steps orbax finalized and those sealed (their manifest written last, so complete);
- the shard's `checkpoint_restored` line (which save it loaded, the digests of the state it
  loaded) and its `checkpoint_started` lines (the digests of what each save wrote): its own
  account, cross-checked against each other.

- `checkpoint_integrity`: no restore loaded a checkpoint the harness damaged, and what each
  restore after a storage fault loaded is what the save it names wrote (its digests: a
  damaged or foreign checkpoint cannot match). PASS (0) when no checkpoint was damaged.
- `restore_latest_intact`: each restore after a listing loaded the newest save that was
  sealed at the kill and not damaged since; a shard with none such must start afresh (no
  restore line). PASS (0) when no listing precedes a restart; UNKNOWN when every listing
  came from a host that could not see the folder (a unit on another host's engine).

Both depend on nothing in trainer/ but the field names.
"""
from __future__ import annotations

from diloco_chaos.harness.eventlog import EventLog
from diloco_chaos.harness.judging.check_base import SHOW, Result, _shards
from diloco_chaos.harness.judging.restores import SHARD_PARTS, loaded_differs

LISTINGS = ("checkpoints_listed", "checkpoint_damaged", "writes_lost")


def damaged_saves(log: EventLog, before: float = float("inf")) -> dict[str, set[int]]:
    """shard -> the save numbers the harness damaged (`checkpoint_damaged` lines) before `before`."""
    out: dict[str, set[int]] = {}
    for e in log.of("checkpoint_damaged", src="harness"):
        if e.get("step") is not None and e["t"] <= before:
            out.setdefault(e["unit"], set()).add(int(e["step"]))
    return out


def _restarts(log: EventLog, shard: str):
    """(listing line, the shard's restore line or None) for each harness listing of `shard`
    followed by a restart: the restore is the shard's first checkpoint_restored after the
    listing, if it comes before the restarted incarnation's own unit_up."""
    listing = None
    for e in log.events:
        if e["src"] == "harness" and e["kind"] in LISTINGS and e.get("unit") == shard:
            listing = e
        elif e["src"] == shard and listing is not None:
            if e["kind"] == "checkpoint_restored":
                yield listing, e
                listing = None
            elif e["kind"] == "unit_up" and "incarnation" in e:  # the process's own: up, nothing restored
                yield listing, None
                listing = None


def checkpoint_integrity(log: EventLog) -> Result:
    """No restore loaded a checkpoint the harness damaged, and each restore after a storage
    fault loaded what the save it names wrote (its digests and versions)."""
    damaged = damaged_saves(log)
    if not damaged:
        return Result("checkpoint_integrity", True, 0, 0, {"damaged": 0, "why": "no checkpoint was damaged"})
    bad, restores = [], 0
    for shard in _shards(log):
        if shard not in damaged:
            continue
        saves, hit = {}, set()
        for e in log.events:
            if e["src"] == "harness" and e["kind"] == "checkpoint_damaged" and e.get("unit") == shard:
                if e.get("step") is not None:
                    hit.add(int(e["step"]))
            elif e["src"] != shard:
                continue
            elif e["kind"] == "checkpoint_started":
                saves[int(e["number"])] = {"digests": e.get("digests"), "versions": e.get("versions"), "t": e["t"]}
            elif e["kind"] == "checkpoint_restored" and hit:
                restores += 1
                n = int(e.get("step") or 0)
                if n in hit:
                    bad.append({"shard": shard, "t": e["t"], "restored": n,
                                "why": f"loaded save {n}, which the harness had damaged"})
                elif (why := loaded_differs(e, saves.get(n), SHARD_PARTS)) is not None:
                    bad.append({"shard": shard, "t": e["t"], "restored": n, **why})
    return Result("checkpoint_integrity", not bad, len(bad), 0,
                  {"damaged": sum(map(len, damaged.values())), "restores_after_damage": restores,
                   "violations": bad[:SHOW]})


def restore_latest_intact(log: EventLog) -> Result:
    """Each shard restart after a harness kill restored the newest save sealed at the kill and
    not damaged since (none such: it restored nothing)."""
    bad, judged, blind = [], 0, 0
    for shard in _shards(log):
        for listing, restore in _restarts(log, shard):
            if "sealed" not in listing:
                blind += 1
                continue
            judged += 1
            damaged = damaged_saves(log, before=listing["t"])  # (a save damaged later was whole then)
            intact = [s for s in listing["sealed"] if s not in damaged.get(shard, set())]
            want = max(intact) if intact else None
            got = int(restore["step"]) if restore is not None and restore.get("step") is not None else None
            if got != want:
                bad.append({"shard": shard, "t": (restore or listing)["t"], "restored": got, "newest_intact": want,
                            "sealed_at_kill": listing["sealed"][-SHOW:],
                            "why": (f"restored save {got}, the newest intact one was {want}" if want is not None
                                    else f"restored save {got}, but none was intact")})
    details = {"restarts_judged": judged, "unseen": blind}
    if not judged and blind:
        return Result("restore_latest_intact", None, None, 0,
                      {**details, "why": "the harness could not see any killed shard's checkpoint folder"})
    if not judged:
        return Result("restore_latest_intact", True, 0, 0, {**details, "why": "no shard was killed by the harness"})
    return Result("restore_latest_intact", not bad, len(bad), 0, {**details, "violations": bad[:SHOW]})


def storage_checks(log: EventLog) -> list[Result]:
    return [checkpoint_integrity(log), restore_latest_intact(log)]
