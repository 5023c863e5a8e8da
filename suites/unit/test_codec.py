"""Wire codec: every message kind round-trips; every malformed frame is named."""
from __future__ import annotations

import json
import struct

import ml_dtypes
import numpy as np
import pytest
from hypothesis import given
from hypothesis import strategies as st
from hypothesis.extra import numpy as hnp

from diloco_chaos.trainer.protocol.compression import KINDS, encode
from diloco_chaos.trainer.protocol.messages import (MESSAGE_TYPES, Contribution, FragmentDelta, FragmentUpdate,
                                                    GradMean, GradStep, Hello, Repair, RepairRequest, Received,
                                                    RoundOpen, SliceControl, describe)
from diloco_chaos.trainer.wire import codec
from diloco_chaos.trainer.wire.codec import FrameDecoder, decode_frame, encode_frame

RUN = "run-7"
BF16 = np.dtype(ml_dtypes.bfloat16)


def arrays():
    a = np.arange(6, dtype=np.float32).reshape(2, 3) - 2.5
    return [a, np.array(1.25, np.float32), np.zeros((0, 4), np.float32)]


def one_of_each():
    raw = [np.arange(4, dtype=BF16), np.array([-3, 7], np.int8), np.array([0, 255], np.uint8)]
    contribs = [Contribution("learner-0", 2, 9, 1, 4, 12, 3072, 0.21, None, encode(arrays(), kind))
                for kind in KINDS]
    return [
        Hello("learner-0", 3),
        Hello("learner-0", 3, "", "0:12:ab12,3:9:cd34"),
        *contribs,
        Contribution("learner-1", 0, 1, 0, 0, 1, 64, 1, 0.5, raw),
        FragmentUpdate(2, 17, True, arrays()),
        FragmentUpdate(0, 0, False, []),
        *[FragmentDelta(1, 6, 4, encode(arrays(), kind)) for kind in ("int8", "int4")],
        RoundOpen(3, 12),
        RepairRequest(1, 7),
        Repair("learner-2", 1, 1, 7, arrays()),
        GradStep("learner-2", 1, 5, 0, 41, 256, encode(arrays(), "bf16")),
        GradMean(0, 8, 5, 3, arrays()),
        SliceControl(1),
        Received(1 << 40),
    ]


@pytest.mark.parametrize("msg", one_of_each(), ids=lambda m: type(m).__name__)
def test_round_trip_every_kind(msg):
    frame = encode_frame(msg, run_id=RUN, sender="learner-0")
    header, back = decode_frame(frame, expected_run_id=RUN)
    assert back == msg
    assert header["sender"] == "learner-0" and header["kind"] == type(msg).__name__
    assert header["frame_bytes"] == len(frame)


def test_every_message_kind_is_covered():
    assert {type(m).__name__ for m in one_of_each()} == set(MESSAGE_TYPES)


def test_decoded_arrays_are_writable_and_independent_of_the_stream():
    frame = encode_frame(FragmentUpdate(0, 1, False, arrays()), RUN, "s")
    _, msg = decode_frame(frame)
    msg.params[0][0, 0] = 99.0  # a consumer may update in place
    assert msg.params[0].flags.writeable and msg.params[0].dtype == np.float32


def test_stream_fed_byte_by_byte():
    msgs = one_of_each()
    stream = b"".join(encode_frame(m, RUN, "x") for m in msgs)
    dec, out = FrameDecoder(expected_run_id=RUN), []
    for i in range(len(stream)):
        dec.feed(stream[i:i + 1])
        while (item := dec.next()) is not None:
            out.append(item[1])
    assert out == msgs and dec.buffered == 0


def test_describe_gives_scalars_and_tensor_bytes():
    d = describe(GradMean(0, 8, 5, 3, arrays()))
    assert d == {"msg": "GradMean", "fragment": 0, "round": 8, "seq": 5, "n_learners": 3,
                 "tensor_bytes": 4 * 6 + 4}


scalar_values = st.one_of(st.integers(0, 2 ** 40), st.none())


@given(
    payload=st.lists(hnp.arrays(st.sampled_from([np.float32, np.int8, np.uint8, np.float64]),
                                hnp.array_shapes(min_dims=0, max_dims=3, min_side=0, max_side=5)),
                     max_size=4),
    kind=st.sampled_from(KINDS + ("raw",)),
    learner=st.text(max_size=12),
    ints=st.tuples(*[st.integers(0, 2 ** 53)] * 6),
    times=st.tuples(st.floats(allow_nan=False), st.one_of(st.none(), st.floats(allow_nan=False))),
    chunk=st.integers(1, 97),
    bf16=st.booleans(),
)
def test_hypothesis_round_trip(payload, kind, learner, ints, times, chunk, bf16):
    if bf16:  # hypothesis cannot draw bfloat16 itself
        payload = [p.astype(BF16) if p.dtype == np.float32 else p for p in payload]
    if kind != "raw":
        with np.errstate(over="ignore", invalid="ignore"):  # float64 beyond fp32 range -> inf -> max
            payload = encode([np.nan_to_num(p.astype(np.float32)) for p in payload], kind)
    msg = Contribution(learner, *ints, *times, payload)
    frame = encode_frame(msg, RUN, learner)
    dec = FrameDecoder(RUN)
    for i in range(0, len(frame), chunk):
        dec.feed(frame[i:i + chunk])
    header, back = dec.next()
    assert back == msg and header["sender"] == learner and dec.next() is None


# --- malformed frames ----------------------------------------------------------------------

