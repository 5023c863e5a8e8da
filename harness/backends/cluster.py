"""The cluster tier, `local` backend: real processes, real TCP, real Toxiproxy.

`LocalCluster` lays out a run directory, starts the Toxiproxy server, one proxy per
learner↔syncer-shard link, the syncer shards and the learner units as processes,
and offers the operations faults need (kill, restart, pause, resume, slice
control, link toxics). Closing it — on success, failure or Ctrl-C — stops every
process it started (by pid) and removes every proxy, then the server.

Run directory:
  run.json                 config + topology; each process reads it at start
  logs/<src>.<n>.jsonl     events of incarnation n of process src
  ckpt/<src>/              orbax checkpoints
  control/<unit>.json      the last control message (live_slices; faults: the faults on the
                           unit by kind), written by the unit (the harness sends it on the
                           unit's stdin), read each step (a learner) or loop turn (a shard)
  stdout/<src>.<n>.log     each process's stdout/stderr
(A unit on another host's engine keeps its own copy of this layout in a volume, and the
harness's copy is filled from messages: harness/backends/docker_remote.py.)
"""
from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import time
import uuid
from dataclasses import dataclass, field
from pathlib import Path
from typing import Protocol

from diloco_chaos.trainer.units.shell import default_compile_cache
from diloco_chaos.trainer.wire.auth import SECRET_ENV, new_secret
from diloco_chaos.harness.backends import checkpoint_disk
from diloco_chaos.harness.backends.fuse_disks import FuseDisks
from diloco_chaos.harness.backends.small_disks import SmallDisks
from diloco_chaos.harness.backends.toxiproxy_client import ToxiproxyClient
from diloco_chaos.harness.links import LinkProfile
from diloco_chaos.harness.backends.toxiproxy_server import ToxiproxyServer, free_port
from diloco_chaos.harness.run.control import Spawned, apply_profile, link_name, make_topology, mechanism_words


JAX_CACHE = default_compile_cache()  # the units' (trainer/units/shell.py use_compile_cache: the harness's too)


def unit_jax_env(env: dict, role: str, slices: int, cache_dir: str) -> dict:
    """JAX's settings in a unit's environment `env`, whatever runs the unit: a learner's S
    CPU devices (always), and defaults the harness's own environment may override: the CPU
    platform and the persistent compilation cache at `cache_dir` (a restarted unit compiles
    nothing again; real fleets keep compilation caches for the same reason)."""
    if role == "learner":
        env["XLA_FLAGS"] = f"--xla_force_host_platform_device_count={slices}"
    for key, value in (("JAX_PLATFORMS", "cpu"), ("JAX_COMPILATION_CACHE_DIR", cache_dir),
                       ("JAX_PERSISTENT_CACHE_MIN_COMPILE_TIME_SECS", "0"),
                       ("JAX_PERSISTENT_CACHE_MIN_ENTRY_SIZE_BYTES", "0")):
        env.setdefault(key, value)
    return env


@dataclass
class Member:
    name: str
    role: str  # "learner" | "syncer"
    proc: subprocess.Popen | None = None
    incarnation: int = -1
    paused: bool = False
    start: str = "cold"  # how its current process started: "cold", "spare" (warm), "spare_booting"


class Units(Protocol):
    """How a cluster's units run: `Processes` (below) or containers (harness/backends/docker_cluster.py
    `Containers`). A cluster holds one and hands it every unit-level action; the run
    directory, Toxiproxy, the topology and the control files are the cluster's, shared."""

    backend: str                                             # topology.backend.name
    mechanisms: dict                                         # fault kind -> how, in words

    def prepare(self, cluster: "LocalCluster") -> None: ...  # before the cluster lays anything out
    def backend_info(self, cluster: "LocalCluster") -> dict: ...
    def spawn(self, cluster: "LocalCluster", m: Member): ...  # -> a Popen-like (poll, wait, pid, returncode)
    def kill(self, cluster: "LocalCluster", m: Member) -> None: ...
    def pause(self, cluster: "LocalCluster", m: Member) -> str | None: ...
    def resume(self, cluster: "LocalCluster", m: Member) -> None: ...
    def set_speed(self, cluster: "LocalCluster", m: Member, speed: float, period_s: float) -> None: ...
    def pid(self, m: Member) -> int | None: ...
    def shard_listen(self, cluster: "LocalCluster") -> str: ...  # where the syncer shards listen
    def control(self, cluster: "LocalCluster", m: Member, state: dict) -> None: ...  # a control message
    def start_spares(self, cluster: "LocalCluster", delay_s: float = 0.0) -> None: ...  # warm spares, if any
    def stop_all(self, cluster: "LocalCluster") -> None: ...  # the end: every unit, gracefully


