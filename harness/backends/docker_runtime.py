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
    repo/    empty: the mount point of the second volume, `diloco-chaos-code-<sha16>`,
             the project's packages (REPO_PACKAGES) without __pycache__ (a .pyc there
             changes with every run; PYTHONDONTWRITEBYTECODE since the volumes are
             read-only). Its own volume, named by its own files: an edit of the code
             ships a few MB, not the 700 MB of Python and JAX again.
    .complete  written last in each volume, by a separate put; a volume without it (a
             fill that was interrupted) is removed and filled again.
  The volume's tar keeps each file's mtime: the site-packages' and stdlib's __pycache__
  are shipped (start-up time) and a .pyc is valid only for its source's mtime.

Which site-packages. Decided by evidence, `probe()`: a fresh interpreter imports
trainer.learner, trainer.syncer, trainer.spare, trainer.checkpoint, trainer.plugins and
examples.flax_mlp (when Flax is installed), saves and restores an orbax checkpoint and
runs a jitted JAX op, then lists the distributions whose files it loaded from
site-packages. UNIT_DISTRIBUTIONS is that list (suites/docker/test_runtime_docker.py
checks it still covers the probe); `runtime(client, extra=...)` ships more, e.g. for a
user task (docs/TASKS.md) that imports another package. A shipped distribution brings
every file its RECORD lists (its dist-info, numpy.libs/ ...). Never shipped, even when
asked: the harness-only ones (NEVER_SHIP: pytest, playwright, vl-convert, altair,
hypothesis, pip, setuptools, docker, the project's own editable install). JAX declares
scipy but imports it only in its test helpers: not shipped (113 MB).

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

The dropped parts of the standard library keep their .py files: the `corpus` task (and
examples/flax_mlp.py) reads every stdlib .py in sorted path order, so a unit on another
host trains on the same bytes as one here (the corpus hash in the log says so).
"""
from __future__ import annotations

import hashlib
import io
import json
import os
import re
import stat
import subprocess
import sys
import sysconfig
import tarfile
import threading
import time
from dataclasses import dataclass, field
from pathlib import Path
from typing import Iterable, Iterator

from harness.backends.docker_engine import REPO

ROOT = "/opt/diloco-chaos"
IMAGE_REPO = "diloco-chaos-runtime"
VOLUME_PREFIX = "diloco-chaos-runtime-"
CODE_PREFIX = "diloco-chaos-code-"
LABEL = "diloco-chaos.runtime"  # on the image and the volume: =<sha16>
HELPER_LABEL = "diloco-chaos.runtime-helper"  # on the fill / check containers: =<sha16>
ROLE_LABEL = "diloco-chaos.runtime-helper.role"  # "fill" or "check"
SINCE_LABEL = "diloco-chaos.runtime-helper.since"  # time.time() at its creation
COMPLETE = ".complete"
FILL_WAIT_S = 600.0  # a fill helper younger than this is another process's fill under way
PY = f"python{sys.version_info.major}.{sys.version_info.minor}"

# probe() on this project (jax 0.10, orbax-checkpoint 0.12, flax 0.12): the distributions
# units load from site-packages. flax: examples/flax_mlp.py; shipped only where installed.
UNIT_DISTRIBUTIONS = (
    "absl-py", "etils", "flax", "humanize", "jax", "jaxlib", "ml-dtypes", "msgpack", "numpy",
    "opt-einsum", "optax", "orbax-checkpoint", "protobuf", "pygments", "pyyaml", "rich",
    "simplejson", "tensorstore", "treescope", "typing-extensions", "uvloop")
NEVER_SHIP = {"pytest", "playwright", "vl-convert-python", "altair", "hypothesis", "pip", "setuptools",
              "docker", "diloco-chaos"}
REPO_PACKAGES = ("trainer", "faults", "harness", "reports", "diloco_chaos", "examples")
REPO_SKIP = {"__pycache__", ".git", ".venv", "runs", ".cache", ".tools", "node_modules"}
STDLIB_SKIP = {"test", "idlelib", "tkinter", "turtledemo", "ensurepip"}  # (but their .py files)

_lock = threading.Lock()


@dataclass
class Runtime:
    """What a container needs to run the units from the runtime: `image` and the
    `mounts()`, then `python -m trainer.learner ...` in `workdir` with `env`."""

    image: str
    volume: str  # Python and the packages, at ROOT
    code: str = ""  # the project's packages, at ROOT/repo (its own volume: an edit ships only it)
    python: str = f"{ROOT}/python/bin/{PY}"
    workdir: str = f"{ROOT}/repo"
    env: dict = field(default_factory=lambda: {
        "PYTHONPATH": f"{ROOT}/repo",
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
                *([Mount(target=f"{ROOT}/repo", source=self.code, type="volume", read_only=True)] if self.code else [])]


def runtime(client, extra: Iterable[str] = ()) -> Runtime:
    """The runtime on `client`'s engine: imports the image and fills the volume the first
    time, finds both by name after. `extra`: distributions to ship besides
    UNIT_DISTRIBUTIONS."""
    with _lock:
        files, code = volume_files(extra), code_files()
        image_tar = _image_tar([src for _, src, st in files if _is_elf_candidate(src, st)])
        sha = hashlib.sha256(image_tar + _manifest(files)).hexdigest()[:16]
        code_sha = hashlib.sha256(_manifest(code)).hexdigest()[:16]
        rt = Runtime(image=f"{IMAGE_REPO}:{sha}", volume=f"{VOLUME_PREFIX}{sha}", code=f"{CODE_PREFIX}{code_sha}")
        _ensure_image(client, rt.image, sha, image_tar)
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


# ------------------------------------------------------------------ the volume's files
def _walk(src: Path, name: str, skip) -> Iterator[tuple[str, Path, os.stat_result]]:
    """(name, path, lstat) of `src` (named `name`) and everything under it, sorted;
    `skip(child's name)` leaves a child (and what is under it) out."""
    st = src.lstat()
    yield name, src, st
    if stat.S_ISDIR(st.st_mode):
        for child in sorted(os.listdir(src)):
            rel = f"{name}/{child}"
            if not skip(rel):
                yield from _walk(src / child, rel, skip)


def _norm(dist: str) -> str:
    return re.sub(r"[-_.]+", "-", dist).lower()


def _site_entries(site: Path, extra: Iterable[str]) -> list[str]:
    """The site-packages entries (top-level names; single files under __pycache__) of the
    shipped distributions: every file their RECORDs list."""
    import importlib.metadata as md

    wanted = {_norm(d) for d in (*UNIT_DISTRIBUTIONS, *extra)} - NEVER_SHIP
    out: set[str] = set()
    for dist in md.distributions(path=[str(site)]):
        if _norm(dist.metadata["Name"] or "") not in wanted:
            continue
        for f in dist.files or ():
            parts = Path(f).parts
            if parts and parts[0] != "..":  # scripts in ../../bin are not needed
                out.add("/".join(parts[:2]) if parts[0] == "__pycache__" else parts[0])
    return sorted(e for e in out if (site / e).exists())


def volume_files(extra: Iterable[str] = ()) -> list[tuple[str, Path, os.stat_result]]:
    """(name in the volume, host path, lstat) of everything the volume holds, parents
    before children."""
    base, site = Path(sys.base_prefix), Path(sysconfig.get_paths()["purelib"])
    stdlib = Path(sysconfig.get_paths()["stdlib"])
    lib = f"python/lib/{PY}"
    files = [("python", base, base.lstat()), ("python/bin", base / "bin", (base / "bin").lstat())]
    for exe in (PY, f"python{sys.version_info.major}", "python"):
        if (base / "bin" / exe).exists():
            files.append((f"python/bin/{exe}", base / "bin" / exe, (base / "bin" / exe).lstat()))
    files.append(("python/lib", base / "lib", (base / "lib").lstat()))
    for so in sorted((base / "lib").glob("libpython3*.so*")):
        files.append((f"python/lib/{so.name}", so, so.lstat()))

    def stdlib_skip(rel: str) -> bool:
        parts = rel[len(lib) + 1:].split("/")
        # (their .py files stay: the corpus task reads every stdlib .py in path order)
        return (parts[0] == "site-packages"
                or parts[0] in STDLIB_SKIP and not parts[-1].endswith(".py")
                and not (stdlib / "/".join(parts)).is_dir()
                or parts[0] == "lib-dynload" and parts[-1].startswith("_tkinter")
                or parts[0].startswith("config-") and parts[-1].endswith((".a", ".o")))

    files += _walk(stdlib, lib, stdlib_skip)
    files.append((f"{lib}/site-packages", site, site.lstat()))
    site_entries = _site_entries(site, extra)
    if any(e.startswith("__pycache__/") for e in site_entries):
        files.append((f"{lib}/site-packages/__pycache__", site / "__pycache__", (site / "__pycache__").lstat()))
    for e in site_entries:
        files += _walk(site / e, f"{lib}/site-packages/{e}", lambda rel: False)
    files.append(("repo", REPO, REPO.lstat()))  # (empty: the code volume's mount point)
    return files


def code_files() -> list[tuple[str, Path, os.stat_result]]:
    """(name in the code volume, host path, lstat) of the project's packages."""
    files = []
    for pkg in REPO_PACKAGES:
        if (REPO / pkg).is_dir():
            files += _walk(REPO / pkg, pkg, lambda rel: rel.rsplit("/", 1)[-1] in REPO_SKIP)
    return files


def _tarinfo(name: str, src: Path, st: os.stat_result, mtime: bool) -> tarfile.TarInfo:
    ti = tarfile.TarInfo(name)
    ti.mode, ti.mtime = stat.S_IMODE(st.st_mode), int(st.st_mtime) if mtime else 0
    if stat.S_ISLNK(st.st_mode):
        ti.type, ti.linkname = tarfile.SYMTYPE, os.readlink(src)
    elif stat.S_ISDIR(st.st_mode):
        ti.type = tarfile.DIRTYPE
    else:
        ti.size = st.st_size
    return ti


def _tar_stream(files: list[tuple[str, Path, os.stat_result]]) -> Iterator[bytes]:
    """The tar of `files`, generated as it is sent (one file's chunk in memory at a time)."""
    for name, src, st in files:
        ti = _tarinfo(name, src, st, mtime=True)
        yield ti.tobuf(tarfile.GNU_FORMAT, "utf-8", "surrogateescape")
        if ti.isreg():
            left = ti.size
            with open(src, "rb") as f:
                while left > 0:
                    chunk = f.read(min(left, 1 << 20)) or b"\0" * min(left, 1 << 20)  # shrank meanwhile
                    left -= len(chunk)
                    yield chunk
            if ti.size % tarfile.BLOCKSIZE:
                yield b"\0" * (tarfile.BLOCKSIZE - ti.size % tarfile.BLOCKSIZE)
    yield b"\0" * (2 * tarfile.BLOCKSIZE)


# ------------------------------------------------------------------ the image
def _is_elf_candidate(src: Path, st: os.stat_result) -> bool:
    name = src.name
    return stat.S_ISREG(st.st_mode) and (name == PY or name.endswith(".so") or ".so." in name)


def _libraries(binaries: list[Path]) -> list[str]:
    """The shared libraries (and the loader) `ldd` says `binaries` need, outside the
    directories the volume ships."""
    shipped = (str(Path(sys.base_prefix).resolve()) + "/", str(Path(sysconfig.get_paths()["purelib"]).resolve()) + "/")
    found: set[str] = set()
    for i in range(0, len(binaries), 200):
        out = subprocess.run(["ldd", *map(str, binaries[i:i + 200])], capture_output=True, text=True).stdout
        for line in out.splitlines():
            line = line.strip()
            if "=>" in line:
                path = line.split("=>", 1)[1].strip().split(" (", 1)[0].strip()
            elif line.startswith("/") and " (0x" in line:
                path = line.split(" (", 1)[0]
            else:
                continue
            if path.startswith("/") and not str(Path(path).resolve()).startswith(shipped):
                found.add(path)
    return sorted(found)


def _image_tar(binaries: list[Path]) -> bytes:
    """The runtime image's root filesystem (see the module docstring). Deterministic."""
    entries: dict[str, tuple[tarfile.TarInfo, bytes | None]] = {}

    def add(name: str, kind: bytes = tarfile.DIRTYPE, mode: int = 0o755, data: bytes | None = None,
            link: str = "") -> None:
        if name not in entries:
            ti = tarfile.TarInfo(name)
            ti.type, ti.mode, ti.mtime, ti.linkname = kind, mode, 0, link
            ti.size = len(data) if data is not None else 0
            entries[name] = (ti, data)

    def add_host(path: str, depth: int = 0) -> None:
        """`path` with every directory and symlink on the way, as on this host."""
        if depth > 40:
            raise RuntimeError(f"too many symlinks resolving {path}")
        parts, cur = Path(path).parts[1:], "/"
        for i, part in enumerate(parts):
            p = os.path.join(cur, part)
            if os.path.islink(p):
                add(p[1:], tarfile.SYMTYPE, 0o777, link=os.readlink(p))
                return add_host(os.path.normpath(os.path.join(cur, os.readlink(p), *parts[i + 1:])), depth + 1)
            if i < len(parts) - 1:
                add(p[1:])
            else:
                add(p[1:], tarfile.REGTYPE, stat.S_IMODE(os.stat(p).st_mode), Path(p).read_bytes())
            cur = p

    for top in ("bin", "sbin", "lib", "lib32", "lib64", "libx32"):
        if os.path.islink(f"/{top}"):
            add(top, tarfile.SYMTYPE, 0o777, link=os.readlink(f"/{top}"))
    for path in (*_libraries([*binaries, Path("/bin/sh")]), "/bin/sh"):
        add_host(path)
    for d in ("proc", "sys", "dev", "run", "etc", "usr", "usr/bin", "opt", ROOT[1:]):
        add(d)
    add("root", mode=0o700)
    add("tmp", mode=0o1777)
    for name, text in (("etc/passwd", "root:x:0:0:root:/root:/bin/sh\n"), ("etc/group", "root:x:0:\n"),
                       ("etc/nsswitch.conf", "passwd: files\ngroup: files\nhosts: files dns\n"),
                       ("etc/hosts", "127.0.0.1 localhost\n::1 localhost\n")):
        add(name, tarfile.REGTYPE, 0o644, text.encode())
    buf = io.BytesIO()
    with tarfile.open(fileobj=buf, mode="w", format=tarfile.GNU_FORMAT) as tar:
        for name in sorted(entries):
            ti, data = entries[name]
            tar.addfile(ti, io.BytesIO(data) if data is not None else None)
    return buf.getvalue()


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
        helper.put_archive(ROOT, _tar_stream(files))
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


def probe(timeout_s: float = 300.0) -> list[str]:
    """The distributions (normalized names) a fresh interpreter loads from site-packages
    doing what units do (the module docstring); the evidence behind UNIT_DISTRIBUTIONS."""
    code = r"""
import importlib.metadata, importlib.util, sys, sysconfig, tempfile
import jax, jax.numpy as jnp
import trainer.learner, trainer.syncer, trainer.spare, trainer.checkpoint, trainer.plugins
if importlib.util.find_spec("flax"):
    import examples.flax_mlp
with tempfile.TemporaryDirectory() as d, trainer.checkpoint.Checkpointer(d) as c:
    c.save(1, {"w": jnp.ones(3), "n": 1}); c.wait(); assert c.restore()["n"] == 1
assert float(jax.jit(lambda x: x * 2)(jnp.ones(3)).sum()) == 6.0
site = sysconfig.get_paths()["purelib"].rstrip("/") + "/"
tops = {f[len(site):].split("/")[0].removesuffix(".py") for m in list(sys.modules.values())
        if (f := getattr(m, "__file__", None) or "").startswith(site)}
tops = {t for t in tops if not t.startswith("__editable__")}  # the project: PYTHONPATH in containers
owners = importlib.metadata.packages_distributions()
print("\n".join(sorted({d for t in tops for d in owners.get(t, ["?" + t])})))
"""
    env = {**os.environ, "PYTHONPATH": str(REPO), "JAX_PLATFORMS": "cpu"}
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, env=env,
                         cwd=str(REPO), timeout=timeout_s, check=True).stdout
    return sorted({_norm(line) for line in out.split()})
