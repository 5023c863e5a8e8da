"""`diloco-chaos setup`: puts the real Toxiproxy server (Shopify's Go binary, pinned)
where the harness looks for it, for a checkout (`make setup` calls it with
`--tools .tools`) and for an installed package alike (default: the user's tools
folder, `$DILOCO_CHAOS_TOOLS` or `$XDG_DATA_HOME/diloco-chaos/bin`).

In order: a `toxiproxy-server` already in the folder is kept; one on PATH is linked
there; else `go install` builds the pinned version (Go >= 1.23 and the Go module proxy;
about a minute, once). Nothing found and no Go: one message naming every way to get it.
"""
from __future__ import annotations

import os
import shutil
import subprocess
import sys
import tempfile
from pathlib import Path

from diloco_chaos.harness.backends.toxiproxy_server import ToxiproxyUnavailable, user_tools

VERSION = "v2.12.0"
MODULE = "github.com/Shopify/toxiproxy/v2/cmd"


def install(tools: Path, version: str = VERSION, log=print) -> Path:
    """The path of a working toxiproxy-server in `tools` (made if need be)."""
    tools.mkdir(parents=True, exist_ok=True)
    target = tools / "toxiproxy-server"
    if os.access(target, os.X_OK):
        return target
    on_path = shutil.which("toxiproxy-server")
    if on_path:
        target.unlink(missing_ok=True)  # a dangling link from an earlier setup
        target.symlink_to(on_path)
        log(f"setup: using toxiproxy-server from PATH: {on_path}")
        return target
    go = shutil.which("go")
    if go is None:
        raise ToxiproxyUnavailable(
            f"setup: no Toxiproxy server found and Go is not installed, so it cannot be built. Get one of:\n"
            f"  - Go >= 1.23 (then run `diloco-chaos setup` again),\n"
            f"  - the release binary toxiproxy-server-linux-amd64 ({version}) from "
            f"github.com/Shopify/toxiproxy/releases, on PATH as toxiproxy-server,\n"
            f"  - Homebrew: brew install toxiproxy.")
    log(f"setup: building Toxiproxy {version} with Go into {tools} (once; ~1 min)")
    with tempfile.TemporaryDirectory() as build:  # go install names binaries after their folders
        env = {**os.environ, "GOBIN": build, "GOFLAGS": "-mod=mod"}
        done = subprocess.run([go, "install", f"{MODULE}/server@{version}", f"{MODULE}/cli@{version}"],
                              env=env, capture_output=True, text=True)
        if done.returncode != 0:
            raise ToxiproxyUnavailable(f"setup: `go install {MODULE}/server@{version}` failed "
                                       f"(exit {done.returncode}): {done.stderr.strip()[-600:]}")
        shutil.move(os.path.join(build, "cli"), tools / "toxiproxy-cli")
        shutil.move(os.path.join(build, "server"), target)
    return target


def register(sub, help_: str) -> None:
    p = sub.add_parser("setup", help=help_, description=__doc__)
    p.add_argument("--tools", type=Path, default=None,
                   help="where to put toxiproxy-server (default: $DILOCO_CHAOS_TOOLS or "
                        "$XDG_DATA_HOME/diloco-chaos/bin)")
    p.add_argument("--version", default=VERSION, help=f"the Toxiproxy release to build (default {VERSION})")
    p.set_defaults(func=main)


def main(args) -> int:
    tools = args.tools if args.tools is not None else user_tools()
    try:
        path = install(tools, args.version)
    except ToxiproxyUnavailable as e:
        print(e, file=sys.stderr)
        return 1
    version = subprocess.run([str(path), "-version"], capture_output=True, text=True)
    print(f"setup: {path} ({(version.stdout or version.stderr).strip() or 'no version printed'})")
    from diloco_chaos.harness.backends.fuse_disks import FuseDiskError, binary

    try:  # the storage faults' FUSE layer (disk_slow, lost_writes): optional
        print(f"setup: {binary(tools, log=lambda m: print('setup: ' + m))} (the FUSE layer of disk_slow and lost_writes)")
    except (FuseDiskError, OSError, subprocess.SubprocessError) as e:
        print(f"setup: no FUSE layer, so no disk_slow / lost_writes on processes: {e}", file=sys.stderr)
    return 0
