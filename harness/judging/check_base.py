"""What every check shares: the Result (Jepsen's checker shape), composing results, and
a syncer shard's incarnations as its log lines tell them (which merges a crash lost)."""
from __future__ import annotations

from dataclasses import asdict, dataclass, field
from typing import Any, Iterable

from diloco_chaos.harness.eventlog import EventLog
from diloco_chaos.harness.judging.history import is_process_up, learner_names

SHOW = 10  # offending lines kept in details


@dataclass(frozen=True)
class Result:
    name: str
    valid: bool | None
    value: Any = None
    bound: Any = None
    details: dict = field(default_factory=dict)

    def to_dict(self) -> dict:
        return asdict(self)


def compose(results: Iterable[Result], name: str = "all") -> Result:
    rs = list(results)
    failed = [r.name for r in rs if r.valid is False]
    unknown = [r.name for r in rs if r.valid is None]
    valid = False if failed else (None if unknown else True)
    return Result(name, valid, value=len(failed), bound=0,
                  details={"failed": failed, "unknown": unknown, "checks": [[r.name, r.valid] for r in rs]})


def _judge(name: str, bad: list, bound=0, **details) -> Result:
    return Result(name, not bad, len(bad), bound, {"violations": bad[:SHOW], **details})


# --- shard incarnations ------------------------------------------------------------------------


@dataclass
class ShardLife:
    n: int                      # incarnation (-1: lines before any unit_up)
    restored: dict | None       # {fragment: version} of its checkpoint_restored, None = fresh
    events: list


def shard_lives(log: EventLog, shard: str) -> list[ShardLife]:
    """A shard's lines cut at its own unit_up lines. A checkpoint_restored belongs to the
    incarnation whose unit_up follows it (trainer/units/syncer.py restores, then logs unit_up),
    or to the current one if it comes after its unit_up and before its first round."""
    lives = [ShardLife(-1, None, [])]
    pending, ended = None, False
    for e in log.events:
        if e["src"] != shard:
            continue
        if is_process_up(e):
            lives.append(ShardLife(int(e["incarnation"]), pending, [e]))
            pending, ended = None, False
        elif e["kind"] == "checkpoint_restored":
            v = {int(p): int(x) for p, x in (e.get("versions") or {}).items()}
            cur = lives[-1]
            if (cur.n >= 0 and not ended and cur.restored is None
                    and not any(x["kind"] in ("merge", "round_commit") for x in cur.events)):
                cur.restored = v
            else:
                pending = v
        else:
            if e["kind"] == "unit_down" and e.get("reason") != "paused":
                ended = True
            lives[-1].events.append(e)
    return lives if lives[0].events else lives[1:]


def committed_digests(lives: list[ShardLife]) -> dict:
    """(fragment, version) -> the digest of Θ[p] the shard's round_commit lines in `lives`
    name (a version committed again, after a rollback: the later one)."""
    out = {}
    for life in lives:
        for e in life.events:
            if e["kind"] == "round_commit" and "digest" in e:
                out[(e["fragment"], e["version"])] = e["digest"]
    return out


def resumed(lives: list[ShardLife], j: int) -> dict:
    """{fragment: version} life j went on from: its restore, raised by each `repaired` line
    (a copy taken from a learner, trainer/protocol/syncer_core.py) whose digest is the one an earlier
    life committed at that version (the judge's evidence: the shard's own commit lines
    of its earlier incarnations; a repair that is not honoured stays at the restore)."""
    out = dict(lives[j].restored or {})
    committed = None
    for e in lives[j].events:
        if e["kind"] == "repaired":
            committed = committed if committed is not None else committed_digests(lives[:j])
            p, v = int(e["fragment"]), int(e["version"])
            if committed.get((p, v)) == e.get("digest") and v > out.get(p, 0):
                out[p] = v
    return out


def _shards(log: EventLog) -> list[str]:
    topo = (log.header.get("topology") or {}).get("shards") or {}
    learners = set(learner_names(log))
    seen = {e["src"] for e in log.of("merge", "round_commit", "checkpoint_saved", "checkpoint_restored")
            if e["src"] not in learners and e["src"] != "harness"}
    return sorted(set(topo) | seen)


def _lost_merges(log: EventLog) -> set[int]:
    """id() of every merge line whose round its shard lost in a crash: a later incarnation of
    that shard went on from a lower version of the fragment than the merge made (what it
    restored, or repaired from a learner: `resumed`)."""
    out = set()
    for shard in _shards(log):
        lives = shard_lives(log, shard)
        went_on = [resumed(lives, k) for k in range(len(lives))]
        for j, life in enumerate(lives):
            for e in life.events:
                if e["kind"] == "merge" and any(went_on[k].get(e["fragment"], 0) < e["version"]
                                                for k in range(j + 1, len(lives))):
                    out.add(id(e))
    return out
