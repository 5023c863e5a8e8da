"""The sparse codec (chunked top-k, 2-bit values) and its error feedback, by hand.

Numbers checked on paper: which entries a chunk keeps, the two levels, the bytes of the
layout (indices and levels counted), a forged size refused; then the two error
feedbacks: the shard's (a broadcast delta against the learner's copy) and the
learner's (what a sparse Δ left out stays in θ and goes out with the next Δ)."""
from __future__ import annotations

import numpy as np
import pytest
from protocol_link import learner_math

from diloco_chaos.trainer.protocol import compression
from diloco_chaos.trainer.protocol.compression import Encoded, decode_one, encode_one, sparse_k, storage_size
from diloco_chaos.trainer.protocol.learner_core import LearnerCore
from diloco_chaos.trainer.protocol.learner_types import LearnerConfig
from diloco_chaos.trainer.protocol.messages import Contribution, FragmentUpdate
from diloco_chaos.trainer.protocol.protocol_base import Send
from diloco_chaos.trainer.wire import codec


def _four_big() -> np.ndarray:
    """256 entries: 4 large ones among 0.01s."""
    x = np.full(256, 0.01, np.float32)
    x[[10, 20, 30, 40]] = [4.0, -3.0, 1.0, -0.5]
    return x


def test_a_chunk_keeps_its_k_largest_in_two_levels_by_hand():
    e = encode_one(_four_big(), "sparse", density=1 / 64)   # k = 4 of 256
    # kept |x| = 4, 3, 1, 0.5, median 2: hi = mean(4, 3) = 3.5, lo = mean(1, 0.5) = 0.75
    assert e.scale == 3.5
    assert np.frombuffer(e.data[:4].tobytes(), "<f4")[0] == 0.75
    assert e.data[4:8].tolist() == [10, 20, 30, 40]
    # 2 bits each (bit 0 sign, bit 1 hi): 0b10, 0b11, 0b00, 0b01 → 2 | 3<<2 | 0<<4 | 1<<6 = 78
    assert e.data[8:].tolist() == [78]
    assert e.nbytes == 4 + 4 + 1
    want = np.zeros(256, np.float32)
    want[[10, 20, 30, 40]] = [3.5, -3.5, 0.75, -0.75]
    assert decode_one(e).tolist() == want.tolist()


def test_sizes_count_every_index_and_level():
    # 257 entries: 2 chunks (the second padded), 4 kept each: 4 + 8 + ceil(8/4) bytes
    assert encode_one(np.arange(257, dtype=np.float32), "sparse", 1 / 64).nbytes == 14 == 4 + 8 + 2
    assert sparse_k(257, 14) == 4
    # density 1/16: 16 per chunk; a 64 x 100 tensor is 25 chunks: 4 + 400 + 100
    e = encode_one(np.ones((64, 100), np.float32), "sparse", density=1 / 16)
    assert e.nbytes == 504 and sparse_k(6400, 504) == 16
    # fp32 is 25,600 bytes: ~51x fewer at 1/16 (the default), ~198x at 1/64 (129 bytes)
    assert encode_one(np.ones((64, 100), np.float32), "sparse", 1 / 64).nbytes == 129
    assert encode_one(np.ones((64, 100), np.float32), "sparse").nbytes == 504


def test_a_size_no_k_gives_is_refused_by_the_record_and_the_wire():
    with pytest.raises(ValueError, match="no sparse layout"):
        storage_size("sparse", (257,), 13)
    with pytest.raises(ValueError, match="no sparse layout"):
        Encoded("sparse", (257,), np.zeros(13, np.uint8), 1.0)
    spec = {"enc": "sparse", "dtype": "uint8", "shape": [257], "scale": 1.0, "nbytes": 13}
    with pytest.raises(codec.BadTensorSize, match="no sparse layout"):
        codec._tensor(spec, memoryview(bytes(13)), 0, "payload")
    msg = Contribution("A", 0, 1, 0, 0, 2, 20, 1.0, None, compression.encode([_four_big()], "sparse", 1 / 64))
    _, back = codec.decode_frame(codec.encode_frame(msg, "r", "A"), "r")
    assert back.payload[0] == msg.payload[0]


