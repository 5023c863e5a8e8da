"""The self-contained runtime for containers on engines that share nothing with this host
but the network (tcp:// or ssh:// DOCKER_HOSTs): this host's Python, the packages the
units import and the project's code, carried to the engine instead of bind-mounted.

Why two parts. The image `host` of harness/backends/docker_engine.py is an empty root
filesystem and bind-mounts the host's /usr, the Python install, the virtualenv and the
repository: that only works when the engine runs on this machine. Putting the ~700 MB
of Python, JAX and code into an image would work anywhere, but the engines use the vfs
storage driver, which gives every container a full copy of its image's root
filesystem: 700 MB copied per container start. So the runtime is split:

- IMAGE `diloco-chaos-runtime:<sha16>`, a few MB: imported (`docker import`, no
  registry, as `host_image` is) from a tar of the dynamic loader and the system shared
  libraries (outside the Python prefix) that the Python binary and every `.so` file of
  the runtime need, as `ldd` lists them on this host, each with the symlinks on its path
  (/lib -> usr/lib on merged-/usr systems) so the loader finds it at the same path;
  `/bin/sh` (docker_cluster wraps each unit in `sh -c 'exec ... >>log'`); empty /tmp,
  /proc, /sys, /dev, /run, /root; a minimal /etc (root in passwd and group, nsswitch,
  hosts); and the mount point /opt/diloco-chaos. Its tar bytes are deterministic
  (sorted, mtime 0, owner root), so the same host gives the same name.
- VOLUME `diloco-chaos-runtime-<sha16>`, filled once per engine and mounted read-only
  at /opt/diloco-chaos by every container (a volume is shared, not copied):
    python/  a copy of `sys.base_prefix`: bin/python3.11 (+ python3, python), the
             libpython shared library and the standard library, without the parts no
             unit uses: all but the .py files of the top-level test, idlelib, tkinter,
             turtledemo, ensurepip (lib-dynload/_tkinter would pull X11 into the image,
             and the `corpus` task reads every .py), and the static
             libpython3.11.a / python.o of config-3.11-*. The base prefix's own
             site-packages stays empty; into it goes the part of the virtualenv's
             site-packages that units use (so .pth files and importlib.metadata work as
             in a plain install, no virtualenv needed).
    code/    empty: the mount point of the second volume, `diloco-chaos-code-<sha16>`,
             the package `diloco_chaos` in its installed (wheel) layout, its subpackages
             under it (runtime_files.py `code_files`), without __pycache__ (a .pyc there
             changes with every run; PYTHONDONTWRITEBYTECODE since the volumes are
             read-only). Its own volume, named by its own files: an edit of the code
             ships a few MB, not the 700 MB of Python and JAX again.
    .complete  written last in each volume, by a separate put; a volume without it (a
             fill that was interrupted) is removed and filled again.
  What goes in, and which site-packages: harness/backends/runtime_files.py.

The name. sha16 = sha256 over the image tar's bytes plus a cheap manifest of the
volume's files (relative path, size, mtime_ns; 700 MB are not read to name them), so a
changed library or package gives a new image and volume, and the code volume is named
the same way by the project's files alone (an edit: a new code volume); old ones stay
until `remove_runtime`, so runs of another checkout on the same engine keep theirs.

Filling. A helper container is created (never started) from the runtime image with the
volume mounted read-write; `put_archive` streams the tar into the volume (the engine
mounts a created container's volumes for archive calls), generated file by file as it
is sent, then `.complete`; the helper is removed. A second `runtime()` on the same
engine finds the image and the complete volume by name (one short-lived container looks
for `.complete`). Calls in one process are serialized (a lock); a second process that
finds a fill under way (its helper, younger than FILL_WAIT_S) waits for it.
"""
from __future__ import annotations

import hashlib
import io
import json
import tarfile
import threading
import time
from dataclasses import dataclass, field
from typing import Iterable

from diloco_chaos.harness.backends.runtime_files import PY, ROOT, code_files, image_tar, is_elf_candidate, tar_stream, volume_files

IMAGE_REPO = "diloco-chaos-runtime"
VOLUME_PREFIX = "diloco-chaos-runtime-"
CODE_PREFIX = "diloco-chaos-code-"
LABEL = "diloco-chaos.runtime"  # on the image and the volume: =<sha16>
HELPER_LABEL = "diloco-chaos.runtime-helper"  # on the fill / check containers: =<sha16>
ROLE_LABEL = "diloco-chaos.runtime-helper.role"  # "fill" or "check"
SINCE_LABEL = "diloco-chaos.runtime-helper.since"  # time.time() at its creation
COMPLETE = ".complete"
FILL_WAIT_S = 600.0  # a fill helper younger than this is another process's fill under way

_lock = threading.Lock()


@dataclass
class Runtime:
    """What a container needs to run the units from the runtime: `image` and the
    `mounts()`, then `python -m diloco_chaos.trainer.units.learner ...` in `workdir` with `env`."""

    image: str
    volume: str  # Python and the packages, at ROOT
    code: str = ""  # the package diloco_chaos, at ROOT/code (its own volume: an edit ships only it)
    python: str = f"{ROOT}/python/bin/{PY}"
    workdir: str = f"{ROOT}/code"
    env: dict = field(default_factory=lambda: {
        "PYTHONPATH": f"{ROOT}/code",  # the package's own volume: where it is installed here
        "PYTHONDONTWRITEBYTECODE": "1",  # the volume is read-only
        "PYTHONUTF8": "1",  # no locale data in the image
        "LD_LIBRARY_PATH": f"{ROOT}/python/lib",  # python3.11's RUNPATH is the host's prefix
        "HOME": "/root",
        "PATH": f"{ROOT}/python/bin:/usr/bin:/bin"})

    @property
    def sha(self) -> str:
        return self.image.rsplit(":", 1)[1]

    def mounts(self) -> list:
        from docker.types import Mount

        return [Mount(target=ROOT, source=self.volume, type="volume", read_only=True),
                *([Mount(target=f"{ROOT}/code", source=self.code, type="volume", read_only=True)] if self.code else [])]


