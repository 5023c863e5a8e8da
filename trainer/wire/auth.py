"""Run membership: every link proves it belongs to the run before a frame reaches a core.

Once shards and proxies listen beyond loopback (or any other local user can reach
them), a client that speaks our frame format could push a well-formed Contribution
into the global model: the frame header's `run_id` is a label, not a proof. So each
run has a **run secret** (32 random bytes, made by the harness, handed to every unit in
the environment variable `DILOCO_CHAOS_RUN_SECRET`, never written to the run directory
or the event log), and each connection starts with a mutual HMAC-SHA256 challenge —
the same shape as a CHAP exchange — before the first frame:

    shard   → learner   CHALLENGE: b"DCA1" + shard nonce (16 random bytes)
    learner → shard     PROOF:     b"DCA1" + len(name) + name + learner nonce
                                   + HMAC(secret, "learner", run_id, name, shard, n_shard, n_learner)
    shard   → learner   ANSWER:    b"DCA1" + HMAC(secret, "shard", run_id, name, shard, n_learner, n_shard)

The learner's proof binds its name, so the shard adopts the connection as that learner
and cuts it if a frame then claims another sender; the shard's answer proves the shard
to the learner (a stranger listening on a shard's address learns nothing and gets no
Contribution). Each side's fresh nonce makes a recorded exchange useless on the next
connection. A wrong proof, a malformed message or no proof within `AUTH_TIMEOUT_S`
closes the connection; the shard logs it (`auth_refused`), nothing reaches a core.

This module is sans-IO: the messages, the MACs and an incremental reader of a proof.
trainer/wire/transport.py runs the exchange on its sockets.
"""
from __future__ import annotations

import hashlib
import hmac
import os
import secrets

SECRET_ENV = "DILOCO_CHAOS_RUN_SECRET"
MAGIC = b"DCA1"
NONCE_BYTES = 16
MAC_BYTES = 32
MAX_NAME = 255
AUTH_TIMEOUT_S = 10.0  # a connection that has not proved itself by then is cut
CHALLENGE_BYTES = len(MAGIC) + NONCE_BYTES
ANSWER_BYTES = len(MAGIC) + MAC_BYTES


class AuthError(Exception):
    """The peer is not (or not shown to be) a member of this run."""


def new_secret() -> str:
    """A fresh run secret, hex (what the harness puts in SECRET_ENV)."""
    return secrets.token_hex(32)


def secret_from_env(environ=os.environ) -> bytes:
    """The run secret this unit was started with; a clear error when there is none."""
    value = environ.get(SECRET_ENV, "")
    try:
        key = bytes.fromhex(value)
    except ValueError:
        key = b""
    if len(key) < 16:
        raise AuthError(f"{SECRET_ENV} must hold the run secret as hex (at least 16 bytes): got "
                        f"{'nothing' if not value else f'{len(value)} characters'}; the harness sets it "
                        "for every unit it starts")
    return key


def nonce() -> bytes:
    return secrets.token_bytes(NONCE_BYTES)


def _mac(secret: bytes, role: bytes, run_id: str, learner: str, shard: str, first: bytes, second: bytes) -> bytes:
    parts = (role, run_id.encode(), learner.encode(), shard.encode(), first, second)
    msg = b"".join(len(p).to_bytes(2, "big") + p for p in parts)  # length-prefixed: no ambiguity
    return hmac.new(secret, msg, hashlib.sha256).digest()


def challenge(n_shard: bytes) -> bytes:
    return MAGIC + n_shard


def read_challenge(data: bytes) -> bytes:
    """The shard's nonce from a CHALLENGE (exactly CHALLENGE_BYTES)."""
    if len(data) != CHALLENGE_BYTES or data[:len(MAGIC)] != MAGIC:
        raise AuthError("the shard did not open with a run-membership challenge")
    return data[len(MAGIC):]


def proof(secret: bytes, run_id: str, learner: str, shard: str, n_shard: bytes, n_learner: bytes) -> bytes:
    name = learner.encode()
    if not 0 < len(name) <= MAX_NAME:
        raise ValueError(f"learner name of {len(name)} bytes; valid: 1..{MAX_NAME}")
    mac = _mac(secret, b"learner", run_id, learner, shard, n_shard, n_learner)
    return MAGIC + bytes([len(name)]) + name + n_learner + mac


def answer(secret: bytes, run_id: str, learner: str, shard: str, n_shard: bytes, n_learner: bytes) -> bytes:
    return MAGIC + _mac(secret, b"shard", run_id, learner, shard, n_learner, n_shard)


def check_answer(data: bytes, secret: bytes, run_id: str, learner: str, shard: str, n_shard: bytes,
                 n_learner: bytes) -> None:
    want = answer(secret, run_id, learner, shard, n_shard, n_learner)
    if len(data) != ANSWER_BYTES or not hmac.compare_digest(data, want):
        raise AuthError(f"{shard} did not prove it belongs to run {run_id}")


class ProofReader:
    """The shard's side: feed it what a new connection sent; `done` once a whole PROOF is in.

    `learner` is then the proven name and `rest` the bytes after the proof (the first
    frames, if the learner did not wait). Raises AuthError on a malformed or wrong proof."""

    def __init__(self, secret: bytes, run_id: str, shard: str, n_shard: bytes):
        self.secret, self.run_id, self.shard, self.n_shard = secret, run_id, shard, n_shard
        self.buf = b""
        self.learner: str | None = None
        self.n_learner = b""
        self.rest = b""
        self.size = 0  # bytes of the proof, once done

    @property
    def done(self) -> bool:
        return self.learner is not None

    def feed(self, data: bytes) -> bool:
        self.buf += data
        head = len(MAGIC) + 1
        if len(self.buf) < head:
            return False
        if self.buf[:len(MAGIC)] != MAGIC:
            raise AuthError("the connection did not open with a run-membership proof")
        n = self.buf[len(MAGIC)]
        total = head + n + NONCE_BYTES + MAC_BYTES
        if len(self.buf) < total:
            return False
        raw = self.buf[head:head + n]
        n_learner = self.buf[head + n:head + n + NONCE_BYTES]
        mac = self.buf[head + n + NONCE_BYTES:total]
        try:
            name = raw.decode()
        except UnicodeDecodeError:
            raise AuthError("the proof's name is not UTF-8") from None
        want = _mac(self.secret, b"learner", self.run_id, name, self.shard, self.n_shard, n_learner)
        if n == 0 or not hmac.compare_digest(mac, want):
            raise AuthError(f"wrong run-membership proof (claimed name {name!r})")
        self.learner, self.n_learner, self.rest, self.size = name, n_learner, self.buf[total:], total
        self.buf = b""
        return True

    def answer(self) -> bytes:
        assert self.learner is not None
        return answer(self.secret, self.run_id, self.learner, self.shard, self.n_shard, self.n_learner)
