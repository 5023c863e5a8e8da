"""trainer/numerics/checkpoint.py: async orbax checkpoints that restore without templates and
never return a partially written step (a real process is SIGKILLed mid-save)."""
from __future__ import annotations

import json
import os
import subprocess
import sys
import textwrap
import time
from types import SimpleNamespace

import jax
import numpy as np
import pytest

from diloco_chaos.trainer.config import InnerOptConfig, ModelConfig, RunConfig, TaskConfig
from diloco_chaos.trainer.numerics import tasks
from diloco_chaos.trainer.numerics.checkpoint import Checkpointer
from diloco_chaos.trainer.numerics.inner import make_inner, opt_state_to_tree


def syncer_tree(round_: int) -> dict:
    rng = np.random.default_rng(round_)
    return {"theta": {"0": [rng.standard_normal((3, 2)).astype(np.float32),
                            rng.standard_normal(4).astype(np.float32)],
                      "1": [np.ones(5, np.float32)]},
            "outer": {"0": [np.zeros((3, 2), np.float32), np.zeros(4, np.float32)],
                      "1": []},
            "version": [round_, 2], "round": round_, "lr": 0.7, "ok": True,
            "tokens": np.int64(123456789012)}


def assert_same(a, b):
    assert type(a) is type(b) or (isinstance(a, np.ndarray) and isinstance(b, np.ndarray))
    if isinstance(a, dict):
        assert a.keys() == b.keys()
        for k in a:
            assert_same(a[k], b[k])
    elif isinstance(a, list):
        assert len(a) == len(b)
        for x, y in zip(a, b):
            assert_same(x, y)
    elif isinstance(a, np.ndarray):
        assert a.dtype == b.dtype and a.shape == b.shape
        np.testing.assert_array_equal(a, b)
    else:
        assert a == b


def test_round_trip_returns_plain_numpy_trees(tmp_path):
    with Checkpointer(tmp_path / "ck") as ck:
        assert ck.latest_step() is None and ck.restore() is None
        tree = syncer_tree(3)
        ck.save(3, tree)
        ck.wait()
        assert ck.latest_step() == 3
        got = ck.restore()
    want = {**tree, "tokens": np.array(123456789012)}  # numpy scalars come back 0-d
    assert_same(got, want)
    with Checkpointer(tmp_path / "ck") as again:  # a restarted process, no template
        assert again.latest_step() == 3
        assert_same(again.restore(3), want)


def test_save_copies_the_tree_so_the_caller_may_keep_mutating(tmp_path):
    x = np.zeros(1000, np.float32)
    with Checkpointer(tmp_path) as ck:
        ck.save(1, {"x": x})
        x += 1  # immediately, while the write may be in flight
        ck.wait()
        np.testing.assert_array_equal(ck.restore()["x"], np.zeros(1000, np.float32))


def test_keeps_the_newest_and_steps_must_increase(tmp_path):
    with Checkpointer(tmp_path, max_to_keep=2) as ck:
        for step in (1, 2, 5):
            ck.save(step, {"round": step})
        ck.wait()
        assert ck.steps() == [2, 5]
        assert ck.restore(2) == {"round": 2}
        with pytest.raises(ValueError, match="step 5 <= last saved step 5"):
            ck.save(5, {"round": 5})
        with pytest.raises(ValueError, match="no finalized checkpoint for step 1"):
            ck.restore(1)


class InFlight(Checkpointer):
    """A checkpointer whose newest save is still being written: orbax has finalized none
    after `finalized` (what `latest_step` reads from disk), whatever the machine's speed."""

    finalized = 50

    def latest_step(self):
        return self.finalized


def test_a_save_in_flight_is_the_step_a_learner_has_saved(tmp_path):
    """A unit stopped just after a periodic save, its write in flight: the loop's final save
    asks `saved_step`, which must count that save (orbax refuses its step a second time, and
    the unit died before its `done`: seen on Docker at the run's end)."""
    from diloco_chaos.trainer.units.learner import Learner

    with InFlight(tmp_path) as ck:
        ck.save(100, {"round": 100})
        unit = SimpleNamespace(ckpt=ck)
        assert ck.last_saved == Learner.saved_step(unit) == 100 and ck.latest_step() == 50
        with pytest.raises(ValueError, match="step 100 <= last saved step 100"):
            ck.save(100, {"round": 100})


