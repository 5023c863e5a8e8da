"""Child processes that are always cleaned up.

Every process the harness starts goes through `spawn`, which
- starts it in its own session (a terminal's Ctrl-C reaches only us, and we
  decide the order of shutdown),
- asks Linux to SIGKILL it if the harness itself dies (PR_SET_PDEATHSIG), so
  not even a `kill -9` of the harness leaks children,
- remembers its pid, so `stop` signals exactly the pids we started, never a name.
"""
from __future__ import annotations

import ctypes
import os
import signal
import subprocess
import time
import warnings
from dataclasses import dataclass, field
from typing import IO, Sequence

_PR_SET_PDEATHSIG = 1


_LIBC = ctypes.CDLL("libc.so.6", use_errno=True)  # loaded here, not in the forked child


def _die_with_parent() -> None:
    # Runs in the child between fork and exec, where a multithreaded parent (JAX) may
    # have left locks held: one plain C call, no imports, no allocation-heavy Python.
    _LIBC.prctl(_PR_SET_PDEATHSIG, signal.SIGKILL, 0, 0, 0)


def spawn(argv: Sequence[str], *, stdout: IO | int | None = None, stderr: IO | int | None = None,
          env: dict[str, str] | None = None, cwd: str | None = None,
          stdin: IO | int | None = subprocess.DEVNULL) -> subprocess.Popen:
    with warnings.catch_warnings():
        # Python warns when forking a process that runs threads (JAX's, once the harness
        # evaluated a model); the child here only calls prctl and exec.
        warnings.filterwarnings("ignore", "os.fork", RuntimeWarning)
        return subprocess.Popen(
            list(argv), stdout=stdout, stderr=stderr, stdin=stdin, env=env, cwd=cwd,
            start_new_session=True, preexec_fn=_die_with_parent,
        )


def pid_alive(pid: int) -> bool:
    """True while `pid` exists and is not a zombie."""
    try:
        with open(f"/proc/{pid}/stat") as f:
            state = f.read().rsplit(")", 1)[1].split()[0]
    except (FileNotFoundError, ProcessLookupError, IndexError):
        return False
    return state not in ("Z", "X")


def stop(proc: subprocess.Popen, *, grace_s: float = 5.0) -> int | None:
    """SIGCONT (a paused process cannot act on SIGTERM), SIGTERM, then SIGKILL after
    `grace_s`; always reaps. Returns the exit code."""
    if proc.poll() is not None:
        return proc.returncode
    _terminate(proc)
    return _reap(proc, grace_s)


def stop_all(children: Sequence[subprocess.Popen], *, grace_s: float = 5.0) -> None:
    """`stop` for several at once: every one gets SIGCONT and SIGTERM first, then they
    share one `grace_s` to leave (their shutdowns overlap), then SIGKILL; all reaped.
    One SIGTERM each: a second one (this sent it again, as each was reaped) could land
    on a unit already leaving, its handler gone (a unit that exited 1 on the stop read as
    killed by the signal), and many trainers take a second SIGTERM as "quit now"."""
    live = [p for p in children if p.poll() is None]
    for proc in live:
        _terminate(proc)
    deadline = time.monotonic() + grace_s
    for proc in live:
        _reap(proc, max(0.0, deadline - time.monotonic()))


def _terminate(proc: subprocess.Popen) -> None:
    for sig in (signal.SIGCONT, signal.SIGTERM):  # (a paused process cannot act on SIGTERM)
        try:
            os.kill(proc.pid, sig)
        except ProcessLookupError:
            break


def _reap(proc: subprocess.Popen, grace_s: float) -> int:
    """Waits `grace_s` for `proc` to leave, then SIGKILL; reaps it. Its exit code."""
    try:
        return proc.wait(timeout=grace_s)
    except subprocess.TimeoutExpired:
        try:
            os.kill(proc.pid, signal.SIGKILL)
        except ProcessLookupError:
            pass
        return proc.wait()


@dataclass
class ProcessSet:
    """The processes of one run; `close()` stops every one of them, in reverse start order."""

    procs: list[subprocess.Popen] = field(default_factory=list)

    def add(self, proc: subprocess.Popen) -> subprocess.Popen:
        self.procs.append(proc)
        return proc

    def close(self, grace_s: float = 5.0) -> None:
        deadline = time.monotonic() + grace_s
        for proc in reversed(self.procs):
            stop(proc, grace_s=max(0.1, deadline - time.monotonic()))
        self.procs.clear()

    def __enter__(self) -> "ProcessSet":
        return self

    def __exit__(self, *exc) -> None:
        self.close()
