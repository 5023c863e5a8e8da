"""Wire codec: length-prefixed binary frames, no pickle.

    frame  = u32 BE length (of everything after it)
             b"DDLC" | u8 protocol version | u32 BE header length | JSON header | tensor bytes
    header = {"run_id", "sender", "kind": message class name,
              "fields": {scalar fields},
              "tensors": {field: [{"enc", "dtype", "shape", "scale", "nbytes"}, ...]}}

Tensor bytes follow in header order, little-endian, C order. `enc` is null for a raw
array (dtype × shape bytes) or a compression kind for an `Encoded` one (its storage
dtype, `shape` the logical shape, nbytes = storage size × itemsize; a sparse tensor's
size says its k per chunk, and a size no k gives is refused: trainer/protocol/compression.py). Integers are
big-endian in the frame head, JSON is UTF-8.

`FrameDecoder` is incremental and sans-IO like h11: `feed(bytes)`, then `next()` until it
returns None. A malformed frame raises a named `ProtocolError` subclass, and the decoder
stays broken (every later call raises the same error): the transport cuts the link.
"""
from __future__ import annotations

import json
import math
import struct
import types
import typing
from dataclasses import fields

import ml_dtypes
import numpy as np

from diloco_chaos.trainer.protocol.compression import STORAGE_DTYPE, Encoded, storage_size
from diloco_chaos.trainer.protocol.messages import MESSAGE_TYPES

MAGIC = b"DDLC"
PROTOCOL_VERSION = 1
DEFAULT_MAX_FRAME_BYTES = 256 << 20
_LEN = struct.Struct(">I")
_HEAD = struct.Struct(">4sBI")  # magic, version, header length
DTYPES: dict[str, np.dtype] = {d.name: d for d in map(np.dtype, (
    np.float32, np.float64, np.float16, ml_dtypes.bfloat16, np.int8, np.uint8,
    np.int16, np.int32, np.int64, np.bool_))}


class ProtocolError(Exception):
    """A frame that breaks the wire format; `code` names what was wrong."""

    code = "protocol"


class BadMagic(ProtocolError):
    code = "bad_magic"


class BadVersion(ProtocolError):
    code = "bad_version"


class FrameTooLarge(ProtocolError):
    code = "frame_too_large"


class TruncatedFrame(ProtocolError):
    code = "truncated"  # the header or the tensors it declares do not fit in the frame


class BadHeader(ProtocolError):
    code = "bad_header"  # not JSON, wrong shape, missing/extra/mistyped fields


class WrongRunId(ProtocolError):
    code = "wrong_run_id"


class UnknownKind(ProtocolError):
    code = "unknown_kind"


class UnknownDtype(ProtocolError):
    code = "unknown_dtype"


class BadTensorSize(ProtocolError):
    code = "bad_tensor_size"  # nbytes does not match dtype × shape


class TrailingBytes(ProtocolError):
    code = "trailing_bytes"


# --- encoding -----------------------------------------------------------------------------

def _spec(t) -> tuple[dict, bytes]:
    if isinstance(t, Encoded):
        data, enc, shape, scale = t.data, t.kind, t.shape, t.scale
    elif isinstance(t, np.ndarray):
        data, enc, shape, scale = t, None, t.shape, 1.0
    else:
        raise TypeError(f"a tensor field holds np.ndarray or Encoded, got {type(t).__name__}")
    if data.dtype.name not in DTYPES:
        raise TypeError(f"dtype {data.dtype} cannot go on the wire; valid: {sorted(DTYPES)}")
    blob = np.ascontiguousarray(data, data.dtype.newbyteorder("<")).tobytes()
    return {"enc": enc, "dtype": data.dtype.name, "shape": list(shape), "scale": scale,
            "nbytes": len(blob)}, blob


def _scalar(x):
    if isinstance(x, np.generic):
        return x.item()
    raise TypeError(f"not a JSON scalar: {type(x).__name__}")


