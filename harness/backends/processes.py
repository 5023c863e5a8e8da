"""The local backend's units: processes of this host, started through `procs.spawn`
(their own session, SIGKILL if the harness dies, signalled by pid), killed with SIGKILL,
paused with SIGSTOP/SIGCONT, slowed by a SIGSTOP duty cycle, and restarted from warm
spares when the run keeps them (`[cluster] spares`)."""
from __future__ import annotations

import json
import os
import signal
import subprocess
import threading
from dataclasses import dataclass, field
from typing import TYPE_CHECKING

from diloco_chaos.harness.backends import procs
from diloco_chaos.harness.backends.cluster import JAX_CACHE, Member, unit_jax_env
from diloco_chaos.harness.run.control import GRACE_S, LOCAL_MECHANISMS, SPARE_DELAY_S
from diloco_chaos.trainer.units.shell import CONTROL_ENV

if TYPE_CHECKING:
    from diloco_chaos.harness.backends.cluster import LocalCluster


@dataclass
class SlowCycle:
    """Duty-cycled SIGSTOP/SIGCONT: the process runs `speed` of each `period_s`."""

    pid: int
    speed: float
    period_s: float
    stop: threading.Event = field(default_factory=threading.Event)

    def run(self) -> None:
        while not self.stop.is_set():
            try:
                os.kill(self.pid, signal.SIGSTOP)
                self.stop.wait((1 - self.speed) * self.period_s)
                os.kill(self.pid, signal.SIGCONT)
            except ProcessLookupError:
                return
            self.stop.wait(self.speed * self.period_s)
        try:
            os.kill(self.pid, signal.SIGCONT)
        except ProcessLookupError:
            pass




@dataclass
class Spare:
    name: str                 # spare-learner-2: its stdout/ file and spares/NAME.ready
    proc: subprocess.Popen

    def ready(self, cluster: "LocalCluster") -> bool:
        """Has it said it is ready (trainer/units/shell.py `await_identity`)?"""
        return (cluster.run_dir / "spares" / f"{self.name}.ready").exists()

    @staticmethod
    def identity(m: Member) -> bytes:
        """The one line a spare reads on its stdin to become m's next incarnation."""
        return json.dumps({"id": m.name, "incarnation": m.incarnation}).encode() + b"\n"

    def became(self, cluster: "LocalCluster", m: Member, ready: bool) -> None:
        """After the hand-over: its output is the incarnation's (the crash tail reads it),
        and m's `start` says which path the restart took."""
        (cluster.run_dir / "stdout" / f"{m.name}.{m.incarnation}.log").symlink_to(f"{self.name}.log")
        m.start = "spare" if ready else "spare_booting"


def take_spare(pool: list | None, cluster: "LocalCluster") -> Spare | None:
    """The spare a restart takes from `pool` (removed from it): a ready one if any, else
    the oldest (the nearest to ready); None if the pool is empty or absent."""
    if not pool:
        return None
    spare = next((s for s in pool if s.ready(cluster)), pool[0])
    pool.remove(spare)
    return spare


