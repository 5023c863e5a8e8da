"""trainer/numerics/tally.py by hand: what the inner steps did to each fragment, summed over a Δ's steps."""
from __future__ import annotations

import jax.numpy as jnp
import numpy as np

from diloco_chaos.trainer.numerics.tally import AUDIT_SAMPLE, MAX_PENDING, StepTally, audit_index


def _get(params, p):  # two fragments: leaf 0, and leaves 1 and 2
    return [params[0]] if p == 0 else [params[1], params[2]]


def _params(a, b, c):
    return [np.array(a, np.float32), np.array(b, np.float32), np.array(c, np.float32)]


def test_a_tally_sums_each_fragments_changes_over_the_claimed_steps():
    t = StepTally(_get, 2)
    p0 = _params([1, 1], [0], [5, 5])
    p1 = _params([1.5, 1], [0.25], [5, 4])    # step 1: fragment 0 +(0.5, 0), fragment 1 +(0.25, 0, −1)
    p1_taken = _params([3, 3], [0.25], [5, 4])  # a take between the steps moves fragment 0: not a step
    p2 = _params([3, 2], [0.75], [5, 4])      # step 2: fragment 0 +(0, −1), fragment 1 +(0.5, 0, 0)
    t.record(1, p0, p1)
    t.record(2, p1_taken, p2)
    assert t.progress(0, 0, 2).tolist() == [-0.5, 1.0]        # Δ = −(sum of the changes)
    assert t.progress(1, 0, 2).tolist() == [-0.75, 0.0, 1.0]
    assert t.progress(0, 1, 2).tolist() == [0.0, 1.0]
    t.forget_before(1)  # no anchor before step 1 any more
    assert t.progress(0, 0, 2) is None and t.progress(0, 1, 2).tolist() == [0.0, 1.0]
    assert t.progress(0, 2, 5) is None  # steps it never saw


def test_a_large_fragment_is_tallied_at_the_audits_coordinates():
    n = 10_000
    idx = audit_index(n)
    assert len(idx) == AUDIT_SAMPLE and idx[0] == 0 and idx[-1] == n - 1 and audit_index(4096) is None
    before = [np.zeros(6000, np.float32), np.zeros(4000, np.float32)]
    after = [np.arange(6000, dtype=np.float32), -np.arange(4000, dtype=np.float32)]
    t = StepTally(lambda params, p: params, 1)
    t.record(1, before, after)
    flat = np.concatenate([after[0], after[1]])
    assert t.progress(0, 0, 1).tolist() == (-flat[idx]).tolist()


def test_theta_on_the_device_tallies_the_same_bits_as_numpy_without_waiting_on_it():
    """JAX θ is sampled where it lives and summed on the host only when a `progress` asks
    (or MAX_PENDING steps wait): the sums are bit for bit the step-by-step float64 ones."""
    rng = np.random.default_rng(0)
    shapes = [(3000,), (50, 100), (7,)]  # fragment 0: 3000 values, whole; fragment 1: 5007, sampled
    get = lambda params, p: [params[0]] if p == 0 else [params[1], params[2]]  # noqa: E731
    steps = MAX_PENDING * 2 + 5
    thetas = [[rng.standard_normal(s).astype(np.float32) for s in shapes]]
    for _ in range(steps):
        thetas.append([x + np.float32(1e-3) * rng.standard_normal(x.shape).astype(np.float32) for x in thetas[-1]])
    on_host, on_device = StepTally(get, 2), StepTally(get, 2)
    device = [[jnp.asarray(x) for x in theta] for theta in thetas]
    for s in range(1, steps + 1):
        taken = s % 9 == 0  # a take between two steps: θ before is not the last θ after
        before_h = [x + np.float32(0.5) for x in thetas[s - 1]] if taken else thetas[s - 1]
        before_d = [jnp.asarray(x) for x in before_h] if taken else device[s - 1]
        on_host.record(s, before_h, thetas[s])
        on_device.record(s, before_d, device[s])
        assert len(on_device.pending) <= MAX_PENDING
        if s % 20 == 0:
            on_host.forget_before(s - 10)
            on_device.forget_before(s - 10)
        if s % 13 == 0:
            for p in range(2):
                a, b = on_host.progress(p, s - 10, s), on_device.progress(p, s - 10, s)
                assert (a is None) == (b is None) and (a is None or a.tobytes() == b.tobytes())
    # the whole record, by hand: −(Σ over the steps of (after − before)), in step order, in float64
    for p, leaves in ((0, [0]), (1, [1, 2])):
        total = np.zeros(sum(int(np.prod(shapes[i])) for i in leaves), np.float64)
        for s in range(steps - 9, steps + 1):
            before = [x + np.float32(0.5) for x in thetas[s - 1]] if s % 9 == 0 else thetas[s - 1]
            flat = lambda th: np.concatenate([np.ravel(th[i]) for i in leaves]).astype(np.float64)  # noqa: E731
            total = total + (flat(thetas[s]) - flat(before))
        idx = audit_index(total.size)  # fragment 1 at the audit's 64 coordinates
        want = -(total if idx is None else total[idx])
        got = on_device.progress(p, steps - 10, steps)
        assert isinstance(got, np.ndarray) and got.shape == want.shape and np.allclose(got, want, rtol=0, atol=1e-9)
        assert got.tobytes() == on_host.progress(p, steps - 10, steps).tobytes()


def test_a_large_fragment_on_the_device_is_gathered_at_the_audits_coordinates():
    n = 10_000
    before = [jnp.zeros(6000, jnp.float32), jnp.zeros((40, 100), jnp.float32)]
    after = [jnp.arange(6000, dtype=jnp.float32), -jnp.arange(4000, dtype=jnp.float32).reshape(40, 100)]
    t = StepTally(lambda params, p: params, 1)
    t.record(1, before, after)
    assert len(t.pending) == 1 and not isinstance(t.pending[0][2], np.ndarray)  # still on the device
    flat = np.concatenate([np.arange(6000), -np.arange(4000)]).astype(np.float64)
    assert t.progress(0, 0, 1).tolist() == (-flat[audit_index(n)]).tolist() and not t.pending
