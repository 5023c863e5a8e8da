"""Units on an engine that shares nothing with the harness but the network (issue 18).

An engine at a `unix://` socket is on this machine: its containers bind-mount the run
directory and the host's Python (harness/backends/docker_engine.py). Any other engine
(`tcp://`, `ssh://`) is treated as another host, and nothing of the harness's files
reaches it:

  the code        the runtime (harness/backends/docker_runtime.py): a small image and a
                  read-only volume holding Python, the dependencies and the package in its
                  installed layout, shipped once per engine through its API, named by content
  the run dir     one volume per unit, `dc-<run_id>-<unit>`, mounted at RUN_DIR: run.json
                  is put there before the container starts; the unit's checkpoints stay
                  there, so its next incarnation on the same engine restores them (a unit
                  never moves engine: `placement` is fixed for the run)
  event lines     the unit writes them on stdout and nothing else (trainer/units/shell.py
                  `stream_events`); a `Follower` thread per stream reads the engine's log
                  stream into the harness's logs/<unit>.<n>.jsonl, and stderr into
                  stdout/<unit>.<n>.log, so the live progress, the merge and the crash
                  tails read the same files as on one host
  control         kill_slice and corrupt: one JSON line on the unit's stdin through the
                  engine (`docker attach`), the whole control state each time; a restarted
                  unit is sent it again as it starts
  the end         the checkpoints are copied home (run_dir/ckpt/<unit>/: the global
                  model's evaluation reads the shards'), then the containers and the run's
                  volumes are removed; the runtime and the XLA cache volume stay (by content)

Warm spares are not kept on such an engine: a spare does not know, while it waits, which
unit's volume it will need. A restart there is a cold start (docs/DOCKER.md).
"""
from __future__ import annotations

import io
import os
import socket
import tarfile
import tempfile
import threading
from dataclasses import dataclass, field
from pathlib import Path
from urllib.parse import urlparse

from diloco_chaos.harness.backends.cluster import unit_jax_env
from diloco_chaos.harness.backends.docker_engine import LABEL
from diloco_chaos.trainer.units.shell import STREAM_ENV

RUN_DIR = "/dc/run"
JAX_CACHE_DIR = "/dc/jax-cache"
CACHE_VOLUME = "diloco-chaos-jax-cache"  # per engine, kept across runs (the XLA compilation cache)
# What of the harness's environment a unit on another host gets (besides the runtime's own).
_ENV_KEEP = ("DILOCO_CHAOS_", "JAX_", "XLA_")


def is_remote(url: str) -> bool:
    """An engine that does not share this machine's files: any but a unix socket."""
    return not url.startswith("unix://")


def host_of(url: str) -> str:
    """The address the harness reaches an engine's host at (tcp://10.0.0.5:2375 -> 10.0.0.5)."""
    host = urlparse(url).hostname
    if not host:
        raise ValueError(f"engine {url!r}: no host in the URL (tcp://HOST:PORT or ssh://USER@HOST)")
    return host


class Follower(threading.Thread):
    """One stream (stdout or stderr) of a container's log, appended to `path` line by line
    until the container ends (the engine closes the stream)."""

    def __init__(self, client, container_id: str, path: Path, stdout: bool):
        super().__init__(name=f"follow-{path.name}", daemon=True)
        self.client, self.cid, self.path, self.stdout = client, container_id, path, stdout

    def run(self) -> None:
        rest = b""
        with open(self.path, "ab") as f:
            try:
                for chunk in self.client.api.logs(self.cid, stdout=self.stdout, stderr=not self.stdout,
                                                  stream=True, follow=True):
                    lines, _, rest = (rest + chunk).rpartition(b"\n")
                    if lines:
                        f.write(lines + b"\n")
                        f.flush()
            except Exception:  # noqa: BLE001 - the container was removed, the engine went away
                pass
            if rest and not self.stdout:  # a partial event line is a torn write: dropped, as on a SIGKILL
                f.write(rest)


