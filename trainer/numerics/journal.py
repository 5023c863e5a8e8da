"""A syncer shard's journal of commits: one line per commit, `[fragment, version, digest]`,
appended to a file of its own apart from its checkpoints (`<run>/journal/<shard>.jsonl`).

What it is for: a shard that restarts from a checkpoint older than its last commits
learns from it which versions it lost and what each one was (the digest of Θ[p]), so that
it can take a learner's copy of such a version back, and only a copy that is exactly what
it committed (trainer/protocol/syncer_core.py `remember`, docs/PROTOCOL.md "Repair from the
learners"). A line is written, flushed and fsynced at the commit, before the commit's
answers go out (the core's Journal action comes before its sends): a learner can hold a
version only if the journal has it durably, so a host crash (the `lost_writes` fault)
cannot leave a learner's copy the journal cannot vouch for. Without the fsync (the planted
`journal_unsynced`) a killed process still loses nothing the kernel holds, but a host
crash takes the whole file that was never fsynced, and every round since the last save
with it. A torn or unreadable line is skipped.
"""
from __future__ import annotations

import json
import os
from pathlib import Path


class CommitJournal:
    def __init__(self, path: Path, fsync: bool = True):
        self.path, self.fsync = Path(path), fsync
        self._file = None
        self.failed: str | None = None  # why the last append failed (None: it did not)

    def entries(self) -> list[tuple[int, int, str]]:
        """What earlier incarnations wrote, oldest first."""
        if not self.path.is_file():
            return []
        out = []
        for line in self.path.read_text(errors="replace").splitlines():
            try:
                p, v, digest = json.loads(line)
            except ValueError:
                continue  # a line torn by a crash
            if type(p) is int and type(v) is int and isinstance(digest, str):
                out.append((p, v, digest))
        return out

    def append(self, fragment: int, version: int, digest: str) -> str | None:
        """Writes one line; returns why it failed (a full disk, an I/O error), else None."""
        try:
            if self._file is None:
                self.path.parent.mkdir(parents=True, exist_ok=True)
                self._file = open(self.path, "a", encoding="utf-8")
            self._file.write(json.dumps([fragment, version, digest]) + "\n")
            self._file.flush()
            if self.fsync:
                os.fsync(self._file.fileno())
        except OSError as e:
            self.failed = f"{type(e).__name__}: {e}"
            return self.failed
        self.failed = None
        return None

    def close(self) -> None:
        if self._file is not None:
            try:
                self._file.close()
            except OSError:
                pass
            self._file = None
