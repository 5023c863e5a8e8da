"""Small disks: each named unit's checkpoint folder on a filesystem of its own (a tmpfs the
harness mounts; root only), so that a `disk_full` fault fills it for real: the kernel
answers the unit's writes with ENOSPC, inside orbax's background write too, and nothing in
the unit is told or changed. `fill` takes the free space with one file and keeps
taking what the unit frees, `free` deletes it. At the end the folder's contents are copied out, the filesystem
unmounted and the contents put back, so the run's checkpoints stay for the harness's global
eval and the report (and nothing stays mounted, after a failure or Ctrl-C too)."""
from __future__ import annotations

import errno
import os
import shutil
import subprocess
import threading
from pathlib import Path

from diloco_chaos.harness.errors import UserError

FILLER = ".disk-full"  # the file that takes a full disk's free space
SIZE = "64m"           # room for a shard's kept checkpoints of the built-in tasks, many times over
TOP_UP_S = 0.05        # how often a full disk's filler takes back space the unit freed


class SmallDiskError(UserError):
    """A small disk could not be made (not root, no tmpfs): what, where, what would do."""


class SmallDisks:
    def __init__(self, run_dir: Path, units: tuple[str, ...], size: str = SIZE, where: dict | None = None):
        self.run_dir, self.units, self.size = Path(run_dir), tuple(units), size
        self.where = dict(where or {})  # unit -> another folder for its disk (under a FUSE layer)
        self.mounted: list[str] = []
        self.full: dict[str, threading.Event] = {}  # unit -> the switch of its top-up thread

    def folder(self, unit: str) -> Path:
        return self.where.get(unit) or self.run_dir / "ckpt" / unit

    def mount(self) -> None:
        for unit in self.units:
            path = self.folder(unit)
            path.mkdir(parents=True, exist_ok=True)
            if os.geteuid() != 0:
                raise SmallDiskError(f"disk_full on {unit}: its checkpoint folder must be a filesystem of its own "
                                     f"(a tmpfs mounted on {path}), and mounting needs root; run as root, or "
                                     f"leave disk_full out of the scenario")
            r = subprocess.run(["mount", "-t", "tmpfs", "-o", f"size={self.size},mode=0755", "tmpfs", str(path)],
                               capture_output=True, text=True)
            if r.returncode != 0:
                raise SmallDiskError(f"disk_full on {unit}: `mount -t tmpfs` on {path} failed: "
                                     f"{(r.stderr or r.stdout).strip()}")
            self.mounted.append(unit)

    def fill(self, unit: str) -> None:
        """The disk full to its last byte, and kept full until `free`: the filler file grows
        over whatever space there is, now and every TOP_UP_S (the unit deleting an old
        checkpoint frees space, which the filler takes back). A one-shot preallocation of the
        free space measured a moment before failed whole when a save landed in between: a
        CI run's disk was never full."""
        path = self.folder(unit)
        if unit not in self.mounted:
            raise SmallDiskError(f"disk_full on {unit}: its checkpoint folder {path} is not a small disk of its own "
                                 f"(the runner mounts one for each disk_full target)")
        self._top_up(path)
        stop, before = threading.Event(), self.full.get(unit)
        if before is not None:  # filled again while full: one thread keeps it so
            before.set()
        self.full[unit] = stop
        threading.Thread(target=self._keep_full, args=(path, stop), name=f"disk-full-{unit}", daemon=True).start()

    @staticmethod
    def _top_up(path: Path) -> None:
        """Appends to the filler until the kernel says ENOSPC, in smaller and smaller writes."""
        fd = os.open(path / FILLER, os.O_WRONLY | os.O_CREAT | os.O_APPEND, 0o600)
        try:
            for size in (1 << 20, 1 << 12, 1):
                block = bytes(size)
                while True:
                    try:
                        if os.write(fd, block) < size:
                            break
                    except OSError as e:
                        if e.errno != errno.ENOSPC:
                            raise
                        break
        finally:
            os.close(fd)

    def _keep_full(self, path: Path, stop: threading.Event) -> None:
        while not stop.wait(TOP_UP_S):
            try:
                self._top_up(path)
            except OSError:  # unmounted under it at the end
                return

    def free(self, unit: str) -> None:
        stop = self.full.pop(unit, None)
        if stop is not None:
            stop.set()
        (self.folder(unit) / FILLER).unlink(missing_ok=True)

    def unmount(self) -> None:
        """Every mounted disk's checkpoints copied out, unmounted, put back; safe to call twice."""
        for unit in list(self.mounted):
            path = self.folder(unit)
            keep = path.with_name(f".{unit}-kept")
            try:
                self.free(unit)
                shutil.copytree(path, keep, dirs_exist_ok=True)
            finally:
                subprocess.run(["umount", "-l", str(path)], capture_output=True)
                self.mounted.remove(unit)
            shutil.copytree(keep, path, dirs_exist_ok=True)
            shutil.rmtree(keep, ignore_errors=True)