@dataclass
class LocalCluster:
    """A cluster on this host: the run directory, a Toxiproxy server with one proxy per
    learner↔shard link, the control files, and the units, run by `units` (processes by
    default; harness/backends/docker_cluster.py passes containers: composition, not a subclass)."""

    run_dir: Path
    config: dict  # RunConfig.to_dict()
    shards: int = 1
    seed: int = 0
    wan: LinkProfile | None = None
    slices: int = 1
    max_steps_factor: float = 1.0  # learners stop by themselves after this × cfg.steps
    python: str = sys.executable
    listen: str = "127.0.0.1"  # where the link proxies and the syncer shards listen
    spares: tuple[str, ...] = ()  # roles ("learner", "syncer") that keep warm spares for restarts
    spare_pool: int = 2  # how many each such role keeps (on docker: on each engine)
    small_disks: tuple[str, ...] = ()  # units whose checkpoint folder is a filesystem of its own (disk_full)
    _disks: SmallDisks | None = field(default=None, repr=False)
    # units whose checkpoint folder is the harness's FUSE layer (disk_slow, lost_writes), and
    # whether the journals' folder is one too (lost_writes: a host crash loses its tail too)
    fuse_disks: tuple[str, ...] = ()
    fuse_journal: bool = False
    _fuse: FuseDisks | None = field(default=None, repr=False)
    units: Units = field(default_factory=lambda: _processes())
    toxiproxy: ToxiproxyServer | None = None
    client: ToxiproxyClient | None = None
    members: dict[str, Member] = field(default_factory=dict)
    controls: dict[str, dict] = field(default_factory=dict)  # unit -> its control state, as last sent
    topology: dict = field(default_factory=dict)
    # The run secret every unit proves on each connection (trainer/wire/auth.py): in the units'
    # environment only, never in run.json or the event log.
    secret: str = field(default_factory=new_secret, repr=False)
    # Units that failed on the run's graceful stop (an error exit after SIGTERM): `no_crash`
    # judges them with the crashes seen during the run (harness/backends/runner.py).
    stop_errors: list[dict] = field(default_factory=list)
    stop_kills: list[dict] = field(default_factory=list)  # units SIGKILLed after their grace: a note

    def unit_env(self) -> dict[str, str]:
        """What every unit's environment gets from the cluster, whatever runs it."""
        return {SECRET_ENV: self.secret}

    def mechanism(self, kind: str) -> str:
        """How a fault of `kind` is done here, in words (the report's timeline shows it)."""
        return mechanism_words(self.units.mechanisms, kind)

    # lifecycle -------------------------------------------------------------
    def start(self, *, start_learners: bool = True) -> "LocalCluster":
        try:
            self._fuse = FuseDisks(self.run_dir, self.fuse_disks, journal=self.fuse_journal)
            # a unit with both: its small disk under its FUSE layer (the layer's backing folder)
            self._disks = SmallDisks(self.run_dir, self.small_disks,
                                     where={u: self._fuse.backing(u) for u in self.small_disks if u in self.fuse_disks})
            self._disks.mount()  # before any unit opens its checkpoint folder
            self._fuse.mount()
            self.units.prepare(self)
            self._start(start_learners)
        except BaseException:
            self.close()
            raise
        return self

    def _start(self, start_learners: bool) -> None:
        for sub in ("logs", "ckpt", "control", "stdout"):
            (self.run_dir / sub).mkdir(parents=True, exist_ok=True)
        d = self.config["diloco"]
        self.topology = make_topology(d["learners"], self.shards, self._fragments())
        self.toxiproxy = ToxiproxyServer(seed=self.seed, log_path=self.run_dir / "stdout" / "toxiproxy.log").start()
        self.client = self.toxiproxy.client()
        host = self.units.shard_listen(self)
        port_from = host if host == self.listen else "127.0.0.1"  # (another host's: a port free here)
        shard_addrs = {s: f"{host}:{free_port(port_from)}" for s in self.topology["shards"]}
        links: dict[str, dict[str, str]] = {}
        for learner in self.topology["learners"]:
            links[learner] = {}
            for shard, addr in shard_addrs.items():
                name = link_name(learner, shard)
                links[learner][shard] = self.client.create_proxy(name, upstream=addr, listen=f"{self.listen}:0")
                if self.wan is not None:
                    apply_profile(self.client, name, self.wan)
        self.topology.update(shard_addrs=shard_addrs, links=links, run_id=uuid.uuid4().hex[:12])
        self.topology["backend"] = self.units.backend_info(self)  # (docker: reads the run_id)
        run = {"seed": self.seed, "config": self.config, "topology": self.topology, "slices": self.slices,
               "toxiproxy": {"pid": self.toxiproxy.pid, "url": self.toxiproxy.url},
               "max_steps_factor": self.max_steps_factor, "backend": self.topology["backend"]}
        (self.run_dir / "run.json").write_text(json.dumps(run, indent=1))
        for shard in self.topology["shards"]:
            self.members[shard] = Member(shard, "syncer")
            self.spawn(shard)
        for learner in self.topology["learners"]:
            self.members[learner] = Member(learner, "learner")
            if start_learners:
                self.spawn(learner)
        self.units.start_spares(self)

    def _fragments(self) -> int:
        d, m = self.config["diloco"], self.config["model"]
        return d["fragments"] or m["n_layers"] + 1

    def stdout_tail(self, name: str, incarnation: int, lines: int = 3) -> list[str]:
        """The last lines a unit's process wrote to stdout/stderr (a crash's traceback ends there)."""
        log = self.run_dir / "stdout" / f"{name}.{incarnation}.log"
        return log.read_text(errors="replace").strip().splitlines()[-lines:] if log.exists() else []

    def record_stop(self, m: Member, rc: int | None, grace_s: float) -> None:
        """How `m`'s process left after the run's SIGTERM. An exit code of its own other than 0 is an
        error (a traceback: e.g. a final save that failed, so no closing line or `done`); a death by
        our signal is not: SIGTERM before its handler was set (-15 for a process, 143 for a
        container's), or SIGKILL after its `grace_s` (-9 / 137, or None: still up, removed), which
        is noted (`stop_kills`: what it does on a stop is missing from the run's end)."""
        if rc is None or rc in (-9, 128 + 9):
            self.stop_kills.append({"unit": m.name, "incarnation": m.incarnation, "grace_s": grace_s})
        elif rc > 0 and rc != 128 + 15:
            self.stop_errors.append({"unit": m.name, "incarnation": m.incarnation, "rc": rc, "at": "stop",
                                     "stdout_tail": self.stdout_tail(m.name, m.incarnation)})

    def close(self) -> None:
        """Stops everything this cluster started; safe to call twice and from `finally`."""
        try:
            self.units.stop_all(self)
        finally:
            if self.client is not None:
                try:
                    self.client.delete_all()
                except Exception:  # the server may be gone already; stopping it below removes all
                    pass
            if self.toxiproxy is not None:
                self.toxiproxy.stop()
                self.toxiproxy = None
            try:
                if self._fuse is not None:
                    self._fuse.unmount()  # first: a small disk may be under a layer
            finally:
                if self._disks is not None:
                    self._disks.unmount()  # the checkpoints stay, the mounts go

    def __enter__(self) -> "LocalCluster":
        return self.start()

    def __exit__(self, *exc) -> None:
        self.close()

    # unit control (what faults use): the cluster's members, run by `units` --------
    def spawn(self, name: str) -> Spawned:
        """A new process for `name`, and how it started: "cold", or "spare" (a warm spare
        took the identity; "spare_booting" if it was not ready yet)."""
        m = self.members[name]
        if m.proc is not None and m.proc.poll() is None:
            raise RuntimeError(f"{name} is already running (pid {m.proc.pid})")
        m.incarnation += 1
        m.proc = self.units.spawn(self, m)
        m.paused = False
        if (state := self.controls.get(name)) is not None:  # what was set while it was down
            self.units.control(self, m, state)
        return Spawned(m.start, self.pid(name))

    def pid(self, name: str) -> int | None:
        """The unit's process id on this host (None: not running); not part of `Control`."""
        return self.units.pid(self.members[name])

    def running(self, name: str) -> bool:
        return self.pid(name) is not None

    def kill(self, name: str) -> None:
        self.units.kill(self, self.members[name])

    def terminate(self, name: str) -> None:
        """SIGTERM to the unit's process (a container's main process, as this host sees it):
        it closes and leaves, as at the end of a run (a unit on another host's engine has no
        pid here: it stays until its kill)."""
        if (pid := self.pid(name)) is not None:
            os.kill(pid, signal.SIGTERM)

    def pause(self, name: str) -> str | None:
        """Returns None: done the way `mechanism("pause_unit")` says (a backend that had to
        do it another way returns its words, and the log records them)."""
        return self.units.pause(self, self.members[name])

    def resume(self, name: str) -> None:
        self.units.resume(self, self.members[name])

    def set_speed(self, name: str, speed: float, period_s: float = 0.1) -> None:
        """slow_unit: the unit runs at `speed` × full speed (each backend its own way); 1.0 ends it."""
        self.units.set_speed(self, self.members[name], speed, period_s)

    def set_live_slices(self, learner: str, live: int) -> None:
        """A slice control message: the learner reshards its batch over `live` slices."""
        self._control(learner, live_slices=live)

    def set_fault(self, unit: str, kind: str, **fields) -> None:
        """The fault `kind` on `unit` (a learner or a shard) with `fields`: done by this host
        beneath the unit where it is the disk's (`_host_faults`), else a control message, the
        unit's whole dict of the faults on it (trainer/protocol/unit_faults.py: its hooks read it)."""
        if (host := self._host_faults().get(kind)) is not None:
            host[0](unit, fields)
        else:
            self._control(unit, faults={**self.controls.get(unit, {}).get("faults", {}), kind: dict(fields)})

    def clear_fault(self, unit: str, kind: str) -> None:
        """The fault `kind` off `unit` (what it held leaves once the unit reads its control)."""
        if (host := self._host_faults().get(kind)) is not None:
            host[1](unit)
        else:
            faults = dict(self.controls.get(unit, {}).get("faults", {}))
            faults.pop(kind, None)
            self._control(unit, faults=faults)

    def _host_faults(self) -> dict:
        """The kinds this host does beneath the unit, on its checkpoint disk: kind -> (on, off).
        disk_full: the shard's own small disk filled to its last byte, then emptied; disk_slow:
        each write and fsync on its checkpoint folder `latency_ms` late (the FUSE layer)."""
        return {"disk_full": (lambda u, f: self._disks.fill(u), self._disks.free),
                "disk_slow": (lambda u, f: self._fuse.latency(u, f["latency_ms"]), lambda u: self._fuse.latency(u, 0.0))}

    def lose_writes(self, unit: str) -> dict:
        """lost_writes (the unit is dead): its un-fsynced writes dropped by its FUSE layer."""
        return self._fuse.crash(unit)

    def checkpoints(self, unit: str) -> dict:
        """The unit's checkpoint folder as the harness finds it: finalized and sealed steps."""
        return checkpoint_disk.listing(self.run_dir / "ckpt" / unit)

    def damage_checkpoint(self, unit: str, damage: str) -> dict:
        """corrupt_checkpoint: the unit's newest sealed checkpoint damaged at rest (it is down)."""
        return checkpoint_disk.damage(self.run_dir / "ckpt" / unit, damage)

    def _control(self, unit: str, **fields) -> None:
        """A control message: the unit's whole control state, on its stdin (the unit keeps it
        in its control/<unit>.json); a restart is sent it again."""
        state = self.controls[unit] = {**self.controls.get(unit, {}), **fields}
        self.units.control(self, self.members[unit], state)

    def links_of(self, learner: str) -> list[str]:
        return [link_name(learner, s) for s in self.topology["shards"]]

    def wait_exit(self, names: list[str], timeout_s: float) -> bool:
        deadline = time.monotonic() + timeout_s
        for n in names:
            m = self.members[n]
            if m.proc is None:
                continue
            try:
                m.proc.wait(timeout=max(0.0, deadline - time.monotonic()))
            except subprocess.TimeoutExpired:
                return False
        return True


def _processes() -> "Units":
    from diloco_chaos.harness.backends.processes import Processes  # (it imports this module)
    return Processes()