@dataclass
class Processes:
    """Units as processes of this host: SIGKILL, SIGSTOP/SIGCONT, a SIGSTOP duty cycle.

    Warm spares (the cluster's `spares`, from `[cluster] spares`): one process per role started
    ahead (trainer/units/spare.py) takes the next restart's identity, so a restart costs a
    checkpoint restore instead of a Python + JAX start; a new spare replaces it
    SPARE_DELAY_S later. Each restart's path is in the harness's unit_up line (`start`)."""

    backend: str = "local"
    mechanisms: dict = field(default_factory=lambda: dict(LOCAL_MECHANISMS))
    slowed: dict[str, SlowCycle] = field(default_factory=dict)  # slow_unit's duty cycles
    spares: dict[str, list[Spare]] = field(default_factory=dict)  # role -> its spares, oldest first
    made: int = 0

    def prepare(self, cluster: "LocalCluster") -> None:
        pass

    def backend_info(self, cluster: "LocalCluster") -> dict:
        return {"name": "local", "host": os.uname().nodename, "spares": list(cluster.spares)}

    def _env(self, cluster: "LocalCluster", role: str) -> dict:
        env = {**os.environ, "PYTHONUNBUFFERED": "1", **cluster.unit_env(), CONTROL_ENV: "stdin"}
        return unit_jax_env(env, role, cluster.slices, str(JAX_CACHE))

    def start_spares(self, cluster: "LocalCluster", delay_s: float = 0.0) -> None:
        """Fills each role that keeps spares (`cluster.spares`) up to `cluster.spare_pool`;
        the k-th new one waits delay_s + k × SPARE_DELAY_S, so spares started together do
        not boot together (their boots share the units' cores)."""
        for role in cluster.spares:
            pool = self.spares.setdefault(role, [])
            for k in range(cluster.spare_pool - len(pool)):
                self.made += 1
                name = f"spare-{role}-{self.made}"
                argv = [cluster.python, "-m", "diloco_chaos.trainer.units.spare", role, "--delay", str(delay_s + k * SPARE_DELAY_S),
                        "--run-dir", str(cluster.run_dir), "--spare", name]
                with open(cluster.run_dir / "stdout" / f"{name}.log", "wb") as out:
                    proc = procs.spawn(argv, stdout=out, stderr=subprocess.STDOUT, env=self._env(cluster, role),
                                       stdin=subprocess.PIPE)
                pool.append(Spare(name, proc))

    def spawn(self, cluster: "LocalCluster", m: Member) -> subprocess.Popen:
        spare = take_spare(self.spares.get(m.role), cluster)
        if spare is not None:
            handed = self._hand_over(cluster, spare, m)
            # its replacement after the hand-over: its start (a fork of the harness, 10-90 ms on
            # two busy cores) is off the restart's path (the restart line is stamped before
            # the hand-over: harness/run/injector.py `up`)
            self.start_spares(cluster, SPARE_DELAY_S)
            if handed:
                return spare.proc
        m.start = "cold"
        module = "diloco_chaos.trainer.units.learner" if m.role == "learner" else "diloco_chaos.trainer.units.syncer"
        out = open(cluster.run_dir / "stdout" / f"{m.name}.{m.incarnation}.log", "wb")
        argv = [cluster.python, "-m", module, "--run-dir", str(cluster.run_dir), "--id", m.name,
                "--incarnation", str(m.incarnation)]
        with out:  # stdin: the control messages
            return procs.spawn(argv, stdout=out, stderr=subprocess.STDOUT, env=self._env(cluster, m.role),
                               stdin=subprocess.PIPE)

    def _hand_over(self, cluster: "LocalCluster", spare: Spare, m: Member) -> bool:
        """The spare takes m's identity (one JSON line on its stdin); False if it had died
        (its stdout/ file says why): the restart is then cold."""
        ready = spare.ready(cluster)
        try:
            spare.proc.stdin.write(Spare.identity(m))
            spare.proc.stdin.flush()  # (kept open: the control messages come the same way)
        except (BrokenPipeError, ValueError):
            procs.stop(spare.proc, grace_s=1.0)
            return False
        spare.became(cluster, m, ready)
        return True

    def pid(self, m: Member) -> int | None:
        return m.proc.pid if m.proc is not None and m.proc.poll() is None else None

    def shard_listen(self, cluster: "LocalCluster") -> str:
        return cluster.listen

    def control(self, cluster: "LocalCluster", m: Member, state: dict) -> None:
        """One JSON line on the unit's stdin (a pipe: a paused unit reads it once resumed);
        nothing when it is not running (the cluster sends it again at the restart)."""
        if m.proc is None or m.proc.stdin is None or m.proc.poll() is not None:
            return
        try:
            m.proc.stdin.write(json.dumps(state).encode() + b"\n")
            m.proc.stdin.flush()
        except (BrokenPipeError, ValueError):  # exited meanwhile
            pass

    def kill(self, cluster: "LocalCluster", m: Member) -> None:
        """SIGKILL: the process gets no chance to clean up, as with a machine failure."""
        if m.proc is not None:
            if m.proc.poll() is None:
                os.kill(m.proc.pid, signal.SIGKILL)
            m.proc.wait()
            _close_stdin(m.proc)
            m.proc = None

    def pause(self, cluster: "LocalCluster", m: Member) -> str | None:
        self._signal(m, signal.SIGSTOP)
        m.paused = True
        return None

    def resume(self, cluster: "LocalCluster", m: Member) -> None:
        self._signal(m, signal.SIGCONT)
        m.paused = False

    def set_speed(self, cluster: "LocalCluster", m: Member, speed: float, period_s: float) -> None:
        """The process runs `speed` of every `period_s` (SIGSTOP/SIGCONT from a thread); 1.0
        ends it. A unit restarted meanwhile is not slowed (its new pid)."""
        if (old := self.slowed.pop(m.name, None)) is not None:
            old.stop.set()
        pid = self.pid(m)
        if speed < 1.0 and pid is not None:
            cycle = self.slowed[m.name] = SlowCycle(pid, speed, period_s)
            threading.Thread(target=cycle.run, name=f"slow-{m.name}", daemon=True).start()

    def _signal(self, m: Member, sig: int) -> None:
        if (pid := self.pid(m)) is not None:
            os.kill(pid, sig)

    def stop_all(self, cluster: "LocalCluster") -> None:
        """SIGTERM, a grace period, SIGKILL: the spares, then every learner at once (each
        closes, drains its links, writes its last lines and saves: their shutdowns overlap), then
        the shards, which stayed up for the learners' last contributions."""
        for cycle in self.slowed.values():
            cycle.stop.set()
        spares = [s for pool in self.spares.values() for s in pool]
        procs.stop_all([s.proc for s in spares], grace_s=2.0)
        for spare in spares:
            if spare.proc.stdin is not None:
                spare.proc.stdin.close()
        self.spares.clear()
        for role in ("learner", "syncer"):
            members = [m for m in cluster.members.values() if m.role == role and m.proc is not None]
            procs.stop_all([m.proc for m in members], grace_s=GRACE_S[role])
            for m in members:
                cluster.record_stop(m, m.proc.returncode, GRACE_S[role])
                _close_stdin(m.proc)
                m.proc = None


def _close_stdin(proc) -> None:
    try:
        if proc.stdin is not None:
            proc.stdin.close()
    except OSError:  # (the unit is gone: its end of the pipe too)
        pass
