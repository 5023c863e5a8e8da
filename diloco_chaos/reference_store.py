"""Fault-free reference runs kept across output folders: the user's cache.

A scenario's reference run (the same config, seed and tier, without its faults) is what
loss parity is judged against. `diloco-chaos run` keeps it in the output folder's
`_reference/`; this module keeps a copy in the user's cache too, so a run of the same
scenario from another folder (a fresh `init` project, a CI job's new `runs/`) reuses it
instead of simulating it again.

A reference is reused only where it would come out the same: its name holds a digest of
the fault-free scenario, the tier, the code that ran it (every module of this package), a
plug-in task's own source and the planted bugs of the environment (DILOCO_CHAOS_BUGS). On
real processes the same inputs give a run of the same code and config on the same
machine, which is what a reference made in the output folder already was.

The cache: `DILOCO_CHAOS_REFERENCE_CACHE` (a folder, or "off"); by default a checkout's
`.cache/reference` (as its compilation cache), else `$XDG_CACHE_HOME` or `~/.cache`,
then `diloco-chaos/reference`.
"""
from __future__ import annotations

import functools
import hashlib
import importlib.util
import json
import os
import shutil
import tempfile
from pathlib import Path

CACHE_ENV = "DILOCO_CHAOS_REFERENCE_CACHE"
BUGS_ENV = "DILOCO_CHAOS_BUGS"
SUBPACKAGES = ("diloco_chaos", "diloco_chaos.trainer", "diloco_chaos.faults", "diloco_chaos.harness",
               "diloco_chaos.reports")


def _sources(folder: Path) -> list[Path]:
    return sorted(p for p in folder.rglob("*.py") if "__pycache__" not in p.parts)


@functools.lru_cache(maxsize=1)
def code_digest() -> str:
    """sha256 over the source of every module a run executes (the CLI, trainer, faults,
    harness, the reports), by path within its subpackage: any edit makes a new reference."""
    h = hashlib.sha256()
    inside = {n.rsplit(".", 1)[1] for n in SUBPACKAGES[1:]}
    for name in SUBPACKAGES:
        folder = Path(importlib.util.find_spec(name).origin).parent  # its own folder, whatever the layout
        for p in _sources(folder):
            rel = p.relative_to(folder)
            if name == "diloco_chaos" and rel.parts[0] in inside:
                continue  # a wheel's layout, the subpackages inside: hashed under their own names
            h.update(f"{name}/{rel.as_posix()}\0".encode())
            h.update(p.read_bytes())
    return h.hexdigest()


def _plugin_digest(task: str | None) -> str:
    """The source of a plug-in task's module (its package's, for a module in one): a user
    who edits their task gets a new reference. "" for the built-in tasks."""
    if not task or ":" not in task:
        return ""
    from diloco_chaos.trainer.numerics.plugins import _import

    try:
        mod = _import(task.split(":")[0])
    except Exception:  # noqa: BLE001  (the run reports a broken plug-in itself)
        return "unimportable"
    path = Path(getattr(mod, "__file__", "") or "")
    if not path.is_file():
        return ""
    files = _sources(path.parent) if path.name == "__init__.py" else [path]
    return hashlib.sha256(b"".join(f.read_bytes() for f in files)).hexdigest()


def reference_key(clean, tier: str) -> str:
    """Ten hex digits naming the reference run of the fault-free scenario `clean` on `tier`."""
    parts = {"scenario": clean.to_dict(), "tier": tier, "code": code_digest(),
             "task": _plugin_digest(getattr(clean.train, "task", None)),
             "bugs": os.environ.get(BUGS_ENV, "")}
    return hashlib.sha256(json.dumps(parts, sort_keys=True, default=str).encode()).hexdigest()[:10]


def cache_dir() -> Path | None:
    """Where references are kept across output folders; None when switched off."""
    where = os.environ.get(CACHE_ENV)
    if where in ("0", "off"):
        return None
    if where:
        return Path(where)
    root = Path(__file__).resolve().parents[1]
    if (root / "pyproject.toml").is_file():
        return root / ".cache" / "reference"
    return Path(os.environ.get("XDG_CACHE_HOME") or Path.home() / ".cache") / "diloco-chaos" / "reference"


def fetch(name: str, ref_dir: Path) -> Path | None:
    """Copies the cached reference `name` into `ref_dir`; the folder it came from, or None."""
    root = cache_dir()
    src = root / name if root is not None else None
    if src is None or not (src / "summary.json").is_file():
        return None
    try:
        shutil.copytree(src, ref_dir, dirs_exist_ok=True)
    except OSError:
        return None
    return src


def keep(name: str, ref_dir: Path) -> None:
    """Copies a finished reference (its summary written) into the cache, whole or not at
    all: into a temporary folder beside it, then renamed; a copy there already wins."""
    root = cache_dir()
    if root is None or not (ref_dir / "summary.json").is_file() or (root / name).exists():
        return
    try:
        root.mkdir(parents=True, exist_ok=True)
        tmp = Path(tempfile.mkdtemp(prefix=f".{name}-", dir=root))
        shutil.copytree(ref_dir, tmp, dirs_exist_ok=True)
        try:
            os.rename(tmp, root / name)
        except OSError:  # another process kept it first
            shutil.rmtree(tmp, ignore_errors=True)
    except OSError:
        pass  # a read-only or full cache: the run has its reference in its own folder