def encode_frame(msg, run_id: str, sender: str) -> bytes:
    """One message as one frame (length prefix included)."""
    kind = type(msg).__name__
    if MESSAGE_TYPES.get(kind) is not type(msg):
        raise TypeError(f"not a wire message: {kind}; valid: {sorted(MESSAGE_TYPES)}")
    scalars, tensors, blobs = {}, {}, []
    for f in fields(msg):
        value = getattr(msg, f.name)
        if f.name in msg.TENSOR_FIELDS:
            specs = tensors[f.name] = []
            for t in value:
                spec, blob = _spec(t)
                specs.append(spec)
                blobs.append(blob)
        else:
            scalars[f.name] = value
    header = json.dumps({"run_id": run_id, "sender": sender, "kind": kind, "fields": scalars,
                         "tensors": tensors}, separators=(",", ":"), default=_scalar).encode()
    length = _HEAD.size + len(header) + sum(map(len, blobs))
    return b"".join([_LEN.pack(length), _HEAD.pack(MAGIC, PROTOCOL_VERSION, len(header)), header, *blobs])


# --- decoding -----------------------------------------------------------------------------

def _type_ok(value, hint) -> bool:
    options = typing.get_args(hint) if isinstance(hint, types.UnionType) else (hint,)
    for t in options:
        if t is type(None) and value is None:
            return True
        if t is float and isinstance(value, (int, float)) and not isinstance(value, bool):
            return True
        if t in (int, str, bool) and type(value) is t:
            return True
    return False


_HINTS = {name: typing.get_type_hints(cls) for name, cls in MESSAGE_TYPES.items()}


