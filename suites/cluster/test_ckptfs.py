"""harness/backends/ckptfs, the harness's FUSE passthrough filesystem that can be made slow
and can "crash" (lose every write no fsync made durable, as Jepsen's LazyFS does; the
disk_slow and lost_writes faults, harness/backends/fuse_disks.py): built as the harness
builds it (once, into the tools folder), mounted on a fresh folder per test (root and /dev/fuse needed; it mounts
with mount(2) itself, no fusermount), driven over its control socket, and checked both
through the mount and in the backing folder. Every test unmounts in a `finally`."""
from __future__ import annotations

import os
import shutil
import signal
import socket
import subprocess
import threading
import time
from pathlib import Path

import pytest

pytestmark = [pytest.mark.cluster]


if os.geteuid() != 0:
    pytestmark.append(pytest.mark.skip(reason="ckptfs mounts a FUSE filesystem with mount(2): needs root"))
elif not os.path.exists("/dev/fuse"):
    pytestmark.append(pytest.mark.skip(reason="/dev/fuse is missing"))
elif shutil.which("go") is None:
    pytestmark.append(pytest.mark.skip(reason="`go` is not installed: ckptfs cannot be built"))


@pytest.fixture(scope="module")
def ckptfs_bin() -> Path:
    from diloco_chaos.harness.backends.fuse_disks import binary

    return binary()


def _mounted(path: Path) -> bool:
    with open("/proc/mounts") as f:
        return any(line.split()[1] == str(path) for line in f)


