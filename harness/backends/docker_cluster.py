"""The cluster tier, `docker` backend: every learner unit and syncer shard a container.

`DockerCluster(...)` is a `LocalCluster` whose units are `Containers` (composition: the
cluster hands every unit-level action to its `units`) on the engine that DOCKER_HOST
names (or the default socket), driven through the `docker` Python SDK.
Everything else is shared: the run directory, Toxiproxy (on the harness's host; the
containers use host networking, so 127.0.0.1 is the same loopback), slice control
files, the Injector. Faults the container way:

  kill_unit / kill_syncer   container.kill() (SIGKILL), removed; after `down_for` a new
                            container of the same unit starts with the next incarnation
  pause_unit                container.pause() / unpause() (the cgroup freezer)
  slow_unit                 set_speed(): a CFS CPU quota (container.update(cpu_quota=...)),
                            i.e. slower hardware; without it the Injector's SIGSTOP duty
                            cycle still works, on the container's main process (`pid`)
  kill_slice, corrupt       a control message on the container's stdin (docker attach)

Each member's `proc` is a `ContainerProc`, which answers `poll()`, `wait()`, `pid`,
`returncode` as `subprocess.Popen` does, so the runner and the Injector need no change.

Images (harness/backends/docker_engine.py). `image="host"` (default) needs no registry: `host_image()` imports
(`docker import`) a tiny root filesystem of empty mount points, and each container
bind-mounts, read-only, the host's /usr (and /bin, /lib, ... where they are not
symlinks into it), /etc, the Python install (`sys.base_prefix`), the virtualenv and
the repository at the same paths, so it runs the host's Python on the host's files.
The image is named by content (`diloco-chaos-host:<sha>` of the tar and the mount
list), so it is built once per engine. Any other `image` (e.g. one built from
docker/Dockerfile) is used as is, with the repository mounted at the same path.
This host-mount mode needs the engine on this machine; docs/DOCKER.md.

Cleanup. Every container carries the label `diloco-chaos.run=<run_id>`; `close()`
(from `__exit__`, so on exceptions and Ctrl-C too) removes every container of the run
by that label, then stops Toxiproxy. `remove_all()` removes every container any run
left (e.g. after a `kill -9` of the harness, which no `finally` survives).
"""
from __future__ import annotations

import json
import os
import time
from dataclasses import dataclass, field
from pathlib import Path

from diloco_chaos.harness.backends.cluster import JAX_CACHE, LocalCluster, unit_jax_env
from diloco_chaos.harness.backends.container_proc import ContainerProc, wait_job_state
from diloco_chaos.harness.backends.processes import Spare, take_spare
from diloco_chaos.harness.run.control import GRACE_S, LOCAL_MECHANISMS, SPARE_DELAY_S
from diloco_chaos.harness.backends.docker_engine import LABEL, REPO, engine, host_image, host_mounts, remove_all
from diloco_chaos.harness.backends.docker_remote import Shipped, host_of, is_remote, send_line
from diloco_chaos.trainer.units.shell import CONTROL_ENV

UNIT_LABEL = "diloco-chaos.unit"
CPU_PERIOD_US = 100_000
# docker pause: runc's "unable to freeze" is retried, then the engine's SIGSTOP (pause()).
PAUSE_TRIES = 5
PAUSE_BACKOFF_S = 0.2
PAUSE_FALLBACK = f"docker kill --signal SIGSTOP / SIGCONT (the freezer refused {PAUSE_TRIES} times)"

# Environment the harness has that means nothing inside a container (or must not leak).
_ENV_DROP = {"DOCKER_HOST", "DOCKER_TLS_VERIFY", "DOCKER_CERT_PATH", "HOSTNAME", "TERM", "DISPLAY",
             "SSH_AUTH_SOCK", "PYTEST_CURRENT_TEST", "PYTEST_XDIST_WORKER"}


