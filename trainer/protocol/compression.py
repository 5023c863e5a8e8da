"""Outer-gradient compression: a pseudo-gradient tensor in fp32, bf16, int8, 4 bits or sparse.

Pure numpy (+ ml_dtypes for bfloat16). `encode` turns fp32 tensors into `Encoded`
records, `decode` turns them back into fp32: the merge and the outer step always
accumulate in fp32, whatever went over the wire.

Formats and their error bounds (x a tensor, s its per-tensor scale, x̂ = decode(encode(x))):

  fp32  as is, s = 1.                                         x̂ == x bit for bit
  bf16  round to nearest even, s = 1.                         |x̂ − x| ≤ 2^-8·|x| (normal range)
  int8  symmetric, s = max|x|/127, q = rint(x/s) ∈ [−127, 127].
                                                              |x̂ − x| ≤ s/2   (+ fp32 rounding of q·s)
  int4  E3M0-style: sign bit + 3-bit magnitude code c, s = max|x|;
        c = 0 is zero, c = 1..7 is s·2^(c−7), so |x̂| ∈ {0, s/64, s/32, …, s/2, s};
        nearest level in the linear domain, ties to the smaller magnitude.
                                                              |x̂ − x| ≤ max(|x|/3, s/128)
        Two codes per byte, element 2i in the low nibble, 2i+1 in the high one:
        ceil(n/2) bytes. The sign bit of a zero is always 0.

  sparse  chunked top-k with 2-bit values: x is cut into chunks of 256 (the last padded
        with zeros); each chunk keeps its k = round(density · 256) (≥ 1) largest |x|. The kept
        magnitudes are split at their median into two levels, lo and hi (the mean of each
        half); a kept entry is sent as its index in its chunk (one byte) and two bits (sign,
        hi or lo). Storage, uint8: lo as float32 LE (4 bytes) | m = chunks · k indices |
        ceil(m/4) code bytes (entry j in bits 2j mod 8: bit 0 the sign, bit 1 hi); s = hi.
        Everything else decodes to 0: |x̂ − x| is unbounded per call, and the sender
        carries what was not sent into its next Δ (error feedback: docs/PROTOCOL.md
        "Sparse pseudo-gradients"). The bytes count every index and level: 10 bits per
        kept entry; at density 1/16, 0.63 bits per coordinate (fp32: 32).

Why E3M0 for 4 bits rather than 15 uniform levels: pseudo-gradients are heavy-tailed,
and a log grid keeps a bounded *relative* error down to s/64 where uniform int4 rounds
everything below s/14 to zero (DESIGN.md names E3M0; so does Streaming DiLoCo).

Non-finite input to int8/int4 gives scale NaN, so the decoded tensor is all NaN and
the syncer's NaN checks see it rather than a silently clipped value.
"""
from __future__ import annotations

import math
from dataclasses import dataclass

import ml_dtypes
import numpy as np

KINDS = ("fp32", "bf16", "int8", "int4", "sparse")
SPARSE_CHUNK = 256          # one index byte addresses a chunk
SPARSE_DENSITY = 1 / 16     # the default share of each chunk kept (16 of 256)
STORAGE_DTYPE = {
    "fp32": np.dtype(np.float32),
    "bf16": np.dtype(ml_dtypes.bfloat16),
    "int8": np.dtype(np.int8),
    "int4": np.dtype(np.uint8),
    "sparse": np.dtype(np.uint8),
}
# int4 magnitude levels / s for codes c = 0..7, ascending, and the midpoints between them.
_INT4_LEVELS = np.array([0.0] + [2.0 ** (c - 7) for c in range(1, 8)])
_INT4_MIDS = (_INT4_LEVELS[:-1] + _INT4_LEVELS[1:]) / 2
# the value of each 4-bit code (bit 3 the sign) as a fraction of s: one gather decodes a tensor
# (sign × level × s is exact: the levels are powers of two)
_INT4_SIGNED = np.concatenate([_INT4_LEVELS, -_INT4_LEVELS])
_FP32_MAX = float(np.finfo(np.float32).max)


def storage_size(kind: str, shape: tuple[int, ...], declared: int | None = None) -> int:
    """Number of storage elements (of STORAGE_DTYPE[kind]) for a tensor of `shape`. A sparse
    tensor's size depends on its k: `declared` (the size a frame or record claims) is
    returned when it is a valid sparse layout for `shape`, else ValueError."""
    n = math.prod(shape)
    if kind == "sparse":
        if declared is None:
            raise ValueError("a sparse tensor's size follows from its k: give the declared size")
        sparse_k(n, declared)
        return declared
    return (n + 1) // 2 if kind == "int4" else n


def _sparse_bytes(m: int) -> int:
    return 4 + m + (m + 3) // 4


