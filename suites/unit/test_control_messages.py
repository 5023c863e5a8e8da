"""Control messages (kill_slice, corrupt) to containers: the engine refuses to attach to a
paused container ("unpause the container before attach", measured on dockerd 20.10), so a
message to a paused unit is held and sent when it is resumed, the whole state, once; a
restarted unit is sent the state the cluster holds (harness/backends/cluster.py `spawn`)."""
from __future__ import annotations

import json
from types import SimpleNamespace

import docker

from diloco_chaos.harness.backends.cluster import Member
from diloco_chaos.harness.backends.docker_cluster import Containers


class Sock:
    def __init__(self, box: list):
        self.box = box

    def sendall(self, data: bytes) -> None:
        self.box.append(json.loads(data))

    def shutdown(self, how) -> None:
        pass

    def close(self) -> None:
        pass


class Container:
    """What `Containers.control` and `resume` touch of a docker container."""

    def __init__(self):
        self.got, self.paused = [], False

    def attach_socket(self, params):
        if self.paused:
            raise docker.errors.APIError("409 Conflict: container is paused, unpause the container before attach")
        return Sock(self.got)

    def pause(self) -> None:
        self.paused = True

    def unpause(self) -> None:
        self.paused = False


def _unit():
    c = Container()
    proc = SimpleNamespace(container=c, poll=lambda: None, _refresh=lambda force=False: None, returncode=None)
    return Member("learner-1", "learner", proc=proc), c


def test_a_message_to_a_running_container_goes_at_once():
    units, (m, c) = Containers(), _unit()
    units.control(None, m, {"live_slices": 1})
    assert c.got == [{"live_slices": 1}]


def test_a_message_to_a_paused_container_waits_for_the_resume_and_is_sent_whole_once():
    units, (m, c) = Containers(), _unit()
    units.pause(None, m)
    assert m.paused and c.paused
    units.control(None, m, {"live_slices": 1})
    units.control(None, m, {"live_slices": 1, "corrupt": {"mode": "scale"}})
    assert c.got == []
    units.resume(None, m)
    assert c.got == [{"live_slices": 1, "corrupt": {"mode": "scale"}}]
    units.resume(None, m)
    assert len(c.got) == 1


def test_a_refused_attach_is_held_too():
    """The engine paused it behind our back (or a freeze was under way): not lost."""
    units, (m, c) = Containers(), _unit()
    c.paused = True
    units.control(None, m, {"live_slices": 2})
    c.paused = False
    m.paused = True  # (as the injector's pause_unit would have it)
    units.resume(None, m)
    assert c.got == [{"live_slices": 2}]


def test_nothing_is_sent_to_a_unit_that_is_not_running():
    units, (m, c) = Containers(), _unit()
    m.proc = None
    units.control(None, m, {"live_slices": 1})
    assert c.got == []
