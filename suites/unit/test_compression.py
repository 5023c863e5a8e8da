"""Outer-gradient compression: hand-checked encodings and error bounds over random tensors."""
from __future__ import annotations

import math

import ml_dtypes
import numpy as np
import pytest
from hypothesis import given
from hypothesis import strategies as st
from hypothesis.extra import numpy as hnp

from diloco_chaos.trainer.protocol.compression import KINDS, Encoded, decode, decode_one, encode, encode_one, storage_size

TINY = 2.0 ** -149  # one fp32 subnormal step: decoding q·s can round by half of it


def tensors(**float_kw):
    shapes = hnp.array_shapes(min_dims=0, max_dims=3, min_side=0, max_side=9)
    return hnp.arrays(np.float32, shapes, elements=st.floats(width=32, **float_kw))


# --- hand-checked examples ---------------------------------------------------------------

def test_int8_by_hand():
    e = encode_one(np.array([2.54, -1.0, 0.02], np.float32), "int8")
    assert e.scale == np.float32(0.02)
    assert e.data.tolist() == [127, -50, 1]
    np.testing.assert_allclose(decode_one(e), [2.54, -1.0, 0.02], rtol=1e-6)


def test_int4_by_hand():
    # s = 1; 1.0 -> c=7 (0b0111), -0.5 -> c=6 with sign (0b1110), 0.3 -> 0.25 (c=5), 0 -> 0
    e = encode_one(np.array([1.0, -0.5, 0.3, 0.0, 0.005], np.float32), "int4")
    assert e.scale == 1.0
    assert e.data.tolist() == [0x7 | 0xE << 4, 0x5 | 0x0 << 4, 0x0]  # 0.005 < 1/128 -> zero
    assert decode_one(e).tolist() == [1.0, -0.5, 0.25, 0.0, 0.0]


def test_int4_levels_and_ties():
    s = 8.0
    x = np.array([s, 0.75 * s, 0.7501 * s, s / 64, s / 128, s / 127, -s / 64], np.float32)
    # 0.75·s is the midpoint of s/2 and s: ties go to the smaller magnitude
    assert decode_one(encode_one(x, "int4")).tolist() == [s, s / 2, s, s / 64, 0.0, s / 64, -s / 64]


def test_bf16_by_hand():
    e = encode_one(np.array([[1.0, 3.14159265]], np.float32), "bf16")
    assert e.data.dtype == ml_dtypes.bfloat16 and e.shape == (1, 2)
    assert decode_one(e).tolist() == [[1.0, 3.140625]]  # 8 significand bits


def test_int4_packs_two_per_byte():
    for n in (0, 1, 2, 7, 8, 1001):
        e = encode_one(np.linspace(-1, 1, n, dtype=np.float32), "int4")
        assert e.data.nbytes == math.ceil(n / 2) == storage_size("int4", (n,))


def test_zero_and_empty_and_scalar_tensors():
    for kind in KINDS:
        z = decode_one(encode_one(np.zeros((2, 3), np.float32), kind))
        assert z.shape == (2, 3) and not z.any()
        assert decode_one(encode_one(np.zeros((0, 4), np.float32), kind)).shape == (0, 4)
        assert decode_one(encode_one(np.float32(-2.0), kind)).shape == ()


def test_non_finite_input_decodes_to_nan_for_integer_kinds():
    x = np.array([1.0, np.inf, 2.0], np.float32)
    for kind in ("int8", "int4"):
        assert np.isnan(decode_one(encode_one(x, kind))).all()


def test_encoded_rejects_inconsistent_storage():
    with pytest.raises(ValueError, match="kind"):
        Encoded("int2", (2,), np.zeros(1, np.uint8))
    with pytest.raises(ValueError, match="1-D int8"):
        Encoded("int8", (2,), np.zeros(2, np.uint8))
    with pytest.raises(ValueError, match="2 elements"):
        Encoded("int4", (4,), np.zeros(3, np.uint8))
    with pytest.raises(ValueError, match="kind"):
        encode([np.zeros(2, np.float32)], "fp8")


def test_decode_is_fp32_for_every_kind():
    xs = [np.arange(6, dtype=np.float32).reshape(2, 3), np.float32(1.5)]
    for kind in KINDS:
        out = decode(encode(xs, kind))
        assert [o.dtype for o in out] == [np.float32, np.float32]
        assert [o.shape for o in out] == [(2, 3), ()]


# --- bounds over random tensors ----------------------------------------------------------

@given(tensors(allow_nan=False, allow_infinity=False))
def test_fp32_round_trip_is_exact(x):
    e = encode_one(x, "fp32")
    assert e.scale == 1.0 and decode_one(e).tobytes() == x.tobytes()


@given(tensors(allow_nan=False, allow_infinity=False, allow_subnormal=False,
               min_value=-2.0 ** 127, max_value=2.0 ** 127))
def test_bf16_relative_error(x):
    x = np.where(np.abs(x) < 2.0 ** -126, np.float32(0), x)  # normal range only (see docstring)
    err = np.abs(decode_one(encode_one(x, "bf16")).astype(np.float64) - x)
    assert (err <= 2.0 ** -8 * np.abs(x.astype(np.float64))).all()


@given(tensors(allow_nan=False, allow_infinity=False))
def test_int8_abs_error_at_most_half_a_step(x):
    e = encode_one(x, "int8")
    x64, y64 = x.astype(np.float64), decode_one(e).astype(np.float64)
    assert np.abs(e.data.astype(int)).max(initial=0) <= 127 and np.isfinite(y64).all()
    assert (np.abs(y64 - x64) <= e.scale / 2 + 2.0 ** -24 * np.abs(y64) + TINY).all()


@given(tensors(allow_nan=False, allow_infinity=False))
def test_int4_error_bound(x):
    e = encode_one(x, "int4")
    x64, y64 = x.astype(np.float64), decode_one(e).astype(np.float64)
    bound = np.maximum(np.abs(x64) / 3, e.scale / 128) * (1 + 1e-12) + TINY
    assert np.isfinite(y64).all() and (np.abs(y64 - x64) <= bound).all()
    assert e.data.nbytes == math.ceil(x.size / 2)
    assert (np.sign(y64) * np.sign(x64) >= 0).all()  # never flips a sign
