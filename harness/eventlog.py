"""Reading and merging event logs.

A run directory holds `logs/<src>.jsonl` (one per process incarnation, written by
trainer/units/events.py) while it runs; `merge` writes `events.jsonl`: first line
`{"kind": "config", "seed": ..., "config": {...}}`, then every event ordered by
time (ties keep per-file order, so a process's own events never reorder).
Metrics, checks and reports read only this file.
"""
from __future__ import annotations

import heapq
import json
from dataclasses import dataclass, field
from pathlib import Path
from typing import Iterable, Iterator


class EventLogError(ValueError):
    pass


@dataclass(frozen=True)
class EventLog:
    """A run's log: the header (seed, config, scenario, ...) and its events in time order.
    `views` holds what readers derive from it once and share (harness/judging/history.py
    `histories`): a log is read, never changed."""

    header: dict
    events: list[dict]
    views: dict = field(default_factory=dict, compare=False, repr=False)

    @property
    def config(self) -> dict:
        return self.header["config"]

    @property
    def seed(self) -> int:
        return self.header["seed"]

    def of(self, *kinds: str, src: str | None = None) -> list[dict]:
        return [e for e in self.events if e["kind"] in kinds and (src is None or e["src"] == src)]


def _lines(path: Path) -> Iterator[dict]:
    with open(path) as f:
        for i, line in enumerate(f, 1):
            if not line.endswith("\n"):
                return  # a line cut by SIGKILL mid-write: the process never finished it
            try:
                yield json.loads(line)
            except json.JSONDecodeError as e:
                raise EventLogError(f"{path}:{i}: not JSON: {e}") from None


def merge(run_dir: Path, header: dict, extra: Iterable[dict] = ()) -> Path:
    """Merges run_dir/logs/*.jsonl (+ `extra` events) into run_dir/events.jsonl."""
    # A process may write a line after a later one (a learner's step line waits for
    # its metrics to reach the host): each file is put in time order first (stable).
    streams = [sorted(_lines(p), key=lambda e: e["t"]) for p in sorted((run_dir / "logs").glob("*.jsonl"))]
    streams.append(sorted(extra, key=lambda e: e["t"]))
    keyed = [[(e["t"], i, j, e) for j, e in enumerate(s)] for i, s in enumerate(streams)]
    out = run_dir / "events.jsonl"
    tmp = out.with_suffix(".jsonl.tmp")
    with open(tmp, "w") as f:
        f.write(json.dumps({"kind": "config", **header}, separators=(",", ":")) + "\n")
        for _, _, _, e in heapq.merge(*keyed):
            f.write(json.dumps(e, separators=(",", ":")) + "\n")
    tmp.replace(out)  # never a half-written events.jsonl
    return out


def read(path: Path) -> EventLog:
    path = Path(path)
    if path.is_dir():
        path = path / "events.jsonl"
    if not path.exists():
        raise EventLogError(f"{path}: no event log here (a run directory holds events.jsonl)")
    it = _lines(path)
    header = next(it, None)
    if not header or header.get("kind") != "config" or "seed" not in header:
        raise EventLogError(f"{path}:1: the first line must be the config record with a seed")
    return EventLog(header, list(it))
