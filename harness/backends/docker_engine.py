"""The Docker engine and the registry-free host image, for the `docker` backend
(harness/backends/docker_cluster.py): which engine to talk to (DOCKER_HOST, or a private
dockerd this run starts and stops), the image a container runs (`docker import` of an
empty root filesystem, the host's Python and the project bind-mounted read-only,
named by content), and removing what any run left. docs/DOCKER.md."""
from __future__ import annotations

import contextlib
import hashlib
import io
import json
import os
import shutil
import subprocess
import sys
import tarfile
from pathlib import Path

from diloco_chaos.harness.extras import require

LABEL = "diloco-chaos.run"
HOST_IMAGE_REPO = "diloco-chaos-host"
REPO = Path(__file__).resolve().parents[2]

def engine(timeout_s: float = 60.0, url: str | None = None):
    """A client for the engine at `url` (a DOCKER_HOST URL), or the one DOCKER_HOST names;
    raises `docker.errors.DockerException` when none answers (a UserError naming the extra
    when the `docker` package is not installed)."""
    docker = require("docker", "docker")

    if url is None:
        c = docker.from_env(timeout=int(timeout_s))
    else:
        c = docker.DockerClient(base_url=url, timeout=int(timeout_s), use_ssh_client=url.startswith("ssh://"))
    c.ping()
    return c


def reachable() -> str | None:
    """None when an engine answers, else why not (for skip messages)."""
    try:
        engine(timeout_s=5).close()
        return None
    except Exception as e:  # noqa: BLE001 - any failure means "not reachable"
        return f"no Docker engine at {os.environ.get('DOCKER_HOST', 'the default socket')}: {e}"


@contextlib.contextmanager
def engine_for_run():
    """Yields DOCKER_HOST of a reachable engine. When none answers and `dockerd` is
    installed (scripts/install-docker.sh), starts the private one (scripts/dockerd.sh,
    under /tmp/diloco-dockerd) for the duration of the block and stops it afterwards,
    Ctrl-C included. Raises RuntimeError, saying what to do, when neither works."""
    if reachable() is None:
        yield os.environ.get("DOCKER_HOST", "unix:///var/run/docker.sock")
        return
    script = REPO / "scripts" / "dockerd.sh"
    status = subprocess.run(["bash", str(script), "status"], capture_output=True, text=True, timeout=30)
    if status.returncode == 0:  # started by someone else: use it, leave it running
        os.environ["DOCKER_HOST"] = status.stdout.strip().splitlines()[-1]
        yield os.environ["DOCKER_HOST"]
        return
    if shutil.which("dockerd") is None:
        raise RuntimeError("the docker backend needs a Docker engine: set DOCKER_HOST, or install one "
                           "(bash scripts/install-docker.sh) and this run starts it (docs/DOCKER.md)")
    r = subprocess.run(["bash", str(script), "start"], capture_output=True, text=True, timeout=120)
    if r.returncode != 0:
        raise RuntimeError(f"scripts/dockerd.sh start failed: {r.stderr.strip()[-500:]}")
    old = os.environ.get("DOCKER_HOST")
    os.environ["DOCKER_HOST"] = r.stdout.strip().splitlines()[-1]
    try:
        yield os.environ["DOCKER_HOST"]
    finally:
        subprocess.run(["bash", str(script), "stop"], capture_output=True, timeout=120)
        if old is None:
            os.environ.pop("DOCKER_HOST", None)
        else:
            os.environ["DOCKER_HOST"] = old


# ------------------------------------------------------------------ the host image
def host_mounts(extra: tuple[str, ...] = ()) -> list[tuple[str, bool]]:
    """(path, read_only) binds that let a container run this host's Python and project.
    Top-level directories that are symlinks (merged /usr) become symlinks in the image."""
    ro: list[str] = []
    for top in ("usr", "etc", "bin", "sbin", "lib", "lib32", "lib64", "libx32", "opt"):
        p = Path("/") / top
        if p.is_dir() and not p.is_symlink():
            ro.append(str(p))
    for p in (sys.base_prefix, sys.prefix, str(REPO), *extra):
        p = str(Path(p).resolve())
        if not any(p == r or p.startswith(r.rstrip("/") + "/") for r in ro):
            ro.append(p)
    return [(p, True) for p in sorted(set(ro))]


def rootfs_tar(mounts: list[tuple[str, bool]]) -> bytes:
    """A root filesystem with nothing in it but mount points, /tmp, and the host's
    top-level symlinks (/bin -> usr/bin on merged-/usr systems). Deterministic bytes."""
    buf = io.BytesIO()
    with tarfile.open(fileobj=buf, mode="w", format=tarfile.GNU_FORMAT) as tar:
        seen: set[str] = set()

        def add_dir(path: str, mode: int = 0o755) -> None:
            parts = Path(path).relative_to("/").parts
            for i in range(1, len(parts) + 1):
                name = "/".join(parts[:i])
                if name in seen:
                    continue
                seen.add(name)
                ti = tarfile.TarInfo(name)
                ti.type, ti.mode, ti.mtime = tarfile.DIRTYPE, mode if i == len(parts) else 0o755, 0
                tar.addfile(ti)

        for d in ("/proc", "/sys", "/dev", "/root", "/run", "/var", "/work"):
            add_dir(d)
        add_dir("/tmp", 0o1777)
        for top in ("bin", "sbin", "lib", "lib32", "lib64", "libx32"):
            p = Path("/") / top
            if p.is_symlink():
                ti = tarfile.TarInfo(top)
                ti.type, ti.linkname, ti.mtime = tarfile.SYMTYPE, os.readlink(p), 0
                tar.addfile(ti)
                seen.add(top)
        for path, _ in mounts:
            if path.strip("/") not in seen:
                add_dir(path)
    return buf.getvalue()


def host_image(client, mounts: list[tuple[str, bool]]) -> str:
    """`diloco-chaos-host:<sha>`: imported (no registry) once per engine, named by content."""
    import docker

    tar = rootfs_tar(mounts)
    sha = hashlib.sha256(tar + json.dumps(mounts).encode()).hexdigest()[:16]
    ref = f"{HOST_IMAGE_REPO}:{sha}"
    try:
        client.images.get(ref)
    except docker.errors.ImageNotFound:
        client.api.import_image_from_data(tar, repository=HOST_IMAGE_REPO, tag=sha)
        client.images.get(ref)
    return ref


def remove_all(client=None, run_id: str | None = None) -> int:
    """Removes every diloco-chaos container (of one run, or of all); returns how many."""
    client = client or engine()
    flt = f"{LABEL}={run_id}" if run_id else LABEL
    n = 0
    for c in client.containers.list(all=True, filters={"label": flt}):
        try:
            c.remove(force=True)
            n += 1
        except Exception:  # noqa: BLE001
            pass
    return n