class Ckptfs:
    """One running ckptfs: `root` is the mount point, `backing` the folder behind it."""

    def __init__(self, binary: Path, tmp: Path, files: dict[str, bytes] | None = None):
        self.backing, self.root, self.sock = tmp / "backing", tmp / "mnt", tmp / "ctl.sock"
        self.backing.mkdir()
        self.root.mkdir()
        for name, data in (files or {}).items():  # there before the mount
            (self.backing / name).write_bytes(data)
        self.proc = subprocess.Popen([str(binary), "--backing", str(self.backing), "--mount", str(self.root),
                                      "--control", str(self.sock)],
                                     stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
        first: list[str] = []
        reader = threading.Thread(target=lambda: first.append(self.proc.stdout.readline()), daemon=True)
        reader.start()
        reader.join(timeout=60)
        if first != ["ready\n"]:
            self.stop()
            raise AssertionError(f"ckptfs did not say ready: {first!r}, stderr: {self.proc.stderr.read()!r}")

    def ctl(self, command: str) -> str:
        with socket.socket(socket.AF_UNIX) as s:
            s.settimeout(30)
            s.connect(str(self.sock))
            s.sendall(command.encode() + b"\n")
            return s.makefile().readline().strip()

    def stop(self) -> int | None:
        """SIGTERM and wait; SIGKILL and a lazy unmount if that fails. Returns the exit code."""
        if self.proc.poll() is None:
            self.proc.send_signal(signal.SIGTERM)
            try:
                self.proc.wait(timeout=30)
            except subprocess.TimeoutExpired:
                self.proc.kill()
                self.proc.wait(timeout=30)
        if _mounted(self.root):
            subprocess.run(["umount", "-l", str(self.root)], capture_output=True, timeout=30)
        return self.proc.returncode


@pytest.fixture
def fs(ckptfs_bin, tmp_path):
    c = Ckptfs(ckptfs_bin, tmp_path)
    try:
        yield c
    finally:
        c.stop()
        assert not _mounted(c.root)


def write(path: Path, data: bytes, *, sync: bool, mode: str = "wb") -> None:
    with open(path, mode) as f:
        f.write(data)
        f.flush()
        if sync:
            os.fsync(f.fileno())


def test_crash_loses_what_no_fsync_made_durable(fs):
    write(fs.root / "synced", b"hello", sync=True)
    write(fs.root / "unsynced", b"lost", sync=False)
    write(fs.root / "journal", b"12345", sync=True)
    write(fs.root / "journal", b"678", sync=False, mode="ab")
    with open(fs.root / "other-handle", "wb") as w, open(fs.root / "other-handle", "rb") as r:
        w.write(b"kept")
        w.flush()
        os.fsync(r.fileno())  # an fsync through any handle of the path
    assert (fs.root / "journal").read_bytes() == b"12345678"
    assert fs.ctl("status") == "ok latency_ms=0 dirty=2"

    assert fs.ctl("crash") == "ok lost 1 truncated 1"

    for folder in (fs.root, fs.backing):
        assert sorted(p.name for p in folder.iterdir()) == ["journal", "other-handle", "synced"]
        assert (folder / "synced").read_bytes() == b"hello"
        assert (folder / "journal").read_bytes() == b"12345"
        assert (folder / "other-handle").read_bytes() == b"kept"
    assert fs.ctl("status") == "ok latency_ms=0 dirty=0"


def test_files_there_before_the_mount_count_as_durable(ckptfs_bin, tmp_path):
    """Reading a file keeps it; an append to a file that was there before the mount is
    undone back to its size at the mount; a file never touched is kept."""
    c = Ckptfs(ckptfs_bin, tmp_path, files={"old": b"old", "grown": b"abc", "untouched": b"u"})
    try:
        assert (c.root / "old").read_bytes() == b"old"
        write(c.root / "grown", b"def", sync=False, mode="ab")
        assert c.ctl("crash") == "ok lost 0 truncated 1"
        assert {p.name: p.read_bytes() for p in c.backing.iterdir()} == {
            "old": b"old", "grown": b"abc", "untouched": b"u"}
        assert (c.root / "grown").read_bytes() == b"abc"
    finally:
        assert c.stop() == 0


def test_crash_prefix_touches_only_that_folder(fs):
    (fs.root / "ckpt").mkdir()
    (fs.root / "other").mkdir()
    write(fs.root / "ckpt" / "a", b"a", sync=False)
    write(fs.root / "other" / "b", b"b", sync=False)
    write(fs.root / "top", b"t", sync=False)

    assert fs.ctl("crash ckpt/") == "ok lost 1 truncated 0"

    assert sorted(p.name for p in (fs.backing / "ckpt").iterdir()) == []  # folders are kept
    assert (fs.backing / "other" / "b").read_bytes() == b"b"
    assert (fs.backing / "top").read_bytes() == b"t"
    assert fs.ctl("status") == "ok latency_ms=0 dirty=2"
    assert fs.ctl("crash") == "ok lost 2 truncated 0"


def test_rename_carries_the_dirty_state(fs):
    """orbax writes into a temporary folder and renames it: the files inside are as
    un-durable under the new name."""
    (fs.root / "step_1.tmp").mkdir()
    write(fs.root / "step_1.tmp" / "data", b"weights", sync=False)
    write(fs.root / "step_1.tmp" / "durable", b"meta", sync=True)
    (fs.root / "step_1.tmp").rename(fs.root / "step_1")
    write(fs.root / "scratch", b"s", sync=False)
    (fs.root / "scratch").rename(fs.root / "renamed")

    assert fs.ctl("crash") == "ok lost 2 truncated 0"

    assert sorted(p.name for p in fs.backing.iterdir()) == ["step_1"]
    assert sorted(p.name for p in (fs.backing / "step_1").iterdir()) == ["durable"]
    assert not (fs.root / "renamed").exists()
    assert not (fs.root / "step_1" / "data").exists()


def test_latency_slows_write_and_fsync(fs):
    assert fs.ctl("latency 200") == "ok"
    assert fs.ctl("status") == "ok latency_ms=200 dirty=0"
    t = time.monotonic()
    fd = os.open(fs.root / "slow", os.O_WRONLY | os.O_CREAT)
    try:
        os.write(fd, b"x")  # one write: 200 ms
        os.fsync(fd)        # one fsync: 200 ms
    finally:
        os.close(fd)
    assert time.monotonic() - t >= 0.4
    assert fs.ctl("latency 0") == "ok"
    write(fs.root / "fast", b"y", sync=True)  # still works; no upper bound on the time
    assert fs.ctl("status") == "ok latency_ms=0 dirty=0"
    assert fs.ctl("latency soon").startswith("error ")
    assert fs.ctl("bogus").startswith("error ")


def test_sigterm_unmounts_and_exits_0(ckptfs_bin, tmp_path):
    c = Ckptfs(ckptfs_bin, tmp_path)
    try:
        assert _mounted(c.root)
        write(c.root / "f", b"1", sync=False)
        c.proc.send_signal(signal.SIGTERM)
        assert c.proc.wait(timeout=30) == 0
        assert not _mounted(c.root)
        assert (c.backing / "f").read_bytes() == b"1"  # an exit is not a crash
        assert not c.sock.exists()
    finally:
        c.stop()
        assert not _mounted(c.root)


def test_a_failed_mount_says_why_and_exits_2(ckptfs_bin, tmp_path):
    r = subprocess.run([str(ckptfs_bin), "--backing", str(tmp_path), "--mount", str(tmp_path / "missing"),
                        "--control", str(tmp_path / "ctl.sock")], capture_output=True, text=True, timeout=60)
    assert r.returncode == 2
    assert r.stdout == ""
    assert r.stderr.startswith("ckptfs: mount ") and len(r.stderr.strip().splitlines()) == 1
