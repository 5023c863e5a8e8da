"""committed_rounds_kept: a restarted shard loses no committed round a learner still held.

A shard restarts from its newest checkpoint, which may be seconds older than its last
commit (saves coalesce; a full disk refuses them). The rounds committed since are not
lost if a learner holds Θ[p] at such a version: the shard asks for it and takes it when
its digest is the one its journal names (trainer/protocol/syncer_core.py, docs/PROTOCOL.md "Repair
from the learners"). The check, per restart and fragment, from three sources:

- what the earlier incarnations committed: their `round_commit` lines (version, digest);
- what each learner held when it greeted the restarted shard: its own `copy` lines (the
  learner's word of each Θ[p] it took, digest included), the newest before the shard's
  `recv` of its Hello, in the same learner process; it counts only where its digest is
  the committed one (two processes agree on it, so neither's word alone decides);
- what the restarted shard went on from: its restore, raised by each `repaired` line
  whose digest is the committed one at that version (check_base.py `resumed`).

A fragment whose restarted shard went on from below the newest version a greeting
learner held, before it committed that fragment again, lost committed rounds: FAIL (a
life that died before it committed the fragment at all went on from nothing: the next
life is judged, with its own greetings; the run's last life is judged as it ended); so
does a `repaired` line whose digest is not the one committed at its version (a repair
that took another copy). UNKNOWN where a restart had greeting learners but no learner
wrote `copy` lines (no evidence of what they held).
"""
from __future__ import annotations

from collections import defaultdict

from diloco_chaos.harness.eventlog import EventLog
from diloco_chaos.harness.judging.check_base import SHOW, Result, _shards, committed_digests, resumed, shard_lives
from diloco_chaos.harness.judging.history import is_process_up, learner_names

NAME = "committed_rounds_kept"


def committed_rounds_kept(log: EventLog) -> Result:
    mode = log.config["diloco"].get("mode", "decoupled")
    if mode not in ("decoupled", "streaming", "sync_diloco"):
        return Result(NAME, True, 0, 0, {"why": f"{mode}: the shards hold no parameters; not applicable"})
    learners = set(learner_names(log))
    copies: dict[str, list[dict]] = defaultdict(list)  # learner -> its copy lines and own unit_up lines
    for e in log.events:
        if e["src"] in learners and (e["kind"] == "copy" or is_process_up(e)):
            copies[e["src"]].append(e)
    bad, restarts, judged = [], 0, 0
    for shard in _shards(log):
        lives = shard_lives(log, shard)
        for j, life in enumerate(lives):
            if life.n < 1 or j == 0:
                continue
            restarts += 1
            committed = committed_digests(lives[:j])
            went_on = resumed(lives, j)
            for e in life.events:
                if e["kind"] == "repaired" and committed.get((e["fragment"], e["version"])) != e.get("digest"):
                    bad.append({"shard": shard, "incarnation": life.n, "fragment": e["fragment"],
                                "version": e["version"], "t": e["t"],
                                "why": "repaired from a copy whose digest is not the one committed at its version"})
            first_commit: dict[int, float] = {}
            for e in life.events:
                if e["kind"] == "round_commit":
                    first_commit.setdefault(int(e["fragment"]), e["t"])
            held: dict[int, tuple[int, str]] = {}  # p -> (version, learner) the newest verified copy greeting it
            for e in life.events:
                if not (e["kind"] == "recv" and e.get("msg") == "Hello" and e.get("peer") in learners):
                    continue
                judged += 1
                for p, (v, who) in _verified_copies(copies[e["peer"]], e["t"], committed).items():
                    if e["t"] < first_commit.get(p, float("inf")) and v > held.get(p, (0, ""))[0]:
                        held[p] = (v, who)
            for p, (v, who) in sorted(held.items()):
                if p not in first_commit and j + 1 < len(lives):
                    continue  # it died before it went on with p (a repair still asked): the next life is judged
                if went_on.get(p, 0) < v:
                    bad.append({"shard": shard, "incarnation": life.n, "fragment": p, "went_on_from": went_on.get(p, 0),
                                "learner_held": v, "learner": who, "lost_rounds": v - went_on.get(p, 0),
                                "why": f"restarted at version {went_on.get(p, 0)} although {who} held the committed "
                                       f"version {v} when it greeted the shard"})
    if judged and not any(e["kind"] == "copy" for es in copies.values() for e in es):
        return Result(NAME, None, None, 0, {"why": "no learner copy lines: what the learners held is unknown",
                                            "restarts": restarts})
    return Result(NAME, not bad, len(bad), 0, {"violations": bad[:SHOW], "restarts": restarts, "hellos_judged": judged})


def _verified_copies(lines: list[dict], before: float, committed: dict) -> dict:
    """p -> (version, learner) of the newest copy the learner took in its current process
    before `before`, where its digest is the committed one at that version."""
    newest: dict[int, dict] = {}
    for e in lines:
        if e["t"] >= before:
            break
        if is_process_up(e):
            newest = {}  # a new process: what the old one held is gone
        else:
            newest[int(e["fragment"])] = e
    return {p: (int(e["version"]), e["src"]) for p, e in newest.items()
            if committed.get((p, int(e["version"]))) == e.get("digest")}
