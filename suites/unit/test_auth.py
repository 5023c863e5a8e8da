"""Run membership (trainer/wire/auth.py): the HMAC exchange by itself, then on real sockets —
a client that speaks our frame format but lacks the run secret is refused and none of
its frames reaches the shard's caller; a stranger posing as a shard gets no frame from a
learner; a proven learner cannot speak as another. Loopback only; every socket closed."""
from __future__ import annotations

import queue
import socket
import threading
import time

import numpy as np
import pytest

from diloco_chaos.trainer.protocol.messages import Contribution, Hello
from diloco_chaos.trainer.wire import auth, transport
from diloco_chaos.trainer.wire.codec import encode_frame
from diloco_chaos.trainer.wire.shard_link import ShardLink
from diloco_chaos.trainer.wire.transport import ShardServer, wait_until

RUN = "run-auth"
SECRET = bytes(range(32))
OTHER = bytes(range(1, 33))


def exchange(secret_learner: bytes, secret_shard: bytes, name: str = "learner-0"):
    """One whole exchange in memory: (the shard's reader after the proof, the learner's check)."""
    n_shard, n_learner = auth.nonce(), auth.nonce()
    proof = auth.proof(secret_learner, RUN, name, "syncer-0", n_shard, n_learner)
    reader = auth.ProofReader(secret_shard, RUN, "syncer-0", n_shard)
    return reader, proof, n_shard, n_learner


def test_a_proof_with_the_run_secret_is_accepted_byte_by_byte_and_names_the_learner():
    reader, proof, n_shard, n_learner = exchange(SECRET, SECRET)
    for i in range(len(proof) - 1):
        assert reader.feed(proof[i:i + 1]) is False
    assert reader.feed(proof[-1:] + b"FRAME") is True
    assert (reader.learner, reader.rest, reader.size) == ("learner-0", b"FRAME", len(proof))
    auth.check_answer(reader.answer(), SECRET, RUN, "learner-0", "syncer-0", n_shard, n_learner)


@pytest.mark.parametrize("tamper", ["secret", "name", "nonce", "run", "magic"])
def test_a_wrong_or_altered_proof_is_refused(tamper):
    n_shard, n_learner = auth.nonce(), auth.nonce()
    proof = auth.proof(OTHER if tamper == "secret" else SECRET, "other-run" if tamper == "run" else RUN,
                       "learner-0", "syncer-0", n_shard, n_learner)
    if tamper == "name":  # the same length, another learner: the MAC binds the name
        proof = proof.replace(b"learner-0", b"learner-1")
    if tamper == "nonce":  # replayed against a fresh challenge
        n_shard = auth.nonce()
    if tamper == "magic":
        proof = b"XXXX" + proof[4:]
    with pytest.raises(auth.AuthError):
        auth.ProofReader(SECRET, RUN, "syncer-0", n_shard).feed(proof)


def test_a_shard_without_the_secret_cannot_answer():
    reader, proof, n_shard, n_learner = exchange(SECRET, SECRET)
    reader.feed(proof)
    fake = auth.answer(OTHER, RUN, "learner-0", "syncer-0", n_shard, n_learner)
    with pytest.raises(auth.AuthError):
        auth.check_answer(fake, SECRET, RUN, "learner-0", "syncer-0", n_shard, n_learner)


def test_the_secret_comes_from_the_environment_with_a_clear_error():
    assert auth.secret_from_env({auth.SECRET_ENV: SECRET.hex()}) == SECRET
    for bad in ({}, {auth.SECRET_ENV: "zz"}, {auth.SECRET_ENV: "00ff"}):
        with pytest.raises(auth.AuthError, match=auth.SECRET_ENV):
            auth.secret_from_env(bad)
    assert len(bytes.fromhex(auth.new_secret())) == 32 and auth.new_secret() != auth.new_secret()


# --- on sockets ---------------------------------------------------------------------------

@pytest.fixture
def server():
    s = ShardServer("syncer-0", RUN, secret=SECRET)
    yield s
    s.close()


def contribution() -> Contribution:
    return Contribution("learner-0", 0, 1, 0, 0, 6, 6144, 0.02, None, [np.ones(8, np.float32)])


def poll_for(server: ShardServer, seconds: float, refused: int = 1) -> list:
    """What the server reports until it has refused `refused` connections, then 0.1 s more
    (anything else it would say of them is out by then); `seconds` is a give-up timeout, not
    the property: a fixed window (it was 0.5 s) let a busy machine's late accept fail a test."""
    got, end = [], time.monotonic() + seconds
    while time.monotonic() < end and sum(e.kind == "refused" for e in got) < refused:
        got += server.poll(0.01)
    end = time.monotonic() + 0.1
    while time.monotonic() < end:
        got += server.poll(0.01)
    return got