def test_zero_and_non_finite():
    assert not decode_one(encode_one(np.zeros(300, np.float32), "sparse")).any()
    x = _four_big()
    x[7] = np.nan
    assert np.isnan(decode_one(encode_one(x, "sparse"))).all()   # the shard's NaN check sees it


def test_the_shards_error_feedback_brings_the_learners_copy_to_theta():
    """Each broadcast delta is Θ − the copy: what one left out is in the next. A fixed Θ of
    1,024 entries at density 1/64: after 64 deltas (4 chunks x 4 entries each time) every
    entry has been sent once (measured 8 % of |Θ| left), after 400 the copy is Θ exactly."""
    theta = [np.random.default_rng(1).standard_normal(1024).astype(np.float32)]
    held = [np.zeros(1024, np.float32)]
    gaps = []
    for i in range(400):
        _, held = compression.broadcast_delta(theta, held, "sparse", 1 / 64)
        gaps.append(float(np.linalg.norm(theta[0] - held[0]) / np.linalg.norm(theta[0])))
    assert gaps[0] > 0.9 and gaps[49] < 0.15 and gaps[199] < 1e-3 and gaps[-1] == 0.0


def _learner(feedback: bool):
    """H = 2, P = 1, keep_local; Θ0 = 0 over 256 entries; pseudo-gradients sparse."""
    math = learner_math(2, 1)
    math = type(math)(**{**math.__dict__,
                         "pseudo_grad_payload": lambda b, x: compression.encode([b[0] - x[0]], "sparse", 1 / 64),
                         "shard_view": (lambda b, pay: [b[0] - compression.decode(pay)[0]]) if feedback else None})
    core = LearnerCore(LearnerConfig("A", 0, ("s0",), keep_local=True), math)
    s, _ = core.start(core.init([np.zeros(256, np.float32)]), 0.0)
    s, _ = core.receive(s, 0.0, "s0", FragmentUpdate(0, 0, True, [np.zeros(256, np.float32)]))
    return core, s


def _sent(acts):
    return [compression.decode(a.msg.payload)[0] for a in acts if isinstance(a, Send)
            and isinstance(a.msg, Contribution)]


@pytest.mark.parametrize("feedback", [True, False])
def test_what_a_sparse_delta_left_out_goes_out_with_the_next(feedback):
    core, s = _learner(feedback)
    x = _four_big()
    s, _ = core.after_inner_step(s, 0.0, [x], 10, 1.0)
    s, acts = core.after_inner_step(s, 0.0, [x], 10, 1.0)      # step 2: Δ = 0 − x, 4 entries sent
    (first,) = _sent(acts)
    assert np.count_nonzero(first) == 4 and first[10] == -3.5
    s, _ = core.receive(s, 0.0, "s0", FragmentUpdate(0, 1, False, [np.full(256, 5.0, np.float32)]))
    theta = s.params[0]
    if feedback:
        # θ = Θ + (x − (0 − Δ̂)): entry 10 kept 4 − 3.5 = 0.5, the unsent 0.01s stay
        assert theta[10] == 5.5 and theta[20] == np.float32(5.0) + np.float32(-3.0 + 3.5)
        assert theta[0] == np.float32(5.0) + np.float32(0.01)
    else:  # measured from θ as sent: everything the Δ left out is gone
        assert (theta == 5.0).all()
    s, _ = core.after_inner_step(s, 0.0, [theta], 10, 1.0)
    s, acts = core.after_inner_step(s, 0.0, [theta], 10, 1.0)  # step 4: the next Δ
    (second,) = _sent(acts)
    assert np.count_nonzero(second) == (4 if feedback else 0)
    assert abs(float(second.sum())) > 0 if feedback else not second.any()


def test_sparse_needs_keep_local():
    from diloco_chaos.trainer.config import DilocoConfig
    with pytest.raises(ValueError, match="keep_local"):
        DilocoConfig(compression="sparse", keep_local=False)
    assert DilocoConfig(compression="sparse", keep_local=False, mode="dp").mode == "dp"
    with pytest.raises(ValueError, match="sparse_density"):
        DilocoConfig(sparse_density=0.0)