def _tensor(spec, buf: memoryview, offset: int, field: str):
    if not (isinstance(spec, dict) and {"enc", "dtype", "shape", "scale", "nbytes"} <= spec.keys()):
        raise BadHeader(f"tensor spec in {field!r} needs enc, dtype, shape, scale, nbytes: {spec!r}")
    shape, nbytes, enc = spec["shape"], spec["nbytes"], spec["enc"]
    if not (isinstance(shape, list) and all(type(d) is int and d >= 0 for d in shape)
            and type(nbytes) is int and _type_ok(spec["scale"], float)):
        raise BadHeader(f"tensor spec in {field!r} has a bad shape, nbytes or scale: {spec!r}")
    dtype = DTYPES.get(spec["dtype"])
    if dtype is None:
        raise UnknownDtype(f"dtype {spec['dtype']!r} in {field!r}; valid: {sorted(DTYPES)}")
    if enc is None:
        count = math.prod(shape)
    elif enc in STORAGE_DTYPE and STORAGE_DTYPE[enc] == dtype:
        try:  # a sparse tensor's size follows from its k, which the size itself declares
            count = storage_size(enc, tuple(shape), nbytes // dtype.itemsize)
        except ValueError as e:
            raise BadTensorSize(f"{field!r}: {e}") from None
    else:
        raise BadHeader(f"encoding {enc!r} with dtype {dtype.name} in {field!r}")
    if nbytes != count * dtype.itemsize:
        raise BadTensorSize(f"{field!r}: {nbytes} bytes declared, {dtype.name} {shape} "
                            f"({enc or 'raw'}) takes {count * dtype.itemsize}")
    if offset + nbytes > len(buf):
        raise TruncatedFrame(f"{field!r}: tensor bytes end at {offset + nbytes}, frame at {len(buf)}")
    data = np.frombuffer(buf, dtype.newbyteorder("<"), count, offset).astype(dtype, copy=False)
    if enc is None:
        return data.reshape(shape), offset + nbytes
    return Encoded(enc, tuple(shape), data, spec["scale"]), offset + nbytes


def _parse(body: memoryview, expected_run_id: str | None):
    _, _, hlen = _HEAD.unpack_from(body)
    start = _HEAD.size
    if start + hlen > len(body):
        raise TruncatedFrame(f"JSON header of {hlen} bytes does not fit in a {len(body)}-byte frame")
    try:
        header = json.loads(bytes(body[start:start + hlen]))
    except (ValueError, RecursionError) as e:
        raise BadHeader(f"header is not valid JSON: {e}") from None
    if not (isinstance(header, dict) and {"run_id", "sender", "kind", "fields", "tensors"} <= header.keys()
            and isinstance(header["fields"], dict) and isinstance(header["tensors"], dict)
            and isinstance(header["run_id"], str) and isinstance(header["sender"], str)):
        raise BadHeader("header needs run_id: str, sender: str, kind, fields{}, tensors{}")
    if expected_run_id is not None and header["run_id"] != expected_run_id:
        raise WrongRunId(f"frame for run {header['run_id']!r}, this is run {expected_run_id!r}")
    cls = MESSAGE_TYPES.get(header["kind"])
    if cls is None:
        raise UnknownKind(f"message kind {header['kind']!r}; valid: {sorted(MESSAGE_TYPES)}")
    names = {f.name for f in fields(cls)}
    scalars, tensors = header["fields"], header["tensors"]
    if scalars.keys() != names - set(cls.TENSOR_FIELDS) or tensors.keys() != set(cls.TENSOR_FIELDS):
        raise BadHeader(f"{cls.__name__} needs fields {sorted(names)}, got "
                        f"{sorted(scalars)} + tensors {sorted(tensors)}")
    hints = _HINTS[cls.__name__]
    for name, value in scalars.items():
        if not _type_ok(value, hints[name]):
            raise BadHeader(f"{cls.__name__}.{name} must be {hints[name]}, got {value!r}")
    offset, kwargs = start + hlen, dict(scalars)
    for name in cls.TENSOR_FIELDS:
        if not isinstance(tensors[name], list):
            raise BadHeader(f"{cls.__name__}.{name} must be a list of tensor specs")
        kwargs[name] = []
        for spec in tensors[name]:
            t, offset = _tensor(spec, body, offset, name)
            kwargs[name].append(t)
    if offset != len(body):
        raise TrailingBytes(f"{len(body) - offset} bytes after the last tensor of a {cls.__name__}")
    try:
        msg = cls(**kwargs)
    except (TypeError, ValueError) as e:
        raise BadHeader(f"{cls.__name__}: {e}") from None
    return header, msg


class FrameDecoder:
    """Incremental frame decoder for one byte stream."""

    def __init__(self, expected_run_id: str | None = None,
                 max_frame_bytes: int = DEFAULT_MAX_FRAME_BYTES):
        self.expected_run_id = expected_run_id
        self.max_frame_bytes = max_frame_bytes
        self._buf = bytearray()
        self._error: ProtocolError | None = None

    @property
    def buffered(self) -> int:
        """Bytes received that are not yet part of a decoded frame."""
        return len(self._buf)

    def feed(self, data: bytes) -> None:
        if self._error is not None:
            raise self._error
        self._buf += data

    def next(self):
        """The next `(header, message)`, or None until more bytes arrive. The header gets
        `frame_bytes`, the frame's size on the wire."""
        if self._error is not None:
            raise self._error
        try:
            return self._next()
        except ProtocolError as e:
            self._error = e
            raise

    def _next(self):
        buf = self._buf
        if len(buf) < _LEN.size + _HEAD.size:
            return None  # magic, version and header length come first: judge them together
        (length,) = _LEN.unpack_from(buf)
        magic, version, _ = _HEAD.unpack_from(buf, _LEN.size)
        if magic != MAGIC:
            raise BadMagic(f"frame starts with {bytes(magic)!r}, expected {MAGIC!r}")
        if version != PROTOCOL_VERSION:
            raise BadVersion(f"protocol version {version}, this side speaks {PROTOCOL_VERSION}")
        if length > self.max_frame_bytes:
            raise FrameTooLarge(f"frame of {length} bytes, limit {self.max_frame_bytes}")
        if length < _HEAD.size:
            raise TruncatedFrame(f"frame of {length} bytes cannot hold its {_HEAD.size}-byte head")
        end = _LEN.size + length
        if len(buf) < end:
            return None
        body = memoryview(buf[_LEN.size:end])  # a bytearray slice is an owned copy: arrays view it
        del buf[:end]
        header, msg = _parse(body, self.expected_run_id)
        header["frame_bytes"] = end
        return header, msg


def decode_frame(frame: bytes, expected_run_id: str | None = None,
                 max_frame_bytes: int = DEFAULT_MAX_FRAME_BYTES):
    """Exactly one whole frame (length prefix included) → `(header, message)`."""
    dec = FrameDecoder(expected_run_id, max_frame_bytes)
    dec.feed(frame)
    item = dec.next()
    if item is None:
        raise TruncatedFrame(f"{len(frame)} bytes do not make a whole frame")
    if dec.buffered:
        raise TrailingBytes(f"{dec.buffered} bytes after the frame")
    return item
