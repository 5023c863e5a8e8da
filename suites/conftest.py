"""The Docker engine for tests marked `docker`.

`docker_engine` (session scope, used by every test in this folder): if an engine
answers at DOCKER_HOST (or the default socket) it is used as is. Otherwise, where
`dockerd` is installed (scripts/install-docker.sh, run by `make setup`) and we are
root, `scripts/dockerd.sh start` starts a private one under /tmp/diloco-dockerd,
DOCKER_HOST points at it, and at the end of the session — after a failure or Ctrl-C
too (pytest tears session fixtures down on KeyboardInterrupt; an atexit hook is the
backstop) — every diloco-chaos container is removed and that engine is stopped (by
its pid). Only when no engine can be reached or started do the tests skip, saying why (under CI=true they fail: `unavailable_here`).
"""
from __future__ import annotations

import atexit
import os
import shutil
import subprocess
from pathlib import Path

import pytest

REPO = Path(__file__).resolve().parents[1]
DOCKERD_SH = REPO / "scripts" / "dockerd.sh"


def _start_private_engine() -> tuple[str | None, str, str | None]:
    """(DOCKER_HOST we started, "", None), (None, "", DOCKER_HOST of a private engine
    that was already running), or (None, why not, None)."""
    r = subprocess.run(["bash", str(DOCKERD_SH), "status"], capture_output=True, text=True, timeout=30)
    if r.returncode == 0:  # someone (not this session) started it: use it, leave it running
        return None, "", r.stdout.strip().splitlines()[-1]
    if shutil.which("dockerd") is None:
        return None, "dockerd is not installed (scripts/install-docker.sh installs Debian's docker.io)", None
    if os.geteuid() != 0:
        return None, "dockerd is installed but a private engine needs root", None
    r = subprocess.run(["bash", str(DOCKERD_SH), "start"], capture_output=True, text=True, timeout=120)
    if r.returncode != 0:
        return None, f"scripts/dockerd.sh start failed: {r.stderr.strip()[-500:]}", None
    return r.stdout.strip().splitlines()[-1], "", None


def _stop_private_engine() -> None:
    subprocess.run(["bash", str(DOCKERD_SH), "stop"], capture_output=True, timeout=120)


def unavailable_here(why: str):
    """A suite that cannot run here skips, saying why; under CI=true it fails instead, so a
    CI machine without a Docker engine or Chromium cannot pass by running nothing."""
    if os.environ.get("CI") == "true":
        pytest.fail(f"CI=true: this suite must run, but {why}", pytrace=False)
    pytest.skip(why)


@pytest.fixture(scope="session")
def unavailable():
    """unavailable_here, for fixtures in the suites' own conftests."""
    return unavailable_here


@pytest.fixture(scope="session")
def docker_engine():
    """A `docker.DockerClient` for a reachable engine (started here if need be)."""
    from diloco_chaos.harness.backends import docker_engine
    why = docker_engine.reachable()
    started, old_host = False, os.environ.get("DOCKER_HOST")
    if why is not None:
        try:
            host, why_not, running = _start_private_engine()
        except (OSError, subprocess.SubprocessError) as e:
            host, why_not, running = None, repr(e), None
        if host is None and running is None:
            unavailable_here(f"{why}; and none could be started: {why_not}")
        os.environ["DOCKER_HOST"] = host or running
        if host is not None:
            started = True
            atexit.register(_stop_private_engine)
    client = docker_engine.engine()
    try:
        yield client
    finally:
        try:
            if started:  # an engine we did not start may hold other people's runs
                docker_engine.remove_all(client)
        finally:
            client.close()
            if started:
                _stop_private_engine()
                if old_host is None:
                    os.environ.pop("DOCKER_HOST", None)
                else:
                    os.environ["DOCKER_HOST"] = old_host


@pytest.fixture(autouse=True)
def _docker_engine_for_marked(request):
    if request.node.get_closest_marker("docker") is not None:
        request.getfixturevalue("docker_engine")
