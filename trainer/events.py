"""The event log's writer: one JSONL line per event, flushed as written.

Each process (learner unit, syncer shard, the harness itself) appends to its own
file; the harness merges them into the run's `events.jsonl`, whose first line is
the full config and seed. An event is `{"t": wall seconds, "src": who, "kind": ...,
**fields}`; kinds are listed in docs/ARCHITECTURE.md ("The event log").
"""
from __future__ import annotations

import json
import os
import threading
import time
from typing import Any

import numpy as np

KINDS = frozenset({
    "config", "step", "send", "recv", "round_open", "round_commit", "merge", "drop",
    "fault_start", "fault_end", "unit_up", "unit_down", "link_up", "link_down",
    "checkpoint_saved", "checkpoint_restored", "eval", "slices", "blocked", "done", "phase",
    "contribute", "join", "closing", "discard", "reanchor", "corrupt", "starved", "link_buffer", "resources", "auth_refused",
    "copy", "held", "guard", "commit_audit", "checkpoint_started", "checkpoint_failed",
    "checkpoint_skipped", "checkpoint_damaged", "checkpoints_listed", "writes_lost",
    "repair_asked", "repaired", "repair_failed", "journal_failed", "inner_audit",
    "inner_gradient",
})


def _plain(x: Any) -> Any:
    if isinstance(x, (np.floating, np.integer)):
        return x.item()
    if isinstance(x, np.ndarray):
        return x.tolist()
    raise TypeError(f"not JSON-serialisable in an event: {type(x).__name__}")


class EventWriter:
    """`path`: the process's own log file. `stream_fd`: a file descriptor every line is also
    written to, whole, in one write (a unit on another host streams its lines to the harness
    through the engine's log stream: trainer/shell.py `stream_events`)."""

    def __init__(self, path: str | os.PathLike, src: str, clock=time.time, stream_fd: int | None = None):
        self.src = src
        self.clock = clock
        self._f = open(path, "a", buffering=1)  # line-buffered: a SIGKILL loses at most one line
        self._fd = stream_fd
        self._lock = threading.Lock()

    def emit(self, kind: str, t: float | None = None, **fields: Any) -> None:
        if kind not in KINDS:
            raise ValueError(f"unknown event kind {kind!r}; valid: {sorted(KINDS)}")
        rec = {"t": round(self.clock() if t is None else t, 6), "src": self.src, "kind": kind, **fields}
        line = json.dumps(rec, default=_plain, separators=(",", ":")) + "\n"
        with self._lock:  # (threads emit too: a line is never split by another's)
            self._f.write(line)
            if self._fd is not None:
                data = line.encode()
                while data:
                    data = data[os.write(self._fd, data):]

    def close(self) -> None:
        self._f.close()
