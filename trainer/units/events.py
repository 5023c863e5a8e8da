"""The event log's writer: one JSONL line per event, flushed as written.

Each process (learner unit, syncer shard, the harness itself) appends to its own
file; the harness merges them into the run's `events.jsonl`, whose first line is
the full config and seed. An event is `{"t": wall seconds, "src": who, "kind": ...,
**fields}`; `EVENT_KINDS` below declares every kind (docs/reference/events.md).
"""
from __future__ import annotations

import json
import os
import threading
import time
from typing import Any

import numpy as np

# Every event kind, with who writes it and what a line of it says: the writer refuses any
# other kind, and docs/reference/events.md is generated from this (diloco_chaos/reference.py).
EVENT_KINDS: dict[str, tuple[str, str]] = {  # kind -> (who writes it, what it says)
    "config": ("harness", "the first line: seed, full config, scenario, drawn schedule, topology, task "
                          "facts, t_launch, t_start, t_end, the replay command, the crashes"),
    "step": ("learner", "one inner step: step, loss, tokens, dt, live_slices"),
    "send": ("learner, syncer", "a message written to a link: msg, peer, bytes"),
    "recv": ("learner, syncer", "a message read from a link: msg, peer, bytes (a learner's: `at`, when its "
                                "read thread saw it)"),
    "round_open": ("syncer", "a shard announces a round it opens (`diloco.align`)"),
    "round_commit": ("syncer", "a round of a fragment committed: fragment, version, n (contributions "
                               "merged), tokens; the audits' evidence: digests of Θ[p] `before` and after "
                               "(`digest`), `live`, `closed`, `closing`"),
    "merge": ("syncer", "one contribution merged into a round: learner, incarnation, seq, fragment, version, "
                        "base_version, staleness, weight, c_steps, c_tokens"),
    "drop": ("learner, syncer", "a contribution or message dropped, and why (`reason`: stale, corrupt, "
                                "combined, superseded, ...)"),
    "fault_start": ("harness", "fault `id` begins: the fault, and how this host does it (`via`)"),
    "fault_end": ("harness", "fault `id` healed (`healed_at_teardown`: at the run's end)"),
    "unit_up": ("harness, learner, syncer", "a unit's process is up: incarnation, step; its own line carries "
                                            "`started` (the process start), the harness's how it started"),
    "unit_down": ("harness", "a unit taken down, and why (`reason`: killed, paused, preempted, crashed, "
                             "rollback, ...)"),
    "link_up": ("learner", "a learner's link to a shard connected: peer"),
    "link_down": ("learner", "a learner's link to a shard cut: peer (`at`: when its read thread saw it)"),
    "checkpoint_saved": ("learner, syncer", "a checkpoint on disk: step (a shard's: the versions made durable, "
                                            "its save `number`)"),
    "checkpoint_started": ("syncer", "a shard starts a save: number, versions, digests of Θ[p] and the outer "
                                     "state it holds (restores_faithful)"),
    "checkpoint_failed": ("learner, syncer", "a save did not land (a full disk, an I/O error): a shard's save "
                                             "`number` or a learner's `step` (null: the save before), `error`; "
                                             "never fatal, its state goes into the next save"),
    "checkpoint_restored": ("learner, syncer", "a (re)started unit restored a checkpoint: step (a shard's: "
                                               "versions)"),
    "checkpoint_skipped": ("learner, syncer", "a restore passed over a saved checkpoint: step, why (no manifest, "
                                              "did not load, its bytes not what its manifest says)"),
    "checkpoint_damaged": ("harness", "corrupt_checkpoint damaged a unit's newest sealed checkpoint at rest: "
                                      "unit, step, damage (flip, truncate, manifest), file"),
    "writes_lost": ("harness", "lost_writes dropped what a killed shard wrote and never fsynced (its host "
                               "crashed): unit, lost and truncated files of its checkpoint folder and of its "
                               "journal, then its folder's finalized and sealed steps (restore_latest_intact)"),
    "checkpoints_listed": ("harness", "a shard's checkpoint folder as the harness found it right after killing "
                                      "it: unit, finalized and sealed steps (restore_latest_intact)"),
    "repair_asked": ("syncer", "a restarted shard asked a learner for its copy of Θ[p] at a version past the "
                               "restored one (its Hello named it, the journal holds its digest): fragment, "
                               "version, from_version, learner"),
    "repaired": ("syncer", "a restarted shard took a learner's copy of Θ[p] (its digest the journal's): "
                           "fragment, version, from_version, learner, digest"),
    "repair_failed": ("syncer", "a repair given up (no answer, the learner left, a digest not the journal's): "
                                "fragment, version, from_version, learner, why; Θ[p] stays as restored"),
    "journal_failed": ("syncer", "a shard's journal of commits could not be written (once until it can): "
                                 "fragment, version, error"),
    "eval": ("learner, harness", "a held-out loss: a learner's of its local θ, or the harness's of the global "
                                 "model (`global: true`; `snapshot: true` along the run)"),
    "slices": ("learner", "the learner's live slices changed (kill_slice): live_slices"),
    "blocked": ("learner", "a learner waits (`on`) for the network, and why, or goes on (`on` empty)"),
    "done": ("learner, syncer", "a unit finished: finished (true: by itself), step, its links' counters"),
    "phase": ("learner", "a restarted learner's fragment schedule shifted: phase, next_fragment"),
    "contribute": ("learner", "a Δ sent for a fragment: seq, fragment, the steps it holds (from_step, "
                              "to_step), tokens"),
    "join": ("learner", "a learner joins a round another learner's shard opened (`diloco.align`)"),
    "closing": ("learner", "a learner that ended or was stopped sends the progress no Δ holds yet"),
    "discard": ("learner", "progress a take threw away: fragment, step, steps, tokens, version, why (fetch, "
                           "overwritten, stale)"),
    "reanchor": ("learner", "compressed broadcasts: Θ[p] whole at the version held became the learner's copy "
                 "(the shard records it so): fragment, version, max_abs_diff"),
    "corrupt": ("learner", "a contribution the `corrupt` fault corrupted"),
    "starved": ("learner", "a learner heard nothing from a shard for `diloco.starve_cycles` cycles and "
                           "fetches again"),
    "link_buffer": ("learner, syncer", "what waits unsent on a link (the end's own queue)"),
    "resources": ("learner, syncer", "a process's resident memory: rss_kb"),
    "auth_refused": ("learner, syncer", "a connection cut for not proving the run secret"),
    "copy": ("learner", "the learner took Θ[p] as its copy (`via`: whole, delta, reanchor): fragment, version, "
                        "digest (copies_consistent)"),
    "held": ("syncer", "a compressed delta sent: the digest of the copy it builds, `gap` and `error` (rms of "
                       "Θ[p] − copy before and after) (copies_consistent)"),
    "guard": ("syncer", "the corrupt guard judged a Δ: rms, c_steps, theta_rms, factor, accepted "
                        "(guard_decisions)"),
    "commit_audit": ("syncer", "a commit's arrays (base64 float32: Θ[p], outer state, every Δ, the result; "
                               "whole, or a 64-coordinate `sample` with the norms) (commits_audited)"),
    "inner_audit": ("learner", "a sampled inner step: θ before it (whole), the Adam and schedule counts, the "
                               "moments at 16 coordinates a leaf, and what the step made there "
                               "(inner_steps_reexecuted)"),
    "inner_gradient": ("harness", "after the run, the task's gradient of each inner_audit step on the batch the "
                                  "harness draws for it: its norm, and the mean gradient and noise estimate at "
                                  "the line's coordinates (inner_steps_reexecuted)"),
}
KINDS = frozenset(EVENT_KINDS)


def _plain(x: Any) -> Any:
    if isinstance(x, (np.floating, np.integer)):
        return x.item()
    if isinstance(x, np.ndarray):
        return x.tolist()
    raise TypeError(f"not JSON-serialisable in an event: {type(x).__name__}")


class EventWriter:
    """`path`: the process's own log file. `stream_fd`: a file descriptor every line is also
    written to, whole, in one write (a unit on another host streams its lines to the harness
    through the engine's log stream: trainer/units/shell.py `stream_events`)."""

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
