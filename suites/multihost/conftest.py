"""Two hosts on one machine (suites/multihost/hosts.py) for tests marked `multihost`.

`two_hosts` (module scope): skips, saying why, where this machine cannot do it (under
CI=true it fails: `unavailable`); otherwise brings both hosts up and yields describe()
with a `docker.DockerClient` added to each host ("client"). Torn down after the module,
after a failure or Ctrl-C too; an atexit hook is the backstop."""
from __future__ import annotations

import atexit
import copy

import pytest

from suites.multihost import hosts


@pytest.fixture(scope="module")
def hosts_available(unavailable):
    """Skips (fails under CI=true) where two hosts cannot be set up here."""
    why = hosts.available()
    if why is not None:
        unavailable(why)


@pytest.fixture(scope="module")
def two_hosts(hosts_available):
    """{"hub": address, "hosts": {"a"|"b": {"netns", "addr", "gateway", "url", "log", "client"}}}."""
    import docker

    atexit.register(hosts.down)
    clients = []
    try:
        desc = copy.deepcopy(hosts.up())
        for h in desc["hosts"].values():
            h["client"] = docker.DockerClient(base_url=h["url"], timeout=60)
            clients.append(h["client"])
        yield desc
    finally:
        try:
            for c in clients:
                c.close()
        finally:
            left = hosts.down()
            atexit.unregister(hosts.down)
            assert not left, f"left after the hosts came down: {left}"
