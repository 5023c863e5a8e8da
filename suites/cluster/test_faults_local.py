"""Every fault kind on real processes and a real Toxiproxy, each judged by what it
did to the event log (not by which calls were made). Two short runs share the work."""
from __future__ import annotations

import pytest

from harness import eventlog
from harness.runner import run_scenario
from harness.scenario import scenario_from_dict

pytestmark = [pytest.mark.cluster, pytest.mark.slow]


def _scenario(name, faults, *, slices=1, learners=2, shards=1, steps=1500, duration="30s", wan=None):
    # a token budget larger than the 30 s can train: the run lasts until duration + grace,
    # so every fault fires however fast the machine is
    d = {"name": name, "seed": 1, "cluster": {"learners": learners, "slices": slices, "shards": shards},
         "train": {"task": "markov", "steps": steps, "duration": duration, "batch_size": 16},
         "faults": faults}
    if wan:
        d["wan"] = wan
    return scenario_from_dict(d)


def _steps(log, src, t0, t1):
    return [e for e in log.of("step", src=src) if t0 <= e["t"] < t1]


def _window(log, fault_kind):
    start = next(e for e in log.of("fault_start") if e["fault"]["kind"] == fault_kind)
    end = next(e for e in log.of("fault_end") if e["id"] == start["id"])
    return start["t"], end["t"]


@pytest.fixture(scope="module")
def unit_faults(tmp_path_factory):
    s = _scenario("unit-faults", [
        {"kind": "kill_slice", "target": "learner-0", "at": "6s", "duration": "4s"},
        {"kind": "pause_unit", "target": "learner-1", "at": "6s", "duration": "3s"},
        {"kind": "slow_unit", "target": "learner-0", "at": "13s", "duration": "5s", "speed": 0.3},
        {"kind": "kill_unit", "target": "learner-1", "at": "13s", "down_for": "4s"},
        {"kind": "wan", "target": "link:learner-0", "at": "20s", "duration": "5s", "bandwidth_kbps": 400},
    ], slices=2)
    out = tmp_path_factory.mktemp("runs")
    return eventlog.read(run_scenario(s, out, live=False).run_dir)


@pytest.fixture(scope="module")
def link_faults(tmp_path_factory):
    s = _scenario("link-faults", [
        {"kind": "partition", "target": "link:learner-0", "at": "6s", "duration": "4s"},
        {"kind": "kill_syncer", "target": "syncer-1", "at": "7s", "down_for": "3s"},
        {"kind": "reset", "target": "link:learner-1~syncer-0", "at": "12s", "duration": "2s"},
        {"kind": "truncate", "target": "link:learner-0~syncer-1", "at": "16s", "duration": "3s", "bytes": 1000},
    ], shards=2)
    out = tmp_path_factory.mktemp("runs")
    return eventlog.read(run_scenario(s, out, live=False).run_dir)


def test_kill_slice_shrinks_the_batch(unit_faults):
    t0, t1 = _window(unit_faults, "kill_slice")
    during = _steps(unit_faults, "learner-0", t0 + 0.5, t1)
    before = _steps(unit_faults, "learner-0", 0, t0)
    assert during and all(e["live_slices"] == 1 for e in during)
    assert {e["tokens"] for e in during} == {before[-1]["tokens"] // 2}
    after = _steps(unit_faults, "learner-0", t1 + 1, t1 + 3)
    assert after and after[-1]["live_slices"] == 2


def test_pause_stops_steps_then_resumes(unit_faults):
    t0, t1 = _window(unit_faults, "pause_unit")
    assert not _steps(unit_faults, "learner-1", t0 + 0.2, t1)  # SIGSTOPped: no step finished
    assert _steps(unit_faults, "learner-1", t1, t1 + 3)


def test_slow_unit_runs_at_a_fraction(unit_faults):
    t0, t1 = _window(unit_faults, "slow_unit")
    slow = len(_steps(unit_faults, "learner-0", t0, t1)) / (t1 - t0)
    normal = len(_steps(unit_faults, "learner-0", t0 - 2.5, t0)) / 2.5  # the same unit just before
    assert slow < 0.7 * normal, (slow, normal)  # speed 0.3, generous for 2 shared cores


def test_kill_unit_restarts_and_contributes_again(unit_faults):
    t0, t1 = _window(unit_faults, "kill_unit")
    assert not _steps(unit_faults, "learner-1", t0 + 0.2, t1)
    ups = [e for e in unit_faults.of("unit_up", src="learner-1") if "incarnation" in e]
    assert [e["incarnation"] for e in ups] == [0, 1]
    assert any(m["learner"] == "learner-1" and m["incarnation"] == 1 for m in unit_faults.of("merge"))


def test_wan_fault_throttles_the_link(unit_faults):
    t0, t1 = _window(unit_faults, "wan")
    recv = [e for e in unit_faults.of("recv", src="learner-0") if t0 + 1 <= e["t"] < t1]
    rate_kbps = sum(e["bytes"] for e in recv) * 8 / 1000 / (t1 - t0 - 1)
    assert rate_kbps < 400 * 1.3, rate_kbps


def test_partition_blackholes_the_link(link_faults):
    t0, t1 = _window(link_faults, "partition")
    # a frame already past the proxy when the toxic landed may still arrive (a 180 KB
    # fragment on a loaded machine): nothing after the first 1.5 s of the 4 s window
    assert not [e for e in link_faults.of("recv", src="learner-0") if t0 + 1.5 <= e["t"] < t1]
    assert [e for e in link_faults.of("recv", src="learner-0") if e["t"] >= t1]  # healed
    assert _steps(link_faults, "learner-0", t0, t1)  # and the learner never stopped stepping


def test_kill_syncer_restores_from_checkpoint(link_faults):
    restored = link_faults.of("checkpoint_restored", src="syncer-1")
    assert len(restored) == 1
    t0, t1 = _window(link_faults, "kill_syncer")
    assert [e for e in link_faults.of("round_commit", src="syncer-1") if e["t"] > t1]


def test_reset_and_truncate_cut_connections(link_faults):
    for kind, learner in (("reset", "learner-1"), ("truncate", "learner-0")):
        t0, t1 = _window(link_faults, kind)
        downs = [e for e in link_faults.of("link_down", src=learner) if t0 <= e["t"] <= t1 + 1]
        assert downs, f"{kind}: no connection was cut"
