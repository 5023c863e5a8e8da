"""Asynchronous checkpoints with orbax-checkpoint (0.12): a thin `Checkpointer`.

What a caller gets:
- `save(step, tree)` returns at once; orbax writes in a background thread. The
  tree is copied to host numpy first, so the caller may keep mutating its arrays.
  orbax's own start of a save (directories, metadata, its handlers: 18 ms at the
  median, up to 0.5 s on two busy cores) runs on the caller's thread; with
  `start_in_thread` it runs on one worker thread of the Checkpointer instead, so an
  event loop (a syncer shard's, a learner's) is not held by it. Errors of a save
  then surface at the next `wait()`, `save()` or `close()`.
- `latest_step()` is the newest *finalized* step on disk, read from the directory
  (not orbax's in-memory list, which includes a save still in flight). A step is
  durable exactly when it shows up here: `wait()` then `latest_step()` to
  acknowledge one.
- `restore(step=None)` returns the latest finalized checkpoint as a plain tree
  (dicts, lists, numpy arrays, Python scalars) without any template, or None.
- A manifest per checkpoint (`<step>/manifest.json`: the step, and the shape, dtype and
  sha256 of every leaf of the tree the caller handed to `save`), written last: once orbax
  has finalized the step, its files are fsynced, then the manifest is written to a
  temporary name, fsynced, renamed into place and the folder fsynced. A step is *sealed*
  when its manifest is there; `latest_step()` names the newest sealed step, so "latest"
  never names a checkpoint that is not complete. `restore_verified()` tries the sealed
  steps newest first, loads each and checks every leaf against its manifest, and skips
  (with the reason) one without a manifest, one that does not load (a truncated file) and
  one whose bytes differ (a flipped byte): it never loads a damaged or partial checkpoint.

Atomicity is orbax's: on a local filesystem a step is written into
`<step>.orbax-checkpoint-tmp-<timestamp>/` and renamed to `<step>/` only when
complete (AtomicRenameTemporaryPath). A process SIGKILLed mid-save leaves only the
tmp directory, which `latest_step()` ignores and the next `Checkpointer` on the
directory deletes (`cleanup_tmp_directories=True`). suites/unit/test_checkpoint.py
kills a real process mid-save and lists what is left.

Trees may hold: nested dicts with str keys, lists/tuples (restored as lists),
numpy/JAX arrays (restored as numpy) and Python int/float/bool (restored as is).
Strings and None are rejected at `save` (orbax cannot store strings); an optax
state, made of NamedTuples, goes through `trainer.inner.opt_state_to_tree` first.
"""
from __future__ import annotations

import hashlib
import json
import os
from concurrent.futures import Future, ThreadPoolExecutor
from pathlib import Path
from typing import Any

import jax
import numpy as np
import orbax.checkpoint as ocp


def why_failed(e: Exception) -> str:
    """A failed save's error in one bounded line (orbax's carry the path and the errno), for
    a unit's `checkpoint_failed` line."""
    text = str(e).strip().splitlines()[0] if str(e).strip() else ""
    return f"{type(e).__name__}: {text}"[:300]


def to_host_tree(tree: Any, path: str = "") -> Any:
    """A deep numpy copy of `tree`; raises ValueError naming the first leaf orbax
    could not store."""
    if isinstance(tree, dict):
        for key in tree:
            if not isinstance(key, str):
                raise ValueError(f"checkpoint tree key {path}{key!r} must be a str")
        return {k: to_host_tree(v, f"{path}{k}/") for k, v in tree.items()}
    if isinstance(tree, (list, tuple)):
        return [to_host_tree(v, f"{path}{i}/") for i, v in enumerate(tree)]
    if isinstance(tree, (bool, int, float)):
        return tree
    if isinstance(tree, (np.ndarray, np.generic, jax.Array)):
        return np.array(tree, copy=True)
    raise ValueError(f"checkpoint tree leaf {path.rstrip('/') or '<root>'} has type "
                     f"{type(tree).__name__}; valid: dict, list, tuple, numpy/JAX array, "
                     f"int, float, bool")


