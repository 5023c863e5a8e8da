"""A container seen as a process: `ContainerProc` is the subset of `subprocess.Popen` the
harness uses (poll, wait, pid, returncode), for one container of the docker backend
(harness/backends/docker_cluster.py); `wait_job_state` waits until the engine's SIGSTOP /
SIGCONT has reached every thread of a container's process, where this host can see it."""
from __future__ import annotations

import time
from pathlib import Path


class ContainerProc:
    """The subset of `subprocess.Popen` the harness uses, for one container."""

    def __init__(self, container, poll_every_s: float = 0.25):
        self.container = container
        self.returncode: int | None = None
        self.pid: int | None = None
        self._last = 0.0
        self._every = poll_every_s
        self._refresh(force=True)

    def _refresh(self, force: bool = False) -> None:
        import docker

        if self.returncode is not None or (not force and time.monotonic() - self._last < self._every):
            return
        self._last = time.monotonic()
        try:
            self.container.reload()
        except docker.errors.NotFound:
            self.returncode, self.pid = -9, None
            return
        state = self.container.attrs["State"]
        if state["Status"] in ("exited", "dead"):
            self.returncode, self.pid = int(state["ExitCode"]), None
        elif state.get("Pid"):
            self.pid = int(state["Pid"])

    def poll(self) -> int | None:
        self._refresh()
        return self.returncode

    def wait(self, timeout: float | None = None) -> int:
        import subprocess

        deadline = None if timeout is None else time.monotonic() + timeout
        while True:
            self._refresh(force=True)
            if self.returncode is not None:
                return self.returncode
            if deadline is not None and time.monotonic() >= deadline:
                raise subprocess.TimeoutExpired(self.container.name, timeout)
            time.sleep(0.1)


def _thread_states(pid: int, container_id: str) -> list[str] | None:
    """The kernel's state letter of each thread of `pid`, when `pid` is this host's view
    of the container's process (its cgroup names the container); None where it is not
    (an engine on another host, or the process is gone)."""
    try:
        if container_id not in Path(f"/proc/{pid}/cgroup").read_text():
            return None
        states = []
        for task in Path(f"/proc/{pid}/task").iterdir():
            # /proc/PID/task/TID/stat: "tid (comm) S ..."; comm may hold spaces or parens
            states.append((task / "stat").read_text().rsplit(")", 1)[1].split()[0])
        return states
    except (OSError, IndexError):
        return None


def wait_job_state(pid: int | None, container_id: str, stopped: bool, timeout_s: float = 5.0) -> bool:
    """Waits until every thread of the container's process is stopped (`T`), or none is;
    True when seen so, False when this host cannot see the process or the deadline passed
    (the signal was sent either way)."""
    if pid is None:
        return False
    deadline = time.monotonic() + timeout_s
    while True:
        states = _thread_states(pid, container_id)
        if states is None:
            return False
        if all((st in "Tt") == stopped for st in states):
            return True
        if time.monotonic() >= deadline:
            return False
        time.sleep(0.005)