def test_first_per_interval_keeps_the_first_save_of_each_clock_interval():
    from datetime import datetime, timezone
    from types import SimpleNamespace

    from diloco_chaos.trainer.numerics.checkpoint import FirstPerInterval

    def at(s):  # a checkpoint saved at epoch second s
        return SimpleNamespace(step=int(s * 10), time=datetime.fromtimestamp(s, tz=timezone.utc), metrics=None)

    # intervals of 3 s from the epoch: [99, 102) [102, 105) [105, 108) [108, 111)
    saves = [at(t) for t in (100.0, 101.5, 102.1, 104.9, 105.0, 110.2)]
    assert FirstPerInterval(3).should_preserve(saves, context=None) == [True, False, True, False, True, True]


def test_keep_every_s_keeps_a_history_besides_the_newest(tmp_path):
    # steps 1..6 saved 0.4 s apart into 1 s intervals: the newest two (5, 6) are kept as
    # before, and besides them the first of each second (at least 2 of steps 1-4)
    with Checkpointer(tmp_path / "hist", max_to_keep=2, keep_every_s=1) as ck:
        for step in range(1, 7):
            ck.save(step, {"round": step})
            ck.wait()
            time.sleep(0.4)  # the input here is time itself (pace-free: a slower machine only
            #                    spreads steps 1-4 over more seconds, so at least 2 of them stay)
        kept = ck.steps()
    assert {5, 6} <= set(kept) and len(set(kept) & {1, 2, 3, 4}) >= 2, kept
    with Checkpointer(tmp_path / "latest", max_to_keep=2) as ck:
        for step in range(1, 7):
            ck.save(step, {"round": step})
        ck.wait()
        assert ck.steps() == [5, 6]
    with pytest.raises(ValueError, match="keep_every_s = 0.5 must be a whole number of seconds"):
        Checkpointer(tmp_path / "bad", keep_every_s=0.5)


def test_unstorable_leaves_are_named(tmp_path):
    with Checkpointer(tmp_path) as ck:
        with pytest.raises(ValueError, match="leaf meta/name has type str"):
            ck.save(1, {"meta": {"name": "learner-1"}})
        with pytest.raises(ValueError, match="leaf x/1 has type NoneType"):
            ck.save(1, {"x": [1, None]})


def test_a_learner_resumes_exactly_from_its_checkpoint(tmp_path):
    cfg = RunConfig(model=ModelConfig(n_layers=1, d_model=16, n_heads=2, d_ff=32,
                                      context=8, vocab=32),
                    task=TaskConfig(batch_size=4, seq_len=8),
                    inner=InnerOptConfig(warmup_steps=2, total_steps=20))
    task = tasks.task_for_run(cfg)
    loop = make_inner(cfg, task.loss_fn)
    p = task.init_params(jax.random.key(0))
    s = loop.init(p)
    for step in range(3):
        p, s, _ = loop.step(p, s, task.batch(0, step))
    with Checkpointer(tmp_path) as ck:
        ck.save(3, {"theta": p, "inner": opt_state_to_tree(s),
                    "c_steps": [3, 3], "c_tokens": [96, 96]})
        ck.wait()
    with Checkpointer(tmp_path) as restarted:
        tree = restarted.restore()
    q = jax.tree.map(np.asarray, tree["theta"])
    t = loop.opt_state_from_tree(q, tree["inner"])
    assert tree["c_steps"] == [3, 3] and tree["c_tokens"] == [96, 96]
    for step in range(3, 6):
        p, s, _ = loop.step(p, s, task.batch(0, step))
        q, t, _ = loop.step(q, t, task.batch(0, step))
    for x, y in zip(jax.tree.leaves(p), jax.tree.leaves(q)):
        np.testing.assert_array_equal(np.asarray(x), np.asarray(y))


KILL_MID_SAVE = textwrap.dedent("""
    import json, os, signal, sys
    import numpy as np
    from diloco_chaos.trainer.numerics.checkpoint import Checkpointer
    ck = Checkpointer(sys.argv[1])
    ck.save(1, {"x": np.zeros(4, np.float32), "round": 1})
    ck.wait()
    big = np.random.default_rng(0).standard_normal(5_000_000).astype(np.float32)
    ck.save(2, {"x": big, "round": 2})
    print(json.dumps(sorted(os.listdir(sys.argv[1]))), flush=True)
    os.kill(os.getpid(), signal.SIGKILL)  # mid-save: the write runs in orbax's thread
""")