def _to_numpy(tree: Any) -> Any:
    if isinstance(tree, dict):
        return {k: _to_numpy(v) for k, v in tree.items()}
    if isinstance(tree, (list, tuple)):
        return [_to_numpy(v) for v in tree]
    if isinstance(tree, jax.Array):
        return np.asarray(tree)
    return tree


MANIFEST = "manifest.json"  # in each step's folder, written last (the module's docstring)


def _leaves(tree: Any, path: str = ""):
    """(path, leaf) of a checkpoint tree, depth first, in key order."""
    if isinstance(tree, dict):
        for k in sorted(tree):
            yield from _leaves(tree[k], f"{path}{k}/")
    elif isinstance(tree, (list, tuple)):
        for i, v in enumerate(tree):
            yield from _leaves(v, f"{path}{i}/")
    else:
        yield path.rstrip("/"), tree


def manifest_of(step: int, tree: Any) -> dict:
    """What a checkpoint must hold: per leaf its dtype, shape and the sha256 of its bytes
    (a Python scalar as the numpy value it is restored as)."""
    leaves = {}
    for path, leaf in _leaves(tree):
        a = np.ascontiguousarray(np.asarray(leaf))
        leaves[path] = {"dtype": a.dtype.str, "shape": list(a.shape),
                        "sha256": hashlib.sha256(a.tobytes()).hexdigest()}
    return {"step": step, "leaves": leaves}


def manifest_differs(manifest: dict, tree: Any) -> str | None:
    """None if `tree` is what `manifest` says; else the first difference, in words."""
    got = manifest_of(manifest.get("step", -1), tree)["leaves"]
    want = manifest.get("leaves") or {}
    if set(got) != set(want):
        missing, extra = sorted(set(want) - set(got)), sorted(set(got) - set(want))
        return f"leaves differ: missing {missing[:3]}, unexpected {extra[:3]}"
    for path in sorted(want):
        for key in ("dtype", "shape", "sha256"):
            if got[path][key] != want[path][key]:
                return f"{path}: {key} {got[path][key]} != {want[path][key]} in its manifest"
    return None


def _fsync(path: Path) -> None:
    fd = os.open(path, os.O_RDONLY)
    try:
        os.fsync(fd)
    finally:
        os.close(fd)


