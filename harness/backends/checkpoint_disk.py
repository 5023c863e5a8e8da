"""What the harness sees and does in a unit's checkpoint folder on this host (processes, and
containers whose folder is bound from the run directory): the harness's own evidence for
the storage oracles (harness/judging/storage.py), read without the unit's code.

- `listing(folder)`: the steps orbax finalized (a folder named by its step number; a save
  cut short is still `<step>.orbax-checkpoint-tmp-*`) and those *sealed* (their
  `manifest.json`, which trainer/numerics/checkpoint.py writes last, is there).
- `damage(folder, how)`: the `corrupt_checkpoint` fault's act, at rest, while its unit is
  down, on the newest step on disk (the one a restart looks at first; finalized, sealed or
  not: a kill often lands between orbax's finalize and the manifest): `flip` inverts one
  byte in the middle of its largest data file (a flipped bit in a tensor: orbax loads it
  without complaint), `truncate` cuts that file to half (a torn write: the load fails);
  `manifest` removes the newest sealed step's manifest (a lost metadata write). Returns
  what it did: {"step", "damage", "file", **listing}; step None when there was nothing to
  damage.
"""
from __future__ import annotations

import os
from pathlib import Path

MANIFEST = "manifest.json"  # trainer/numerics/checkpoint.py's name: the file format is the contract
DAMAGES = ("flip", "truncate", "manifest")


def listing(folder: Path) -> dict:
    """{"finalized": [...], "sealed": [...]}, or {} where the folder is not on this host (a unit
    on another host's engine): no evidence, not an empty folder."""
    folder = Path(folder)
    if not folder.is_dir():
        return {}
    finalized = sorted(int(p.name) for p in folder.iterdir() if p.is_dir() and p.name.isdigit())
    sealed = [s for s in finalized if (folder / str(s) / MANIFEST).is_file()]
    return {"finalized": finalized, "sealed": sealed}


def _largest_file(step_dir: Path) -> Path:
    files = [p for p in (step_dir / "default").rglob("*") if p.is_file()]
    if not files:
        raise FileNotFoundError(f"{step_dir}/default holds no file to damage")
    return max(files, key=lambda p: (p.stat().st_size, str(p)))


def damage(folder: Path, how: str) -> dict:
    if how not in DAMAGES:
        raise ValueError(f"damage {how!r}; valid: {', '.join(DAMAGES)}")
    folder = Path(folder)
    before = listing(folder)
    candidates = before.get("sealed" if how == "manifest" else "finalized")
    if not candidates:
        return {"step": None, "damage": how, "file": None, **before}
    step = candidates[-1]
    step_dir = folder / str(step)
    if how == "manifest":
        target = step_dir / MANIFEST
        target.unlink()
    else:
        target = _largest_file(step_dir)
        size = target.stat().st_size
        if how == "flip":
            with open(target, "r+b") as f:
                f.seek(size // 2)
                byte = f.read(1)
                f.seek(size // 2)
                f.write(bytes([byte[0] ^ 0xFF]))
                f.flush()
                os.fsync(f.fileno())
        else:
            os.truncate(target, size // 2)
    return {"step": step, "damage": how, "file": str(target.relative_to(folder)), **before}