def test_a_process_killed_mid_save_leaves_only_an_ignored_tmp_dir(tmp_path):
    ck_dir = tmp_path / "ck"
    proc = subprocess.run([sys.executable, "-c", KILL_MID_SAVE, str(ck_dir)],
                          cwd=tmp_path,  # the installed package, not the checkout's folders
                          capture_output=True, text=True, timeout=120)
    assert proc.returncode == -9, proc.stderr[-2000:]
    at_kill = json.loads(proc.stdout.strip().splitlines()[-1])
    left = sorted(os.listdir(ck_dir))
    # What orbax leaves: the finalized step 1 and step 2's tmp dir (renamed to "2"
    # only once complete). Should the write ever win the race, "2" is complete.
    assert "1" in left and at_kill[0] == "1"
    assert left in (["1", "2.orbax-checkpoint-tmp"], ["1", "2"]), left
    with Checkpointer(ck_dir) as ck:
        restored = ck.restore()
        if "2" in left:
            assert ck.latest_step() == 2 and restored["x"].shape == (5_000_000,)
        else:
            assert ck.latest_step() == 1 and restored["round"] == 1
            np.testing.assert_array_equal(restored["x"], np.zeros(4, np.float32))
            ck.save(2, {"round": 2})  # and the step can be written again
            ck.wait()
            assert ck.restore() == {"round": 2}
            # the new manager removed the partial step: orbax deletes tmp dirs in a background
            # future that its first save waits for (a listing before that save raced with it:
            # a CI run saw the tmp dir still there)
            assert sorted(os.listdir(ck_dir)) == ["1", "2"]


@pytest.mark.skipif(os.geteuid() != 0, reason="mounting a small filesystem needs root")
def test_a_save_a_full_disk_refused_is_raised_and_the_checkpointer_saves_again(tmp_path):
    """The kernel's ENOSPC (a 256 KiB tmpfs) from orbax's background write: `wait` raises
    it; orbax's manager keeps raising it at every later save, so `recover` makes a new one,
    which deletes the half-written step; the next save lands and nothing partial restores."""
    disk = tmp_path / "disk"
    disk.mkdir()
    if subprocess.run(["mount", "-t", "tmpfs", "-o", "size=256k", "tmpfs", str(disk)]).returncode != 0:
        pytest.skip("mount -t tmpfs failed here")
    try:
        ck = Checkpointer(disk / "ck", start_in_thread=True)
        big = np.random.default_rng(0).random(200_000).astype(np.float32)  # 800 KB, incompressible
        ck.save(1, {"a": big})
        with pytest.raises(Exception, match="No space left on device|RESOURCE_EXHAUSTED"):
            ck.wait()
        assert ck.steps() == []
        ck.recover()
        ck.save(2, {"a": big[:1000]})
        ck.wait()
        assert ck.steps() == [2] and np.array_equal(ck.restore()["a"], big[:1000])
        ck.close()
    finally:
        subprocess.run(["umount", "-l", str(disk)])


def test_a_flipped_byte_loads_through_orbax_and_only_the_manifest_sees_it(tmp_path):
    """One byte inverted in the middle of a checkpoint's largest data file (what the
    corrupt_checkpoint fault does): orbax restores it without complaint, with other values;
    `restore_checked` and `restore_verified` refuse it and fall back to the save before."""
    from diloco_chaos.harness.backends import checkpoint_disk

    with Checkpointer(tmp_path) as ck:
        for step in (1, 2):
            ck.save(step, {"theta": np.arange(4096, dtype=np.float32) * step, "n": step})
        ck.wait()
        assert ck.sealed_steps() == [1, 2]
        done = checkpoint_disk.damage(tmp_path, "flip")
        assert done["step"] == 2
        loaded = ck.restore(2)  # orbax: no error, other bytes
        assert not np.array_equal(loaded["theta"], np.arange(4096, dtype=np.float32) * 2)
        with pytest.raises(ValueError, match="not what was saved"):
            ck.restore_checked(2)
        step, tree, skipped = ck.restore_verified()
        assert step == 1 and [s["step"] for s in skipped] == [2]
        np.testing.assert_array_equal(tree["theta"], np.arange(4096, dtype=np.float32))
        assert checkpoint_disk.listing(tmp_path) == {"finalized": [1, 2], "sealed": [1, 2]}


def test_the_harness_reads_the_manifest_by_the_trainers_name():
    """checkpoint_disk reads a unit's folder without the unit's code (no orbax import in
    the harness's evidence path); the file's name is the contract the two share."""
    from diloco_chaos.harness.backends import checkpoint_disk
    from diloco_chaos.trainer.numerics import checkpoint

    assert checkpoint_disk.MANIFEST == checkpoint.MANIFEST