# ------------------------------------------------------------------ the cluster
def DockerCluster(run_dir: Path, config: dict, *, image: str = "host", cpus: float | None = None,
                  docker_client=None, engines=(), **kw) -> LocalCluster:
    """A `LocalCluster` whose units are containers (`Containers`). `image` ("host": the
    registry-free host image, else an image reference), `cpus` (each unit's CPU budget in
    cores; None: unlimited), `docker_client` (default: from DOCKER_HOST), `engines`
    (DOCKER_HOST URLs to spread the learner units over: learner-i on engines[i % n]; the
    syncer shards run on the first, beside Toxiproxy; empty: every unit on
    `docker_client`'s engine). The other keywords are LocalCluster's."""
    units = Containers(image=image, cpus=cpus, docker_client=docker_client, engines=tuple(engines))
    return LocalCluster(run_dir, config, units=units, **kw)


@dataclass
class Containers:
    """A cluster's units as containers (harness/backends/cluster.py `Units`)."""

    image: str = "host"
    cpus: float | None = None
    docker_client: object | None = None
    engines: tuple = ()
    backend: str = "docker"
    mechanisms: dict = field(default_factory=lambda: {
        **LOCAL_MECHANISMS,
        "kill_unit": "docker kill; a new container after down_for",
        "kill_syncer": "docker kill; a new container restores the checkpoint",
        "pause_unit": "docker pause / unpause (cgroup freezer)",
        "slow_unit": "docker update: CPU quota"})
    placement: dict = field(default_factory=dict)  # unit -> engine URL
    spares: dict = field(default_factory=dict)  # (role, engine URL) -> its warm spares (Spare), oldest first
    made: int = 0  # spares started so far (their names: spare-ROLE-N)
    _clients: dict = field(default_factory=dict)  # engine URL -> client
    _image_ref: str = ""
    images: dict = field(default_factory=dict)  # engine URL -> the image its units run
    shipped: Shipped | None = None  # the units on engines that share no files (docker_remote.py)
    _mounts: list = field(default_factory=list)
    _sigstopped: set = field(default_factory=set)  # paused by the SIGSTOP fallback
    _held: dict = field(default_factory=dict)  # unit -> a control message for when it is resumed

    def prepare(self, cluster: LocalCluster) -> None:
        """The engines, the image and the mounts, before the cluster lays out its run."""
        if self.engines:
            for url in self.engines:
                if url not in self._clients:
                    self._clients[url] = engine(url=url)
            self.docker_client = self._clients[self.engines[0]]
        else:
            if self.docker_client is None:
                self.docker_client = engine()
            self._clients = {self._engine_name(self.docker_client): self.docker_client}
        urls = list(self._clients)
        d = cluster.config["diloco"]
        self.placement = {f"learner-{i}": urls[i % len(urls)] for i in range(d["learners"])}
        cluster.run_dir = Path(cluster.run_dir).resolve()
        cluster.run_dir.mkdir(parents=True, exist_ok=True)
        JAX_CACHE.mkdir(parents=True, exist_ok=True)
        self.shipped = Shipped(cluster.run_dir)
        if self.image == "host":
            self._mounts = host_mounts()
        else:  # the image installed the package (docker/Dockerfile): nothing of the checkout mounted
            self._mounts = []
            self._image_ref = self.image
        for url, client in self._clients.items():  # imported (or shipped) once per engine
            if is_remote(url):  # another host: the runtime carries the code, nothing is mounted
                from diloco_chaos.harness.backends.docker_runtime import runtime
                self.shipped.runtimes[url] = runtime(client)
                self.images[url] = self.shipped.runtimes[url].image
            elif self.image == "host":
                self.images[url] = self._image_ref = host_image(client, self._mounts)
            else:
                self.images[url] = self.image
        self._image_ref = self._image_ref or next(iter(self.images.values()))
        # read-write: the run directory and the shared XLA compilation cache; a disk_full target's
        # small disk too (a bind of the run directory does not carry the tmpfs mounted inside it)
        disks = [(str(cluster.run_dir / "ckpt" / unit), False) for unit in {*cluster.small_disks, *cluster.fuse_disks}]
        if cluster.fuse_journal:  # the journals' FUSE layer (lost_writes)
            disks.append((str(cluster.run_dir / "journal"), False))
        self._mounts = [*self._mounts, (str(cluster.run_dir), False), (str(JAX_CACHE.resolve()), False), *disks]

    def backend_info(self, cluster: LocalCluster) -> dict:
        for shard in cluster.topology["shards"]:
            self.placement[shard] = next(iter(self._clients))
        return {"name": "docker", "image": self._image_ref, "engine": next(iter(self._clients)),
                "engines": list(self._clients), "placement": dict(self.placement), "cpus": self.cpus,
                "spares": list(cluster.spares), "images": dict(self.images),
                "shipped": [u for u in self._clients if is_remote(u)]}

    def shard_listen(self, cluster: LocalCluster) -> str:
        """Where the syncer shards listen: `cluster.listen` when their engine (the first) is
        this machine's, else the address the harness reaches that engine's host at (the
        link proxies connect there)."""
        first = next(iter(self._clients))
        return host_of(first) if is_remote(first) else cluster.listen

    @staticmethod
    def _engine_name(client) -> str:
        """The engine's URL as DOCKER_HOST would say it."""
        try:
            url = client.api.base_url
        except Exception:  # noqa: BLE001
            return "?"
        if url.startswith("http+docker://") and getattr(client.api, "_custom_adapter", None) is not None:
            sock = getattr(client.api._custom_adapter, "socket_path", None)
            if sock:
                return f"unix://{sock}"
        return url

    def client_of(self, name: str):
        """The client of the engine that runs unit `name`."""
        return self._clients[self.placement[name]]

    def start_spares(self, cluster: LocalCluster, delay_s: float = 0.0) -> None:
        """A warm spare container (trainer/units/spare.py, stdin kept open) for every role that keeps
        one (`cluster.spares`), on every engine that runs a unit of that role: a spare takes
        the identity of a unit on its own engine only, so a restarted unit stays on its host
        (its checkpoint, and later its data, are there)."""
        for role in cluster.spares:
            for url in dict.fromkeys(self.placement.get(n) or next(iter(self._clients))
                                     for n in cluster.members if cluster.members[n].role == role):
                if is_remote(url):  # (docker_remote.py: why not there)
                    continue
                pool = self.spares.setdefault((role, url), [])
                for k in range(cluster.spare_pool - len(pool)):  # staggered as on local (processes.py)
                    self.made += 1
                    name = f"spare-{role}-{self.made}"
                    c = self._run(cluster, url, role, name, "spare",
                                  ["diloco_chaos.trainer.units.spare", role, "--delay", str(delay_s + k * SPARE_DELAY_S),
                                   "--run-dir", str(cluster.run_dir), "--spare", name], log=f"{name}.log")
                    pool.append(Spare(name, ContainerProc(c)))

    def _hand_over(self, cluster: LocalCluster, spare: Spare, m) -> bool:
        """The spare container takes m's identity: one JSON line on its stdin, written through
        the engine (`docker attach`); False if it had exited (its stdout/ file says why)."""
        ready = spare.ready(cluster)
        if spare.proc.poll() is not None or not send_line(spare.proc.container, Spare.identity(m)):
            self._remove(spare.proc.container)
            return False
        spare.became(cluster, m, ready)
        return True

    @staticmethod
    def _remove(container) -> None:
        import docker

        try:
            container.remove(force=True)
        except docker.errors.APIError:
            pass

    def stop_all(self, cluster: LocalCluster) -> None:
        """Stops the units as on local (SIGTERM, a grace period, learners first), then
        removes every container of this run (by label, so also ones a failed spawn left)."""
        self.spares.clear()  # removed with the rest, by label
        try:
            self._stop_units(cluster)
            if self.shipped is not None and self.shipped.units:
                for m in cluster.members.values():
                    if m.proc is not None:
                        self.shipped.drain(m.proc.container)
                if errors := self.shipped.bring_home(cluster):
                    (cluster.run_dir / "stdout" / "checkpoints-home.log").write_text("\n".join(errors) + "\n")
        finally:
            if cluster.topology.get("run_id"):
                for url, client in self._clients.items():
                    remove_all(client, cluster.topology["run_id"])
                    if is_remote(url):
                        Shipped.remove_volumes(client, cluster.topology["run_id"])
            for m in cluster.members.values():
                m.proc = None

    def _stop_units(self, cluster: LocalCluster) -> None:
        """SIGTERM to every running unit, learners first, then the shards, each role given its
        GRACE_S to leave: a learner closes, writes its last lines and `done`, a shard makes its
        state durable (as on local); how each left is recorded (`record_stop`)."""
        import subprocess

        for role in ("learner", "syncer"):
            live = [m for m in cluster.members.values()
                    if m.role == role and m.proc is not None and m.proc.poll() is None]
            for m in live:
                try:
                    if m.paused:
                        self.resume(cluster, m)  # a frozen process cannot act on SIGTERM
                    m.proc.container.kill(signal="SIGTERM")
                except Exception:  # noqa: BLE001 - exited meanwhile, or the engine refused: removed below
                    pass
            deadline = time.monotonic() + GRACE_S[role]
            for m in live:
                try:
                    m.proc.wait(timeout=max(0.0, deadline - time.monotonic()))
                except subprocess.TimeoutExpired:
                    pass  # removed (SIGKILL) below
                cluster.record_stop(m, m.proc.returncode, GRACE_S[role])

    # unit control ----------------------------------------------------------------------
    def spawn(self, cluster: LocalCluster, m) -> ContainerProc:
        url = self.placement.get(m.name) or next(iter(self._clients))
        spare = take_spare(self.spares.get((m.role, url)), cluster)
        if spare is not None:
            self.start_spares(cluster, SPARE_DELAY_S)  # its replacement
            if self._hand_over(cluster, spare, m):
                return spare.proc
        m.start = "cold"
        module = "diloco_chaos.trainer.units.learner" if m.role == "learner" else "diloco_chaos.trainer.units.syncer"
        args = [module, "--run-dir", str(cluster.run_dir), "--id", m.name, "--incarnation", str(m.incarnation)]
        if is_remote(url):
            c = self.shipped.run(cluster, self._clients[url], url, m.role, m.name, str(m.incarnation), args,
                                 labels=self._labels(cluster, m.name, str(m.incarnation)), **self._limits())
        else:
            c = self._run(cluster, url, m.role, m.name, str(m.incarnation), args, log=f"{m.name}.{m.incarnation}.log")
        return ContainerProc(c)

    def control(self, cluster: LocalCluster, m, state: dict) -> None:
        """A control message: one JSON line on the container's stdin, through its engine
        (`docker attach`); to a paused unit, once it is resumed."""
        if m.proc is None or m.proc.poll() is not None:
            return  # (the cluster sends it again at the restart)
        if m.paused:
            self._held[m.name] = state
        elif not send_line(m.proc.container, json.dumps(state).encode() + b"\n"):
            self._held[m.name] = state  # refused (a freeze under way): with the resume, or the restart

    def _labels(self, cluster: LocalCluster, name: str, incarnation: str) -> dict:
        return {LABEL: cluster.topology["run_id"], UNIT_LABEL: name, "diloco-chaos.incarnation": incarnation}

    def _limits(self) -> dict:
        return {} if self.cpus is None else {"nano_cpus": int(self.cpus * 1e9)}

    def _run(self, cluster: LocalCluster, url: str, role: str, name: str, incarnation: str, args: list[str], *,
             log: str):
        """A container on engine `url` running `python -m ARGS...` for unit (or spare) `name`."""
        env = {k: v for k, v in os.environ.items() if k not in _ENV_DROP}
        env["PYTHONUNBUFFERED"] = "1"
        env.update(cluster.unit_env())  # the run secret: in the container's environment only
        unit_jax_env(env, role, cluster.slices, str(JAX_CACHE.resolve()))
        env["DILOCO_CHAOS_LOG"] = str(cluster.run_dir / "stdout" / log)
        env[CONTROL_ENV] = "stdin"  # the control messages (`control`)
        python = cluster.python if self.image == "host" else "python"
        # stdout/stderr to the run directory, as on local; `exec` keeps python the main process
        cmd = ["/bin/sh", "-c", 'exec "$@" >>"$DILOCO_CHAOS_LOG" 2>&1', "sh", python, "-m", *args]
        from docker.types import Mount

        run_id = cluster.topology["run_id"]
        return self._clients[url].containers.run(
            self.images[url], cmd, detach=True, name=f"dc-{run_id}-{name}-{incarnation}",
            environment=env, network_mode="host", init=False, stdin_open=True,
            working_dir=str(REPO) if self.image == "host" else str(cluster.run_dir),
            mounts=[Mount(target=p, source=p, type="bind", read_only=ro) for p, ro in self._mounts],
            labels=self._labels(cluster, name, incarnation), stop_signal="SIGTERM", **self._limits())

    def kill(self, cluster: LocalCluster, m) -> None:
        """`docker kill` (SIGKILL to the container: no chance to clean up), then removed."""
        import docker

        if m.proc is None:
            return
        c = m.proc.container
        try:
            if m.paused or m.proc.poll() is None:
                c.kill()
        except docker.errors.APIError:
            pass  # exited meanwhile
        m.proc.wait(timeout=30)
        self.shipped.drain(c)  # (another host's unit: its last lines, from the engine's log)
        try:
            c.remove(force=True)
        except docker.errors.APIError:
            pass
        m.proc = None
        m.paused = False

    def pause(self, cluster: LocalCluster, m) -> str | None:
        """`docker pause` (the cgroup freezer). Returns how the unit was paused: None for
        the freezer, or the fallback's words; a no-op on a unit that is not running (as
        SIGSTOP to no pid is on local): it may have exited since the last look.

        On cgroup v1 runc gives up on a freeze that does not settle within its retry loop
        ("OCI runtime pause failed: unable to freeze"), which happens on a loaded machine;
        it thaws the cgroup before it answers, so the unit is running and unharmed, and
        asking again works (measured here, 3 learners on 2 cores: 9 of 120 pauses refused
        once, each paused on the second ask; 0.10 s mean, 0.65 s worst). After
        PAUSE_TRIES refusals the engine stops the container's process instead (`docker kill
        --signal SIGSTOP`: this container's one process, python, with all its threads), so
        the fault still happens, the container way, and the log says which way."""
        import docker

        if m.proc is None:
            return None
        for attempt in range(PAUSE_TRIES):
            m.proc._refresh(force=True)
            if m.proc.returncode is not None:
                return None
            try:
                m.proc.container.pause()
                m.paused = True
                return None
            except docker.errors.APIError as e:
                if "freeze" not in str(e).lower():
                    m.proc._refresh(force=True)
                    if m.proc.returncode is None:
                        raise  # running, and refused for another reason: a real error
                    return None
                time.sleep(PAUSE_BACKOFF_S * (attempt + 1))
        m.proc.container.kill(signal="SIGSTOP")
        m.paused = True
        self._sigstopped.add(m.name)
        # The engine's kill returns once the signal is sent; on a loaded machine the
        # group stop takes effect a few milliseconds later, thread by thread. The fault
        # starts when the unit has stopped, so wait for it (where this host sees it).
        wait_job_state(m.proc.pid, m.proc.container.id, stopped=True)
        return PAUSE_FALLBACK

    def resume(self, cluster: LocalCluster, m) -> None:
        if m.proc is not None and m.paused:
            try:
                if m.name in self._sigstopped:
                    m.proc.container.kill(signal="SIGCONT")
                    wait_job_state(m.proc.pid, m.proc.container.id, stopped=False)
                else:
                    m.proc.container.unpause()
            except Exception:  # noqa: BLE001 - killed while paused
                pass
        m.paused = False
        self._sigstopped.discard(m.name)
        if (state := self._held.pop(m.name, None)) is not None:
            self.control(cluster, m, state)

    def set_speed(self, cluster: LocalCluster, m, fraction: float, period_s: float = 0.1) -> None:
        """Slower hardware: a CFS quota of `fraction` of the unit's CPU budget (`cpus`, or
        one core when the unit is unlimited: a learner of this miniature keeps about one
        core busy, so `fraction` of all the host's cores would often not slow it at all);
        fraction >= 1 restores the budget. `period_s` is not used: the CFS period is the kernel's."""
        if m.proc is None or m.proc.poll() is not None:
            return
        budget = self.cpus if self.cpus is not None else 1.0
        if fraction >= 1.0:
            quota = int(budget * CPU_PERIOD_US) if self.cpus is not None else -1
        else:
            quota = max(1000, int(fraction * budget * CPU_PERIOD_US))
        m.proc.container.update(cpu_period=CPU_PERIOD_US, cpu_quota=quota)

    def pid(self, m) -> int | None:
        """The container's main process (python) as the host sees it, while it runs."""
        if m.proc is None or m.proc.poll() is not None:
            return None
        return m.proc.pid
