"""Fuse disks: a unit's checkpoint folder (and, for a host crash, the shards' journal folder)
seen through the harness's own FUSE layer, `ckptfs` (harness/backends/ckptfs/main.go,
built with Go by `diloco-chaos setup` or at first use), so that the storage faults are
done to the unit's real writes and nothing in the unit is told or changed:

- `disk_slow`: `latency(unit, ms)` makes every write and fsync on its folder that much late;
- `lost_writes`: `crash(unit)`, once the unit is dead, drops every write no fsync made
  durable, as Jepsen's LazyFS does: a file never fsynced is deleted, one written past its
  last fsync cut back to it; in its checkpoint folder and in its journal file.

Each layer is a `ckptfs` process of the harness's, serving a backing folder (`<run>/.disks/`)
on the unit's folder; its control is a Unix socket. At the end each is stopped by its pid
(SIGTERM: it unmounts) and the backing folder's contents are put back where the unit wrote
them, so the run's checkpoints stay for the global evals and the report. Root only (mount(2)
of /dev/fuse without fusermount)."""
from __future__ import annotations

import os
import shutil
import signal
import socket
import subprocess
import tempfile
import threading
from importlib import resources
from pathlib import Path

from diloco_chaos.harness.errors import UserError

SOURCE = Path(resources.files(__package__)) / "ckptfs"  # main.go, go.mod, go.sum
READY_S = 60.0  # a mount's "ready" line, at most (Go's start is fast; a loaded machine is not)
JOURNAL = "journal"  # the layer over <run>/journal, where every shard's journal lives


class FuseDiskError(UserError):
    """A FUSE layer could not be made (not root, no /dev/fuse, no Go): what, where, what would do."""


def binary(folder: Path | None = None, log=print) -> Path:
    """A built ckptfs in `folder` (default: the checkout's .tools/, else the user's tools
    folder), built there once."""
    from diloco_chaos.harness.backends.toxiproxy_server import LOCAL_BINARY, user_tools

    folder = folder or (LOCAL_BINARY.parent if LOCAL_BINARY.parent.is_dir() else user_tools())
    target = folder / "ckptfs"
    if os.access(target, os.X_OK):
        return target
    go = shutil.which("go")
    if go is None:
        raise FuseDiskError(f"disk_slow / lost_writes need the harness's FUSE layer, built from {SOURCE} with "
                            f"Go >= 1.23 (not installed): install Go, run `diloco-chaos setup`, or leave these "
                            f"faults out of the scenario")
    folder.mkdir(parents=True, exist_ok=True)
    log(f"building the FUSE layer ckptfs with Go into {folder} (once)")
    with tempfile.TemporaryDirectory() as build:  # the package folder may be read-only
        shutil.copytree(SOURCE, build, dirs_exist_ok=True)
        done = subprocess.run([go, "build", "-o", str(target), "."], cwd=build, capture_output=True, text=True,
                              env={**os.environ, "GOFLAGS": "-mod=mod"}, timeout=900)
    if done.returncode != 0:
        raise FuseDiskError(f"`go build` of {SOURCE} failed (exit {done.returncode}): {done.stderr.strip()[-600:]}")
    return target


class Layer:
    """One ckptfs process: `backing` served on `mount`, controlled on `sock`."""

    def __init__(self, exe: Path, backing: Path, mount: Path, sock: Path, log_path: Path):
        self.backing, self.mount, self.sock = backing, mount, sock
        self.log = open(log_path, "ab")
        self.proc = subprocess.Popen([str(exe), "--backing", str(backing), "--mount", str(mount),
                                      "--control", str(sock)], stdout=subprocess.PIPE, stderr=self.log)
        ready = threading.Event()
        first = []

        def read():
            first.append(self.proc.stdout.readline())
            ready.set()

        threading.Thread(target=read, daemon=True).start()
        if not ready.wait(READY_S) or not first or first[0].strip() != b"ready":
            self.stop()
            raise FuseDiskError(f"ckptfs did not mount {backing} on {mount} within {READY_S:.0f} s "
                                f"(see {log_path}): root and /dev/fuse are needed")

    def ask(self, line: str) -> str:
        with socket.socket(socket.AF_UNIX, socket.SOCK_STREAM) as s:
            s.settimeout(30)
            s.connect(str(self.sock))
            s.sendall(line.encode() + b"\n")
            out = b""
            while not out.endswith(b"\n"):
                chunk = s.recv(4096)
                if not chunk:
                    break
                out += chunk
        answer = out.decode().strip()
        if not answer.startswith("ok"):
            raise FuseDiskError(f"ckptfs on {self.mount} answered {answer!r} to {line!r}")
        return answer

    def stop(self) -> None:
        if self.proc.poll() is None:
            self.proc.send_signal(signal.SIGTERM)
            try:
                self.proc.wait(20)
            except subprocess.TimeoutExpired:
                self.proc.kill()
                self.proc.wait()
        subprocess.run(["umount", "-l", str(self.mount)], capture_output=True)  # if it died mounted
        self.log.close()


