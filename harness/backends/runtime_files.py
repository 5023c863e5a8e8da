"""What the runtime (harness/backends/docker_runtime.py) carries, read from this host: the
files of its two volumes (`volume_files`: Python and the packages units import;
`code_files`: the package `diloco_chaos` in its installed layout), the tar they travel in (`tar_stream`, generated as
it is sent), and the image's root filesystem (`image_tar`: the dynamic loader and the
system libraries that `ldd` lists for the Python binary and every shipped `.so` file).

Which site-packages. Decided by evidence, `probe()`: a fresh interpreter (in a neutral
folder: the installed package) imports diloco_chaos.trainer's learner, syncer, spare,
checkpoint and plugins and diloco_chaos.examples.flax_mlp (when Flax is installed), saves and restores an orbax checkpoint and
runs a jitted JAX op, then lists the distributions whose files it loaded from
site-packages. UNIT_DISTRIBUTIONS is that list (suites/docker/test_runtime_docker.py
checks it still covers the probe); `runtime(client, extra=...)` ships more, e.g. for a
user task (docs/TASKS.md) that imports another package. A shipped distribution brings
every file its RECORD lists (its dist-info, numpy.libs/ ...). Never shipped, even when
asked: the harness-only ones (NEVER_SHIP: pytest, playwright, vl-convert, altair,
hypothesis, pip, setuptools, docker, the project's own editable install). JAX declares
scipy but imports it only in its test helpers: not shipped (113 MB).

The volume's tar keeps each file's mtime: the site-packages' and stdlib's __pycache__ are
shipped (start-up time) and a .pyc is valid only for its source's mtime.

The dropped parts of the standard library keep their .py files: the `corpus` task (and
examples/flax_mlp.py) reads every stdlib .py in sorted path order, so a unit on another
host trains on the same bytes as one here (the corpus hash in the log says so).
"""
from __future__ import annotations

import io
import os
import re
import stat
import subprocess
import sys
import sysconfig
import tarfile
import tempfile
from pathlib import Path
from typing import Iterable, Iterator

ROOT = "/opt/diloco-chaos"  # where the runtime is mounted in a container
PY = f"python{sys.version_info.major}.{sys.version_info.minor}"
# probe() on this project (jax 0.10, orbax-checkpoint 0.12, flax 0.12): the distributions
# units load from site-packages. flax: examples/flax_mlp.py; shipped only where installed.
UNIT_DISTRIBUTIONS = (
    "absl-py", "etils", "filelock", "flax", "humanize", "jax", "jaxlib", "ml-dtypes", "msgpack", "numpy",
    "opt-einsum", "optax", "orbax-checkpoint", "protobuf", "pygments", "pyyaml", "rich",
    "simplejson", "tensorstore", "treescope", "typing-extensions", "uvloop")
NEVER_SHIP = {"pytest", "playwright", "vl-convert-python", "altair", "hypothesis", "pip", "setuptools",
              "docker", "diloco-chaos"}
PACKAGE_SKIP = {"__pycache__"}
STDLIB_SKIP = {"test", "idlelib", "tkinter", "turtledemo", "ensurepip"}  # (but their .py files)


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


def norm(dist: str) -> str:
    return re.sub(r"[-_.]+", "-", dist).lower()


def _site_entries(site: Path, extra: Iterable[str]) -> list[str]:
    """The site-packages entries (top-level names; single files under __pycache__) of the
    shipped distributions: every file their RECORDs list."""
    import importlib.metadata as md

    wanted = {norm(d) for d in (*UNIT_DISTRIBUTIONS, *extra)} - NEVER_SHIP
    out: set[str] = set()
    for dist in md.distributions(path=[str(site)]):
        if norm(dist.metadata["Name"] or "") not in wanted:
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
    files.append(("code", base, base.lstat()))  # (empty: the code volume's mount point)
    return files


def package_dirs() -> list[tuple[str, Path]]:
    """(name in a wheel, folder) of the installed package `diloco_chaos` and of each
    subpackage whose folder is not inside it: none from a wheel; from an editable install,
    the checkout's top-level folders that pyproject.toml's package-dir maps under it (the
    one list of them)."""
    import importlib.resources
    import tomllib

    top = Path(str(importlib.resources.files("diloco_chaos")))
    dirs = [("diloco_chaos", top)]
    pyproject = top.parent / "pyproject.toml"
    if (top / "__init__.py").is_file() and pyproject.is_file():  # an editable install of a checkout
        mapped = tomllib.loads(pyproject.read_text())["tool"]["setuptools"]["package-dir"]
        for name in sorted(mapped):
            if name.startswith("diloco_chaos.") and name.count(".") == 1:
                dirs.append((name.replace(".", "/"), Path(str(importlib.resources.files(name)))))
    return dirs


def code_files() -> list[tuple[str, Path, os.stat_result]]:
    """(name in the code volume, host path, lstat) of the package in its installed layout:
    `diloco_chaos/`, its subpackages under it (`diloco_chaos/trainer/`, ...)."""
    files = []
    for name, folder in package_dirs():
        files += _walk(folder, name, lambda rel: rel.rsplit("/", 1)[-1] in PACKAGE_SKIP)
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


def tar_stream(files: list[tuple[str, Path, os.stat_result]]) -> Iterator[bytes]:
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
def is_elf_candidate(src: Path, st: os.stat_result) -> bool:
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


def image_tar(binaries: list[Path]) -> bytes:
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


def probe(timeout_s: float = 300.0) -> list[str]:
    """The distributions (normalized names) a fresh interpreter loads from site-packages
    doing what units do (the module docstring); the evidence behind UNIT_DISTRIBUTIONS."""
    code = r"""
import importlib.metadata, importlib.util, sys, sysconfig, tempfile
import jax, jax.numpy as jnp
import diloco_chaos.trainer.units.learner, diloco_chaos.trainer.units.syncer, diloco_chaos.trainer.units.spare, diloco_chaos.trainer.numerics.checkpoint, diloco_chaos.trainer.numerics.plugins
import diloco_chaos.trainer as trainer
if importlib.util.find_spec("flax"):
    import diloco_chaos.examples.flax_mlp
with tempfile.TemporaryDirectory() as d, trainer.numerics.checkpoint.Checkpointer(d) as c:
    c.save(1, {"w": jnp.ones(3), "n": 1}); c.wait(); assert c.restore()["n"] == 1
assert float(jax.jit(lambda x: x * 2)(jnp.ones(3)).sum()) == 6.0
site = sysconfig.get_paths()["purelib"].rstrip("/") + "/"
tops = {f[len(site):].split("/")[0].removesuffix(".py") for m in list(sys.modules.values())
        if (f := getattr(m, "__file__", None) or "").startswith(site)}
tops = {t for t in tops if not t.startswith("__editable__")}  # the project: its own volume in containers
owners = importlib.metadata.packages_distributions()
print("\n".join(sorted({d for t in tops for d in owners.get(t, ["?" + t])})))
"""
    env = {**os.environ, "JAX_PLATFORMS": "cpu"}
    with tempfile.TemporaryDirectory() as cwd:  # the installed package, not a checkout's folders
        out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, env=env,
                             cwd=cwd, timeout=timeout_s, check=True).stdout
    return sorted({norm(line) for line in out.split()})