def sparse_k(n: int, size: int) -> int:
    """k per chunk of a sparse tensor of n entries stored in `size` bytes; ValueError when
    no k gives that size (a truncated or forged record)."""
    chunks = -(-n // SPARSE_CHUNK)
    m = max(0, (4 * (size - 4)) // 5)
    for cand in (m - 1, m, m + 1):
        if cand >= 0 and _sparse_bytes(cand) == size:
            if chunks == 0 and cand == 0:
                return 0
            if chunks and cand % chunks == 0 and cand // chunks <= SPARSE_CHUNK:
                return cand // chunks
    raise ValueError(f"{size} bytes are no sparse layout for {n} entries "
                     f"({chunks} chunks of {SPARSE_CHUNK}: 4 + m + ceil(m/4) bytes for m = chunks·k)")


@dataclass(frozen=True, eq=False)
class Encoded:
    """One compressed tensor: `data` is the flat storage, `shape` the logical shape."""

    kind: str
    shape: tuple[int, ...]
    data: np.ndarray
    scale: float = 1.0

    def __post_init__(self):
        if self.kind not in KINDS:
            raise ValueError(f"Encoded.kind must be one of {KINDS}, got {self.kind!r}")
        object.__setattr__(self, "shape", tuple(int(d) for d in self.shape))
        if any(d < 0 for d in self.shape):
            raise ValueError(f"Encoded.shape must be non-negative, got {self.shape}")
        want = STORAGE_DTYPE[self.kind]
        if self.data.dtype != want or self.data.ndim != 1:
            raise ValueError(f"Encoded.data for {self.kind} must be 1-D {want}, "
                             f"got {self.data.ndim}-D {self.data.dtype}")
        if self.data.size != storage_size(self.kind, self.shape, self.data.size):
            raise ValueError(f"Encoded.data for {self.kind} {self.shape} must hold "
                             f"{storage_size(self.kind, self.shape)} elements, got {self.data.size}")
        object.__setattr__(self, "scale", float(self.scale))

    @property
    def nbytes(self) -> int:
        return self.data.nbytes

    def __eq__(self, other) -> bool:  # bitwise: NaN scales and payloads compare equal to themselves
        return (isinstance(other, Encoded) and (self.kind, self.shape) == (other.kind, other.shape)
                and np.float64(self.scale).tobytes() == np.float64(other.scale).tobytes()
                and self.data.tobytes() == other.data.tobytes())

    __hash__ = None


def _absmax(x64: np.ndarray) -> float:
    return float(np.max(np.abs(x64))) if x64.size else 0.0


def _encode_int8(x64: np.ndarray) -> tuple[np.ndarray, float]:
    amax = _absmax(x64)
    if not math.isfinite(amax):
        return np.zeros(x64.size, np.int8), math.nan
    scale = np.float32(amax / 127)
    if np.float64(scale) * 127.5 <= amax:  # rounded far down (subnormal): rint(x/s) must stay ≤ 127
        scale = np.nextafter(scale, np.float32(np.inf))
    q = np.rint(x64 / np.float64(scale)) if scale > 0 else np.zeros_like(x64)
    return np.clip(q, -127, 127).astype(np.int8), float(scale)


def _encode_int4(x64: np.ndarray) -> tuple[np.ndarray, float]:
    amax = _absmax(x64)
    if not math.isfinite(amax):
        return np.zeros(storage_size("int4", x64.shape), np.uint8), math.nan
    scale = float(np.float32(amax))
    mag = np.abs(x64) / scale if scale > 0 else np.zeros_like(x64)
    code = np.searchsorted(_INT4_MIDS, mag, side="left").astype(np.uint8)  # 0..7
    code |= ((x64 < 0) & (code > 0)).astype(np.uint8) << 3
    if code.size % 2:
        code = np.append(code, np.uint8(0))
    return code[0::2] | (code[1::2] << 4), scale


def _decode_int4(data: np.ndarray, n: int, scale: float) -> np.ndarray:
    code = np.empty(data.size * 2, np.uint8)
    code[0::2], code[1::2] = data & 0x0F, data >> 4
    return _INT4_SIGNED[code[:n]] * scale


def _encode_sparse(x64: np.ndarray, density: float) -> tuple[np.ndarray, float]:
    n = x64.size
    chunks = -(-n // SPARSE_CHUNK)
    k = min(SPARSE_CHUNK, max(1, round(density * SPARSE_CHUNK))) if chunks else 0
    if not np.all(np.isfinite(x64)):
        return np.zeros(_sparse_bytes(chunks * k), np.uint8), math.nan
    padded = np.zeros(chunks * SPARSE_CHUNK)
    padded[:n] = x64
    padded = padded.reshape(chunks, SPARSE_CHUNK)
    idx = np.sort(np.argpartition(-np.abs(padded), k - 1, axis=1)[:, :k], axis=1) if chunks else \
        np.zeros((0, 0), np.int64)
    vals = np.take_along_axis(padded, idx, axis=1).ravel()
    mag = np.abs(vals)
    hi = mag > np.median(mag) if mag.size else np.zeros(0, bool)
    lo_level = float(np.float32(mag[~hi].mean())) if (~hi).any() else 0.0
    hi_level = float(np.float32(mag[hi].mean())) if hi.any() else lo_level
    code = ((vals < 0).astype(np.uint8) | (hi.astype(np.uint8) << 1))
    code = np.concatenate([code, np.zeros(-code.size % 4, np.uint8)]).reshape(-1, 4)
    packed = code[:, 0] | (code[:, 1] << 2) | (code[:, 2] << 4) | (code[:, 3] << 6)
    data = np.concatenate([np.frombuffer(np.float32(lo_level).astype("<f4").tobytes(), np.uint8),
                           idx.ravel().astype(np.uint8), packed.astype(np.uint8)])
    return data, hi_level


def _decode_sparse(data: np.ndarray, n: int, scale: float) -> np.ndarray:
    k = sparse_k(n, data.size)
    chunks = -(-n // SPARSE_CHUNK)
    if math.isnan(scale):
        return np.full(n, np.nan)
    m = chunks * k
    lo = float(np.frombuffer(data[:4].tobytes(), "<f4")[0])
    idx = data[4:4 + m].astype(np.int64) + np.repeat(np.arange(chunks) * SPARSE_CHUNK, k)
    packed = data[4 + m:]
    code = np.stack([(packed >> s) & 3 for s in (0, 2, 4, 6)], axis=1).ravel()[:m]
    vals = np.where(code & 2, scale, lo) * np.where(code & 1, -1.0, 1.0)
    out = np.zeros(chunks * SPARSE_CHUNK)
    out[idx] = vals
    return out[:n]


def encode_one(x: np.ndarray, kind: str, density: float = SPARSE_DENSITY) -> Encoded:
    x = np.asarray(x)
    if kind == "fp32":
        return Encoded(kind, x.shape, np.ascontiguousarray(x, np.float32).ravel().copy())
    if kind == "bf16":
        return Encoded(kind, x.shape, np.asarray(x, np.float32).astype(STORAGE_DTYPE["bf16"]).ravel())
    x64 = np.asarray(x, np.float64).ravel()
    if kind == "int8":
        data, scale = _encode_int8(x64)
    elif kind == "int4":
        data, scale = _encode_int4(x64)
    elif kind == "sparse":
        data, scale = _encode_sparse(x64, density)
    else:
        raise ValueError(f"compression kind must be one of {KINDS}, got {kind!r}")
    return Encoded(kind, x.shape, data, scale)


def decode_one(e: Encoded) -> np.ndarray:
    if e.kind in ("fp32", "bf16"):
        flat = e.data.astype(np.float32)
    elif e.kind == "int8":  # 127·s may round past the fp32 maximum when max|x| is close to it
        flat = np.clip(e.data.astype(np.float64) * e.scale, -_FP32_MAX, _FP32_MAX)
    elif e.kind == "sparse":
        flat = _decode_sparse(e.data, math.prod(e.shape), e.scale)
    else:
        flat = _decode_int4(e.data, math.prod(e.shape), e.scale)
    return flat.astype(np.float32).reshape(e.shape)


def encode(arrays: list[np.ndarray], kind: str, density: float = SPARSE_DENSITY) -> list[Encoded]:
    """Compresses each fp32 tensor of a fragment with its own scale (`density`: sparse only)."""
    if kind not in KINDS:
        raise ValueError(f"compression kind must be one of {KINDS}, got {kind!r}")
    return [encode_one(a, kind, density) for a in arrays]


def decode(encoded: list[Encoded]) -> list[np.ndarray]:
    """Back to fp32 tensors of the original shapes."""
    return [decode_one(e) for e in encoded]


# --- compressed broadcasts (Θ shard → learner), with error feedback ------------------------

def apply_delta(held: list, payload: list[Encoded]) -> list[np.ndarray]:
    """The learner's new copy of Θ[p]: its copy plus the decoded delta, in fp32. The shard
    runs this very function to know the copy the learner holds, so both agree bit for bit."""
    if len(held) != len(payload):
        raise ValueError(f"delta has {len(payload)} tensors, the held fragment {len(held)}")
    return [np.asarray(h, np.float32) + d for h, d in zip(held, decode(payload))]


def broadcast_delta(theta: list, held: list, kind: str,
                    density: float = SPARSE_DENSITY) -> tuple[list[Encoded], list[np.ndarray]]:
    """(payload, the learner's copy once it applies it). The delta is Θ − the learner's copy,
    not Θ_new − Θ_old: what one delta's quantisation (or a sparse delta's omission) lost is
    in the next one — the downlink's error feedback, kept by the shard."""
    residual = [np.asarray(t, np.float32) - np.asarray(h, np.float32) for t, h in zip(theta, held)]
    payload = encode(residual, kind, density)
    return payload, apply_delta(held, payload)