@dataclass
class Shipped:
    """The run's units on other hosts: their volumes, log followers and control messages."""

    run_dir: Path
    runtimes: dict = field(default_factory=dict)  # engine URL -> Runtime
    followers: dict = field(default_factory=dict)  # container id -> [Follower]
    units: dict = field(default_factory=dict)  # unit name -> (client, engine URL): whose volume where

    def volume(self, client, run_id: str, unit: str) -> str:
        import docker

        name = f"dc-{run_id}-{unit}"
        try:
            client.volumes.get(name)
        except docker.errors.NotFound:
            client.volumes.create(name, labels={LABEL: run_id, "diloco-chaos.unit": unit})
        return name

    def env(self, cluster, url: str, role: str) -> dict:
        env = {k: v for k, v in os.environ.items() if k.startswith(_ENV_KEEP)}
        env.update(self.runtimes[url].env)
        env.update(cluster.unit_env())  # the run secret: in the container's environment only
        env.update({"PYTHONUNBUFFERED": "1", STREAM_ENV: "1", "JAX_COMPILATION_CACHE_DIR": JAX_CACHE_DIR})
        return unit_jax_env(env, role, cluster.slices, JAX_CACHE_DIR)  # (the cache: its host's volume)

    def run(self, cluster, client, url: str, role: str, name: str, incarnation: str, args: list[str], *,
            labels: dict, **kwargs):
        """A container on another host running `python -m ARGS...` with RUN_DIR as its run
        directory, started, its log followed into the run directory."""
        from docker.types import Mount

        rt = self.runtimes[url]
        run_id = cluster.topology["run_id"]
        vol = self.volume(client, run_id, name)
        self.units[name] = (client, url)
        args = [RUN_DIR if a == str(cluster.run_dir) else a for a in args]
        c = client.containers.create(
            rt.image, [rt.python, "-m", *args], name=f"dc-{run_id}-{name}-{incarnation}",
            environment=self.env(cluster, url, role), network_mode="host", working_dir=rt.workdir,
            stdin_open=True, labels=labels, stop_signal="SIGTERM",
            mounts=[*rt.mounts(), Mount(target=RUN_DIR, source=vol, type="volume"),
                    Mount(target=JAX_CACHE_DIR, source=CACHE_VOLUME, type="volume")], **kwargs)
        c.put_archive(RUN_DIR, _tar({"run.json": (cluster.run_dir / "run.json").read_bytes()}))
        c.start()
        log = f"{name}.{incarnation}"
        self.followers[c.id] = [Follower(client, c.id, cluster.run_dir / "logs" / f"{log}.jsonl", stdout=True),
                                Follower(client, c.id, cluster.run_dir / "stdout" / f"{log}.log", stdout=False)]
        for f in self.followers[c.id]:
            f.start()
        return c

    def drain(self, container, timeout_s: float = 10.0) -> None:
        """Waits for the container's log to be read to its end (call once it has exited)."""
        for f in self.followers.pop(container.id, []):
            f.join(timeout_s)

    def bring_home(self, cluster) -> list[str]:
        """Copies every shipped unit's checkpoints into run_dir/ckpt/<unit>/ (the shards'
        are the global model the report evaluates); returns what could not be copied."""
        errors = []
        for name, (client, url) in self.units.items():
            c = None
            try:
                vol = self.volume(client, cluster.topology["run_id"], name)
                from docker.types import Mount
                c = client.containers.create(self.runtimes[url].image, ["true"],
                                             labels={LABEL: cluster.topology["run_id"]},
                                             mounts=[Mount(target=RUN_DIR, source=vol, type="volume")])
                try:
                    stream, _ = c.get_archive(f"{RUN_DIR}/ckpt")
                except Exception:  # noqa: BLE001 - no checkpoint yet: nothing to bring
                    continue
                with tempfile.TemporaryFile() as tmp:
                    for chunk in stream:
                        tmp.write(chunk)
                    tmp.seek(0)
                    with tarfile.open(fileobj=tmp) as tar:
                        tar.extractall(cluster.run_dir, filter="data")
            except Exception as e:  # noqa: BLE001 - reported in the run's header, never raised
                errors.append(f"{name}: {e!r}")
            finally:
                if c is not None:
                    try:
                        c.remove(force=True)
                    except Exception:  # noqa: BLE001
                        pass
        return errors

    @staticmethod
    def remove_volumes(client, run_id: str) -> None:
        for v in client.volumes.list(filters={"label": f"{LABEL}={run_id}"}):
            try:
                v.remove(force=True)
            except Exception:  # noqa: BLE001 - in use by a container being removed: the label finds it later
                pass


def send_line(container, line: bytes) -> bool:
    """`line` on the container's stdin, through its engine (`docker attach`; the container's
    stdin stays open after this attach ends); False if the engine refused (a paused one)."""
    import docker

    try:
        sock = container.attach_socket(params={"stdin": 1, "stream": 1})
        raw = getattr(sock, "_sock", sock)
        raw.sendall(line)
        try:
            raw.shutdown(socket.SHUT_WR)
        except OSError:
            pass
        sock.close()
        return True
    except (docker.errors.APIError, OSError):
        return False


def _tar(files: dict[str, bytes]) -> bytes:
    buf = io.BytesIO()
    with tarfile.open(fileobj=buf, mode="w") as tar:
        for name, data in files.items():
            ti = tarfile.TarInfo(name)
            ti.size, ti.mode = len(data), 0o644
            tar.addfile(ti, io.BytesIO(data))
    return buf.getvalue()