def _lines(path: Path) -> int:
    """Complete lines in a file (0 if there is none): read by the harness, not the unit."""
    try:
        return path.read_bytes().count(b"\n")
    except FileNotFoundError:
        return 0


def _counts(answer: str) -> tuple[int, int]:
    """`ok lost N truncated M` -> (N, M)."""
    words = answer.split()
    return int(words[words.index("lost") + 1]), int(words[words.index("truncated") + 1])


class FuseDisks:
    """The layers of a run: one per named unit's checkpoint folder, and one over the journal
    folder when `journal` (a lost_writes run)."""

    def __init__(self, run_dir: Path, units: tuple[str, ...], journal: bool = False):
        self.run_dir, self.units, self.journal = Path(run_dir), tuple(units), journal and bool(units)
        self.layers: dict[str, Layer] = {}
        self._sockets: str | None = None

    def backing(self, name: str) -> Path:
        return self.run_dir / ".disks" / name

    def folder(self, name: str) -> Path:
        return self.run_dir / (JOURNAL if name == JOURNAL else f"ckpt/{name}")

    def mount(self) -> None:
        names = list(self.units) + ([JOURNAL] if self.journal else [])
        if not names:
            return
        if os.geteuid() != 0 or not os.path.exists("/dev/fuse"):
            raise FuseDiskError(f"disk_slow / lost_writes on {', '.join(self.units)}: the checkpoint folder is "
                                f"a FUSE layer of the harness's, and mounting it needs root and /dev/fuse; run as "
                                f"root, or leave these faults out of the scenario")
        exe = binary()
        self._sockets = tempfile.mkdtemp(prefix="ckptfs-")  # short: a socket path is at most 107 bytes
        (self.run_dir / "stdout").mkdir(parents=True, exist_ok=True)
        for name in names:
            for d in (self.backing(name), self.folder(name)):
                d.mkdir(parents=True, exist_ok=True)
            self.layers[name] = Layer(exe, self.backing(name), self.folder(name), Path(self._sockets) / f"{name}.sock",
                                      self.run_dir / "stdout" / f"ckptfs-{name}.log")

    def latency(self, unit: str, ms: float) -> None:
        self._layer(unit).ask(f"latency {int(round(ms))}")

    def crash(self, unit: str) -> dict:
        """Drops the dead unit's un-fsynced writes: {"lost", "truncated"} files in its
        checkpoint folder, and "journal_lost" / "journal_truncated" of its journal file."""
        lost, truncated = _counts(self._layer(unit).ask("crash"))
        out = {"lost": lost, "truncated": truncated}
        if JOURNAL in self.layers:
            journal = self.backing(JOURNAL) / f"{unit}.jsonl"
            before = _lines(journal)
            jl, jt = _counts(self.layers[JOURNAL].ask(f"crash {unit}.jsonl"))
            out.update(journal_lost=jl, journal_truncated=jt, journal_lines_lost=before - _lines(journal))
        return out

    def _layer(self, unit: str) -> Layer:
        if unit not in self.layers:
            raise FuseDiskError(f"disk_slow / lost_writes on {unit}: its checkpoint folder is not a FUSE layer of "
                                f"the harness's (the runner makes one for each such target)")
        return self.layers[unit]

    def unmount(self) -> None:
        """Every layer stopped (it unmounts), its backing folder's contents put back where the
        unit wrote them; safe to call twice."""
        for name in list(self.layers):
            layer = self.layers.pop(name)
            layer.stop()
            shutil.copytree(layer.backing, layer.mount, dirs_exist_ok=True, symlinks=True)
            shutil.rmtree(layer.backing, ignore_errors=True)
        if self._sockets is not None:
            shutil.rmtree(self._sockets, ignore_errors=True)
            self._sockets = None