class FirstPerInterval:
    """An orbax preservation policy: keeps the first checkpoint saved in each interval of
    wall-clock time, the intervals counted from the epoch (not from this directory's
    first save, as orbax's EveryNSeconds does), so that separate checkpointers, e.g. the
    syncer shards, keep snapshots at the same moments."""

    def __init__(self, interval_s: int):
        self.interval_s = interval_s

    def should_preserve(self, checkpoints, *, context) -> list[bool]:
        seen, keep = set(), []
        for info in checkpoints:  # oldest first
            bucket = int(info.time.timestamp() // self.interval_s)
            keep.append(bucket not in seen)
            seen.add(bucket)
        return keep


class Checkpointer:
    """Numbered, asynchronous checkpoints of one tree in `directory`."""

    def __init__(self, directory: str | Path, max_to_keep: int = 3, keep_every_s: int | None = None,
                 start_in_thread: bool = False):
        """Keeps the latest `max_to_keep` steps, and with `keep_every_s` also the first step
        saved in each `keep_every_s` of wall-clock time (`FirstPerInterval`): a history to
        look back at, e.g. the global model along a run. `start_in_thread`: orbax's start
        of each save runs on a worker thread (the module's docstring)."""
        if max_to_keep < 1:
            raise ValueError(f"max_to_keep = {max_to_keep} must be >= 1")
        if keep_every_s is not None and (not isinstance(keep_every_s, int) or keep_every_s < 1):
            raise ValueError(f"keep_every_s = {keep_every_s!r} must be a whole number of seconds >= 1, or None")
        self.directory = Path(directory).absolute()
        keep = [ocp.checkpoint_managers.LatestN(n=max_to_keep)]
        if keep_every_s is not None:
            keep.append(FirstPerInterval(keep_every_s))
        self._options = ocp.CheckpointManagerOptions(
            preservation_policy=ocp.checkpoint_managers.AnyPreservationPolicy(keep),
            enable_async_checkpointing=True, cleanup_tmp_directories=True, create=True)
        self._mngr = ocp.CheckpointManager(self.directory, options=self._options)
        self._pending: dict[int, dict] = {}  # saved steps whose manifest is not written yet
        finalized = self.steps()
        self._last_saved: int | None = finalized[-1] if finalized else None
        self._starter = ThreadPoolExecutor(1, thread_name_prefix="ckpt-start") if start_in_thread else None
        self._starting: Future | None = None  # the worker's start of the newest save

    def save(self, step: int, tree: dict) -> None:
        """Start saving `tree` as `step` and return; steps must increase. If the
        previous save is still running, this first waits for it (orbax's rule)."""
        if not isinstance(step, int) or step < 0:
            raise ValueError(f"checkpoint step {step!r} must be an int >= 0")
        if self._last_saved is not None and step <= self._last_saved:
            raise ValueError(f"checkpoint step {step} <= last saved step "
                             f"{self._last_saved} in {self.directory}; steps must increase")
        if not isinstance(tree, dict):
            raise ValueError(f"checkpoint tree must be a dict, got {type(tree).__name__}")
        host_tree = to_host_tree(tree)
        self._seal()
        self._pending[step] = manifest_of(step, host_tree)
        if self._starter is None:
            self._mngr.save(step, args=ocp.args.StandardSave(host_tree), force=True)
        else:
            self._started()  # the previous start's error, if any, before a new one
            self._starting = self._starter.submit(self._mngr.save, step,
                                                  args=ocp.args.StandardSave(host_tree), force=True)
        self._last_saved = step

    def _started(self) -> None:
        """Wait for the worker's start of the newest save (if any); raises its error."""
        if self._starting is not None:
            starting, self._starting = self._starting, None
            starting.result()

    @property
    def last_saved(self) -> int | None:
        """The newest step saved, its write finished or still in flight (`latest_step` is the
        newest finalized one, which lags an async save): the step the next save must exceed."""
        return self._last_saved

    def wait(self) -> None:
        """Block until the save in flight (if any) is finalized on disk."""
        self._started()
        self._mngr.wait_until_finished()
        self._mngr.check_for_errors()
        self._seal(strict=True)

    def _seal(self, strict: bool = False) -> None:
        """Writes the manifest of every saved step orbax has finalized since (the module's
        docstring): its files fsynced first, the manifest last, atomically. A manifest the
        storage refuses (a full disk) leaves its step unsealed, so never durable: `strict`
        (from `wait`, where the caller learns whether its save landed) raises that error,
        as a failed save; elsewhere the step simply stays unsealed."""
        for step in sorted(self._pending):
            folder = self.directory / str(step)
            if not folder.is_dir():
                continue  # still being written (or failed: `recover` forgets it)
            manifest = self._pending.pop(step)
            tmp = folder / (MANIFEST + ".tmp")
            try:
                for root, _dirs, files in os.walk(folder):
                    for name in files:
                        _fsync(Path(root) / name)
                with open(tmp, "w") as f:
                    json.dump(manifest, f)
                    f.flush()
                    os.fsync(f.fileno())
                os.replace(tmp, folder / MANIFEST)
                _fsync(folder)
            except FileNotFoundError:
                continue  # deleted meanwhile by the preservation policy: nothing to seal
            except OSError:
                tmp.unlink(missing_ok=True)
                if strict:
                    raise

    def recover(self) -> None:
        """After a failed save (a full disk, an I/O error: `wait` raised it): orbax's manager
        keeps that error and raises it again at every later save, and its half-written step
        stays on disk. A new manager on the same folder deletes the half-written step (its
        `cleanup_tmp_directories`) and saves again; the finalized steps are untouched. The
        next save's step must still exceed the failed one's (orbax refuses a step it saw)."""
        self._starting = None
        self._pending = {s: m for s, m in self._pending.items() if (self.directory / str(s)).is_dir()}
        self._seal()  # an earlier save that did land keeps its manifest
        self._pending.clear()
        try:
            self._mngr.close()
        except Exception:  # noqa: BLE001 - the failed save's error, raised once more on the way out
            pass
        self._mngr = ocp.CheckpointManager(self.directory, options=self._options)

    def saving(self) -> bool:
        if self._starting is not None and not self._starting.done():
            return True
        return self._mngr.is_saving_in_progress()

    def steps(self) -> list[int]:
        """Finalized steps on disk, ascending."""
        return sorted(ocp.utils.checkpoint_steps(self.directory))

    def sealed_steps(self) -> list[int]:
        """Finalized steps whose manifest was written (complete), ascending."""
        self._seal()
        return [s for s in self.steps() if (self.directory / str(s) / MANIFEST).is_file()]

    def latest_step(self) -> int | None:
        """The newest sealed step: finalized, its manifest written."""
        steps = self.sealed_steps()
        return steps[-1] if steps else None

    def restore_checked(self, step: int, listed: list[int] | None = None) -> dict:
        """The tree saved at `step`, checked against its manifest; raises ValueError saying why
        when it has none or its bytes differ (a reader of another unit's checkpoints, e.g. the
        harness's global evals, must not take a damaged one for Θ)."""
        try:
            manifest = json.loads((self.directory / str(step) / MANIFEST).read_text())
        except FileNotFoundError:
            raise ValueError(f"checkpoint {step} in {self.directory} has no manifest") from None
        tree = self.restore(step, listed=listed)
        if (why := manifest_differs(manifest, tree)) is not None:
            raise ValueError(f"checkpoint {step} in {self.directory} is not what was saved: {why}")
        return tree

    def restore_verified(self, like: dict | None = None, verify: bool = True) -> tuple[int | None, dict | None, list[dict]]:
        """(step, tree, skipped): the newest finalized step that loads and matches its
        manifest, newest first; `skipped` lists the newer ones passed over, each
        {"step", "why"} (no manifest, did not load, a leaf differs). (None, None, skipped)
        when none is intact. `verify=False` (the planted bug `restore_unverified`): the newest
        finalized step, loaded as it is."""
        skipped = []
        finalized = self.steps()
        self._seal()
        for step in reversed(finalized):
            if not verify:
                return step, self.restore(step, listed=finalized, like=like), skipped
            path = self.directory / str(step) / MANIFEST
            try:
                manifest = json.loads(path.read_text())
            except FileNotFoundError:
                skipped.append({"step": step, "why": "no manifest (a save cut short, or its manifest lost)"})
                continue
            except (OSError, ValueError) as e:
                skipped.append({"step": step, "why": f"manifest unreadable: {why_failed(e)}"})
                continue
            try:
                tree = self.restore(step, listed=finalized, like=like)
            except Exception as e:  # noqa: BLE001 - orbax/tensorstore's words for a damaged file
                skipped.append({"step": step, "why": f"did not load: {why_failed(e)}"})
                continue
            if (why := manifest_differs(manifest, tree)) is not None:
                skipped.append({"step": step, "why": f"not what was saved: {why}"})
                continue
            return step, tree, skipped
        return None, None, skipped

    def restore(self, step: int | None = None, listed: list[int] | None = None, like: dict | None = None) -> dict | None:
        """The tree saved at `step` (default: the latest finalized one), or None if
        there is none. Never a partially written checkpoint. `listed`: the caller's own
        `steps()` to check `step` against (restoring every kept step, one listing of the
        folder instead of one per restore: 36 ms each). `like`: a tree of the saved one's
        structure, shapes and dtypes (its values unused): orbax then builds the restore from
        it instead of reading the checkpoint's metadata (a restart's restore: 57 → 20 ms)."""
        if step is None:
            step = self.latest_step()
            if step is None:
                return None
        elif step not in (finalized := self.steps() if listed is None else listed):
            raise ValueError(f"no finalized checkpoint for step {step} in "
                             f"{self.directory}; finalized steps: {finalized}")
        template = None if like is None else jax.tree.map(np.asarray, to_host_tree(like))
        restored = self._mngr.restore(step, args=ocp.args.StandardRestore(template))
        return _to_numpy(restored)

    def close(self) -> None:
        """Finish any save in flight and release orbax's threads."""
        try:
            self._started()
            self._mngr.wait_until_finished()
            self._mngr.check_for_errors()
            self._seal()
        finally:
            self._mngr.close()
            if self._starter is not None:
                self._starter.shutdown(wait=True)

    def __enter__(self) -> "Checkpointer":
        return self

    def __exit__(self, *exc: Any) -> None:
        self.close()