def frame(header: dict | bytes, blob: bytes = b"", *, magic=codec.MAGIC, version=codec.PROTOCOL_VERSION,
          length_delta: int = 0, hlen_delta: int = 0) -> bytes:
    h = header if isinstance(header, bytes) else json.dumps(header).encode()
    body = struct.pack(">4sBI", magic, version, len(h) + hlen_delta) + h + blob
    return struct.pack(">I", len(body) + length_delta) + body


def good_header(**over) -> dict:
    h = {"run_id": RUN, "sender": "s", "kind": "FragmentUpdate",
         "fields": {"fragment": 0, "version": 1, "rejoin": False, "unmoved": False},
         "tensors": {"params": [{"enc": None, "dtype": "float32", "shape": [2], "scale": 1.0,
                                 "nbytes": 8}]}}
    h.update(over)
    return h


def spec(**over) -> dict:
    s = {"enc": None, "dtype": "float32", "shape": [2], "scale": 1.0, "nbytes": 8}
    s.update(over)
    return {"params": [s]}


BLOB = np.array([1, 2], np.float32).tobytes()
MALFORMED = [
    ("bad magic", frame(good_header(), BLOB, magic=b"HTTP"), codec.BadMagic),
    ("wrong version", frame(good_header(), BLOB, version=2), codec.BadVersion),
    ("too large", frame(good_header(), BLOB, length_delta=1 << 30), codec.FrameTooLarge),
    ("length below head", struct.pack(">I", 3) + struct.pack(">4sBI", codec.MAGIC, 1, 0), codec.TruncatedFrame),
    ("truncated JSON", frame(good_header(), BLOB, hlen_delta=1 << 20), codec.TruncatedFrame),
    ("JSON cut short", frame(json.dumps(good_header()).encode()[:-5], BLOB), codec.BadHeader),
    ("not JSON", frame(b"\xff\xfe{", BLOB), codec.BadHeader),
    ("deep JSON", frame(b"[" * 100_000, BLOB), codec.BadHeader),
    ("header not an object", frame(b"[1, 2]", BLOB), codec.BadHeader),
    ("wrong run id", frame(good_header(run_id="other"), BLOB), codec.WrongRunId),
    ("unknown kind", frame(good_header(kind="Pickle"), BLOB), codec.UnknownKind),
    ("missing field", frame(good_header(fields={"fragment": 0, "version": 1}), BLOB), codec.BadHeader),
    ("extra field", frame(good_header(fields={"fragment": 0, "version": 1, "rejoin": False, "unmoved": False, "x": 1}), BLOB),
     codec.BadHeader),
    ("mistyped field", frame(good_header(fields={"fragment": "0", "version": 1, "rejoin": False, "unmoved": False}), BLOB),
     codec.BadHeader),
    ("bool as int", frame(good_header(fields={"fragment": True, "version": 1, "rejoin": False, "unmoved": False}), BLOB),
     codec.BadHeader),
    ("negative version", frame(good_header(fields={"fragment": 0, "version": -1, "rejoin": False, "unmoved": False}), BLOB),
     codec.BadHeader),
    ("unknown dtype", frame(good_header(tensors=spec(dtype="complex64")), BLOB), codec.UnknownDtype),
    ("nbytes vs dtype x shape", frame(good_header(tensors=spec(nbytes=4)), BLOB[:4]), codec.BadTensorSize),
    ("int4 nbytes", frame(good_header(tensors=spec(enc="int4", dtype="uint8", shape=[3], nbytes=1)), b"\0"),
     codec.BadTensorSize),
    ("enc with wrong dtype", frame(good_header(tensors=spec(enc="int8", dtype="float32")), BLOB), codec.BadHeader),
    ("negative dim", frame(good_header(tensors=spec(shape=[-2])), BLOB), codec.BadHeader),
    ("tensor past the end", frame(good_header(), BLOB[:4]), codec.TruncatedFrame),
    ("trailing bytes", frame(good_header(), BLOB + b"\0"), codec.TrailingBytes),
    ("tensor field missing", frame(good_header(tensors={}), b""), codec.BadHeader),
]


@pytest.mark.parametrize("name,data,error", MALFORMED, ids=[m[0] for m in MALFORMED])
def test_malformed_frame_is_named(name, data, error):
    dec = FrameDecoder(expected_run_id=RUN, max_frame_bytes=1 << 20)
    dec.feed(data + b"\0" * 64)  # more bytes behind it must not change the verdict
    with pytest.raises(error):
        dec.next()
    with pytest.raises(error):  # the stream stays broken
        dec.next()


def test_the_good_frame_of_the_table_decodes():
    _, msg = decode_frame(frame(good_header(), BLOB), expected_run_id=RUN)
    assert msg == FragmentUpdate(0, 1, False, [np.array([1, 2], np.float32)])


def test_any_run_id_when_none_expected_and_limit_is_configurable():
    data = frame(good_header(run_id="other"), BLOB)
    assert decode_frame(data)[0]["run_id"] == "other"
    with pytest.raises(codec.FrameTooLarge):
        decode_frame(data, max_frame_bytes=len(data) - 5)


def test_partial_frame_waits_and_whole_frame_check():
    data = frame(good_header(), BLOB)
    dec = FrameDecoder()
    dec.feed(data[:-1])
    assert dec.next() is None and dec.buffered == len(data) - 1
    with pytest.raises(codec.TruncatedFrame):
        decode_frame(data[:-1])
    with pytest.raises(codec.TrailingBytes):
        decode_frame(data + data[:3])


def test_encoding_refuses_what_is_not_a_message():
    with pytest.raises(TypeError):
        encode_frame(object(), RUN, "s")
    with pytest.raises(TypeError, match="dtype"):
        encode_frame(FragmentUpdate(0, 0, False, [np.zeros(2, np.complex64)]), RUN, "s")