def test_a_client_speaking_our_frames_without_the_proof_is_refused(server):
    with socket.create_connection(transport.parse_addr(server.addr), timeout=5) as rogue:
        frame = encode_frame(contribution(), run_id=RUN, sender="learner-0")
        rogue.sendall(frame * 3)
        got = poll_for(server, 10)  # accepts (the challenge goes out), reads the frames
        assert rogue.recv(auth.CHALLENGE_BYTES)[:4] == auth.MAGIC
    assert [e.kind for e in got] == ["refused"], got
    assert "did not open with a run-membership proof" in got[0].msg
    assert server.connected() == [] and server.refused == 1


def test_a_link_with_another_secret_is_refused_and_sends_nothing(server):
    inbox: queue.Queue = queue.Queue()
    link = ShardLink("learner-0", "syncer-0", server.addr, RUN, inbox, secret=OTHER, backoff_s=(0.02, 0.1)).start()
    try:
        got = poll_for(server, 10, refused=2)  # it retried
        assert not link.up and link.send(contribution()) == 0
    finally:
        link.close()
    assert got and {e.kind for e in got} == {"refused"}, got   # it retried, refused each time
    assert all("wrong run-membership proof" in e.msg for e in got)
    assert server.connected() == []


def test_a_stranger_posing_as_the_shard_gets_no_frame():
    """A listener where the learner was told to go, that answers the proof without the
    secret: the learner refuses it (its inbox says so), never comes up, sends nothing."""
    heard: list[bytes] = []
    with socket.create_server(("127.0.0.1", 0)) as listener:
        def fake_shard():
            conn, _ = listener.accept()
            with conn:
                n_shard = auth.nonce()
                conn.sendall(auth.challenge(n_shard))
                proof = conn.recv(4096)
                n_learner = proof[5 + proof[4]:5 + proof[4] + auth.NONCE_BYTES]
                conn.sendall(auth.answer(OTHER, RUN, "learner-0", "syncer-0", n_shard, n_learner))
                conn.settimeout(1.0)
                try:
                    while data := conn.recv(4096):
                        heard.append(data)
                except OSError:
                    pass

        thread = threading.Thread(target=fake_shard, daemon=True)
        thread.start()
        inbox: queue.Queue = queue.Queue()
        link = ShardLink("learner-0", "syncer-0", "127.0.0.1:%d" % listener.getsockname()[1], RUN, inbox,
                         secret=SECRET, backoff_s=(5.0, 5.0)).start()
        try:
            event = inbox.get(timeout=5)
            assert not link.up and link.send(contribution()) == 0
        finally:
            link.close()
        thread.join(timeout=5)
    assert event.kind == "refused" and "did not prove it belongs" in event.msg, event
    assert heard == []  # after its proof, the learner sent the stranger nothing


def test_a_learner_that_proved_its_name_cannot_speak_as_another(server):
    inbox: queue.Queue = queue.Queue()
    link = ShardLink("learner-0", "syncer-0", server.addr, RUN, inbox, secret=SECRET, backoff_s=(0.02, 0.1)).start()
    try:
        got: list = []
        assert wait_until(lambda: got.extend(server.poll(0.01)) or link.up, 5)
        link.send(Hello("learner-0", 0))
        assert wait_until(lambda: got.extend(server.poll(0.01)) or any(e.kind == "message" for e in got), 5)
        with link._cv:  # a frame signed by another learner, on learner-0's proven connection
            link._outbox.put(encode_frame(Hello("learner-1", 0), run_id=RUN, sender="learner-1"), None)
            link._cv.notify()
        assert wait_until(lambda: got.extend(server.poll(0.01)) or any(e.kind == "refused" for e in got), 5)
    finally:
        link.close()
    kinds = [e.kind for e in got]
    assert kinds[:2] == ["connected", "message"] and "refused" in kinds
    assert [e.msg.learner for e in got if e.kind == "message"] == ["learner-0"]
    assert "learner-1" in next(e.msg for e in got if e.kind == "refused")


def test_a_connection_that_never_proves_itself_is_cut(server, monkeypatch):
    monkeypatch.setattr(auth, "AUTH_TIMEOUT_S", 0.2)
    with socket.create_connection(transport.parse_addr(server.addr), timeout=5) as idle:
        got = poll_for(server, 10)  # cut after AUTH_TIMEOUT_S, and refused
        assert idle.recv(auth.CHALLENGE_BYTES)[:4] == auth.MAGIC and idle.recv(64) == b""  # challenge, then closed
    assert [e.kind for e in got] == ["refused"] and "no run-membership proof" in got[0].msg
