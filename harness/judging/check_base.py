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
    incarnation whose unit_up follows it (trainer/syncer.py restores, then logs unit_up),
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


def _shards(log: EventLog) -> list[str]:
    topo = (log.header.get("topology") or {}).get("shards") or {}
    learners = set(learner_names(log))
    seen = {e["src"] for e in log.of("merge", "round_commit", "checkpoint_saved", "checkpoint_restored")
            if e["src"] not in learners and e["src"] != "harness"}
    return sorted(set(topo) | seen)


def _lost_merges(log: EventLog) -> set[int]:
    """id() of every merge line whose round its shard lost in a crash: a later incarnation of
    that shard restored a lower version of the fragment than the merge made."""
    out = set()
    for shard in _shards(log):
        lives = shard_lives(log, shard)
        for j, life in enumerate(lives):
            for e in life.events:
                if e["kind"] == "merge" and any((later.restored or {}).get(e["fragment"], 0) < e["version"]
                                                for later in lives[j + 1:]):
                    out.add(id(e))
    return out
