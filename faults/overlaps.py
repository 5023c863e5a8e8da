"""Which faults may not be active at once on the same target, shape-free (the run's
shape is `faults.schedule`'s part): `conflict(a, b)` over the kinds' own `conflicts`
(faults/kinds/: each unit kind says which kinds it may not overlap with on one unit, and
why) for process faults, and for link faults `LinkTarget`, the one parser of a link
target ('link:*', 'link:learner-N', 'link:learner-N~syncer-M': the links it names,
whether it reaches a learner, whether two share a link)."""
from __future__ import annotations

import math
from dataclasses import dataclass
from typing import TYPE_CHECKING, Sequence

if TYPE_CHECKING:
    from diloco_chaos.faults.kinds import Fault


@dataclass(frozen=True)
class LinkTarget:
    """A link fault's target, parsed once: `learner` ("*": every learner) and `shard`
    (None: every shard of that learner). 'link:*', 'link:learner-N', 'link:learner-N~syncer-M'
    (the syntax faults.kinds.TARGET_FORMS checks); every reader of a link target goes
    through this."""

    learner: str
    shard: str | None = None

    @classmethod
    def parse(cls, target: str) -> "LinkTarget":
        learner, _, shard = target.removeprefix("link:").partition("~")
        return cls(learner, shard or None)

    @property
    def every(self) -> bool:
        return self.learner == "*"

    def reaches(self, learner: str) -> bool:
        """Does it cut some link of `learner`?"""
        return self.every or self.learner == learner

    def links(self, learners: Sequence[str], shards: Sequence[str]) -> list[str]:
        """The link names the cluster uses ('learner-N~syncer-M'), in topology order."""
        return [f"{u}~{s}" for u in learners for s in shards
                if self.reaches(u) and (self.shard is None or self.shard == s)]

    def exists(self, learners: Sequence[str], shards: Sequence[str]) -> bool:
        return self.every or (self.learner in learners and (self.shard is None or self.shard in shards))

    def intersects(self, other: "LinkTarget") -> bool:
        """Do the two targets share a link?"""
        if self.every or other.every:
            return True
        return self == other or (self.learner == other.learner and None in (self.shard, other.shard))


def links_intersect(a: str, b: str) -> bool:
    """Do two link specs ('link:*', 'link:learner-N', 'link:learner-N~syncer-M') share a link?"""
    return LinkTarget.parse(a).intersects(LinkTarget.parse(b))


def overlap_in_time(a: Fault, b: Fault) -> bool:
    """Half-open intervals [at, end): a fault may start exactly when another ends."""
    a_end = math.inf if a.end_s is None else a.end_s
    b_end = math.inf if b.end_s is None else b.end_s
    return a.at_s < b_end and b.at_s < a_end


def conflict(a: Fault, b: Fault) -> str | None:
    """Why `a` and `b` cannot both be active, or None if they can (shape-free part)."""
    if not overlap_in_time(a, b):
        return None
    a_link, b_link = a.target.startswith("link:"), b.target.startswith("link:")
    if a_link and b_link:
        if a.kind == b.kind and links_intersect(a.target, b.target):
            return f"two {a.kind} faults on one link at once (the second would replace the first's toxic)"
        return None
    if not a_link and not b_link and a.target == b.target:  # one unit (a learner's or a shard's name)
        return a.conflicts.get(b.kind) or b.conflicts.get(a.kind)
    return None