def runtime(client, extra: Iterable[str] = ()) -> Runtime:
    """The runtime on `client`'s engine: imports the image and fills the volume the first
    time, finds both by name after. `extra`: distributions to ship besides
    UNIT_DISTRIBUTIONS."""
    with _lock:
        files, code = volume_files(extra), code_files()
        root_fs = image_tar([src for _, src, st in files if is_elf_candidate(src, st)])
        sha = hashlib.sha256(root_fs + _manifest(files)).hexdigest()[:16]
        code_sha = hashlib.sha256(_manifest(code)).hexdigest()[:16]
        rt = Runtime(image=f"{IMAGE_REPO}:{sha}", volume=f"{VOLUME_PREFIX}{sha}", code=f"{CODE_PREFIX}{code_sha}")
        _ensure_image(client, rt.image, sha, root_fs)
        _ensure_volume(client, rt.image, rt.volume, sha, files)
        _ensure_volume(client, rt.image, rt.code, code_sha, code)
        return rt


def _manifest(files) -> bytes:
    return json.dumps([(name, st.st_size, st.st_mtime_ns) for name, _, st in files]).encode()


def remove_runtime(client, sha: str | None = None) -> int:
    """Removes the runtime helper containers, volumes and images on the engine (of one
    `sha`, or all); those in use by a container stay. Returns how many were removed."""
    label = f"{LABEL}={sha}" if sha else LABEL
    n = 0
    for c in client.containers.list(all=True, filters={"label": f"{HELPER_LABEL}={sha}" if sha else HELPER_LABEL}):
        n += _try(lambda: c.remove(force=True))
    for v in client.volumes.list(filters={"label": label}):
        n += _try(lambda: v.remove())
    for img in client.images.list(filters={"label": label}):
        n += _try(lambda: client.images.remove(img.id))
    return n


def _try(action) -> int:
    import docker

    try:
        action()
        return 1
    except docker.errors.APIError:
        return 0


def _ensure_image(client, ref: str, sha: str, tar: bytes) -> None:
    import docker

    try:
        client.images.get(ref)
    except docker.errors.ImageNotFound:
        client.api.import_image_from_data(tar, repository=IMAGE_REPO, tag=sha, changes=[f"LABEL {LABEL}={sha}"])
        client.images.get(ref)


# ------------------------------------------------------------------ the volume on the engine
def _helper(client, image: str, volume: str, sha: str, role: str):
    """A created (never started) container with `volume` at ROOT: read-write to fill it."""
    from docker.types import Mount

    return client.containers.create(
        image, [f"{ROOT}/python/bin/{PY}"], network_disabled=True,
        mounts=[Mount(target=ROOT, source=volume, type="volume", read_only=role != "fill")],
        labels={HELPER_LABEL: sha, ROLE_LABEL: role, SINCE_LABEL: f"{time.time():.0f}"})


def _complete(client, image: str, volume: str, sha: str) -> bool:
    """Whether the volume holds `.complete` (looked up through a created container)."""
    import docker

    c = _helper(client, image, volume, sha, "check")
    try:
        stream, _ = c.get_archive(f"{ROOT}/{COMPLETE}")
        for _ in stream:
            pass
        return True
    except docker.errors.NotFound:
        return False
    finally:
        c.remove(force=True)


def _fill_under_way(client, sha: str) -> bool:
    """Whether another process is filling this volume: a fill helper of this sha younger
    than FILL_WAIT_S. Older helpers (their process died) are removed."""
    busy = False
    for c in client.containers.list(all=True, filters={"label": f"{HELPER_LABEL}={sha}"}):
        try:
            age = time.time() - float(c.labels.get(SINCE_LABEL, "0"))
        except ValueError:
            age = FILL_WAIT_S
        if age >= FILL_WAIT_S:
            _try(lambda: c.remove(force=True))
        elif c.labels.get(ROLE_LABEL) == "fill":
            busy = True
    return busy


def _ensure_volume(client, image: str, volume: str, sha: str, files) -> None:
    import docker

    deadline = time.monotonic() + FILL_WAIT_S
    while True:
        try:
            vol = client.volumes.get(volume)
        except docker.errors.NotFound:
            vol = None
        if vol is not None and _complete(client, image, volume, sha):
            return
        if _fill_under_way(client, sha) and time.monotonic() < deadline:
            time.sleep(2.0)
            continue
        if vol is not None:
            vol.remove(force=True)  # an interrupted fill: start again
        break
    client.volumes.create(volume, labels={LABEL: sha})
    helper = _helper(client, image, volume, sha, "fill")
    try:
        helper.put_archive(ROOT, tar_stream(files))
        done = tarfile.TarInfo(COMPLETE)
        body = json.dumps({"sha": sha, "files": len(files),
                           "bytes": sum(st.st_size for _, _, st in files)}).encode() + b"\n"
        done.size, done.mode = len(body), 0o644
        buf = io.BytesIO()
        with tarfile.open(fileobj=buf, mode="w", format=tarfile.GNU_FORMAT) as tar:
            tar.addfile(done, io.BytesIO(body))
        helper.put_archive(ROOT, buf.getvalue())
    finally:
        helper.remove(force=True)
